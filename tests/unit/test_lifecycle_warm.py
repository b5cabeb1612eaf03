"""Warm lending's lifecycle steps (docs/warm-lending.md): each new step from its facts, the cold
fallback when a sleep or wake fails or the sleeping pod is lost, the Deployment count, and
convergence when any write (or the daemon right after it) is lost and sleep/wake may fail."""

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
from bridge.model import Phase, WarmRecord, WarmState

NOW = 1_000_000.0
POD = PodFacts("vllm-abc", ready=True, terminating=False, awake=True, ip="10.0.0.7")
GATED = dataclasses.replace(POD, ready=False, awake=False)
MARKED_GATED = dataclasses.replace(GATED, deletion_cost=LENDING_POD_DELETION_COST)  # a cold fallback's pod, marked
ASLEEP = WarmRecord(WarmState.ASLEEP, "vllm-abc")
AWAKE = WarmRecord(WarmState.AWAKE, "vllm-abc")
COLD = WarmRecord(WarmState.COLD, "vllm-abc")
MEM = HoldFacts("30", running=True)  # the memory hold (gpu-bridge-warm:<node>)


def facts(**kw: object) -> NodeFacts:
    base = dict(
        name="gpu-node-01", phase=Phase.SERVING, phase_since=NOW - 100, fenced=False, pods=(POD,),
        slurm_drained_by_us=True, slurm_drained_by_other=False, slurm_down=False, slurm_allocated=True,
        hold=HoldFacts("17", running=True), research_jobs=(),
    )
    base.update(kw)
    return NodeFacts(**base)  # type: ignore[arg-type]


LENT = dict(phase=Phase.LENT, fenced=True, pods=(GATED,), slurm_drained_by_us=False, hold=None, warm=ASLEEP, mem_hold=MEM)
RETURNING = dict(phase=Phase.RETURNING, fenced=True, pods=(GATED,), hold=HoldFacts("18", running=True))

