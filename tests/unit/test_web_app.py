"""gpu-bridge web over the lab's fakes (FakeKube, FakeSlurm, FakeProm): each page and its JSON
endpoint answer from what the adapters read, with the same numbers as ``status``; bad input
(malformed or unknown job id, malformed query, a missing or foreign user) gets a clear 4xx page
naming the field; the preemption Event the daemon writes is read back as the job's history."""

from __future__ import annotations

import html
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from starlette.testclient import TestClient

from bridge.adapters.kube.objects import NodeEvent
from bridge.adapters.prom.history import parse_daemon_history
from bridge.adapters.prom.types import DaemonHistory, PromPool
from bridge.adapters.protocols import PoolTarget
from bridge.config import parse_config
from bridge.cli.daemon import status_rows
from bridge.model import Phase
from bridge.preemption import EVENT_REASON, parse_preemption, preemption_message
from bridge.web import svg
from bridge.web.app import build_app
from bridge.web.source import WebSource
from bridge.wiring import Adapters
from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from gpu_bridge_lab.fakes.slurm import FakeSlurm

T0 = 1_800_000_000.0
NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
POOL = {"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m", "min_serving": 1,
        "cold_start_s": 3, "drain_s": 5}


@dataclass
class HistoryProm(FakeProm):
    """FakeProm plus the daemon's metrics history (``PromAdapter.daemon_history``)."""

    def daemon_history(self, pool: PromPool, *, start: float, end: float, step_s: float) -> DaemonHistory:
        n = int((end - start) // step_s) + 1
        lent = [float(i % 3) for i in range(n)]
        lends = [1.0 if i % 10 == 0 else 0.0 for i in range(n)]
        return DaemonHistory(start=start, step_s=step_s,
                             series={"lends": tuple(lends), "reclaims": tuple(reversed(lends)), "lent": tuple(lent),
                                     "slo_spent": tuple([0.25] * n)})


@dataclass
class Site:
    kube: FakeKube
    slurm: FakeSlurm
    source: WebSource
    events: list[NodeEvent]
    running: str
    pending: str


def site(web: dict[str, object] | None = None) -> Site:
    cfg = parse_config({"pools": [POOL], "slurm": {"grace_s": 5},
                        "prometheus": {"url": "http://127.0.0.1:1", "timeout_s": 1},  # nothing listens: outlook 503
                        "policy": {"calibration": {"enabled": False}}, "web": {"cache_s": 0, **(web or {})}})
    kube = FakeKube(now=T0)
    slurm = FakeSlurm(grace_s=5, now=T0)
    for n in NODES:
        kube.add_node(n, "default")
        slurm.add_node(n)
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=2, start_delay_s=0)
    for n in NODES[:2]:
        slurm.drain(n, "gpu-bridge: serving")  # serving nodes: no research job lands there
    kube.set_phase("gpu-node-03", Phase.LENT, "lend gpu-node-03: forecast peak 0.4 replicas < 2 serving - 1", T0 - 600)
    running = slurm.add_job("gpu-node-03", name="train-llm", user="alice", comment="gpu-bridge:checkpoint=1799999700")
    pending = slurm.add_job(name="waiting", user="bob")
    events = [NodeEvent("gpu-node-02", EVENT_REASON, preemption_message(
        job_id=running, node="gpu-node-02", grace_s=5, lost_gpu_hours=0.2, checkpoint_time=T0 - 3000), T0 - 2000)]
    adapters = Adapters(kube=kube, slurm=slurm, prom=HistoryProm(), prom_pools={"default": PromPool("default", "m")},  # type: ignore[arg-type]
                        leader=None, identity="web-test")
    source = WebSource(cfg, adapters, events=lambda reason: tuple(e for e in events if e.reason == reason), clock=lambda: T0)
    return Site(kube, slurm, source, events, running, pending)


@pytest.fixture
def s() -> Site:
    return site()


@pytest.fixture
def client(s: Site) -> Iterator[TestClient]:
    with TestClient(build_app(s.source)) as c:
        yield c


