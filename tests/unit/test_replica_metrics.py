"""Prometheus down, the pool's replicas read directly (``prometheus.direct_fallback``,
``bridge.adapters.replicas``): the same signals from each Ready pod's own ``/metrics``, failing
closed the way the Prometheus reading does, and what an outage then costs the SLO budget.

The pods' servers are the lab's vLLM simulator at each pod's own (loopback) address, as in the
sandbox; the reader is the daemon's own."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from bridge.adapters.kube.objects import PodInfo
from bridge.adapters.prom.types import SignalsReading
from bridge.adapters.replicas import BODY_CAP, RETRY_S, ReplicaMetrics, parse_metrics, replica_reader
from bridge.config import Config, parse_config
from bridge.errors import AdapterError
from bridge.model import LoadSignals
from bridge.observer import Observer
from bridge.simulate.baselines import BridgeController
from bridge.simulate.engine import Setup, simulate
from gpu_bridge_lab.sandbox.vllm.follow_kube import PodView
from gpu_bridge_lab.sandbox.vllm.pod_ports import PodPorts, pod_metrics
from gpu_bridge_lab.sandbox.vllm.server import SimServer
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from tests.unit.test_gap_recount import POOL, T0, cluster
from tests.unit.test_vllm_adapter import IDLE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def _config(port: int, *, direct: bool = True) -> Config:
    return parse_config({
        "pools": [{"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m", "vllm_port": port,
                   "target": {"concurrency_per_replica": 60}}],
        "prometheus": {"direct_fallback": direct, "timeout_s": 2},
    })


def _pod(name: str, ip: str | None, *, ready: bool = True, terminating: bool = False) -> PodInfo:
    return PodInfo(name, "serving", f"uid-{name}", "1", "default", node=f"node-{name}", phase="Running", ready=ready, ip=ip,
                   deletion_timestamp="2026-12-07T00:00:00Z" if terminating else None)


Pods = tuple[Simulation, PodPorts, int]


@pytest.fixture
def pods() -> Iterator[Pods]:
    """Two replicas of model ``m`` with requests in flight, each at its pod's own address."""
    sim = Simulation(IDLE, ["m"], seed=1)
    for name in ("vllm-a", "vllm-b"):
        sim.add_replica(name, "m")
    server = SimServer(sim, "127.0.0.1", 0, tick_s=0.02).start()
    port = _free_port()
    ports = PodPorts(server, port)
    ports.sync({"vllm-a": PodView("vllm-a", "n1", "m", True, ip="127.1.9.1"),
                "vllm-b": PodView("vllm-b", "n2", "m", True, ip="127.1.9.2")})
    try:
        yield sim, ports, port
    finally:
        ports.stop()
        server.stop()


def test_each_pods_metrics_are_its_replicas_alone_as_its_own_vllm_server_would_label_them(pods: Pods) -> None:
    sim, ports, port = pods
    text = requests.get(f"http://127.1.9.1:{port}/metrics", timeout=5).text
    assert "vllm:num_requests_running{" in text and "vllm_sim_" not in text
    assert 'pod="' not in text and 'node="' not in text  # Prometheus adds those; a vLLM server does not know them
    got = parse_metrics(text, pod="vllm-a", model="m")
    assert {dict(k)["pod"] for series in got.values() for k in series} == {"vllm-a"}
    assert set(got) >= {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                        "vllm:prompt_tokens_total", "vllm:generation_tokens_total"}
    assert parse_metrics(text, pod="vllm-a", model="another") == {}  # another model's series count for nothing


def test_the_reader_sums_the_ready_pods_and_rates_the_token_counters_from_its_previous_read(pods: Pods) -> None:
    sim, ports, port = pods
    reader = ReplicaMetrics(_config(port))
    both = [_pod("vllm-a", "127.1.9.1"), _pod("vllm-b", "127.1.9.2"),
            _pod("pending", None, ready=False), _pod("leaving", "127.1.9.3", terminating=True)]
    first = reader.read("default", both, T0)
    s = first.signals
    assert s.replicas_reporting == 2 and s.running is not None and s.waiting is not None and s.kv_cache_usage_sum is not None
    assert s.tokens_per_s is None and "no token rate yet" in first.problems["tokens_per_s"]  # one read: no rate
    assert set(first.inflight_by_pod) == {"vllm-a", "vllm-b"}
    second = reader.read("default", both, T0 + 15)
    assert second.signals.tokens_per_s is not None and second.signals.tokens_per_s >= 0
    assert "tokens_per_s" not in second.problems


