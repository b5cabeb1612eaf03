"""The node lifecycle as pure code: from what is observed on a node, the next idempotent step.

A node's phase lives on the node (Kubernetes label + annotations); everything else is read
back from Kubernetes and Slurm every tick. So after a crash at any point the same function,
given the same facts, names the same next step, and a step that already happened is simply
observed as done: the daemon converges without state of its own.

Lend:    serving -> lending (fence, steer the Deployment's scale-down to this node's pod,
         wait until no serving pod is left) -> release to Slurm (cancel our hold job,
         resume the node) -> lent.
Reclaim: lent -> reclaiming (submit a hold job pinned to the node in the high-tier
         partition: Slurm preempts the research jobs with GraceTime and REQUEUE; wait until
         the hold job runs, i.e. the node is empty) -> drain with our reason (no research
         job can land, even across slurmd/slurmctld restarts) -> returning (unfence; the
         Deployment scales up onto it) -> wait for a Ready replica -> serving.

Warm lending (a pool with ``warm_lending``, docs/warm-lending.md): the lend keeps the node's one
replica and puts it to sleep instead: lending (fence, close the bridge's readiness gate so the
pod leaves the Service, sleep level 1, recorded on the node as ``asleep/<pod>``, submit the
memory hold: a job pinned to the node that keeps the sleeping weights' host memory from research
jobs) -> release to Slurm as above -> lent. Reclaim: the serving hold job, then the memory hold
cancelled at once (Slurm cannot start the whole-node serving hold, so never preempts for it,
while the never-preempted memory hold runs), then as above up to the drain, then returning: wake
the replica (recorded ``awake/<pod>``), open its gate, unfence -> serving. A warm-lent node
carries exactly one memory hold; any other node none (an orphan is cancelled). A sleep or wake
that fails, a sleeping pod that is lost, or a lent node whose memory hold is gone (an
administrator cancelled it, it failed), is recorded ``cold/<pod>``: the pod is evicted and the
cold path (scale-down at lend, a new pod at reclaim) takes over. The record, not the pool's setting,
drives a node already lent warm.

Invariant: research jobs never run on a node while a serving pod may be placed or run on
it. A node is unfenced in Kubernetes only after it is drained by us in Slurm and its hold
job runs (or Slurm reports it down with nothing allocated); it is released to Slurm only
after no serving pod is left on it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from bridge.model import EVICT_AFTER_S, Phase, WarmRecord, WarmState

# The deletion cost put on the pod of a node being lent, so that the ReplicaSet removes
# exactly that pod when the Deployment is scaled down (lower cost goes first).
LENDING_POD_DELETION_COST = -10_000


class Step(enum.StrEnum):
    """One write (or a wait) of the lifecycle. Names say what the actuator does."""

    ADOPT = "adopt"  # an unmanaged pool node: record phase serving
    ADOPT_LENT = "adopt_lent"  # an unmanaged pool node running research jobs: record phase lent
    ENSURE_DRAINED = "ensure_drained"  # serving node not drained by us in Slurm: drain it
    ENSURE_HOLD = "ensure_hold"  # serving node without our hold job: submit one
    FENCE = "fence"  # cordon + taint
    MARK_POD = "mark_pod"  # low pod-deletion-cost on the node's serving pod
    EVICT_POD = "evict_pod"  # the scale-down removed another pod: evict ours (PDB-respecting)
    ABORT_LEND = "abort_lend"  # the serving pod outlived the lend timeout: the node serves again
    UNMARK_POD = "unmark_pod"  # a serving node's pod still carries the lending deletion cost
    WAIT_PODS_GONE = "wait_pods_gone"
    CANCEL_HOLD = "cancel_hold"
    RESUME = "resume"  # undrain in Slurm (only our own drain)
    MARK_LENT = "mark_lent"
    SUBMIT_HOLD = "submit_hold"
    WAIT_HOLD = "wait_hold"  # research jobs are being preempted (GraceTime)
    REQUEUE_JOBS = "requeue_jobs"  # GraceTime is over but Slurm has not ended them yet: requeue
    DRAIN = "drain"
    MARK_RETURNING = "mark_returning"
    UNFENCE = "unfence"
    WAIT_DRAIN_SAVED = "wait_drain_saved"  # our drain is younger than slurmctld's state-save delay
    WAIT_READY = "wait_ready"
    MARK_SERVING = "mark_serving"
    CLEAR_SLURM_DRAIN = "clear_slurm_drain"  # lent node: lift Slurm's own drain (slurm.own_drain_reasons)
    TAKE_OVER_DRAIN = "take_over_drain"  # other phases: Slurm's own drain becomes ours (stays drained)
    BLOCKED = "blocked"  # something outside our control: report, do nothing
    # warm lending
    CLOSE_GATE = "close_gate"  # the bridge's readiness condition False: the pod leaves the Service
    SLEEP_REPLICA = "sleep_replica"  # vLLM sleep level 1, then record asleep/<pod> (cold/<pod> if it fails)
    WARM_LOST = "warm_lost"  # the sleeping pod is gone: record cold/<pod> (an alarm)
    WAKE_REPLICA = "wake_replica"  # vLLM wake_up, then record awake/<pod> (cold/<pod> if it fails)
    DELETE_ASLEEP = "delete_asleep"  # the cold fallback's pod outlived the scale that left it out: evict it
    OPEN_GATE = "open_gate"  # the bridge's readiness condition True (never while research runs)
    CLEAR_WARM = "clear_warm"  # serving again: the warm record goes
    # each pass on a lent node recorded asleep: GET /is_sleeping; awake (an engine restarted
    # under research jobs) or silent -> recorded cold/<pod> and its pod evicted (DELETE_ASLEEP)
    CHECK_ASLEEP = "check_asleep"
    # the memory hold (slurm.warm_partition, gpu-bridge-warm:<node>, pools[].warm_hold_mb)
    SUBMIT_MEM_HOLD = "submit_mem_hold"  # lending, asleep: before the node is released to Slurm
    CANCEL_MEM_HOLD = "cancel_mem_hold"  # reclaiming (right after the serving hold), or an orphan
    MEM_HOLD_LOST = "mem_hold_lost"  # lent asleep without its memory hold: record cold/<pod> (an alarm)
    # returning asleep, pools[].wake_gpu_free_mib set: the GPUs are not known free yet (memory held, or unknown)
    WAIT_GPU_FREE = "wait_gpu_free"
    GPU_HELD = "gpu_held"  # still not free pools[].wake_gpu_wait_s into returning: record cold/<pod> (the wake is given up)


WAITS = frozenset({Step.WAIT_PODS_GONE, Step.WAIT_HOLD, Step.WAIT_DRAIN_SAVED, Step.WAIT_READY, Step.WAIT_GPU_FREE, Step.BLOCKED})


@dataclass(frozen=True, slots=True)
class PodFacts:
    """A serving pod bound to the node."""

    name: str
    ready: bool
    terminating: bool
    deletion_cost: int | None = None
    awake: bool | None = None  # the bridge's readiness condition gpu-bridge.io/awake; None = not set
    ip: str | None = None  # status.podIP: where warm lending reaches the vLLM server


@dataclass(frozen=True, slots=True)
class HoldFacts:
    """Our placeholder job on the node."""

    job_id: str
    running: bool  # False: pending (waiting for the research jobs to leave)


# Slurm's times are whole seconds (truncated): a grace is over only this much after
# PreemptTime + GraceTime, so it is never cut short by the rounding.
GRACE_ROUNDING_S = 1.0


@dataclass(frozen=True, slots=True)
class PreemptedJob:
    """A research job on the node whose preemption Slurm has recorded (its PreemptTime)."""

    job_id: str
    preempt_time: float  # slurmctld's clock, when its GraceTime began
    restart_count: int  # the run that was preempted: the requeue re-checks it is still that run
    grace_s: float | None = None  # its partition's GraceTime when not the preempt partition's (the fast tier)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """Everything the lifecycle needs about one node, read back from both schedulers."""

    name: str
    phase: Phase | None  # None: never managed by gpu-bridge
    phase_since: float
    fenced: bool  # cordoned and carrying our taint
    pods: tuple[PodFacts, ...]  # serving pods bound to this node
    slurm_drained_by_us: bool
    slurm_drained_by_other: bool  # an administrator's drain: never undone by us
    slurm_down: bool  # not responding / DOWN in Slurm
    slurm_allocated: bool  # slurmctld has any job (ours or research) allocated on it
    hold: HoldFacts | None
    research_jobs: tuple[str, ...]  # research jobs running on the node
    # Slurm's own drain reason (one of slurm.own_drain_reasons) when Slurm drained the node
    # itself and has nothing allocated or completing there any more; else None
    slurm_own_drain: str | None = None
    slurm_drained_at: float | None = None  # when our drain was set (Slurm's reason time), if known
    # research jobs of the preempt partition on the node that Slurm has preempted
    research_preempted: tuple[PreemptedJob, ...] = ()
    # slurmctld's clock when Slurm was read: Slurm's own times (PreemptTime, the drain's
    # reason time) are compared with it, never with ours (no clock skew); None = unknown
    slurm_now: float | None = None
    warm: WarmRecord | None = None  # warm lending's record on the node (None: never lent warm, or done)
    mem_hold: HoldFacts | None = None  # our memory-hold job for the node (pending or running), if any
    # the lowest free framebuffer (MiB) over the node's GPUs (dcgm-exporter), read only for a node
    # returning asleep in a pool with wake_gpu_free_mib; None = not read or unknown (counts as not free)
    gpu_free_mib: float | None = None


def gpu_short(facts: NodeFacts, need_mib: float | None) -> bool:
    """The free-GPU check's verdict for a node about to wake (``need_mib``: the pool's
    ``wake_gpu_need_mib``, None = no check): its reading unknown or below the need."""
    return need_mib is not None and (facts.gpu_free_mib is None or facts.gpu_free_mib < need_mib)


def warm_pod(facts: NodeFacts) -> PodFacts | None:
    """The live (not terminating) pod the warm record names, if any."""
    if facts.warm is None:
        return None
    return next((p for p in facts.pods if p.name == facts.warm.pod and not p.terminating), None)


def _asleep_check(facts: NodeFacts) -> Step | None:
    """A node lent warm keeps exactly its sleeping pod, out of the Service."""
    pod = warm_pod(facts)
    if pod is None:
        return Step.WARM_LOST
    if pod.awake is not False:
        return Step.CLOSE_GATE
    return None


def fallback_pod(facts: NodeFacts) -> PodFacts | None:
    """The pod a cold fallback removes: the live pod the warm record names once the record is
    ``cold`` (a failed sleep, wake or check), or on a node serving again, not ``awake``."""
    pod = warm_pod(facts)
    if pod is None or facts.warm is None:
        return None
    if facts.warm.state is WarmState.COLD or (facts.phase is Phase.SERVING and facts.warm.state is not WarmState.AWAKE):
        return pod
    return None


def _drop_cold_pod(pod: PodFacts, scaled_down: bool) -> Step:
    """The fallback's pod goes through the Deployment's scale, as a cold lend's does: marked
    cheapest first, then left out of the desired replicas (``desired_replicas``), so the
    ReplicaSet removes exactly it. Never an eviction first: with the pool's other replicas asleep
    (not Ready) a PodDisruptionBudget refuses it, and a scale that left the node out before its
    pod was marked let the ReplicaSet remove another node's sleeping replica. Evicted only if it
    outlives a written scale. ``pod``: the node's ``fallback_pod``."""
    if pod.deletion_cost != LENDING_POD_DELETION_COST:
        return Step.MARK_POD
    return Step.DELETE_ASLEEP if scaled_down else Step.WAIT_PODS_GONE


