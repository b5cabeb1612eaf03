"""The lifecycle's next step from observed facts, and convergence of lend/reclaim when
every write may be lost to a crash (the daemon restarts and reads the facts again)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.lifecycle import (
    LENDING_POD_DELETION_COST,
    HoldFacts,
    NodeFacts,
    PodFacts,
    PreemptedJob,
    Step,
    desired_replicas,
    next_step,
    past_grace,
)
from bridge.model import Phase

NOW = 1_000_000.0
POD = PodFacts("vllm-abc", ready=True, terminating=False)
HOLD_RUNNING = HoldFacts("17", running=True)


def facts(**kw: object) -> NodeFacts:
    base = dict(
        name="gpu-node-01",
        phase=Phase.SERVING,
        phase_since=NOW - 100,
        fenced=False,
        pods=(POD,),
        slurm_drained_by_us=True,
        slurm_drained_by_other=False,
        slurm_down=False,
        slurm_allocated=True,
        hold=HOLD_RUNNING,
        research_jobs=(),
    )
    base.update(kw)
    return NodeFacts(**base)  # type: ignore[arg-type]


CASES = [
    ("unmanaged-adopted", facts(phase=None), False, Step.ADOPT),
    ("unmanaged-research-fenced-first", facts(phase=None, pods=(), research_jobs=("3",)), False, Step.FENCE),
    ("unmanaged-research-adopted-lent", facts(phase=None, pods=(), fenced=True, research_jobs=("3",)), False, Step.ADOPT_LENT),
    ("serving-at-rest", facts(), False, None),
    ("serving-undrained", facts(slurm_drained_by_us=False), False, Step.ENSURE_DRAINED),
    ("serving-admin-drain-is-enough", facts(slurm_drained_by_us=False, slurm_drained_by_other=True), False, None),
    ("serving-hold-first-while-idle", facts(hold=None, slurm_drained_by_us=False), False, Step.ENSURE_HOLD),
    ("serving-drained-without-hold-rests", facts(hold=None), False, None),
    ("serving-no-hold-node-down", facts(hold=None, slurm_down=True, slurm_drained_by_us=False), False, Step.ENSURE_DRAINED),
    # research on a serving node is preempted by Slurm for our hold (its signal and grace), never requeued at once
    ("serving-research-slipped-in-hold-preempts-it", facts(hold=None, slurm_drained_by_us=False, research_jobs=("7",)),
     False, Step.ENSURE_HOLD),
    ("serving-research-our-drain-lifted-for-the-hold", facts(hold=HoldFacts("9", running=False), research_jobs=("7",)),
     False, Step.RESUME),
    ("serving-research-waits-for-its-grace",
     facts(hold=HoldFacts("9", running=False), slurm_drained_by_us=False, research_jobs=("7",)), False, Step.WAIT_HOLD),
    ("serving-research-admin-drain-blocks",
     facts(slurm_drained_by_us=False, slurm_drained_by_other=True, research_jobs=("7",)), False, Step.BLOCKED),
    ("lending-fence-first", facts(phase=Phase.LENDING), False, Step.FENCE),
    ("lending-mark-pod", facts(phase=Phase.LENDING, fenced=True), False, Step.MARK_POD),
    (
        "lending-wait-scale-down",
        facts(phase=Phase.LENDING, fenced=True, pods=(dataclasses.replace(POD, deletion_cost=LENDING_POD_DELETION_COST),)),
        False,
        Step.WAIT_PODS_GONE,
    ),
    (
        "lending-evict-when-rs-removed-another",
        facts(
            phase=Phase.LENDING,
            phase_since=NOW - 60,
            fenced=True,
            pods=(dataclasses.replace(POD, deletion_cost=LENDING_POD_DELETION_COST),),
        ),
        True,
        Step.EVICT_POD,
    ),
    (
        "lending-wait-terminating",
        facts(phase=Phase.LENDING, fenced=True, pods=(dataclasses.replace(POD, terminating=True),)),
        True,
        Step.WAIT_PODS_GONE,
    ),
    ("lending-cancel-hold", facts(phase=Phase.LENDING, fenced=True, pods=()), True, Step.CANCEL_HOLD),
    ("lending-resume", facts(phase=Phase.LENDING, fenced=True, pods=(), hold=None), True, Step.RESUME),
    (
        "lending-mark-lent",
        facts(phase=Phase.LENDING, fenced=True, pods=(), hold=None, slurm_drained_by_us=False),
        True,
        Step.MARK_LENT,
    ),
    ("lent-at-rest", facts(phase=Phase.LENT, fenced=True, pods=(), hold=None, slurm_drained_by_us=False), True, None),
    ("lent-reasserts-resume", facts(phase=Phase.LENT, fenced=True, pods=(), hold=None), True, Step.RESUME),
    (
        "reclaiming-submit-hold",
        facts(phase=Phase.RECLAIMING, fenced=True, pods=(), hold=None, slurm_drained_by_us=False, research_jobs=("5",)),
        True,
        Step.SUBMIT_HOLD,
    ),
    (
        "reclaiming-wait-grace",
        facts(
            phase=Phase.RECLAIMING,
            fenced=True,
            pods=(),
            hold=HoldFacts("9", running=False),
            slurm_drained_by_us=False,
            research_jobs=("5",),
        ),
        True,
        Step.WAIT_HOLD,
    ),
    (
        "reclaiming-drain-once-held",
        facts(phase=Phase.RECLAIMING, fenced=True, pods=(), slurm_drained_by_us=False),
        True,
        Step.DRAIN,
    ),
    (
        "reclaiming-down-node-empty-drains",
        facts(
            phase=Phase.RECLAIMING,
            fenced=True,
            pods=(),
            hold=None,
            slurm_drained_by_us=False,
            slurm_down=True,
            slurm_allocated=False,
        ),
        True,
        Step.DRAIN,
    ),
    (
        "reclaiming-admin-drain-blocks",
        facts(
            phase=Phase.RECLAIMING,
            fenced=True,
            pods=(),
            hold=HoldFacts("9", running=False),
            slurm_drained_by_us=False,
            slurm_drained_by_other=True,
            research_jobs=("5",),
        ),
        True,
        Step.BLOCKED,
    ),
    ("reclaiming-to-returning", facts(phase=Phase.RECLAIMING, fenced=True, pods=()), True, Step.MARK_RETURNING),
    (
        "returning-never-unfence-undrained",
        facts(phase=Phase.RETURNING, fenced=True, pods=(), slurm_drained_by_us=False),
        True,
        Step.DRAIN,
    ),
    ("returning-unfence", facts(phase=Phase.RETURNING, fenced=True, pods=()), True, Step.UNFENCE),
    (
        "returning-wait-ready",
        facts(phase=Phase.RETURNING, pods=(dataclasses.replace(POD, ready=False),)),
        True,
        Step.WAIT_READY,
    ),
    ("returning-ready", facts(phase=Phase.RETURNING), True, Step.MARK_SERVING),
]


@pytest.mark.parametrize(("node", "scaled_down", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_next_step(node: NodeFacts, scaled_down: bool, expected: Step | None) -> None:
    assert next_step(node, now=NOW, scaled_down=scaled_down) == expected


SLURM_T = 1_700_000_000.0  # slurmctld's clock: far from the daemon's NOW on purpose (skew)


def _reclaiming_with(*preempted: PreemptedJob, slurm_now: float | None, phase_since: float = NOW - 3600) -> NodeFacts:
    return facts(phase=Phase.RECLAIMING, phase_since=phase_since, fenced=True, pods=(),
                 hold=HoldFacts("9", running=False), slurm_drained_by_us=False, research_jobs=("5", "6"),
                 research_preempted=preempted, slurm_now=slurm_now)


def test_jobs_are_requeued_only_once_slurms_grace_is_over_by_slurms_clock() -> None:
    """Issue 21 point 1: the grace starts at Slurm's PreemptTime, not at our phase's start, and
    is measured by slurmctld's clock. The reclaim is an hour old here (the old rule requeued at
    phase_since + grace_s + 2, whatever Slurm had done)."""
    p = PreemptedJob("5", preempt_time=SLURM_T - 30, restart_count=0)
    assert next_step(_reclaiming_with(p, slurm_now=SLURM_T), now=NOW, scaled_down=True, grace_s=30) is Step.WAIT_HOLD
    assert next_step(_reclaiming_with(p, slurm_now=SLURM_T + 0.9), now=NOW, scaled_down=True, grace_s=30) is Step.WAIT_HOLD
    due = _reclaiming_with(p, slurm_now=SLURM_T + 1), 30
    assert next_step(due[0], now=NOW, scaled_down=True, grace_s=due[1]) is Step.REQUEUE_JOBS
    assert past_grace(*due) == (p,)  # only the preempted job, never job 6 next to it
    # a grace longer than ours (Slurm's GraceTime raised): not yet
    assert next_step(due[0], now=NOW, scaled_down=True, grace_s=31) is Step.WAIT_HOLD


@pytest.mark.parametrize(("case", "node", "grace_s"), [
    ("not-preempted-yet", _reclaiming_with(slurm_now=SLURM_T + 10_000), 30.0),  # a late preemption: no grace started
    ("slurm-clock-unknown", _reclaiming_with(PreemptedJob("5", SLURM_T - 999, 0), slurm_now=None), 30.0),
    ("grace-unknown", _reclaiming_with(PreemptedJob("5", SLURM_T - 999, 0), slurm_now=SLURM_T), None),
    ("job-no-longer-on-the-node", dataclasses.replace(
        _reclaiming_with(PreemptedJob("8", SLURM_T - 999, 0), slurm_now=SLURM_T), research_jobs=("5",)), 30.0),
], ids=lambda v: v if isinstance(v, str) else "")
def test_no_requeue_without_slurms_preemption_and_grace(case: str, node: NodeFacts, grace_s: float | None) -> None:
    assert next_step(node, now=NOW + 10**6, scaled_down=True, grace_s=grace_s) is Step.WAIT_HOLD


def test_research_on_a_serving_node_gets_its_grace_too() -> None:
    """Issue 21 point 1: a serving node found running a research job never requeues it at once:
    Slurm preempts it for our hold (signal + GraceTime) and only then is it requeued."""
    node = facts(hold=HoldFacts("9", running=False), slurm_drained_by_us=False, research_jobs=("7",), slurm_now=SLURM_T)
    assert next_step(node, now=NOW, scaled_down=False, grace_s=30) is Step.WAIT_HOLD
    preempted = dataclasses.replace(node, research_preempted=(PreemptedJob("7", SLURM_T - 30, 2),))
    assert next_step(preempted, now=NOW, scaled_down=False, grace_s=30) is Step.WAIT_HOLD
    over = dataclasses.replace(preempted, slurm_now=SLURM_T + 1)
    assert next_step(over, now=NOW, scaled_down=False, grace_s=30) is Step.REQUEUE_JOBS
    # once the hold runs and the job is gone: our drain again
    done = dataclasses.replace(over, research_jobs=(), research_preempted=(), hold=HOLD_RUNNING)
    assert next_step(done, now=NOW, scaled_down=False, grace_s=30) is Step.ENSURE_DRAINED


def test_the_drain_saved_wait_uses_slurmctlds_clock() -> None:
    """Issue 21 point 8: the drain's reason time is slurmctld's: compared with slurmctld's clock,
    a daemon clock running ahead cannot cut the wait short."""
    node = facts(phase=Phase.RETURNING, fenced=True, pods=(), slurm_drained_at=SLURM_T, slurm_now=SLURM_T + 2)
    assert next_step(node, now=SLURM_T + 3600, scaled_down=True, drain_saved_after_s=6.0) is Step.WAIT_DRAIN_SAVED
    later = dataclasses.replace(node, slurm_now=SLURM_T + 6)
    assert next_step(later, now=SLURM_T - 3600, scaled_down=True, drain_saved_after_s=6.0) is Step.UNFENCE


def test_desired_replicas_keeps_lending_replica_until_its_pod_is_marked() -> None:
    serving = facts()
    lending_unmarked = facts(name="n2", phase=Phase.LENDING, fenced=True)
    lending_marked = facts(
        name="n3", phase=Phase.LENDING, fenced=True, pods=(dataclasses.replace(POD, deletion_cost=LENDING_POD_DELETION_COST),)
    )
    lent = facts(name="n4", phase=Phase.LENT, pods=())
    returning = facts(name="n5", phase=Phase.RETURNING, pods=())
    assert desired_replicas([serving, lending_unmarked, lending_marked, lent, returning]) == 3


# --- convergence under lost writes -----------------------------------------------------


@dataclasses.dataclass
class World:
    """A toy of both schedulers, enough to apply each step's effect."""

    phase: Phase | None
    fenced: bool = False
    pod: PodFacts | None = POD
    drained: bool = True
    hold: HoldFacts | None = HOLD_RUNNING
    research: tuple[str, ...] = ()
    research_requeued: int = 0
    since: float = NOW

    def facts(self) -> NodeFacts:
        return NodeFacts(
            name="gpu-node-01",
            phase=self.phase,
            phase_since=self.since,
            fenced=self.fenced,
            pods=(self.pod,) if self.pod else (),
            slurm_drained_by_us=self.drained,
            slurm_drained_by_other=False,
            slurm_down=False,
            slurm_allocated=bool(self.hold or self.research),
            hold=self.hold,
            research_jobs=self.research,
        )

    def check_invariant(self) -> None:
        # research never runs where a serving pod may run or be placed
        if self.research:
            assert self.pod is None and self.fenced

    def apply(self, step: Step, rng: random.Random) -> None:
        if step is Step.FENCE:
            self.fenced = True
        elif step is Step.UNFENCE:
            self.fenced = False
        elif step is Step.MARK_POD and self.pod:
            self.pod = dataclasses.replace(self.pod, deletion_cost=LENDING_POD_DELETION_COST)
        elif step in (Step.WAIT_PODS_GONE, Step.EVICT_POD) and self.pod:
            # the scale-down (or eviction) terminates, then removes, the pod
            self.pod = None if self.pod.terminating else dataclasses.replace(self.pod, terminating=True)
        elif step is Step.CANCEL_HOLD:
            self.hold = None
        elif step is Step.RESUME:
            self.drained = False
            if rng.random() < 0.7:
                self.research = ("r1",)  # research lands at once
        elif step is Step.SUBMIT_HOLD:
            self.hold = HoldFacts("h", running=not self.research)
        elif step is Step.REQUEUE_JOBS:
            self.research_requeued += len(self.research)
            self.research = ()
        elif step is Step.WAIT_HOLD and self.hold:
            if self.research:
                self.research_requeued += len(self.research)
                self.research = ()
            self.hold = HoldFacts(self.hold.job_id, running=True)
        elif step is Step.DRAIN or step is Step.ENSURE_DRAINED:
            self.drained = True
        elif step is Step.ENSURE_HOLD:
            self.hold = HoldFacts("h2", running=not self.research)
        elif step is Step.WAIT_READY:
            self.pod = PodFacts("vllm-new", ready=self.pod is not None, terminating=False)
        elif step in (Step.MARK_LENT, Step.MARK_RETURNING, Step.MARK_SERVING, Step.ADOPT):
            self.phase = {
                Step.MARK_LENT: Phase.LENT,
                Step.MARK_RETURNING: Phase.RETURNING,
                Step.MARK_SERVING: Phase.SERVING,
                Step.ADOPT: Phase.SERVING,
            }[step]