def test_a_ready_pod_that_does_not_answer_fails_the_whole_reading_never_a_partial_sum(pods: Pods) -> None:
    sim, ports, port = pods
    reader = ReplicaMetrics(_config(port))
    with pytest.raises(AdapterError, match=r"1 of 3 Ready pods unread: vllm-c: GET http://127.1.9.9:\d+/metrics: ConnectionError"):
        reader.read("default", [_pod("vllm-a", "127.1.9.1"), _pod("vllm-b", "127.1.9.2"), _pod("vllm-c", "127.1.9.9")], T0)
    with pytest.raises(AdapterError, match="vllm-c: no IP"):
        reader.read("default", [_pod("vllm-a", "127.1.9.1"), _pod("vllm-c", None)], T0)
    with pytest.raises(AdapterError, match="no Ready pod"):
        reader.read("default", [_pod("vllm-c", "127.1.9.9", ready=False)], T0)
    # a pool it is not configured for
    with pytest.raises(AdapterError, match="pool other: not configured"):
        reader.read("other", [_pod("vllm-a", "127.1.9.1")], T0)


def test_when_no_pod_answers_the_next_read_waits_and_costs_no_connection() -> None:
    port = _free_port()  # nothing listens at any pod address
    reader = ReplicaMetrics(_config(port))
    lost = [_pod("vllm-a", "127.1.9.21"), _pod("vllm-b", "127.1.9.22")]
    with pytest.raises(AdapterError, match="2 of 2 Ready pods unread"):
        reader.read("default", lost, T0)
    calls: list[str] = []

    class Counting(requests.Session):
        def get(self, url: str | bytes, **kw: Any) -> requests.Response:  # type: ignore[override]
            calls.append(str(url))
            return super().get(url, **kw)

    reader._session = Counting()
    with pytest.raises(AdapterError, match="paused"):
        reader.read("default", lost, T0 + RETRY_S - 1)
    assert calls == []
    with pytest.raises(AdapterError, match="unread"):
        reader.read("default", lost, T0 + RETRY_S + 1)
    assert len(calls) == 2