def asleep(facts: NodeFacts) -> bool:
    """The node's warm record says its replica sleeps there (lent warm, or returning to wake it)."""
    return facts.warm is not None and facts.warm.state is WarmState.ASLEEP


def past_grace(facts: NodeFacts, grace_s: float | None) -> tuple[PreemptedJob, ...]:
    """The jobs on the node whose preemption Slurm recorded and whose GraceTime (``grace_s``,
    Slurm's, read at start-up) is over by slurmctld's clock: the only ones ever requeued by
    gpu-bridge. None when either the grace or Slurm's clock is unknown (Slurm ends it itself)."""
    if grace_s is None or facts.slurm_now is None:
        return ()
    now = facts.slurm_now
    return tuple(j for j in facts.research_preempted
                 if j.job_id in facts.research_jobs
                 and now >= j.preempt_time + (grace_s if j.grace_s is None else j.grace_s) + GRACE_ROUNDING_S)


def next_step(
    facts: NodeFacts, *, now: float, scaled_down: bool, evict_after_s: float = EVICT_AFTER_S,
    grace_s: float | None = None, lend_timeout_s: float | None = None, drain_saved_after_s: float = 0.0,
    warm: bool = False, wake_gpu_free_mib: float | None = None, wake_gpu_wait_s: float = 0.0,
) -> Step | None:
    """The next step for a node, or None when it is at rest in its phase.

    ``grace_s``: the preempt partition's GraceTime (Slurm's, read at start-up). A research job
    Slurm preempted is requeued once that grace is over by slurmctld's clock (22.05 enforces
    the end of GraceTime only on its 30 s sweep, so a job can outlive its grace by that much);
    a job Slurm has not preempted is never requeued: it gets its signal and grace first.
    None: leave it all to Slurm.

    ``warm``: the pool lends warm (``pools[].warm_lending``); only a new lend reads it.

    ``wake_gpu_free_mib``: the free MiB each GPU must show before a sleeping replica is woken
    (None: no check); not known free ``wake_gpu_wait_s`` after the node turned returning (its
    ``phase_since``, on the node: a restart times it the same), the wake is given up for cold.

    ``scaled_down``: the pool's Deployment already has no replica counted for this node
    (``desired_replicas`` excludes it and the scale was written), so a remaining pod on a
    lending node means the ReplicaSet removed another pod; after ``evict_after_s`` in the
    phase it is evicted instead.
    """
    c = _Context(now=now, scaled_down=scaled_down, evict_after_s=evict_after_s, grace_s=grace_s, lend_timeout_s=lend_timeout_s,
                 drain_saved_after_s=drain_saved_after_s, warm=warm, wake_gpu_free_mib=wake_gpu_free_mib,
                 wake_gpu_wait_s=wake_gpu_wait_s)
    return _unowned(facts) if facts.phase is None else _BY_PHASE[facts.phase](facts, c)  # one function a phase