def test_pool_page_and_json_are_status_rows(s: Site, client: TestClient) -> None:
    doc = client.get("/api/pool").json()
    rows = {r["node"]: r for r in status_rows(s.source._daemon.observe(T0))}
    assert [r["node"] for r in doc["nodes"]] == list(NODES)
    for r in doc["nodes"]:
        assert (r["phase"], r["reason"], r["slurm_jobs"]) == (rows[r["node"]]["phase"], rows[r["node"]]["reason"],
                                                              rows[r["node"]]["slurm_jobs"])
    assert doc["nodes"][2]["phase"] == "lent" and doc["nodes"][2]["slurm_jobs"] == [s.running]
    page = client.get("/pool")
    assert page.status_code == 200
    assert 'data-node="gpu-node-03" data-phase="lent"' in page.text
    assert f'href="/job/{s.running}"' in page.text
    assert "forecast peak 0.4 replicas" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert client.get("/", follow_redirects=False).headers["location"] == "/pool"


def test_job_page_shows_state_nodes_checkpoint_and_recorded_preemptions(s: Site, client: TestClient) -> None:
    doc = client.get(f"/api/job/{s.running}").json()
    assert (doc["state"], doc["nodes"], doc["user"]) == ("running", ["gpu-node-03"], "alice")
    assert doc["last_checkpoint"] == "2027-01-15 07:55:00 UTC"
    # the same number the policy's victim choice uses: 4 GPUs x 300 s since the checkpoint
    assert doc["at_risk_gpu_hours"] == pytest.approx(4 * 300 / 3600, abs=1e-3)
    assert [(p["node"], p["grace_s"], p["lost_gpu_hours"]) for p in doc["preemptions"]] == [("gpu-node-02", 5.0, 0.2)]
    page = client.get(f"/job/{s.running}")
    assert page.status_code == 200 and "requeued" in page.text and "0.200 GPU-h" in page.text
    pending = client.get(f"/api/job/{s.pending}").json()
    assert pending["state"] == "pending" and pending["preemptions"] == []
    # no Prometheus: the page says there is no forecast rather than failing
    assert pending["forecast_free_from"] is None


def test_a_job_known_only_from_its_preemption_events_is_shown_as_ended(s: Site, client: TestClient) -> None:
    s.events.append(NodeEvent("gpu-node-01", EVENT_REASON, preemption_message(
        job_id="777", node="gpu-node-01", grace_s=5, lost_gpu_hours=1.5, checkpoint_time=None), T0 - 100))
    doc = client.get("/api/job/777").json()
    assert doc["state"] == "ended" and doc["lost_gpu_hours_total"] == 1.5


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/job/12abc", 400, "job id: expected digits such as 1234 (or 1234_5 for an array task), got '12abc'"),
        ("/job/99999", 404, "job 99999: not in squeue's preemptible partition and no preemption of it recorded"),
        ("/job?id=%3Cscript%3E", 400, "job id: expected digits"),
        ("/history?days=soon", 400, "days: expected a number of days such as 7 or 0.5, got 'soon'"),
        ("/history?days=-1", 400, "days: expected a number of days such as 7 or 0.5, got '-1'"),
        ("/history?days=1_0", 400, "days: expected a number of days such as 7 or 0.5, got '1_0'"),
        ("/history?days=nan", 400, "days: expected a number of days such as 7 or 0.5, got 'nan'"),
        ("/history?days=91", 400, "days: must be > 0 and <= 90, got '91'"),
        ("/history?days=0", 400, "days: must be > 0 and <= 90, got '0'"),
        ("/outlook?pool=nope", 404, "pool: no pool named 'nope' (pools: default)"),
        ("/no/such/page", 404, "no page at /no/such/page"),
        ("/history?days=7&days=8", 400, "days: given 2 times, expected once"),
        ("/outlook?pool=default&pool=default", 400, "pool: given 2 times, expected once"),
        ("/job?id=1&id=2", 400, "id: given 2 times, expected once"),
    ],
    ids=["malformed-job", "unknown-job", "malformed-form", "days-not-a-number", "days-negative", "days-underscore", "days-nan",
         "days-too-many", "days-zero", "unknown-pool", "no-route", "days-twice", "pool-twice", "id-twice"],
)
def test_bad_input_gets_a_clear_4xx_page_and_json(client: TestClient, path: str, status: int, says: str) -> None:
    page = client.get(path)
    assert page.status_code == status
    assert html.escape(says).replace("&#x27;", "&#39;") in page.text  # as Jinja2 escapes
    assert "<script" not in page.text.lower()
    if path.startswith(("/job/", "/history", "/outlook")):
        api = client.get("/api" + path)
        assert api.status_code == status and says in api.json()["error"]


