"""Warm lending in the simulator and the plan's horizon: a reclaimed node of a warm pool is
Ready ``wake_s`` after Slurm releases it (not a cold start later); the policy plans such a
pool with grace + wake; a pool with several replicas per node stays cold (the lifecycle keeps
a replica asleep only when it is the node's one pod)."""

from __future__ import annotations

import dataclasses

from bridge.config import Config, default_config
from bridge.model import ActionKind, Tier
from bridge.policy.forecast import horizon_s, return_s
from bridge.simulate.engine import Engine, Setup
from tests.unit.test_fast_tier import COLD, DRAIN, GRACE, MIX, TICK, Scripted, flat_workload

WAKE = 20.0


def cfg(*, warm: bool, replicas_per_node: int = 1) -> Config:
    c = default_config(cold_start_s=COLD, drain_s=DRAIN)
    pools = tuple(dataclasses.replace(p, warm_lending=warm, wake_s=WAKE, replicas_per_node=replicas_per_node,
                                      warm_hold_mb=140_000 if warm else None) for p in c.pools)
    return dataclasses.replace(c, pools=pools, slurm=dataclasses.replace(c.slurm, grace_s=GRACE))


def reclaim_delay(c: Config, *, wake_fail_rate: float = 0.0) -> tuple[float, float]:
    """Lend one node, give it a research job, reclaim it: (first tick it is Ready again, the measured delay)."""
    setup = Setup(c, flat_workload(1.0, 60), nodes=3, mix=MIX, wake_fail_rate=wake_fail_rate)
    node = setup.node_names()[0]
    t_re = 1200.0
    ctl = Scripted({0.0: [(ActionKind.LEND, node, Tier.NORMAL)], t_re: [(ActionKind.RECLAIM, node, Tier.NORMAL)]},
                   setup.start_unix)
    eng = Engine(setup, ctl)
    eng.run()
    assert next(n for n in ctl.at(t_re - TICK).nodes if n.name == node).jobs  # a job to preempt: the grace applies
    ready = next(v.now - setup.start_unix for v in ctl.views
                 if v.now - setup.start_unix > t_re and next(n for n in v.nodes if n.name == node).serving_ready)
    assert len(eng.reclaim_delays) == 1
    return ready - t_re, eng.reclaim_delays[0]


def test_a_warm_reclaim_is_grace_plus_wake() -> None:
    seen, delay = reclaim_delay(cfg(warm=True))
    assert GRACE + WAKE <= delay < GRACE + WAKE + TICK and delay <= seen < GRACE + COLD


def test_a_failed_wake_costs_the_wakes_wait_and_a_cold_start() -> None:
    _, delay = reclaim_delay(cfg(warm=True), wake_fail_rate=1.0)
    assert GRACE + WAKE + COLD <= delay < GRACE + WAKE + COLD + TICK
    # with the free-GPU check the daemon waits wake_gpu_wait_s before it gives the wake up
    c = cfg(warm=True)
    c = dataclasses.replace(c, pools=tuple(dataclasses.replace(p, wake_gpu_free_mib="auto", wake_gpu_wait_s=45.0) for p in c.pools))
    _, delay = reclaim_delay(c, wake_fail_rate=1.0)
    assert GRACE + 45.0 + COLD <= delay < GRACE + 45.0 + COLD + TICK
    assert reclaim_delay(cfg(warm=True), wake_fail_rate=0.0) == reclaim_delay(cfg(warm=True))  # 0: as without the knob


def test_the_wake_fail_rate_is_a_share_and_the_oracle_plans_with_it() -> None:
    import pytest

    with pytest.raises(ValueError, match="wake_fail_rate: expected a share between 0 and 1, got 1.5"):
        Setup(cfg(warm=True), flat_workload(1.0, 60), nodes=3, wake_fail_rate=1.5)
    rare = Setup(cfg(warm=True), flat_workload(1.0, 60), nodes=3, wake_fail_rate=0.0005)
    often = Setup(cfg(warm=True), flat_workload(1.0, 60), nodes=3, wake_fail_rate=0.2)
    assert rare.cold_start_quantile(0.999) == WAKE  # fewer failures than the quantile leaves out
    assert often.cold_start_quantile(0.999) == WAKE + COLD  # the wake's wait, then the cold start


def test_a_cold_reclaim_is_grace_plus_cold_start() -> None:
    seen, delay = reclaim_delay(cfg(warm=False))
    assert GRACE + COLD <= delay <= seen


def test_several_replicas_per_node_stay_cold() -> None:
    _, delay = reclaim_delay(cfg(warm=True, replicas_per_node=2))
    assert delay >= GRACE + COLD


def test_the_plan_horizon_uses_the_wake_for_a_warm_pool() -> None:
    warm, cold, multi = cfg(warm=True), cfg(warm=False), cfg(warm=True, replicas_per_node=2)
    assert return_s(warm.pools[0]) == WAKE and return_s(cold.pools[0]) == COLD == return_s(multi.pools[0])
    assert horizon_s(cold, cold.pools[0]) - horizon_s(warm, warm.pools[0]) == COLD - WAKE


def test_bench_harvest_warm_prints_cold_and_warm_per_trace() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    trace = root / "bridge" / "data" / "traces" / "azure2024-code.csv"
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "bench_harvest.py"), "--warm", "--days", "1", "--trace", str(trace)],
        capture_output=True, text=True, timeout=300, cwd=root,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("azure2024-code ")]
    assert len(rows) == 1 and rows[0].split()[1] == "1"
    assert any(line.startswith("azure2024-code: warm - cold = ") for line in out.stdout.splitlines())
