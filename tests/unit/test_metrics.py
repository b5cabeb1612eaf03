"""bridge.metrics: independent registries, what each record_* call exports, the HTTP endpoint
on a real port, and that docs/metrics.md, the alert rules and the dashboard name only metrics
that exist."""

from __future__ import annotations

import json
import math
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.metrics import BridgeMetrics, metric_names, serve
from bridge.model import (
    Action,
    ActionKind,
    ClusterView,
    LoadSignals,
    NodeState,
    Phase,
    Plan,
    PoolDecision,
    PoolState,
    SlurmJob,
)

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


def sample(m: BridgeMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def view(now: float, phases: dict[str, Phase]) -> ClusterView:
    nodes = tuple(NodeState(name=n, pool="llama", phase=p, phase_since=now - 60) for n, p in phases.items())
    signals = LoadSignals(t=now - 7, running=10, waiting=2, kv_cache_usage_sum=1.2, tokens_per_s=900, replicas_reporting=2)
    return ClusterView(now=now, nodes=nodes, pools={"llama": PoolState(name="llama", signals=signals, ready_replicas=2)})


def test_many_instances_do_not_collide() -> None:
    a, b = BridgeMetrics(), BridgeMetrics()
    a.record_lend("llama")
    assert sample(a, "gpu_bridge_lends_total", pool="llama") == 1
    assert sample(b, "gpu_bridge_lends_total", pool="llama") is None


def test_record_view_counts_phases_and_accrues_lent_gpu_hours() -> None:
    m = BridgeMetrics()
    phases = {"n1": Phase.SERVING, "n2": Phase.SERVING, "n3": Phase.LENT, "n4": Phase.RECLAIMING}
    m.record_view(view(NOW, phases))
    assert sample(m, "gpu_bridge_nodes", pool="llama", phase="serving") == 2
    assert sample(m, "gpu_bridge_nodes", pool="llama", phase="lent") == 1
    assert sample(m, "gpu_bridge_nodes", pool="llama", phase="lending") == 0
    assert sample(m, "gpu_bridge_pool_serving_ready_replicas", pool="llama") == 2
    assert sample(m, "gpu_bridge_pool_signal_staleness_seconds", pool="llama") == 7
    assert sample(m, "gpu_bridge_pool_reclaim_in_progress_seconds", pool="llama") == 60  # n4 reclaiming for 60 s
    assert sample(m, "gpu_bridge_lent_gpu_hours_total", pool="llama") is None  # first view: nothing accrued
    m.record_view(view(NOW + 1800, phases))  # half an hour later, one 4-GPU node lent
    assert sample(m, "gpu_bridge_lent_gpu_hours_total", pool="llama") == pytest.approx(2.0)


def test_missing_signals_are_infinitely_stale() -> None:
    m = BridgeMetrics()
    v = ClusterView(now=NOW, nodes=(), pools={"llama": PoolState(name="llama", signals=None)})
    m.record_view(v)
    assert sample(m, "gpu_bridge_pool_signal_staleness_seconds", pool="llama") == math.inf


def test_a_sample_with_no_usable_signal_is_infinitely_stale() -> None:
    """The Prometheus adapter stamps a sample with the query time even when every vLLM gauge
    was missing or stale (its scrape target down): that is no fresh load signal."""
    m = BridgeMetrics()
    empty = LoadSignals(t=NOW, running=None, waiting=None, kv_cache_usage_sum=None, tokens_per_s=None, replicas_reporting=0)
    m.record_view(ClusterView(now=NOW, nodes=(), pools={"llama": PoolState(name="llama", signals=empty)}))
    assert sample(m, "gpu_bridge_pool_signal_staleness_seconds", pool="llama") == math.inf


def test_record_plan_sets_gauges_and_counts_decisions() -> None:
    m = BridgeMetrics()
    plan = Plan(
        now=NOW,
        actions=(Action(kind=ActionKind.RECLAIM, node="n3", pool="llama", reason="spike", detail="..."),),
        pools=(PoolDecision(pool="llama", demand_now=None, forecast_peak=3.5, horizon_s=900, serving_now=2,
                            desired_serving=3, reason="spike", detail="..."),),
        held={"n4": "pinned: operator pin serving"},
    )
    m.record_plan(plan)
    assert math.isnan(sample(m, "gpu_bridge_pool_demand_replicas", pool="llama"))
    assert sample(m, "gpu_bridge_pool_forecast_peak_replicas", pool="llama") == 3.5
    assert sample(m, "gpu_bridge_pool_desired_serving_nodes", pool="llama") == 3
    assert sample(m, "gpu_bridge_decisions_total", action="reclaim", reason="spike") == 1
    assert sample(m, "gpu_bridge_decisions_total", action="hold", reason="pinned") == 1


def test_record_reclaim_observes_total_and_phases() -> None:
    m = BridgeMetrics()
    m.record_reclaim(pool="llama", reason="spike", detection_s=4, slurm_release_s=11, kubernetes_ready_s=30)
    assert sample(m, "gpu_bridge_reclaims_total", pool="llama", reason="spike") == 1
    assert sample(m, "gpu_bridge_reclaim_duration_seconds_sum", pool="llama", tier="normal", mode="cold") == 45
    assert sample(m, "gpu_bridge_reclaim_duration_seconds_bucket", pool="llama", tier="normal", mode="cold", le="45.0") == 1
    assert sample(m, "gpu_bridge_reclaim_duration_seconds_bucket", pool="llama", tier="normal", mode="cold", le="30.0") == 0
    assert sample(m, "gpu_bridge_reclaim_phase_duration_seconds_sum", pool="llama", phase="slurm_release", tier="normal", mode="cold") == 11
    m.record_reclaim(pool="llama", reason="spike", detection_s=4, slurm_release_s=3, kubernetes_ready_s=30, tier="fast", mode="cold")
    assert sample(m, "gpu_bridge_reclaim_phase_duration_seconds_sum", pool="llama", phase="slurm_release", tier="fast", mode="cold") == 3
    assert sample(m, "gpu_bridge_reclaim_duration_seconds_sum", pool="llama", tier="fast", mode="cold") == 37
    m.record_reclaim(pool="llama", reason="spike", detection_s=4, slurm_release_s=3, kubernetes_ready_s=6, tier="fast", mode="warm")
    assert sample(m, "gpu_bridge_reclaim_phase_duration_seconds_sum", pool="llama", phase="kubernetes_ready", tier="fast", mode="warm") == 6
    assert sample(m, "gpu_bridge_reclaim_duration_seconds_sum", pool="llama", tier="fast", mode="warm") == 13
    assert sample(m, "gpu_bridge_reclaim_duration_seconds_sum", pool="llama", tier="fast", mode="cold") == 37
    with pytest.raises(ValueError, match="record_reclaim: detection_s must be >= 0, got -1"):
        m.record_reclaim(pool="llama", reason="spike", detection_s=-1, slurm_release_s=0, kubernetes_ready_s=0)


def test_record_preemption_counts_lost_work_since_checkpoint() -> None:
    m = BridgeMetrics()
    job = SlurmJob(job_id="7", name="train", user="ana", partition="preempt", state="running", nodes=("n3",),
                   start_time=NOW - 7200, checkpoint_time=NOW - 900)
    assert m.record_preemption(pool="llama", job=job, now=NOW) == pytest.approx(1.0)  # 15 min x 4 GPUs
    no_ckpt = SlurmJob(job_id="8", name="t", user="ana", partition="preempt", state="running", nodes=("n3",),
                       start_time=NOW - 1800)
    assert m.record_preemption(pool="llama", job=no_ckpt, now=NOW) == pytest.approx(2.0)
    assert sample(m, "gpu_bridge_preempted_jobs_total", pool="llama") == 2
    assert sample(m, "gpu_bridge_lost_gpu_hours_total", pool="llama") == pytest.approx(3.0)
    # a job that checkpoints on the signal within the grace loses nothing; beyond it, as usual
    saver = SlurmJob(job_id="9", name="t", user="ana", partition="preempt", state="running", nodes=("n3",),
                     start_time=NOW - 1800, signal_save_s=60.0)
    assert m.record_preemption(pool="llama", job=saver, now=NOW, grace_s=120) == 0.0
    assert m.record_preemption(pool="llama", job=saver, now=NOW, grace_s=30) == pytest.approx(2.0)
    assert sample(m, "gpu_bridge_lost_gpu_hours_total", pool="llama") == pytest.approx(5.0)


def test_api_call_counts_errors_and_reraises() -> None:
    m = BridgeMetrics()
    with m.api_call("slurm", "squeue"):
        pass
    with pytest.raises(RuntimeError), m.api_call("slurm", "scontrol_update"):
        raise RuntimeError("boom")
    assert sample(m, "gpu_bridge_api_calls_total", system="slurm", verb="squeue") == 1
    assert sample(m, "gpu_bridge_adapter_errors_total", system="slurm") == 1
    assert sample(m, "gpu_bridge_adapter_errors_total", system="kubernetes") == 0
    assert sample(m, "gpu_bridge_api_call_duration_seconds_count", system="slurm") == 2


def test_tick_leader_settings() -> None:
    m = BridgeMetrics()
    assert sample(m, "gpu_bridge_leader") == 0
    m.set_leader(True)
    m.record_tick(duration_s=0.2, ok=True, now=NOW)
    m.record_tick(duration_s=3, ok=False, now=NOW + 10)
    m.record_settings(pool="llama", min_serving=2, reclaim_budget_s=120)
    assert sample(m, "gpu_bridge_leader") == 1
    assert sample(m, "gpu_bridge_last_successful_tick_timestamp_seconds") == NOW
    assert sample(m, "gpu_bridge_tick_duration_seconds_count") == 2
    assert sample(m, "gpu_bridge_pool_min_serving_nodes", pool="llama") == 2
    assert sample(m, "gpu_bridge_pool_reclaim_budget_seconds", pool="llama") == 120


def test_http_endpoint_on_free_port() -> None:
    m = BridgeMetrics()
    m.record_lend("llama")
    server = serve(m.registry, port=0)
    try:
        assert server.port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        server.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["gpu_bridge_lends"].samples[0].value == 1
    assert 'gpu_bridge_build_info{version="' in text


def test_http_endpoint_serves_only_metrics_and_names_no_version() -> None:
    """prometheus_client answered any path with the metrics (/foo, /../../etc/passwd), refused
    HEAD, and its ``Server`` header named the Python version."""
    import http.client

    server = serve(BridgeMetrics().registry, port=0)
    try:
        def ask(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            try:
                conn.request(method, path)
                r = conn.getresponse()
                return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
            finally:
                conn.close()

        status, headers, body = ask("GET", "/metrics?name[]=gpu_bridge_build_info")
        assert status == 200 and body.startswith(b"# HELP gpu_bridge_build_info")
        assert "python" not in headers["server"].lower() and headers["server"] == "gpu-bridge"
        for path in ("/", "/foo", "/metrics/", "/../../etc/passwd", "/favicon.ico"):
            status, headers, body = ask("GET", path)
            assert status == 404 and b"gpu_bridge" not in body, path
        status, headers, body = ask("HEAD", "/metrics")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 0
        assert ask("POST", "/metrics")[0] == 405
    finally:
        server.close()


def test_a_slow_client_neither_blocks_others_nor_holds_a_thread_for_ever() -> None:
    """Slowloris: a connection that never finishes its request kept a thread until the client
    left, and every new one started another (no bound: thousands of idle connections were
    thousands of the daemon's threads). Now each is dropped after ``timeout_s`` and at most
    ``max_clients`` are served at once; the others are closed at once."""
    server = serve(BridgeMetrics().registry, port=0, timeout_s=0.5, max_clients=4)
    slow: list[socket.socket] = []
    try:
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no end of headers
            slow.append(s)
        time.sleep(0.1)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        assert extra.recv(1) == b""  # over the bound: closed, no thread for it
        extra.close()
        t0 = time.monotonic()
        for s in slow:
            assert s.recv(65536) == b""  # dropped by the server, not by the client
        assert time.monotonic() - t0 < 3
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
            assert resp.status == 200
    finally:
        for s in slow:
            s.close()
        server.close()


def exposed_names() -> set[str]:
    """Every series name a scrape can show, including histogram suffixes."""
    names: set[str] = set()
    for name, kind in metric_names(BridgeMetrics().registry).items():
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def test_every_metric_is_documented() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(gpu_bridge_[a-z_]+)", doc))
    missing = set(metric_names(BridgeMetrics().registry)) - documented
    assert not missing, f"docs/metrics.md does not document {sorted(missing)}"
    unknown = documented - exposed_names()
    assert not unknown, f"docs/metrics.md documents metrics that do not exist: {sorted(unknown)}"


@pytest.mark.parametrize(
    "path", ["deploy/prometheus/gpu-bridge-rules.yml", "deploy/grafana/gpu-bridge-dashboard.json"], ids=["rules", "dashboard"]
)
def test_rules_and_dashboard_use_existing_metrics(path: str) -> None:
    text = (ROOT / path).read_text()
    if path.endswith(".json"):
        json.loads(text)
    used = set(re.findall(r"\b(gpu_bridge_[a-z_]+)", text))
    # recording rules defined in the rules file are names too
    used -= set(re.findall(r"record:\s*(gpu_bridge_[a-z_:]+)", text))
    used = {u for u in used if not u.startswith("gpu_bridge_rules")}
    unknown = used - exposed_names()
    assert not unknown, f"{path} uses metrics the daemon does not export: {sorted(unknown)}"