def test_no_redirect_is_built_from_the_host_header(client: TestClient) -> None:
    """Starlette's slash redirect would send /pool/ to http://<Host header>/pool: a client picks the host."""
    for path in ("/pool/", "/api/pool/"):
        r = client.get(path, follow_redirects=False, headers={"Host": "evil.example"})
        assert r.status_code == 404 and "location" not in r.headers
        assert f"did you mean {path.rstrip('/')}?" in r.text
    assert client.get("/", follow_redirects=False, headers={"Host": "evil.example"}).headers["location"] == "/pool"


def test_job_form_redirects_to_the_job_page(s: Site, client: TestClient) -> None:
    r = client.get(f"/job?id={s.running}", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, f"/job/{s.running}")


def test_outlook_without_prometheus_is_a_503_that_says_so(client: TestClient) -> None:
    r = client.get("/outlook")
    assert r.status_code == 503 and "cannot read prometheus now" in r.text


def test_history_page_from_the_daemon_metrics(client: TestClient) -> None:
    doc = client.get("/api/history?days=1").json()
    assert doc["pool"] == "default" and doc["days"] == 1
    assert doc["lends_total"] == doc["reclaims_total"] > 0
    assert doc["slo_spent_now"] == 0.25
    page = client.get("/history?days=1")
    assert page.status_code == 200 and 'role="img"' in page.text and "<desc" in page.text
    for raw, days in (("0.5", 0.5), (".25", 0.25), ("90", 90)):
        assert client.get(f"/api/history?days={raw}").json()["days"] == days


def test_user_header_filters_jobs_and_refuses_requests_without_it() -> None:
    s = site({"user_header": "X-Forwarded-User"})
    with TestClient(build_app(s.source)) as c:
        r = c.get("/pool")
        assert r.status_code == 401 and "no X-Forwarded-User header" in r.text
        bob = {"X-Forwarded-User": "bob"}
        pool = c.get("/api/pool", headers=bob).json()
        lent = next(n for n in pool["nodes"] if n["node"] == "gpu-node-03")
        assert lent["slurm_jobs"] == [] and lent["other_jobs"] == 1  # alice's job counted, not named
        assert c.get(f"/api/job/{s.running}", headers=bob).status_code == 404  # not bob's: as if unknown
        assert c.get(f"/api/job/{s.pending}", headers=bob).json()["user"] == "bob"
        assert [j["job_id"] for j in c.get("/api/jobs", headers=bob).json()["jobs"]] == [s.pending]
        assert c.get("/api/pool", headers={"X-Forwarded-User": "bob; rm -rf"}).status_code == 400


def test_with_a_user_header_a_node_reason_names_only_the_users_own_jobs() -> None:
    """A node's reason names the jobs on it ("Slurm jobs 12, 13 run on it"): with a user filter
    the others' ids are not shown, in the page nor in its JSON, the user's own are."""
    s, plain = site({"user_header": "X-Forwarded-User"}), site()
    written = f"adopted by gpu-bridge as lent: Slurm jobs {s.pending}, {s.running} run on it"
    for each in (s, plain):
        each.kube.set_phase("gpu-node-03", Phase.LENT, written, T0 - 600)
    with TestClient(build_app(s.source)) as c:
        for user, foreign in (("alice", s.pending), ("bob", s.running)):
            lent = next(n for n in c.get("/api/pool", headers={"X-Forwarded-User": user}).json()["nodes"]
                        if n["node"] == "gpu-node-03")
            shown = f"(another user's), {s.running}" if user == "alice" else f"{s.pending}, (another user's)"
            assert lent["reason"] == f"adopted by gpu-bridge as lent: Slurm jobs {shown} run on it", user
            page = html.unescape(c.get("/pool", headers={"X-Forwarded-User": user}).text)
            assert f"Slurm jobs {shown} run on it" in page and f"{foreign}," not in page and f", {foreign}" not in page, user
    with TestClient(build_app(plain.source)) as c:  # no user filter: the reason as written
        assert c.get("/api/pool").json()["nodes"][2]["reason"] == written


def test_a_user_header_given_twice_is_refused() -> None:
    """A proxy that appends its header (instead of replacing the client's) passes the client's
    first: the first one was trusted, so anyone could read the view as another user."""
    s = site({"user_header": "X-Forwarded-User"})
    with TestClient(build_app(s.source)) as c:
        twice = [("X-Forwarded-User", "alice"), ("X-Forwarded-User", "bob")]
        for path in ("/api/jobs", f"/api/job/{s.running}", "/api/pool", "/api/history"):
            r = c.get(path, headers=twice)
            assert r.status_code == 400, path
            assert r.json()["error"] == "X-Forwarded-User: given 2 times, expected once"
        assert c.get("/jobs", headers=twice).status_code == 400