def drive(world: World, target: Phase, rng: random.Random, loss: float) -> int:
    for tick in range(200):
        world.check_invariant()
        step = next_step(world.facts(), now=NOW + 1000, scaled_down=True)
        if step is None:
            if world.phase is target:
                return tick
            raise AssertionError(f"stuck at rest in {world.phase} before reaching {target}")
        assert step is not Step.BLOCKED
        if rng.random() >= loss:  # the write happened before the crash, or not
            world.apply(step, rng)
    raise AssertionError(f"did not converge: {world}")


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10_000), loss=st.floats(0.0, 0.6))
def test_lend_then_reclaim_converges_with_lost_writes(seed: int, loss: float) -> None:
    rng = random.Random(seed)
    world = World(phase=None)
    drive(world, Phase.SERVING, rng, loss)
    world.phase = Phase.LENDING  # the policy decided to lend
    drive(world, Phase.LENT, rng, loss)
    assert world.pod is None and not world.drained and world.hold is None
    world.phase = Phase.RECLAIMING  # the policy decided to reclaim
    drive(world, Phase.SERVING, rng, loss)
    assert world.pod is not None and world.pod.ready and world.drained and not world.fenced
    assert world.research == ()


# --- an abandoned lend ------------------------------------------------------------------

MARKED = dataclasses.replace(POD, deletion_cost=LENDING_POD_DELETION_COST)


