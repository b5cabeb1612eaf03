"""Jobs preempted within minutes of (re)starting are counted: by the daemon's
``gpu_bridge_preempted_job_runtime_seconds`` histogram and by the simulator's
``early_preemptions`` / ``early_lost_gpu_hours``."""

from __future__ import annotations

import pytest

from bridge.metrics import BridgeMetrics
from bridge.model import ActionKind, SlurmJob
from bridge.simulate.engine import Setup, simulate
from bridge.simulate.research import EARLY_PREEMPTION_S
from tests.unit.test_simulate_engine import Scripted, cfg, flat_workload, one_class

NOW = 1_796_000_000.0


def _bucket(m: BridgeMetrics, le: str, **labels: str) -> float:
    v = m.registry.get_sample_value("gpu_bridge_preempted_job_runtime_seconds_bucket", {**labels, "le": le})
    return v or 0.0


def test_daemon_histogram_of_runtime_at_preemption_splits_reruns() -> None:
    m = BridgeMetrics()
    fresh = SlurmJob(job_id="1", name="t", user="ana", partition="preempt", state="running", nodes=("n1",),
                     start_time=NOW - 20, restart_count=1)  # requeued, restarted, preempted 20 s later
    old = SlurmJob(job_id="2", name="t", user="ana", partition="preempt", state="running", nodes=("n2",),
                   start_time=NOW - 7200)
    m.record_preemption(pool="llama", job=fresh, now=NOW)
    m.record_preemption(pool="llama", job=old, now=NOW)
    assert _bucket(m, "30.0", pool="llama", rerun="yes") == 1
    assert _bucket(m, "300.0", pool="llama", rerun="no") == 0
    assert _bucket(m, "14400.0", pool="llama", rerun="no") == 1
    unknown = SlurmJob(job_id="3", name="t", user="ana", partition="preempt", state="running", nodes=("n3",),
                       start_time=None)
    m.record_preemption(pool="llama", job=unknown, now=NOW)  # no start time: not observed, still counted
    assert m.registry.get_sample_value("gpu_bridge_preempted_jobs_total", {"pool": "llama"}) == 3
    assert m.registry.get_sample_value("gpu_bridge_preempted_job_runtime_seconds_count",
                                       {"pool": "llama", "rerun": "no"}) == 1


@pytest.mark.parametrize(("reclaim_at", "early"), [(120.0, 1), (1200.0, 0)])
def test_simulator_counts_preemptions_soon_after_start(reclaim_at: float, early: int) -> None:
    assert reclaim_at < EARLY_PREEMPTION_S or reclaim_at > EARLY_PREEMPTION_S + 60
    setup = Setup(cfg(), flat_workload(1.0, 60), nodes=3, mix=one_class(checkpoint_s=None))
    n = setup.node_names()[0]
    ctl = Scripted({0.0: [(ActionKind.LEND, n)], reclaim_at: [(ActionKind.RECLAIM, n)]}, setup.start_unix)
    r = simulate(setup, ctl)
    assert r.metrics.preemptions == 1
    assert r.metrics.early_preemptions == early
    if early:  # a job that never checkpoints loses its whole (short) run
        assert 0 < r.metrics.early_lost_gpu_hours <= reclaim_at * 4 / 3600 + 1e-9
        assert r.metrics.early_lost_gpu_hours == pytest.approx(r.metrics.lost_gpu_hours)
    else:
        assert r.metrics.early_lost_gpu_hours == 0
