"""Slurm's own reactions to a controller crash (issue 16, seed 203): a job started again on
the node where its first run still went on ("Duplicate jobid") is requeued *held* by Slurm
(launch_failed_requeued_held) and the node drained by Slurm itself. gpu-bridge releases the
job once the failed run is gone and clears (lent) or takes over (other phases) that drain
once nothing is allocated on the node; an administrator's drain or hold is never touched.
The daemon over the in-memory fakes (tests/unit/test_daemon_loop.py's World); the same on
the real sandbox in tests/integration/test_slurm_duplicate_jobid.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridge.lifecycle import NodeFacts, Step, next_step
from bridge.model import Phase
from bridge.observe import LAUNCH_FAILED_HELD, own_drain_reason
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from bridge.metrics import BridgeMetrics

try:
    from test_daemon_loop import HIGH, LOW, World, config
except ImportError:  # tests/ became a package
    from .test_daemon_loop import HIGH, LOW, World, config  # type: ignore[no-redef]


def facts(phase: Phase | None, **kw: object) -> NodeFacts:
    base = NodeFacts(name="gpu-node-01", phase=phase, phase_since=0.0, fenced=phase is not Phase.SERVING, pods=(),
                     slurm_drained_by_us=False, slurm_drained_by_other=True, slurm_down=False, slurm_allocated=False,
                     hold=None, research_jobs=(), slurm_own_drain="Duplicate jobid")
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("phase,step", [
    (Phase.LENT, Step.CLEAR_SLURM_DRAIN),
    (Phase.LENDING, Step.CLEAR_SLURM_DRAIN),
    (Phase.SERVING, Step.TAKE_OVER_DRAIN),
    (Phase.RECLAIMING, Step.TAKE_OVER_DRAIN),
    (Phase.RETURNING, Step.TAKE_OVER_DRAIN),
])
def test_slurm_own_drain_on_an_empty_node(phase: Phase, step: Step) -> None:
    assert next_step(facts(phase), now=100.0, scaled_down=True) is step


def test_administrators_drain_is_never_handled() -> None:
    f = facts(Phase.LENT, slurm_own_drain=None)
    assert next_step(f, now=100.0, scaled_down=True) is None
    assert next_step(replace(f, phase=Phase.RECLAIMING), now=100.0, scaled_down=True) is Step.BLOCKED


def test_own_drain_reason_matches_configured_prefixes_only() -> None:
    cfg = config()
    assert own_drain_reason("Duplicate jobid", cfg) == "Duplicate jobid"
    assert own_drain_reason("duplicate jobid on nodes gpu-node-01", cfg) == "Duplicate jobid"
    assert own_drain_reason("Kill task failed", cfg) is None
    assert own_drain_reason("maintenance: Duplicate jobid", cfg) is None


def _lent_with_job(w: World) -> tuple[str, str]:
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    job = w.sbatch("research-dup", duration_s=30)
    w.tick(2)
    node = w.job(job).nodes[0]  # type: ignore[attr-defined]
    return job, node


def test_duplicate_start_hold_is_released_and_drain_cleared_then_job_completes() -> None:
    w = World()
    w.daemon.ledger.metrics = BridgeMetrics()
    job, node = _lent_with_job(w)
    w.slurm.duplicate_start(job)
    assert w.job(job).held_for(LAUNCH_FAILED_HELD)  # type: ignore[attr-defined]
    w.tick(1)
    # one tick: released (the failed run is gone: pending), Slurm's drain lifted on the lent node
    assert ("release", job) in w.slurm.writes
    assert ("clear_own_drain", node) in w.slurm.writes
    assert not w.slurm.node(node).drained
    assert w.phases()[node] is Phase.LENT
    events = {e.reason for e in w.kube.events if e.node == node}
    assert "GpuBridgeSlurmDrainCleared" in events
    m = w.daemon.ledger.metrics
    assert m.slurm_repairs.labels(pool="default", kind="clear_slurm_drain")._value.get() == 1
    assert m.slurm_repairs.labels(pool="", kind="job_released")._value.get() \
        + m.slurm_repairs.labels(pool="default", kind="job_released")._value.get() == 1
    w.run_until(lambda: job in w.completed, 80, "the released job completed")
    assert w.violations == []


def test_drain_kept_while_slurm_still_has_a_job_on_the_node() -> None:
    w = World()
    job, node = _lent_with_job(w)
    other = w.sbatch("research-other", duration_s=60)
    w.slurm.admin_drain(node, "Duplicate jobid", user="slurm")  # Slurm's drain while its job still runs
    w.tick(3)
    assert ("clear_own_drain", node) not in w.slurm.writes  # a run Slurm knows of is still there
    w.slurm.finish(job)
    w.completed.add(job)
    w.tick(2)
    assert ("clear_own_drain", node) in w.slurm.writes
    assert other


def test_slurm_drain_mid_reclaim_is_taken_over_once_the_jobs_are_gone() -> None:
    w = World()
    job, node = _lent_with_job(w)
    w.load = HIGH
    w.run_until(lambda: w.phases()[node] is Phase.RECLAIMING, 30, "the job's node reclaiming")
    w.slurm.admin_drain(node, "Duplicate jobid", user="slurm")  # Slurm drains it during the grace
    w.tick(1)
    assert ("take_over_drain", node) not in w.slurm.writes  # the preempted job is still on it
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 60, "all serving again")
    assert ("take_over_drain", node) in w.slurm.writes
    assert w.slurm.node(node).drained_by_us
    w.load = LOW
    w.run_until(lambda: job in w.completed, 200, "the requeued job completed")
    assert w.violations == []


def test_users_hold_and_release_switch_off() -> None:
    s = FakeSlurm()
    s.add_node("gpu-node-01")
    jid = s.add_job("gpu-node-01")
    s.duplicate_start(jid)
    assert not s.release(jid, "JobHeldUser")  # only the reason Slurm gave
    assert s.release(jid, LAUNCH_FAILED_HELD)
    w = World()
    w.config = config()
    w.config = replace(w.config, slurm=replace(w.config.slurm, release_launch_failed=False))
    w.daemon = w.new_daemon()
    job, node = _lent_with_job(w)
    w.slurm.duplicate_start(job)
    w.tick(3)
    assert ("release", job) not in w.slurm.writes
    assert w.job(job).state == "pending"


def test_returning_node_is_unfenced_only_once_our_drain_is_saved() -> None:
    f = facts(Phase.RETURNING, slurm_own_drain=None, slurm_drained_by_us=True, slurm_drained_by_other=False,
              fenced=True, slurm_drained_at=100.0)
    # slurmctld may not have saved a drain younger than its state-save delay: a crash would undo it
    assert next_step(f, now=103.0, scaled_down=True, drain_saved_after_s=6.0) is Step.WAIT_DRAIN_SAVED
    assert next_step(f, now=106.0, scaled_down=True, drain_saved_after_s=6.0) is Step.UNFENCE
    assert next_step(replace(f, slurm_drained_at=None), now=101.0, scaled_down=True,
                     drain_saved_after_s=6.0) is Step.UNFENCE  # unknown time: Slurm gave none
