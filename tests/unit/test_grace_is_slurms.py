"""Issue 21 point 1: a research job's grace is Slurm's, never ours. The daemon requeues only a
job Slurm has preempted, once the partition's GraceTime from Slurm's PreemptTime is over by
slurmctld's clock; after a late preemption, a research job found on a serving node, or a
``slurm.grace_s`` lower than the partition's GraceTime, a job still gets its whole grace.

Over the lab's honest fakes (``FakeSlurm`` models the 22.05 sweep that ends a grace up to 30 s
late with ``requeue_lag_s``, so any requeue here is the daemon's own)."""

from __future__ import annotations

import pytest

from bridge import wellknown as wk
from bridge.config import replace
from bridge.errors import AdapterError
from bridge.model import Phase
from gpu_bridge_lab.fakes.slurm import holds_of
from tests.unit.test_daemon_loop import HIGH, NODES, World

SWEEP_LAG_S = 30.0  # 22.05 ends a grace on its periodic sweep: up to 30 s late


def _world(*, grace_s: float = 5.0) -> World:
    w = World()
    w.slurm.grace_s = grace_s
    w.slurm.requeue_lag_s = SWEEP_LAG_S
    return w


def _requeues(w: World, ticks: int) -> list[tuple[str, float, float | None]]:
    """Tick, and for each requeue the daemon wrote: (job, when, the job's PreemptTime then)."""
    out = []
    for _ in range(ticks):
        before = {j.job_id: j.preempt_time for j in w.slurm.snapshot().values()}
        seen = len(w.slurm.writes)
        w.tick()
        for intent, jid in w.slurm.writes[seen:]:
            if intent == "requeue":
                out.append((jid, w.t, before.get(jid)))
    return out


def _assert_whole_grace(requeues: list[tuple[str, float, float | None]], grace_s: float) -> None:
    assert requeues, "the daemon never requeued: the scenario did not happen"
    for jid, at, preempted in requeues:
        assert preempted is not None, f"job {jid} requeued at {at} without Slurm's preemption (no signal, no grace)"
        assert at >= preempted + grace_s + 1, f"job {jid} requeued {at - preempted:.0f} s after its preemption"


def test_a_late_preemption_still_gets_its_whole_grace() -> None:
    """The hold job is submitted 20 s into the reclaim (sbatch failing meanwhile): Slurm preempts
    only then. The old rule (phase start + grace_s + 2) requeued the job the moment it was preempted."""
    w = _world()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    job = w.sbatch("research", duration_s=10_000)
    w.tick(2)
    w.slurm.fail["submit_hold"] = AdapterError("slurm", "sbatch failed (rc 1): Socket timed out")
    w.load = HIGH
    requeues = _requeues(w, 20)
    assert w.job(job).preempt_time is None  # type: ignore[attr-defined]
    del w.slurm.fail["submit_hold"]
    requeues += _requeues(w, 30)
    _assert_whole_grace(requeues, 5.0)
    assert w.job(job).restart_count == 1  # type: ignore[attr-defined]
    assert w.violations == []


def test_research_found_on_a_serving_node_gets_its_grace() -> None:
    """A research job running on a node adopted as serving (or slipped in): the old daemon drained
    the node and requeued the job at once, without its signal or grace."""
    w = _world()
    w.load = HIGH  # nothing is lent: the node stays serving
    job = w.slurm.add_job("gpu-node-01", name="slipped-in")
    assert w.job(job).state == "running"  # type: ignore[attr-defined]
    requeues = _requeues(w, 30)
    _assert_whole_grace(requeues, 5.0)
    assert w.phases()["gpu-node-01"] is Phase.SERVING
    node = w.slurm.node("gpu-node-01")
    assert node.drained_by_us  # the node is ours again: hold running, drained
    assert holds_of(w.slurm)["gpu-node-01"].state == "running"


def test_a_config_grace_lower_than_slurms_is_raised_to_slurms() -> None:
    """``slurm.grace_s`` 5 s, the partition's GraceTime 30 s: read at start-up, Slurm's wins."""
    from bridge.daemon import with_slurm_grace

    w = _world(grace_s=30.0)
    assert w.config.slurm.grace_s == 5
    w.config = with_slurm_grace(w.config, w.slurm)
    assert w.config.slurm.grace_s == 30
    higher = with_slurm_grace(replace(w.config, slurm=replace(w.config.slurm, grace_s=60)), w.slurm)
    assert higher.slurm.grace_s == 60  # a longer one is kept: the daemon only waits longer
    w.daemon = w.new_daemon()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    w.sbatch("research", duration_s=10_000)
    w.tick(2)
    w.load = HIGH
    _assert_whole_grace(_requeues(w, 60), 30.0)


def test_grace_read_failure_is_an_error_at_start_up() -> None:
    from bridge.daemon import with_slurm_grace

    w = _world()
    w.slurm.fail["grace_time_s"] = AdapterError("slurm", "scontrol show partition preempt failed (rc 1)")
    with pytest.raises(AdapterError, match="show partition"):
        with_slurm_grace(w.config, w.slurm)


def test_the_requeue_rereads_the_job_and_never_runs_a_finished_one_again() -> None:
    """Decided on a snapshot, actuated later: a job that ended in between is not requeued, nor a
    later run of the same job (requeued by Slurm and started again since)."""
    w = _world()
    n = NODES[0]
    jid = w.slurm.add_job(n)
    w.slurm.submit_hold(n)  # preempts it
    w.slurm.advance(6)
    restart = w.job(jid).restart_count  # type: ignore[attr-defined]
    w.slurm.finish(jid)
    assert w.slurm.requeue(jid, restart_count=restart) is False
    w.slurm.cancel_hold(n)
    again = w.slurm.add_job(n)
    w.slurm.submit_hold(n)
    w.slurm.advance(SWEEP_LAG_S + 6)  # Slurm's own sweep requeued it; it runs again once the hold goes
    w.slurm.cancel_hold(n)
    assert w.job(again).state == "running" and w.job(again).restart_count == 1  # type: ignore[attr-defined]
    w.slurm.submit_hold(n)  # and is preempted again: run 1 now
    assert w.slurm.requeue(again, restart_count=0) is False  # the run decided on was restart 0
    assert w.slurm.requeue(again, restart_count=1) is True
    assert w.job(again).partition == wk.SLURM_PREEMPT_PARTITION  # type: ignore[attr-defined]