class _Answers(BaseHTTPRequestHandler):
    """A pod answering what the test sets (``server.answer``: status, body)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        status, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "http://127.1.9.31:1/elsewhere")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def one_pod() -> Iterator[tuple[ThreadingHTTPServer, int]]:
    httpd = ThreadingHTTPServer(("127.1.9.30", 0), _Answers)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd, int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


GOOD = (b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m",engine="0"} 3\n'
        b'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m",engine="0"} %s\n'
        b'# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25\n'
        b'vllm:kv_cache_usage_perc{model_name="other",engine="0"} NaN\n')


@pytest.mark.parametrize(("status", "body", "why"), [
    (500, b"oops", "HTTP 500"),
    (302, b"", "HTTP 302"),  # a redirect is not followed: a pod cannot send the daemon elsewhere
    (200, b"vllm:num_requests_running{model_name= 3\n", "not the Prometheus text format"),
    (200, b"\xff\xfe" * 10, "not the Prometheus text format"),
    (200, b"#" * (BODY_CAP + 10), f"answer larger than {BODY_CAP} bytes"),
])
def test_a_pod_answering_garbage_fails_the_reading_naming_the_pod_and_the_problem(
    one_pod: tuple[ThreadingHTTPServer, int], status: int, body: bytes, why: str,
) -> None:
    httpd, port = one_pod
    httpd.answer = (status, body)  # type: ignore[attr-defined]
    with pytest.raises(AdapterError, match=f"vllm-x: GET http://127.1.9.30:{port}/metrics: {why}"):
        ReplicaMetrics(_config(port)).read("default", [_pod("vllm-x", "127.1.9.30")], T0)


def test_an_invalid_value_fails_its_signal_closed_and_another_models_series_count_for_nothing(
    one_pod: tuple[ThreadingHTTPServer, int],
) -> None:
    httpd, port = one_pod
    httpd.answer = (200, GOOD % b"-1")  # type: ignore[attr-defined]
    got = ReplicaMetrics(_config(port)).read("default", [_pod("vllm-x", "127.1.9.30")], T0)
    assert got.signals.waiting is None and "is negative" in got.problems["waiting"]
    assert got.signals.running == 3 and got.signals.kv_cache_usage_sum == 0.25  # the other model's NaN is not ours
    httpd.answer = (200, GOOD % b"2")  # type: ignore[attr-defined]
    ok = ReplicaMetrics(_config(port)).read("default", [_pod("vllm-x", "127.1.9.30")], T0)
    assert (ok.signals.running, ok.signals.waiting, ok.signals.replicas_reporting) == (3, 2, 1)


def test_the_fallback_is_off_by_default_and_built_only_when_asked() -> None:
    assert parse_config({"pools": [{"name": "p", "model_name": "m"}]}).prometheus.direct_fallback is False
    assert replica_reader(_config(8000, direct=False)) is None
    assert isinstance(replica_reader(_config(8000)), ReplicaMetrics)
    with pytest.raises(Exception, match="direct_fallback"):
        parse_config({"pools": [{"name": "p", "model_name": "m"}], "prometheus": {"direct_fallback": "sometimes"}})


class _Reader:
    def __init__(self, signals: LoadSignals | None) -> None:
        self.signals, self.calls = signals, 0

    def read(self, pool: str, pods: Sequence[PodInfo], now: float) -> SignalsReading:
        self.calls += 1
        if self.signals is None:
            raise AdapterError("vllm", f"pool {pool}: 1 of 2 Ready pods unread: injected")
        return SignalsReading(pool, self.signals)


def test_the_observer_reads_the_pods_only_when_prometheus_fails() -> None:
    cfg, kube, slurm, prom = cluster()
    direct = LoadSignals(T0 + 60, running=20.0, waiting=0.0, kv_cache_usage_sum=None, tokens_per_s=None, replicas_reporting=2)
    reader = _Reader(direct)
    obs = Observer(cfg, kube, slurm, prom, {"default": POOL}, reader)  # type: ignore[arg-type]
    prom.set("default", direct)
    assert obs.read(T0 + 60).readings["default"].current is not None and reader.calls == 0  # Prometheus answers
    prom.fail = True
    got = obs.read(T0 + 60)
    assert got.readings["default"].current == direct and reader.calls == 1
    assert got.errors == ("prometheus",)  # still counted: the alert on Prometheus fires
    reader.signals = None  # the pods fail too: blind, both named
    blind = obs.read(T0 + 90)
    assert blind.readings["default"].current is None and blind.errors == ("prometheus", "vllm")
    problem = blind.readings["default"].problem or ""
    assert "query failed: injected" in problem and "direct read: " in problem and "1 of 2 Ready pods unread" in problem
    off = Observer(cfg, kube, slurm, prom, {"default": POOL})  # type: ignore[arg-type]
    assert off.read(T0 + 90).readings["default"].current is None


def test_with_direct_reads_an_outage_prometheus_never_scraped_costs_no_budget() -> None:
    """The simulator's ``direct_reads``: the same outage (Prometheus down, nothing scraped)
    charged blind without them, and not at all with them."""
    import numpy as np

    from test_governor import NODES, config, workload

    load = np.concatenate([np.full(150, 0.6), np.full(180, 0.6), np.full(60, 0.6)])
    w = workload(load)
    gap = ((150 * 60.0, 330 * 60.0),)
    spent = {}
    for direct in (False, True):
        setup = Setup(config(0.08, w.duration_s), w, NODES, 4, seed=1, signal_gaps=gap, signal_gaps_recorded=False,
                      direct_reads=direct)
        ctl = BridgeController(setup)
        r = simulate(setup, ctl)
        assert r.metrics.lent_gpu_hours > 0
        spent[direct] = max(g.spent_min for g in ctl.governors)
    assert spent[False] >= 10 and spent[True] == 0, spent
