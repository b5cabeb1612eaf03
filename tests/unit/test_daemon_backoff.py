"""A step something outside us refuses for long (a PDB that never allows the eviction) is
retried with exponential backoff and a warning per attempt, not every 0.25 s iteration
(reliability finding: 4 evictions a second against a PDB, forever, silently)."""

from __future__ import annotations

from bridge.reconcile import MAX_RETRY_BACKOFF_S
from bridge.model import Phase
from tests.pdb_world import pdb_world


def test_blocked_eviction_backs_off_exponentially() -> None:
    w = pdb_world({"tick_s": 1000})  # the policy stays out of it: this is the lifecycle's retry
    w.start_stuck_lend()
    for _ in range(4 * 60):  # one minute of 0.25 s iterations
        w.tick()
    assert w.kube.node("gpu-node-01").phase is Phase.LENDING  # never released while its pod is there
    evictions = w.kube.calls[("create", "pods/eviction")]
    # evict_after_s (20 s) then tries at +1, +2, +4, +8, +16 s...: a handful, not 4 a second
    assert 1 <= evictions <= 7, evictions
    assert MAX_RETRY_BACKOFF_S == 60.0
    assert not any(j.state == "running" for j in w.slurm.snapshot().values() if j.partition == "preempt")