@dataclass(frozen=True, slots=True)
class _Context:
    """``next_step``'s arguments besides the node's facts (see there)."""

    now: float
    scaled_down: bool
    evict_after_s: float
    grace_s: float | None
    lend_timeout_s: float | None
    drain_saved_after_s: float
    warm: bool
    wake_gpu_free_mib: float | None
    wake_gpu_wait_s: float


def _unowned(facts: NodeFacts) -> Step:
    """Not ours yet: adopt it (as lent when Slurm is using it, fenced first)."""
    if facts.research_jobs and not facts.pods:
        # Slurm is using it: adopt it as lent (fenced first, so no serving pod lands)
        return Step.ADOPT_LENT if facts.fenced else Step.FENCE
    return Step.ADOPT


def _serving(facts: NodeFacts, c: _Context) -> Step | None:
    """Serving: research jobs off it, warm leftovers gone, the gate open, then held and drained in Slurm."""
    if facts.mem_hold is not None:
        return Step.CANCEL_MEM_HOLD  # an orphan (e.g. a crash): a serving node holds no memory for Slurm
    drained = facts.slurm_drained_by_us or facts.slurm_drained_by_other
    if facts.research_jobs:
        # Research on a serving node (adopted that way, or slipped in): Slurm preempts it
        # for our hold job, with its signal and GraceTime, as in a reclaim; never requeued
        # before that grace is over.
        if past_grace(facts, c.grace_s):
            return Step.REQUEUE_JOBS
        if facts.slurm_drained_by_other:
            return Step.BLOCKED  # an administrator's drain keeps our hold job from preempting
        if facts.hold is None:
            return Step.ENSURE_HOLD
        if facts.slurm_drained_by_us and not facts.hold.running:
            return Step.RESUME  # a drained node never starts the hold: lift our drain so it preempts
        return Step.WAIT_HOLD
    if facts.warm is not None:
        if (pod := fallback_pod(facts)) is not None:
            return _drop_cold_pod(pod, c.scaled_down)  # a pod left asleep (or failed) never serves: a new one starts cold
        return Step.CLEAR_WARM
    if c.warm and any(p.awake is not True and not p.terminating for p in facts.pods):
        return Step.OPEN_GATE  # the gate of a warm pool's pod (a new one, or an abandoned lend's)
    if facts.slurm_own_drain is not None:
        return Step.TAKE_OVER_DRAIN  # drained by Slurm itself: make the drain ours (never lifted)
    if facts.fenced:  # an abandoned lend (or a crash right after marking it serving)
        return Step.UNFENCE
    if any(p.deletion_cost == LENDING_POD_DELETION_COST and not p.terminating for p in facts.pods):
        return Step.UNMARK_POD  # else the next scale-down would remove this serving pod first
    if facts.hold is None and not drained and not facts.slurm_down:
        # Hold first, while the node is idle: it starts at once, and squeue shows who
        # holds the node. Then the drain, which survives slurmd/slurmctld restarts.
        return Step.ENSURE_HOLD
    return None if drained else Step.ENSURE_DRAINED