CASES = [
    # lend
    ("lending-fence-first", facts(phase=Phase.LENDING), True, Step.FENCE),
    ("lending-gate-closed-before-sleep", facts(phase=Phase.LENDING, fenced=True), True, Step.CLOSE_GATE),
    ("lending-gate-never-set-is-not-closed", facts(phase=Phase.LENDING, fenced=True, pods=(dataclasses.replace(POD, awake=None),)),
     True, Step.CLOSE_GATE),
    ("lending-sleep-once-out-of-service", facts(phase=Phase.LENDING, fenced=True, pods=(GATED,)), True, Step.SLEEP_REPLICA),
    # the memory hold is queued while the node is still ours (serving hold, drain): the first job it takes
    ("lending-asleep-mem-hold-before-release", facts(phase=Phase.LENDING, fenced=True, pods=(GATED,), warm=ASLEEP), True,
     Step.SUBMIT_MEM_HOLD),
    ("lending-asleep-no-mem-hold-in-time-abandoned", facts(phase=Phase.LENDING, phase_since=NOW - 700, fenced=True, pods=(GATED,),
                                                           warm=ASLEEP), True, Step.ABORT_LEND),
    ("lending-asleep-mem-hold-before-resume", facts(phase=Phase.LENDING, fenced=True, pods=(GATED,), warm=ASLEEP, hold=None), True,
     Step.SUBMIT_MEM_HOLD),
    ("lending-asleep-released-to-slurm", facts(phase=Phase.LENDING, fenced=True, pods=(GATED,), warm=ASLEEP, mem_hold=MEM), True,
     Step.CANCEL_HOLD),
    ("lending-asleep-mem-hold-pending-is-enough", facts(phase=Phase.LENDING, fenced=True, pods=(GATED,), warm=ASLEEP,
                                                        mem_hold=HoldFacts("30", running=False)), True, Step.CANCEL_HOLD),
    ("lending-asleep-resume", facts(phase=Phase.LENDING, fenced=True, pods=(GATED,), warm=ASLEEP, hold=None, mem_hold=MEM), True,
     Step.RESUME),
    ("lending-asleep-marked-lent", facts(phase=Phase.LENDING, fenced=True, pods=(GATED,), warm=ASLEEP, hold=None,
                                         slurm_drained_by_us=False, mem_hold=MEM), True, Step.MARK_LENT),
    ("lending-pod-lost-after-mem-hold-cold", facts(phase=Phase.LENDING, fenced=True, pods=(), warm=COLD, mem_hold=MEM), True,
     Step.CANCEL_MEM_HOLD),
    ("lending-asleep-gate-reopened-closed-again", facts(phase=Phase.LENDING, fenced=True, warm=ASLEEP), True, Step.CLOSE_GATE),
    ("lending-asleep-pod-lost", facts(phase=Phase.LENDING, fenced=True, pods=(), warm=ASLEEP), True, Step.WARM_LOST),
    # the pool's setting only starts a lend: not warm, or two replicas, or a failed sleep -> the cold path
    ("lending-cold-pool", facts(phase=Phase.LENDING, fenced=True), False, Step.MARK_POD),
    ("lending-two-pods-cold", facts(phase=Phase.LENDING, fenced=True, pods=(POD, dataclasses.replace(POD, name="b"))),
     True, Step.MARK_POD),
    ("lending-sleep-failed-cold", facts(phase=Phase.LENDING, fenced=True, pods=(GATED,), warm=COLD), True, Step.MARK_POD),
    ("lending-sleep-failed-pod-marked-evicted", facts(phase=Phase.LENDING, fenced=True, warm=COLD,
                                                    pods=(dataclasses.replace(GATED, deletion_cost=LENDING_POD_DELETION_COST),)),
     True, Step.EVICT_POD),
    # lent warm: the invariant is checked every tick
    ("lent-warm-at-rest-asks-is-sleeping", facts(**LENT), True, Step.CHECK_ASLEEP),
    ("lent-warm-at-rest-pool-setting-irrelevant", facts(**LENT), False, Step.CHECK_ASLEEP),
    # the cold fallback's pod goes by the scale, marked first (never evicted first: a PDB refuses it
    # while the pool's other replicas sleep, and an unmarked scale-down may take another node's)
    ("lent-engine-woke-or-silent-pod-marked", facts(**{**LENT, "warm": COLD}), True, Step.MARK_POD),
    ("lent-cold-marked-pod-evicted-if-it-outlives-the-scale", facts(**{**LENT, "warm": COLD, "pods": (MARKED_GATED,)}), True,
     Step.DELETE_ASLEEP),
    ("lent-cold-no-pod-at-rest", facts(**{**LENT, "warm": COLD, "pods": (), "mem_hold": None}), True, None),
    ("lent-warm-mem-hold-pending-at-rest", facts(**{**LENT, "mem_hold": HoldFacts("30", running=False)}), True, Step.CHECK_ASLEEP),
    ("lent-warm-mem-hold-lost", facts(**{**LENT, "mem_hold": None}), True, Step.MEM_HOLD_LOST),
    ("lent-warm-mem-hold-lost-pod-first", facts(**{**LENT, "mem_hold": None, "pods": ()}), True, Step.WARM_LOST),
    ("lent-cold-pod-goes-before-mem-hold-goes", facts(**{**LENT, "warm": COLD}), True, Step.MARK_POD),
    ("lent-cold-pod-terminating-mem-hold-kept", facts(**{**LENT, "warm": COLD,
                                                         "pods": (dataclasses.replace(GATED, terminating=True),)}), True, None),
    ("lent-cold-pod-gone-mem-hold-cancelled", facts(**{**LENT, "warm": COLD, "pods": ()}), True, Step.CANCEL_MEM_HOLD),
    ("lent-never-warm-orphan-cancelled", facts(**{**LENT, "warm": None, "pods": ()}), True, Step.CANCEL_MEM_HOLD),
    ("lent-warm-pod-lost", facts(**{**LENT, "pods": ()}), True, Step.WARM_LOST),
    ("lent-warm-pod-terminating-is-lost", facts(**{**LENT, "pods": (dataclasses.replace(GATED, terminating=True),)}),
     True, Step.WARM_LOST),
    ("lent-warm-pod-made-ready-closed", facts(**{**LENT, "pods": (POD,)}), True, Step.CLOSE_GATE),
    ("lent-cold-record-rests", facts(**{**LENT, "pods": (), "warm": COLD, "mem_hold": None}), True, None),
    # reclaim: preemption as today; a lost pod is noticed at once
    ("reclaiming-warm-hold-as-today", facts(**{**LENT, "phase": Phase.RECLAIMING, "research_jobs": ("9",)}), True, Step.SUBMIT_HOLD),
    ("reclaiming-warm-pod-lost", facts(**{**LENT, "phase": Phase.RECLAIMING, "pods": ()}), True, Step.WARM_LOST),
    # the memory hold goes right after the serving hold: while it runs Slurm never preempts for the serving hold
    ("reclaiming-mem-hold-cancelled-after-hold", facts(**{**LENT, "phase": Phase.RECLAIMING, "research_jobs": ("9",),
                                                          "hold": HoldFacts("18", running=False)}), True, Step.CANCEL_MEM_HOLD),
    ("reclaiming-then-preemption-as-today", facts(**{**LENT, "phase": Phase.RECLAIMING, "research_jobs": ("9",), "mem_hold": None,
                                                     "hold": HoldFacts("18", running=False)}), True, Step.WAIT_HOLD),
    ("reclaiming-drained-mem-hold-before-returning", facts(**{**LENT, "phase": Phase.RECLAIMING, "slurm_drained_by_us": True,
                                                             "hold": HoldFacts("18", running=True)}), True, Step.CANCEL_MEM_HOLD),
    ("reclaiming-drained-returning", facts(**{**LENT, "phase": Phase.RECLAIMING, "slurm_drained_by_us": True, "mem_hold": None,
                                              "hold": HoldFacts("18", running=True)}), True, Step.MARK_RETURNING),
    # returning: wake instead of a cold start, gate, unfence
    ("returning-wake", facts(**RETURNING, warm=ASLEEP), True, Step.WAKE_REPLICA),
    ("returning-mem-hold-cancelled-before-wake", facts(**RETURNING, warm=ASLEEP, mem_hold=MEM), True, Step.CANCEL_MEM_HOLD),
    ("returning-wake-record-drives-not-pool", facts(**RETURNING, warm=ASLEEP), False, Step.WAKE_REPLICA),
    ("returning-wake-never-with-research", facts(**RETURNING, warm=ASLEEP, research_jobs=("9",)), True, Step.BLOCKED),
    ("returning-wake-never-undrained", facts(**RETURNING, warm=ASLEEP, slurm_drained_by_us=False), True, Step.DRAIN),
    ("returning-wake-waits-drain-saved", facts(**RETURNING, warm=ASLEEP, slurm_drained_at=NOW - 1, slurm_now=NOW), True,
     Step.WAIT_DRAIN_SAVED),
    ("returning-asleep-pod-lost", facts(**{**RETURNING, "pods": ()}, warm=ASLEEP), True, Step.WARM_LOST),
    ("returning-awake-gate-opened", facts(**RETURNING, warm=AWAKE), True, Step.OPEN_GATE),
    ("returning-awake-unfenced", facts(**{**RETURNING, "pods": (POD,)}, warm=AWAKE), True, Step.UNFENCE),
    ("returning-awake-serving", facts(**{**RETURNING, "pods": (POD,), "fenced": False}, warm=AWAKE), True, Step.MARK_SERVING),
    # the cold fallback: the pod that was asleep goes, a new one starts and gets its gate
    ("returning-wake-failed-pod-marked", facts(**RETURNING, warm=COLD), True, Step.MARK_POD),
    ("returning-wake-failed-marked-pod-evicted", facts(**{**RETURNING, "pods": (MARKED_GATED,)}, warm=COLD), True,
     Step.DELETE_ASLEEP),
    ("returning-cold-old-pod-going-unfence", facts(**{**RETURNING, "pods": (dataclasses.replace(GATED, terminating=True),)}, warm=COLD),
     True, Step.UNFENCE),
    ("returning-cold-new-pod-gate", facts(**{**RETURNING, "fenced": False,
                                             "pods": (PodFacts("vllm-new", ready=False, terminating=False),)}, warm=COLD),
     True, Step.OPEN_GATE),
    ("returning-cold-new-pod-ready", facts(**{**RETURNING, "fenced": False, "pods": (dataclasses.replace(POD, name="vllm-new"),)},
                                           warm=COLD), True, Step.MARK_SERVING),
    # serving again
    ("serving-record-cleared", facts(warm=AWAKE), True, Step.CLEAR_WARM),
    ("serving-orphan-mem-hold-cancelled", facts(mem_hold=MEM), True, Step.CANCEL_MEM_HOLD),
    ("serving-orphan-mem-hold-cancelled-first", facts(warm=AWAKE, mem_hold=MEM), False, Step.CANCEL_MEM_HOLD),
    ("serving-cold-record-cleared", facts(warm=COLD, pods=(dataclasses.replace(POD, name="vllm-new"),)), True, Step.CLEAR_WARM),
    ("serving-asleep-pod-never-serves", facts(warm=COLD, pods=(GATED,)), True, Step.MARK_POD),
    ("serving-asleep-marked-pod-evicted", facts(warm=COLD, pods=(MARKED_GATED,)), True, Step.DELETE_ASLEEP),
    ("serving-warm-pool-new-pod-gate", facts(pods=(dataclasses.replace(POD, awake=None),)), True, Step.OPEN_GATE),
    ("serving-cold-pool-gate-untouched", facts(pods=(dataclasses.replace(POD, awake=None),)), False, None),
    ("serving-gate-never-opened-with-research", facts(pods=(dataclasses.replace(POD, awake=None),), research_jobs=("9",),
                                                      hold=None, slurm_drained_by_us=False), True, Step.ENSURE_HOLD),
]