def test_the_web_source_never_writes(s: Site, client: TestClient) -> None:
    def state() -> object:
        return (s.kube.nodes(), s.kube.pods("default"), s.kube.deployment("default"), s.slurm.snapshot(),
                s.slurm.nodes())

    before = state()
    for path in ("/pool", "/jobs", f"/job/{s.running}", f"/job/{s.pending}", "/history", "/outlook"):
        client.get(path)
    assert state() == before
    assert s.kube.events == []  # not even an Event


def test_preemption_message_round_trips() -> None:
    text = preemption_message(job_id="12_3", node="gpu-node-07", grace_s=120, lost_gpu_hours=0.0314, checkpoint_time=1_800_000_000)
    p = parse_preemption(text, 5.0)
    assert p is not None
    assert (p.job_id, p.node, p.grace_s, p.lost_gpu_hours, p.checkpoint_time, p.t) == ("12_3", "gpu-node-07", 120.0, 0.031, 1_800_000_000, 5.0)
    assert parse_preemption(preemption_message(job_id="5", node="n", grace_s=0.5, lost_gpu_hours=2, checkpoint_time=None), 1.0) is not None
    assert parse_preemption("job 5 preempted somewhere", 1.0) is None


def test_parse_daemon_history_puts_samples_on_the_grid() -> None:
    result = [{"metric": {"bridge_q": "lent"}, "values": [[100, "2"], [160, "3"]]},
              {"metric": {"bridge_q": "lends"}, "values": [[160, "1"]]},
              {"metric": {"bridge_q": "other"}, "values": [[100, "9"]]}]
    h = parse_daemon_history(result, start=100, end=220, step_s=60)
    assert h.series["lent"][:2] == (2.0, 3.0) and math.isnan(h.series["lent"][2])
    assert math.isnan(h.series["lends"][0]) and h.series["lends"][1] == 1.0
    assert h.t(2) == 220


def test_charts_carry_a_text_alternative() -> None:
    chart = svg.outlook_chart(["Mon 10:00", "Mon 11:00"], [2, None], [1.5, None], nodes=4)
    assert 'role="img"' in chart and "Mon 10:00 2" in chart and "<title" in chart


def test_the_outlook_says_when_the_slo_budget_holds_lending(s: Site, client: TestClient) -> None:
    """Hours the governor holds say 0 lendable and why, on the page and in its JSON, so a
    researcher is not promised nodes the daemon will not lend."""
    from bridge.cli.forecast import PoolOutlook
    from bridge.policy.outlook import HourOutlook

    held = "SLO budget spent: lending held until 2027-01-15 12:46 UTC"
    hours = (HourOutlook(T0, 1.0, 1, 0, "now", 1.5, held), HourOutlook(T0 + 3600, 1.0, 1, 2, "1d", 1.5))
    s.source.outlook = lambda pool: PoolOutlook(  # type: ignore[method-assign]
        pool=pool, now=T0, nodes=3, nodes_source="test", history_since=T0 - 86400, read_from=T0 - 86400, step_s=60.0,
        margin_note="calibrated margin x1.50", calibrating=False, hours=hours)
    page = client.get("/outlook")
    assert page.status_code == 200 and f"now; {held}</td>" in page.text
    doc = client.get("/api/outlook").json()
    assert [h["held"] for h in doc["hours"]] == [held, None] and [h["lendable_nodes"] for h in doc["hours"]] == [0, 2]


HOSTILE = '<script>alert(1)</script>"\'><img src=x onerror=alert(1)>'


def test_hostile_names_from_slurm_and_kubernetes_are_escaped_everywhere(s: Site) -> None:
    """Job names, users, comments and the node's reason arrive from Slurm and Kubernetes as anyone
    typed them: every page shows them as text, never as markup; the JSON is JSON."""
    s.kube.set_phase("gpu-node-03", Phase.LENT, "reason " + HOSTILE, T0 - 600)
    job = s.slurm.add_job("gpu-node-03", name="job" + HOSTILE, user="u" + HOSTILE, comment="gpu-bridge:checkpoint=" + HOSTILE)
    with TestClient(build_app(s.source)) as c:
        for path in ("/pool", "/jobs", f"/job/{job}"):
            page = c.get(path)
            assert page.status_code == 200
            assert "<script" not in page.text and "<img" not in page.text
        assert "&lt;script&gt;" in c.get("/jobs").text and "&lt;script&gt;" in c.get("/pool").text
        api = c.get(f"/api/job/{job}")
        assert api.headers["content-type"] == "application/json" and api.json()["name"] == "job" + HOSTILE