def _lending(facts: NodeFacts, c: _Context) -> Step | None:
    """Lending: fenced, the replica put to sleep (warm) or removed (cold), then released to Slurm."""
    if not facts.fenced:
        return Step.FENCE
    live = [p for p in facts.pods if not p.terminating]
    if asleep(facts):
        got = _asleep_check(facts)
        if got is None and facts.mem_hold is None:
            if c.lend_timeout_s is not None and c.now - facts.phase_since >= c.lend_timeout_s:
                return Step.ABORT_LEND  # never got its memory hold (sbatch refused it): abandoned, as any late lend
            # queued before the node is released: it is the first job the node takes (its
            # tier preempts a research job that got there first and leaves too little)
            return Step.SUBMIT_MEM_HOLD
        return got or _release(facts)
    if c.warm and facts.warm is None and len(live) == 1 and live[0].deletion_cost != LENDING_POD_DELETION_COST:
        # one replica to keep: out of the Service first, then asleep (else the cold path below)
        return Step.CLOSE_GATE if live[0].awake is not False else Step.SLEEP_REPLICA
    if any(p.deletion_cost != LENDING_POD_DELETION_COST for p in live):
        return Step.MARK_POD
    if live:
        if c.lend_timeout_s is not None and c.now - facts.phase_since >= c.lend_timeout_s:
            return Step.ABORT_LEND
        if c.scaled_down and c.now - facts.phase_since >= c.evict_after_s:
            return Step.EVICT_POD
        return Step.WAIT_PODS_GONE
    if facts.pods:  # terminating: vLLM drains in-flight requests within its grace
        return Step.WAIT_PODS_GONE
    if facts.mem_hold is not None:
        return Step.CANCEL_MEM_HOLD  # lent cold (its sleep failed, its pod lost): no memory to hold
    return _release(facts)