@pytest.mark.parametrize(("node", "warm", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_next_step_warm(node: NodeFacts, warm: bool, expected: Step | None) -> None:
    assert next_step(node, now=NOW, scaled_down=True, warm=warm, drain_saved_after_s=5.0, lend_timeout_s=600.0) is expected


def test_a_node_lent_warm_keeps_its_replica_counted_until_it_is_lost() -> None:
    serving = facts()
    lending = facts(phase=Phase.LENDING, fenced=True, pods=(GATED,))
    lent = facts(**LENT)
    assert desired_replicas([serving, lending, lent]) == 3
    assert desired_replicas([serving, facts(**{**LENT, "phase": Phase.RECLAIMING})]) == 2
    assert desired_replicas([serving, facts(**{**LENT, "pods": ()})]) == 1  # lost: its replacement is not wanted
    assert desired_replicas([serving, facts(**{**LENT, "warm": COLD, "pods": ()})]) == 1


# --- convergence when writes are lost and sleep/wake fail -----------------------------------


@dataclasses.dataclass
class World:
    """Both schedulers and the replica, enough to apply each step's effect."""

    phase: Phase
    fenced: bool = False
    pod: PodFacts | None = POD
    engine_asleep: bool = False
    warm: WarmRecord | None = None
    drained: bool = True
    hold: HoldFacts | None = dataclasses.field(default_factory=lambda: HoldFacts("17", running=True))
    research: tuple[str, ...] = ()
    requeued: int = 0
    pods_made: int = 0
    mem_hold: HoldFacts | None = None

    def facts(self) -> NodeFacts:
        return NodeFacts(
            name="gpu-node-01", phase=self.phase, phase_since=NOW, fenced=self.fenced,
            pods=(self.pod,) if self.pod else (), slurm_drained_by_us=self.drained, slurm_drained_by_other=False,
            slurm_down=False, slurm_allocated=bool(self.hold or self.research), hold=self.hold,
            research_jobs=self.research, warm=self.warm, mem_hold=self.mem_hold,
        )

    def check_invariant(self) -> None:
        # research never runs beside a pod that may serve: only a sleeping one, out of the Service
        if self.research:
            assert self.fenced
            if self.pod is not None and not self.pod.terminating:
                assert self.pod.awake is False and self.engine_asleep and not self.pod.ready, self
                if self.phase in (Phase.LENDING, Phase.LENT):  # its memory kept from them (reclaiming: going)
                    assert self.mem_hold is not None, self

    def apply(self, step: Step, rng: random.Random, fail: float) -> None:
        pod = self.pod
        if step is Step.FENCE:
            self.fenced = True
        elif step is Step.UNFENCE:
            self.fenced = False
        elif step in (Step.CLOSE_GATE, Step.OPEN_GATE) and pod:
            awake = step is Step.OPEN_GATE
            self.pod = dataclasses.replace(pod, awake=awake, ready=awake and not self.engine_asleep and pod.name != "")
        elif step is Step.SLEEP_REPLICA and pod:
            ok = rng.random() >= fail
            if ok:
                self.engine_asleep = True
            self.warm = WarmRecord(WarmState.ASLEEP if ok else WarmState.COLD, pod.name)
        elif step is Step.WAKE_REPLICA and pod:
            ok = rng.random() >= fail
            if ok:
                self.engine_asleep = False
            self.warm = WarmRecord(WarmState.AWAKE if ok else WarmState.COLD, pod.name)
        elif step is Step.CHECK_ASLEEP and pod and self.warm and not self.engine_asleep:
            self.warm = WarmRecord(WarmState.COLD, pod.name)
        elif step is Step.WARM_LOST and self.warm:
            self.warm = WarmRecord(WarmState.COLD, self.warm.pod)
        elif step is Step.CLEAR_WARM:
            self.warm = None
        elif step is Step.MARK_POD and pod:
            self.pod = dataclasses.replace(pod, deletion_cost=LENDING_POD_DELETION_COST)
        elif step in (Step.WAIT_PODS_GONE, Step.EVICT_POD, Step.DELETE_ASLEEP) and pod:
            if pod.terminating:
                self.pod, self.engine_asleep = None, False
            else:
                self.pod = dataclasses.replace(pod, terminating=True, ready=False)
        elif step is Step.SUBMIT_MEM_HOLD:
            self.mem_hold = HoldFacts("m", running=not self.drained)
        elif step is Step.CANCEL_MEM_HOLD:
            self.mem_hold = None
        elif step is Step.MEM_HOLD_LOST and self.warm:
            self.warm = WarmRecord(WarmState.COLD, self.warm.pod)
        elif step is Step.CANCEL_HOLD:
            self.hold = None
        elif step is Step.RESUME:
            self.drained = False
            if rng.random() < 0.7:
                self.research = ("r1",)
        elif step is Step.SUBMIT_HOLD:
            self.hold = HoldFacts("h", running=not self.research)
        elif step is Step.REQUEUE_JOBS or (step is Step.WAIT_HOLD and self.hold and self.mem_hold is None):
            # Slurm preempts for the whole-node serving hold only once no memory hold runs there
            self.requeued += len(self.research)
            self.research = ()
            if self.hold:
                self.hold = HoldFacts(self.hold.job_id, running=True)
        elif step in (Step.DRAIN, Step.ENSURE_DRAINED):
            self.drained = True
        elif step is Step.ENSURE_HOLD:
            self.hold = HoldFacts("h2", running=not self.research)
        elif step is Step.WAIT_READY:
            if pod is not None and pod.terminating:  # the evicted pod ends by itself
                self.pod, self.engine_asleep = None, False
            elif pod is None and not self.fenced:  # the ReplicaSet's new pod: cold start
                self.pods_made += 1
                self.pod = PodFacts(f"vllm-new{self.pods_made}", ready=False, terminating=False, awake=None)
            elif pod is not None and pod.awake and not pod.terminating:
                self.pod = dataclasses.replace(pod, ready=True)
        elif step in (Step.MARK_LENT, Step.MARK_RETURNING, Step.MARK_SERVING):
            self.phase = {Step.MARK_LENT: Phase.LENT, Step.MARK_RETURNING: Phase.RETURNING, Step.MARK_SERVING: Phase.SERVING}[step]


def drive(world: World, target: Phase, rng: random.Random, loss: float, fail: float) -> list[Step]:
    done: list[Step] = []
    for _tick in range(300):
        world.check_invariant()
        step = next_step(world.facts(), now=NOW + 1000, scaled_down=True, warm=True)
        if step is Step.CHECK_ASLEEP and world.phase is target and world.engine_asleep:
            return done  # lent warm, at rest: only the per-pass is_sleeping probe
        if step is None:
            if world.phase is target:
                return done
            raise AssertionError(f"stuck at rest in {world.phase} before reaching {target}: {world}")
        assert step is not Step.BLOCKED, world
        if rng.random() >= loss:  # the write happened before the crash, or not
            world.apply(step, rng, fail)
            done.append(step)
    raise AssertionError(f"did not converge: {world}")


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10_000), loss=st.floats(0.0, 0.6), fail=st.sampled_from([0.0, 0.3, 1.0]))
def test_warm_lend_then_reclaim_converges_with_lost_writes_and_failed_wakes(seed: int, loss: float, fail: float) -> None:
    rng = random.Random(seed)
    world = World(phase=Phase.LENDING)  # the policy decided to lend
    drive(world, Phase.LENT, rng, loss, fail)
    assert not world.drained and world.hold is None
    if world.warm is not None and world.warm.state is WarmState.ASLEEP:
        assert world.pod is not None and world.engine_asleep and world.pod.awake is False
        assert world.mem_hold is not None  # a warm-lent node carries its memory hold
    else:
        assert world.pod is None  # the sleep failed: lent cold
    world.phase = Phase.RECLAIMING
    done = drive(world, Phase.SERVING, rng, loss, fail)
    assert world.pod is not None and world.pod.ready and world.pod.awake and not world.engine_asleep
    assert world.drained and not world.fenced and world.research == () and world.warm is None and world.mem_hold is None
    if fail == 0.0:
        assert Step.DELETE_ASLEEP not in done and world.pod.name == POD.name  # woken, never cold-started
    if fail == 1.0:
        assert Step.WAKE_REPLICA not in done or Step.DELETE_ASLEEP in done


@pytest.mark.parametrize("lost_at", ["lent", "reclaiming", "returning"])
def test_a_sleeping_pod_lost_at_any_phase_ends_serving_cold(lost_at: str) -> None:
    rng = random.Random(3)
    world = World(phase=Phase.LENDING)
    drive(world, Phase.LENT, rng, 0.0, 0.0)
    if lost_at == "lent":
        world.pod = None
    world.phase = Phase.RECLAIMING
    if lost_at == "reclaiming":
        world.pod = None
    while world.phase is Phase.RECLAIMING:
        step = next_step(world.facts(), now=NOW + 1000, scaled_down=True, warm=True)
        assert step is not None
        world.apply(step, rng, 0.0)
    if lost_at == "returning":
        world.pod = None
    drive(world, Phase.SERVING, rng, 0.0, 0.0)
    assert world.pod is not None and world.pod.name.startswith("vllm-new") and world.pod.ready
