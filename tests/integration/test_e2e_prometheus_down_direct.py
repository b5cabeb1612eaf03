"""Prometheus down, the pool read directly, live: test_e2e_warm's sandbox (real Slurm, a real
kube-apiserver with kwok's pods, Prometheus, the vLLM simulator with each pod's own address)
and the daemon with ``prometheus.direct_fallback`` on.

Research jobs run on two lent nodes; then Prometheus is stopped. The pool is set to reclaim
every node once blind (``blind_serving: null``, ``blind_after_s`` 10 s), so a daemon that went
blind would take the nodes back within seconds. It does not: it reads the Ready pods' own
``/metrics`` and keeps lending on what they say. Load then rises with Prometheus still down:
the daemon sees it through the same reads and reclaims both nodes (the jobs requeued, never
lost). Prometheus is started again at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sandbox_fixtures import assert_requeued, daemon_run
from test_e2e_warm import MIN_SERVING, NODES, _pods, lent_warm, warm_config, warm_watcher, warm_world

from bridge import wellknown as wk
from gpu_bridge_lab.sandbox.daemon_config import write_config
from gpu_bridge_lab.sandbox.e2e import World, event_time, put_load, read_events, submit_backlog, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(480)]

BLIND_AFTER_S = 10.0
DOWN_S = 40.0  # Prometheus down this long before the load rises: four times the blind timer
POD_START_S = 3.0  # no cold start is timed here: the pods start sooner than test_e2e_warm's


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, World, Path, int]]:
    """test_e2e_warm's sandbox, its pods starting in POD_START_S."""
    yield from warm_world("gb-e2e-promdown-", pod_start_delay_s=POD_START_S)


def test_with_prometheus_down_the_daemon_reads_the_pods_keeps_lending_and_still_reclaims_on_load(
    world: tuple[Any, World, Path, int],
) -> None:
    sb, w, d, port = world
    out = d / "jobs"
    out.mkdir()
    out.chmod(0o777)
    job_ids = submit_backlog(sb, NODES, wk.SLURM_PREEMPT_PARTITION, NODES - MIN_SERVING, out, "train")
    put_load(sb.vllm_url, {"rate": 2.0, "cv": 1.0})
    cfg = warm_config(sb, d, port, blind_serving=None)
    doc = yaml.safe_load(cfg.read_text())
    doc["prometheus"]["direct_fallback"] = True
    doc["policy"]["blind_after_s"] = BLIND_AFTER_S
    write_config(cfg, doc)
    log_path = d / "daemon.log"
    watcher = warm_watcher(sb, w)
    prom = next(c for c in sb.components if c.name == "prometheus")
    restarted = False
    try:
        with daemon_run(cfg, log_path, sb.env, watcher=watcher):
            lent = lent_warm(w, watcher, len(job_ids))
            assert len(lent) == NODES - MIN_SERVING, lent

            down_at = time.time()
            sb.stop_process("prometheus")
            time.sleep(DOWN_S)
            phases = w.phases()
            assert all(phases[n] == "lent" for n in lent), phases  # not blind: no node taken back
            assert sorted(w.research_running_by_node()) == lent

            spike_at = time.time()
            put_load(sb.vllm_url, {"rate": 75.0, "cv": 1.0})
            wait_until(lambda: all(w.phases().get(n) == "serving" and _pods(w).get(n, ("", "", "", False))[3] for n in lent),
                       120, "both lent nodes reclaimed on the load read from the pods, Prometheus still down")
            prom.start(sb)
            prom.wait_ready(sb, 30)
            restarted = True
            assert_requeued(w, job_ids)
    finally:  # after the daemon's stop: Prometheus back whatever happened
        if not restarted:
            prom.start(sb)
            prom.wait_ready(sb, 30)

    ts = event_time
    unavailable = [e for e in read_events(log_path, "prometheus_unavailable") if ts(e) >= down_at]
    direct = [e for e in read_events(log_path, "direct_read") if ts(e) >= down_at]
    assert unavailable and len(direct) >= DOWN_S / 4, (len(unavailable), len(direct))  # every tick (2 s) read the pods
    assert all(e["reporting"] >= MIN_SERVING for e in direct), direct[:3]
    blind = [e for e in read_events(log_path, "pool_decision") if ts(e) >= down_at and e.get("reason") == "signals_lost"]
    assert blind == [], blind[:3]
    reclaims = [e for e in read_events(log_path, "decision") if e.get("action") == "reclaim" and ts(e) >= down_at]
    assert reclaims and all(ts(e) >= spike_at for e in reclaims), reclaims[:3]  # only once the load rose
    assert not read_events(log_path, "direct_read_failed")
    print(f"\nPrometheus down {DOWN_S:g} s with {len(lent)} nodes lent: {len(direct)} direct reads, no blind reclaim; "
          f"reclaimed on the load {min(ts(e) for e in reclaims) - spike_at:.1f} s after it rose")
