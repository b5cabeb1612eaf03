"""The free-GPU check before a warm wake, live: test_e2e_warm's sandbox and daemon (real Slurm,
a real kube-apiserver with kwok's pods, Prometheus, the vLLM simulator in sleep mode), with the
lab's fake dcgm-exporter scraped too and the pool's ``wake_gpu_free_mib: auto`` (the need read from
the engine's ``vllm:cache_config_info`` and the GPUs' memory); the pods start in
3 s, not 25 s (no cold start is timed here, only told apart from a wake by the pod's identity).

Two nodes are lent warm. Before the reclaim both get GPU memory held (the fake's knob, as a
research job stuck in ``Kill task failed`` would): both return and wait, asleep, not woken. The
first is freed during the wait: woken, the same pod, a warm reclaim. The second stays held past
``wake_gpu_wait_s``: given up (``warm_fallback``, reason ``gpu_memory_held``), its pod replaced
by a cold start, a cold reclaim. No research job is lost on the way."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_api_client import PrometheusConnect
from sandbox_fixtures import QUIET_START_RPS, assert_requeued, daemon_run
from test_e2e_warm import (
    GRACE_S, MIN_SERVING, NODES, WARM_SLURM_CONF, _free_port, _pods, lent_warm, warm_config, warm_watcher,
)

from bridge import wellknown as wk
from bridge.adapters.prom.gpu import FB_FREE
from gpu_bridge_lab.sandbox.cluster.slurm import node_names
from gpu_bridge_lab.sandbox.dcgm import FB_BASE_USED_MIB, FB_TOTAL_MIB, FakeDcgm
from gpu_bridge_lab.sandbox.e2e import World, event_time, put_load, read_events, replica_sleeping, submit_backlog, wait_until
from gpu_bridge_lab.sandbox.serving import serving_sandbox
from gpu_bridge_lab.sandbox.vllm.sleep import SleepParams

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(480)]

HELD_MIB = 70_000  # held per GPU: the fake shows ~81,000 MiB free at rest, ~11,000 with this held
# auto's need: the simulator's gpu_memory_utilization (0.9) x the GPU's memory (free + used)
NEED_MIB = SleepParams().gpu_memory_utilization * FB_TOTAL_MIB
WAIT_S = 45.0  # pools[].wake_gpu_wait_s
POD_START_S = 3.0  # the pods' cold start: none is timed here, so sooner than test_e2e_warm's


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, World, Path, int, FakeDcgm]]:
    d = Path(tempfile.mkdtemp(prefix="gb-e2e-gpufree-", dir="/tmp"))
    port = _free_port()
    dcgm = FakeDcgm(node_names(NODES)).start()
    sb = serving_sandbox(d, nodes=NODES, grace_s=GRACE_S, pod_start_delay_s=POD_START_S, pod_grace_s=3,
                         shutdown_timeout_s=2, vllm_extra=("--max-cv", "1.5"), warm_port=port, timeout_s=90.0,
                         extra_slurm_conf=WARM_SLURM_CONF, dcgm=dcgm, peak_rps=QUIET_START_RPS)
    sb.up()
    w = World(sb)
    try:
        yield sb, w, d, port, dcgm
    finally:
        w.close()
        sb.down()
        dcgm.stop()


def _least_free_mib(sb: Any, nodes: list[str]) -> dict[str, float]:
    """node -> its GPUs' least free memory (MiB), as Prometheus has the fake's series now."""
    pc = PrometheusConnect(url=sb.prometheus_url, disable_ssl=True)
    got = pc.custom_query(f"min by (Hostname) ({FB_FREE})")
    return {r["metric"]["Hostname"]: float(r["value"][1]) for r in got if r["metric"].get("Hostname") in nodes}


def test_a_wake_waits_for_held_gpus_then_wakes_or_gives_up_cold(world: tuple[Any, World, Path, int, FakeDcgm]) -> None:
    sb, w, d, port, dcgm = world
    out = d / "jobs"
    out.mkdir()
    out.chmod(0o777)
    job_ids = submit_backlog(sb, NODES, wk.SLURM_PREEMPT_PARTITION, NODES - MIN_SERVING, out, "train")
    before = _pods(w)
    put_load(sb.vllm_url, {"rate": 2.0, "cv": 1.0})
    cfg = warm_config(sb, d, port, wake_gpu_free_mib="auto", wake_gpu_wait_s=WAIT_S)
    log_path = d / "daemon.log"
    watcher = warm_watcher(sb, w)
    with daemon_run(cfg, log_path, sb.env, watcher=watcher):
        lent = lent_warm(w, watcher, len(job_ids))
        assert len(lent) == 2, lent
        freed, held = lent
        dcgm.hold({n: HELD_MIB for n in lent})  # a job stuck in "Kill task failed" on each
        at_rest = FB_TOTAL_MIB - FB_BASE_USED_MIB
        assert at_rest - HELD_MIB < NEED_MIB <= at_rest  # held: short of auto's need; at rest: not

        def held_scraped() -> bool:
            free = _least_free_mib(sb, lent)
            return sorted(free) == lent and all(v < NEED_MIB for v in free.values())

        wait_until(held_scraped, 30, "Prometheus to scrape the held GPU memory of both nodes")

        spike_at = time.time()
        put_load(sb.vllm_url, {"rate": 75.0, "cv": 1.0})
        wait_until(lambda: all(w.phases().get(n) == "returning" for n in lent), 60, "both lent nodes returning")
        returning_at = time.time()
        time.sleep(8)  # waiting: drained, asleep, not woken
        pods = _pods(w)
        for node in lent:
            assert w.phases()[node] == "returning" and not pods[node][3], (node, w.phases()[node], pods[node])
            assert replica_sleeping(sb.vllm_url, pods[node][0]) is True
        assert not [e for e in read_events(log_path, "node_step") if e.get("step") == "wake_replica" and event_time(e) >= spike_at]
        dcgm.hold({held: HELD_MIB})  # the first node's memory is released
        wait_until(lambda: w.phases().get(freed) == "serving" and _pods(w).get(freed, ("", "", "", False))[3], 40,
                   f"{freed} woken and serving")
        assert time.time() - returning_at < WAIT_S  # woken within the wait, not given up
        assert _pods(w)[freed][:2] == before[freed][:2]  # the same pod: woken, not cold-started
        wait_until(lambda: w.phases().get(held) == "serving" and _pods(w).get(held, ("", "", "", False))[3],
                   WAIT_S + POD_START_S + 60, f"{held} given up, cold-started and serving")
        assert _pods(w)[held][:2] != before[held][:2]  # a new pod: the cold path
        dcgm.hold({})
        assert_requeued(w, job_ids)

    ts = event_time
    fallbacks = read_events(log_path, "warm_fallback")
    assert [(e["node"], e["step"], e["reason"].split(":")[0]) for e in fallbacks] == [(held, "gpu_held", "gpu_memory_held")], fallbacks
    marked = max(ts(e) for e in read_events(log_path, "node_step") if e.get("step") == "mark_returning" and e["node"] == held)
    assert ts(fallbacks[0]) - marked >= WAIT_S - 1  # given up only after the wait (its phase's time on the node)
    checks = [e for e in read_events(log_path, "wake_gpu_check") if e["node"] in lent]
    assert any(e["margin_mib"] is not None and e["margin_mib"] < 0 for e in checks), checks[:3]  # read, short
    assert all(e["need_mib"] == "auto" for e in checks), checks[:3]
    reclaimed = {e["node"]: e for e in read_events(log_path, "node_reclaimed") if ts(e) >= spike_at}
    assert reclaimed[freed].get("mode") == "warm" and reclaimed[held].get("mode") == "cold", reclaimed
    print(f"\nheld then freed: {freed} {reclaimed[freed].get('kubernetes_ready_s', -1):.1f} s from release to serving "
          f"(warm); held past {WAIT_S:g} s: {held} {reclaimed[held].get('kubernetes_ready_s', -1):.1f} s (cold)")
