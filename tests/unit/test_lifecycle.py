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
    Step,
    desired_replicas,
    next_step,
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
    ("serving-research-slipped-in-drain", facts(slurm_drained_by_us=False, research_jobs=("7",)), False, Step.ENSURE_DRAINED),
    ("serving-research-requeued", facts(research_jobs=("7",)), False, Step.REQUEUE_JOBS),
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


def test_jobs_outliving_their_grace_are_requeued() -> None:
    node = facts(
        phase=Phase.RECLAIMING,
        phase_since=NOW - 30,
        fenced=True,
        pods=(),
        hold=HoldFacts("9", running=False),
        slurm_drained_by_us=False,
        research_jobs=("5",),
    )
    assert next_step(node, now=NOW, scaled_down=True, requeue_after_s=31) is Step.WAIT_HOLD
    assert next_step(node, now=NOW, scaled_down=True, requeue_after_s=30) is Step.REQUEUE_JOBS


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
    # research on it still comes first (a node must never serve and run jobs)
    busy = facts(phase=Phase.SERVING, fenced=True, pods=(), research_jobs=("7",))
    assert next_step(busy, now=NOW, scaled_down=False) is Step.REQUEUE_JOBS


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