def test_every_answer_carries_the_security_headers_even_an_internal_error(s: Site) -> None:
    """An exception the view did not expect: a 500 without its details, JSON under /api/, and the
    same CSP / nosniff / framing headers (Starlette's own 500 had none: text/plain, no CSP)."""
    def broken() -> object:
        raise KeyError("secret-internal-detail")

    s.source.jobs = broken  # type: ignore[method-assign]
    with TestClient(build_app(s.source), raise_server_exceptions=False) as c:
        for path in ("/pool", "/jobs", "/api/jobs", "/nope", "/static/style.css"):
            r = c.get(path)
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["x-frame-options"] == "SAMEORIGIN", path
            assert "frame-ancestors 'self'" in r.headers["content-security-policy"], path
            assert "base-uri 'none'" in r.headers["content-security-policy"], path
            assert "script-src" not in r.headers["content-security-policy"]  # default-src 'none': no script at all
        page, api = c.get("/jobs"), c.get("/api/jobs")
        assert page.status_code == api.status_code == 500
        assert "secret-internal-detail" not in page.text + api.text and "Traceback" not in page.text + api.text
        assert api.headers["content-type"] == "application/json" and api.json()["status"] == 500
        assert "internal error" in page.text and page.headers["content-type"].startswith("text/html")


def test_other_methods_get_a_405_with_allow(client: TestClient) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"):
        for path in ("/pool", "/api/pool", "/job/1", "/job", "/"):
            r = client.request(method, path)
            assert r.status_code == 405, (method, path)
            assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}, (method, path)
    assert client.head("/pool").status_code == 200 and client.head("/pool").text == ""


def test_control_characters_of_an_unknown_path_are_shown_escaped(client: TestClient) -> None:
    """/pool%00 put a raw NUL (any control character, an escape sequence too) into the 404 page."""
    for raw, shown in (("/pool%00", "/pool\\x00"), ("/a%1b%5b2Jb", "/a\\x1b[2Jb"), ("/x%7fy", "/x\\x7fy")):
        page, api = client.get(raw), client.get("/api" + raw)
        assert page.status_code == api.status_code == 404
        assert f"no page at {shown}" in page.text and not any(ord(c) < 32 and c not in "\n" for c in page.text), raw
        assert api.json()["error"] == f"no page at /api{shown}"


def test_under_a_root_path_the_api_answers_json_and_every_page_links_below_it(s: Site) -> None:
    """uvicorn puts ``web.root_path`` in front of the path: /gb/api/nope was an HTML 404 (as
    /api/ is looked for first), and the error pages of the /static mount linked /gb/static/pool."""
    def broken() -> object:
        raise KeyError("boom")

    s.source.jobs = broken  # type: ignore[method-assign]
    with TestClient(build_app(s.source), root_path="/gb", raise_server_exceptions=False) as c:
        assert c.get("/gb/api/pool").status_code == 200
        for method, path, status in (("GET", "/gb/api/nope", 404), ("POST", "/gb/api/pool", 405), ("GET", "/gb/api/jobs", 500)):
            r = c.request(method, path)
            assert (r.status_code, r.headers["content-type"]) == (status, "application/json"), path
            assert r.json()["status"] == status
        for method, path in (("GET", "/gb/static/nope.css"), ("POST", "/gb/static/style.css"), ("GET", "/gb/nope")):
            page = c.request(method, path)
            assert page.status_code in (404, 405) and page.headers["content-type"].startswith("text/html"), path
            assert 'href="/gb/static/style.css"' in page.text and 'href="/gb/pool"' in page.text, path
            assert "/static/pool" not in page.text and "/static/static/" not in page.text, path


def test_static_files_only_from_the_static_directory(client: TestClient) -> None:
    assert client.get("/static/style.css").status_code == 200
    for path in ("/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py", "/static/%2e%2e%2f%2e%2e%2fconfig.py",
                 "/static//etc/passwd", "/static/%00", "/static/"):
        r = client.get(path)
        assert r.status_code == 404 and "import" not in r.text, path


def test_an_unreachable_system_is_named_but_not_its_address(client: TestClient) -> None:
    """The 503 says which system cannot be read; the adapter's text (its URL, host and port, the
    client's exception) stays in the log, not in a page researchers see."""
    for path in ("/outlook", "/api/outlook"):
        r = client.get(path)
        assert r.status_code == 503 and "cannot read prometheus now" in r.text
        assert "127.0.0.1" not in r.text and "Connection" not in r.text