def _lent(facts: NodeFacts, c: _Context) -> Step | None:
    """Lent: the sleeping replica (warm) still asleep and its memory held, the release re-asserted."""
    if asleep(facts):
        got = _asleep_check(facts)
        if got is not None:
            return got
        if facts.mem_hold is None:
            # Slurm no longer keeps the sleeping weights' memory from research jobs: the
            # replica goes (cold), as for a lost pod, rather than a new hold preempting them
            return Step.MEM_HOLD_LOST
    elif (pod := fallback_pod(facts)) is not None:
        return _drop_cold_pod(pod, c.scaled_down)  # its engine woke or went silent under Slurm: the pod goes, the node stays lent
    elif facts.mem_hold is not None and not facts.pods:
        return Step.CANCEL_MEM_HOLD  # lent cold, the replica gone: its memory is Slurm's again
    # Re-assert the release (idempotent): e.g. a crash between resume and mark, or Slurm's
    # own drain ("Duplicate jobid" after a controller crash) with nothing running there
    release = _release(facts)
    if release is not Step.MARK_LENT:
        return release
    return Step.CHECK_ASLEEP if asleep(facts) else None


def _reclaiming(facts: NodeFacts, c: _Context) -> Step | None:
    """Reclaiming: the research jobs preempted by our hold job (requeued after their grace), then drained."""
    if asleep(facts) and warm_pod(facts) is None:
        return Step.WARM_LOST  # noticed now, not after the preemption: the plan counts it cold
    if facts.slurm_own_drain is not None:
        return Step.TAKE_OVER_DRAIN  # empty and drained: ours from now on, the reclaim goes on
    slurm_empty_and_down = facts.slurm_down and not facts.slurm_allocated
    if facts.slurm_drained_by_other and not facts.slurm_drained_by_us and not slurm_empty_and_down:
        return Step.BLOCKED  # an administrator's drain keeps our hold job from starting
    if facts.hold is None and not facts.slurm_drained_by_us:
        return Step.DRAIN if slurm_empty_and_down else Step.SUBMIT_HOLD
    if facts.mem_hold is not None:
        # right after the serving hold, not once the research jobs are gone: the serving hold
        # takes the whole node, so while the memory hold (never preempted) runs, Slurm never
        # starts it and never preempts the research jobs for it (shown on Slurm 22.05)
        return Step.CANCEL_MEM_HOLD
    if not facts.slurm_drained_by_us:
        if (facts.hold is not None and facts.hold.running and not facts.research_jobs) or slurm_empty_and_down:
            return Step.DRAIN
        if facts.research_jobs and past_grace(facts, c.grace_s):
            return Step.REQUEUE_JOBS
        return Step.WAIT_HOLD
    if facts.research_jobs:  # drained but jobs still on it: the hold has not got it yet
        return Step.WAIT_HOLD if facts.hold is not None else Step.SUBMIT_HOLD
    return Step.MARK_RETURNING