def test_a_lend_whose_pod_outlives_the_timeout_is_abandoned() -> None:
    stuck = facts(phase=Phase.LENDING, phase_since=NOW - 600, fenced=True, pods=(MARKED,))
    assert next_step(stuck, now=NOW, scaled_down=True, lend_timeout_s=601) is Step.EVICT_POD
    assert next_step(stuck, now=NOW, scaled_down=True, lend_timeout_s=600) is Step.ABORT_LEND
    assert next_step(stuck, now=NOW, scaled_down=False, lend_timeout_s=600) is Step.ABORT_LEND
    # no timeout configured: the old behaviour (retry the eviction for ever)
    assert next_step(stuck, now=NOW, scaled_down=True) is Step.EVICT_POD
    # a pod already terminating is on its way out: wait for it, never abandon
    going = dataclasses.replace(stuck, pods=(dataclasses.replace(MARKED, terminating=True),))
    assert next_step(going, now=NOW, scaled_down=True, lend_timeout_s=60) is Step.WAIT_PODS_GONE
    # once the pod is gone the lend goes on to Slurm whatever its age
    gone = dataclasses.replace(stuck, pods=())
    assert next_step(gone, now=NOW, scaled_down=True, lend_timeout_s=60) is Step.CANCEL_HOLD


def test_after_an_abandoned_lend_the_serving_node_is_unfenced_then_its_pod_unmarked() -> None:
    node = facts(phase=Phase.SERVING, fenced=True, pods=(MARKED,))
    assert next_step(node, now=NOW, scaled_down=False) is Step.UNFENCE
    node = dataclasses.replace(node, fenced=False)
    assert next_step(node, now=NOW, scaled_down=False) is Step.UNMARK_POD
    node = dataclasses.replace(node, pods=(POD,))
    assert next_step(node, now=NOW, scaled_down=False) is None
    # research on it still comes first (a node must never serve and run jobs): preempted by
    # Slurm for our hold, so it gets its grace
    busy = facts(phase=Phase.SERVING, fenced=True, pods=(), research_jobs=("7",), hold=HoldFacts("9", running=False))
    assert next_step(busy, now=NOW, scaled_down=False) is Step.RESUME


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000), loss=st.floats(0.0, 0.6))
def test_an_abandoned_lend_converges_to_serving_with_lost_writes(seed: int, loss: float) -> None:
    rng = random.Random(seed)
    world = World(phase=Phase.LENDING, since=NOW - 5000)  # the pod never goes: e.g. a PDB
    for tick in range(100):
        world.check_invariant()
        step = next_step(world.facts(), now=NOW, scaled_down=True, lend_timeout_s=600)
        if step is None:
            break
        assert step not in (Step.CANCEL_HOLD, Step.RESUME, Step.MARK_LENT, Step.BLOCKED)  # nothing to Slurm
        if rng.random() >= loss:
            if step is Step.ABORT_LEND:
                world.phase = Phase.SERVING
            elif step is Step.UNMARK_POD and world.pod:
                world.pod = dataclasses.replace(world.pod, deletion_cost=0)
            elif step in (Step.FENCE, Step.UNFENCE, Step.MARK_POD):
                world.apply(step, rng)
            # an eviction is refused: the pod stays
    else:
        raise AssertionError(f"did not converge: {world}")
    assert world.phase is Phase.SERVING and not world.fenced and world.pod is not None
    assert world.pod.deletion_cost != LENDING_POD_DELETION_COST and world.drained and world.hold is not None