def test_history_windows_cached_are_bounded(s: Site, client: TestClient) -> None:
    """Each ?days= value is its own cached reading: distinct values no longer pile up forever."""
    from bridge.web.source import HISTORY_CACHED

    for i in range(1, 200):
        assert client.get(f"/api/history?days=0.{i:03d}").status_code == 200
    assert sum(k.startswith("history:") for k in s.source._cache) == HISTORY_CACHED
    assert sum(k.startswith("history:") for k in s.source._reading) == HISTORY_CACHED  # one lock per reading kept


def test_failed_readings_keep_no_lock(s: Site, client: TestClient) -> None:
    from bridge.errors import AdapterError

    def down(*_args: object, **_kwargs: object) -> DaemonHistory:
        raise AdapterError("prometheus", "down")

    s.source.adapters.prom.daemon_history = down  # type: ignore[method-assign]
    for i in range(1, 50):
        assert client.get(f"/api/history?days=0.{i:03d}").status_code == 503
    assert not any(k.startswith("history:") for k in s.source._reading)


def test_a_slow_reading_holds_up_only_the_pages_that_need_it(s: Site, client: TestClient) -> None:
    """One lock was held over every reading: a history query that took Prometheus its timeout
    (10 s by default) held up the job list, which reads only squeue, for as long."""
    started, release = threading.Event(), threading.Event()
    read = s.source.adapters.prom.daemon_history

    def slow(*args: object, **kwargs: object) -> DaemonHistory:
        started.set()
        release.wait(10)
        return read(*args, **kwargs)  # type: ignore[arg-type]

    s.source.adapters.prom.daemon_history = slow  # type: ignore[method-assign]
    history = threading.Thread(target=client.get, args=("/api/history",))
    history.start()
    try:
        assert started.wait(5)
        t0 = time.monotonic()
        assert client.get("/api/jobs").status_code == 200
        assert time.monotonic() - t0 < 2
    finally:
        release.set()
        history.join()


def test_times_no_date_can_show_are_left_out_not_a_500() -> None:
    """Slurm's numbers are finite but unbounded (a start time of 1e300): ``iso`` raised
    OverflowError / ValueError, a 500 for the job's page."""
    from bridge.web import pages

    assert [pages.iso(t) for t in (1e300, 1.8e15, -1.0, float("nan"))] == [None] * 4
    assert pages.iso(T0) == "2027-01-15 08:00:00 UTC"


def test_daemon_history_values_that_are_not_counts_are_unknown_steps() -> None:
    """+Inf, -5, NaN or text from Prometheus: an unknown step (None on the page), not a number
    the page cannot draw (``ceil(inf)``) or JSON cannot hold; a sample time of NaN or Infinity is
    a malformed answer: AdapterError, not an OverflowError out of the adapter."""
    from bridge.adapters.prom.signals import PromAdapter
    from bridge.errors import AdapterError
    from tests.unit.test_bad_input_metrics import FakeClient

    result = [{"metric": {"bridge_q": "lent"}, "values": [[100, "+Inf"], [160, "-5"], [220, "NaN"], [280, "two"], [340, "3"]]}]
    h = parse_daemon_history(result, start=100, end=340, step_s=60)
    assert [None if math.isnan(v) else v for v in h.series["lent"]] == [None, None, None, None, 3.0]
    doc = history_doc_of(h)
    assert doc["steps"][0]["lent"] is None and doc["steps"][4]["lent"] == 3.0
    for bad_t in ("NaN", "+Inf"):
        client = FakeClient([], range_result=[{"metric": {"bridge_q": "lent"}, "values": [[bad_t, "1"]]}])
        adapter = PromAdapter("http://unused", client=client)  # type: ignore[arg-type]
        with pytest.raises(AdapterError, match="unexpected query_range result"):
            adapter.daemon_history(PromPool("default", "m"), start=100, end=340, step_s=60)


def history_doc_of(h: DaemonHistory) -> dict[str, object]:
    import json

    from bridge.web import pages

    doc = pages.history_doc("default", h, days=1, now=T0)
    json.dumps(doc, allow_nan=False)  # what JSONResponse does: no inf, no nan
    svg.history_chart([r["t"] for r in doc["steps"]], [r["lent"] for r in doc["steps"]], [r["lends"] for r in doc["steps"]],
                      [r["reclaims"] for r in doc["steps"]], nodes=3)
    return doc