def _returning(facts: NodeFacts, c: _Context) -> Step | None:
    """Returning: drained in Slurm, the replica woken (warm) or started cold, unfenced, until it serves."""
    if facts.slurm_own_drain is not None:
        return Step.TAKE_OVER_DRAIN
    if not facts.slurm_drained_by_us and not facts.slurm_drained_by_other:
        return Step.DRAIN  # never unfence a node Slurm could still schedule on
    if facts.mem_hold is not None:
        return Step.CANCEL_MEM_HOLD  # before the wake: a node back to serving holds no memory apart in Slurm
    if facts.research_jobs:
        return Step.BLOCKED
    slurm_now = facts.slurm_now if facts.slurm_now is not None else c.now
    drain_young = (facts.slurm_drained_by_us and facts.slurm_drained_at is not None
                   and slurm_now - facts.slurm_drained_at < c.drain_saved_after_s)
    if asleep(facts):
        if warm_pod(facts) is None:
            return Step.WARM_LOST
        if drain_young:
            return Step.WAIT_DRAIN_SAVED
        if gpu_short(facts, c.wake_gpu_free_mib):
            # a job stuck in "Kill task failed" may still hold GPU memory: the wake would fail or OOM
            return Step.GPU_HELD if c.now - facts.phase_since >= c.wake_gpu_wait_s else Step.WAIT_GPU_FREE
        return Step.WAKE_REPLICA
    if (pod := fallback_pod(facts)) is not None:
        return _drop_cold_pod(pod, c.scaled_down)
    if facts.fenced and drain_young:
        return Step.WAIT_DRAIN_SAVED
    if (c.warm or facts.warm is not None) and any(p.awake is not True and not p.terminating for p in facts.pods):
        return Step.OPEN_GATE
    if facts.fenced:
        return Step.UNFENCE
    if any(p.ready and not p.terminating for p in facts.pods):
        return Step.MARK_SERVING
    return Step.WAIT_READY


_BY_PHASE: dict[Phase, Callable[[NodeFacts, _Context], Step | None]] = {
    Phase.SERVING: _serving, Phase.LENDING: _lending, Phase.LENT: _lent, Phase.RECLAIMING: _reclaiming,
    Phase.RETURNING: _returning,
}


def _release(facts: NodeFacts) -> Step:
    """Lending, the serving side done: give the node to Slurm."""
    if facts.hold is not None:
        return Step.CANCEL_HOLD
    if facts.slurm_drained_by_us:
        return Step.RESUME
    if facts.slurm_own_drain is not None:
        return Step.CLEAR_SLURM_DRAIN
    return Step.MARK_LENT


def counts_for_serving(facts: NodeFacts) -> bool:
    """Does this node get a replica in the Deployment's desired count? A node lent warm keeps
    its sleeping replica counted (else the ReplicaSet would remove it, or another pod)."""
    if facts.phase is None:  # not adopted yet: serving unless Slurm is using it
        return bool(facts.pods) or not facts.research_jobs
    if facts.phase in (Phase.LENDING, Phase.LENT, Phase.RECLAIMING) and asleep(facts):
        return warm_pod(facts) is not None
    return facts.phase in (Phase.SERVING, Phase.RETURNING)


def desired_replicas(nodes: list[NodeFacts]) -> int:
    """One replica per node that serves or is returning to serving.

    A lending node keeps its replica counted until its pod carries the low deletion cost,
    so the scale-down removes exactly that pod.
    """
    total = 0
    for n in nodes:
        if (pod := fallback_pod(n)) is not None:
            # a cold fallback's pod: counted until marked, then the scale-down removes it (a
            # node serving or returning is counted again once it is gone: a new pod, cold)
            total += pod.deletion_cost != LENDING_POD_DELETION_COST
        elif counts_for_serving(n):
            total += 1
        elif n.phase is Phase.LENDING:
            live = [p for p in n.pods if not p.terminating]
            if any(p.deletion_cost != LENDING_POD_DELETION_COST for p in live) or not n.fenced:
                total += 1
    return total
