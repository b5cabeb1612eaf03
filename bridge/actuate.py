"""Carries out lifecycle steps and policy actions through the adapters' write sides.

The actuator decides nothing: ``bridge.lifecycle.next_step`` names the step, the policy
names the nodes to move. Each write is idempotent, so a step repeated after a crash is
harmless. Every transition is logged (``node``, ``phase``, ``step``, ``reason``) and shown
as a Kubernetes Event on the node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, TypeVar

from bridge import logs
from bridge.adapters.protocols import KubeWriter, PoolTarget, RequeueOutcome, SleepControl, SlurmWriter, outcome
from bridge.errors import AdapterError
from bridge.lifecycle import LENDING_POD_DELETION_COST, WAITS, NodeFacts, PodFacts, PreemptedJob, Step, past_grace, warm_pod
from bridge.model import Action, ActionKind, Phase, SlurmJob, Tier, WarmRecord, WarmState
from bridge.observe import LAUNCH_FAILED_HELD
from bridge.policy.victims import job_loss_gpu_hours
from bridge.preemption import EVENT_REASON as PREEMPTION_EVENT
from bridge.preemption import preemption_message
from bridge.reconcile import Intents

log = logs.get(__name__)

# Write points reported to ``Actuator.after_write`` besides the lifecycle's own step names.
SCALE_POINT = "scale"  # a pool's Deployment scale
RELEASE_POINT = "release_job"  # a research job Slurm held, released
REQUEST_POINT = "request"  # an operator's request, carried out or refused
START_POINTS = {ActionKind.LEND: "start_lending", ActionKind.RECLAIM: "start_reclaiming"}  # a policy action's first mark
MAX_PARALLEL_WAKES = 16  # engines woken at once in one pass (each its own HTTP call, waiting on its GPUs)
TIER_POINT = "set_tier"  # a lend's Slurm partition (the fast tier), written before its first mark
RETRY_LOG_S = 60.0  # a sleep vLLM refuses, retried each pass, is logged again after this long (or a new reason)


def _no_hook(point: str) -> None:
    """The product's default: nothing happens after a write."""


def _no_sleep_control(pool: str, ip: str | None) -> SleepControl:
    """No pool lends warm: a warm step (only from a record left on a node) falls back cold."""
    raise AdapterError("vllm", f"pool {pool}: no sleep control (warm_lending is off)")


# Event reasons shown by `kubectl describe node` (CamelCase, as Kubernetes' own).
EVENT_REASONS: Mapping[Step | Phase, str] = {
    Phase.SERVING: "GpuBridgeServing",
    Phase.LENDING: "GpuBridgeLending",
    Phase.LENT: "GpuBridgeLent",
    Phase.RECLAIMING: "GpuBridgeReclaiming",
    Phase.RETURNING: "GpuBridgeReturning",
    Step.EVICT_POD: "GpuBridgeEvicting",
    Step.ABORT_LEND: "GpuBridgeLendAborted",
    Step.BLOCKED: "GpuBridgeBlocked",
    Step.REQUEUE_JOBS: "GpuBridgeRequeued",
    Step.CLEAR_SLURM_DRAIN: "GpuBridgeSlurmDrainCleared",
    Step.TAKE_OVER_DRAIN: "GpuBridgeSlurmDrainTakenOver",
    Step.SLEEP_REPLICA: "GpuBridgeReplicaAsleep",
    Step.WAKE_REPLICA: "GpuBridgeReplicaAwake",
    Step.WARM_LOST: "GpuBridgeWarmLost",
    Step.DELETE_ASLEEP: "GpuBridgeWarmColdFallback",
    Step.MEM_HOLD_LOST: "GpuBridgeMemoryHoldLost",
}
WARM_FAILED_EVENT = "GpuBridgeWarmFailed"  # a sleep or wake failed: the cold path from here on

_MARKS: Mapping[Step, Phase] = {
    Step.ADOPT: Phase.SERVING,
    Step.ADOPT_LENT: Phase.LENT,
    Step.MARK_LENT: Phase.LENT,
    Step.MARK_RETURNING: Phase.RETURNING,
    Step.MARK_SERVING: Phase.SERVING,
}


@dataclass(slots=True)
class StepRecord:
    """What one write did (for logs, metrics and the latency breakdown): a lifecycle step, or
    a write point (``START_POINTS``, ``REQUEST_POINT``, ``SCALE_POINT``, ``RELEASE_POINT``)."""

    node: str  # the node (a pool for a scale)
    step: Step | str
    changed: bool
    at: float
    detail: str = ""
    error: AdapterError | None = None  # the write failed (nothing is known to have changed)


K = TypeVar("K")
T = TypeVar("T")
V = TypeVar("V")
Handler = Callable[["Actuator", Step, NodeFacts, PoolTarget, float], tuple[bool, str]]


@dataclass
class _PassBatch(Generic[K, V]):
    """Steps of one pass that share one call, made at the first of them for all: the
    REQUEUE_JOBS steps one ``requeue_jobs`` (the due jobs of all their nodes), the DRAIN steps one
    ``drain_nodes`` and the hold steps one ``submit_holds`` (one read each, not one per node, in a
    mass reclaim), the WAKE_REPLICA steps their engines' wakes at once (seconds each, which one
    after another would add up); each step then takes its own outcome, and a failed call fails
    every one of them with its error."""

    todo: dict[str, K]  # job -> the run preempted; node -> its drain reason, or None (a hold); node -> its pool and pod to wake
    got: dict[str, V] | AdapterError | None = None  # once made: the outcomes, or why it failed

    def outcomes(self, call: Callable[[dict[str, K]], dict[str, V]]) -> dict[str, V]:
        if self.got is None:
            try:
                self.got = call(self.todo)
            except AdapterError as exc:  # nothing known to be done
                self.got = exc
        if isinstance(self.got, AdapterError):
            raise self.got
        return self.got


def _batched(batch: _PassBatch[K, T | AdapterError] | None, key: str, call: Callable[[dict[str, K]], dict[str, T | AdapterError]],
             alone: Callable[[], T]) -> T:
    """``key``'s outcome of its pass's shared call (its error raised), or ``alone()`` outside a pass."""
    if batch is None or key not in batch.todo:
        return alone()
    return outcome(batch.outcomes(call), key)


@dataclass
class Actuator:
    kube: KubeWriter
    slurm: SlurmWriter
    clock: Callable[[], float]
    targets: Mapping[str, PoolTarget] = field(default_factory=dict)  # pool -> its Deployment
    # Called with the write point (a Step value, SCALE_POINT or a START_POINTS value) after each
    # write that changed something: the lab's crash injection hooks in here; nothing by default.
    after_write: Callable[[str], None] = field(default=_no_hook)
    # the preempt partition's GraceTime (Slurm's, read at start-up): only jobs Slurm preempted
    # whose grace is over are requeued; None = none ever is
    grace_s: float | None = None
    tiers: Mapping[Tier, str] = field(default_factory=dict)  # tier -> its partition; empty: no fast tier
    # (pool, pod IP) -> the pod's vLLM sleep mode (bridge.adapters.vllm.sleep_controls: warm pools only)
    sleep_control: Callable[[str, str | None], SleepControl] = field(default=_no_sleep_control)
    # pool -> pools[].drain_s: for that long into a warm lend a failed sleep is retried each pass,
    # not taken as a failure (vLLM refuses to sleep while requests are in flight, and the ones
    # the replica had when its gate closed take that long to finish); absent: no retry
    sleep_retry_s: Mapping[str, float] = field(default_factory=dict)
    # pool -> pools[].warm_hold_mb: the memory hold's size on a node lent warm (warm pools only)
    mem_hold_mb: Mapping[str, int] = field(default_factory=dict)
    _requeues: _PassBatch[int | None, RequeueOutcome] | None = field(default=None, init=False, repr=False)  # the pass being applied
    _drains: _PassBatch[str, bool | AdapterError] | None = field(default=None, init=False, repr=False)
    _holds: _PassBatch[None, str | AdapterError] | None = field(default=None, init=False, repr=False)
    _wakes: _PassBatch[tuple[PoolTarget, PodFacts], AdapterError | None] | None = field(default=None, init=False, repr=False)
    _refused: dict[str, tuple[str, float]] = field(default_factory=dict, init=False, repr=False)  # node -> sleep refusal logged, when

    def apply(self, intents: Intents) -> list[StepRecord]:
        """Carry out what ``bridge.reconcile`` decided, in its order. A write that fails is
        logged (the event names are stable) and recorded with its error; the rest go on."""
        obs, now = intents.observation, intents.observation.view.now
        for node, why in intents.stuck:
            self._event(node, "GpuBridgeNotReady", why, "Warning")
        out = [self._try("action_not_started", a.node, START_POINTS[a.kind], partial(self.start, a, now=now, jobs=obs.view.jobs))
               for a in intents.starts]
        out += [self._try("request_failed", n, REQUEST_POINT, partial(self.request, n, r, o, now=now), request=r)
                for n, r, o in intents.requests]
        self._requeues = _PassBatch({j.job_id: j.restart_count for s, f, _ in intents.steps if s is Step.REQUEUE_JOBS
                                     for j in past_grace(f, self.grace_s)})
        self._drains = _PassBatch({f.name: _drain_text(self.targets[p]) for s, f, p in intents.steps if s is Step.DRAIN})
        self._holds = _PassBatch({f.name: None for s, f, _ in intents.steps if s in (Step.SUBMIT_HOLD, Step.ENSURE_HOLD)})
        self._wakes = _PassBatch({f.name: (self.targets[p], pod) for s, f, p in intents.steps
                                  if s is Step.WAKE_REPLICA and (pod := warm_pod(f)) is not None})
        out += [self._try("step_failed", f.name, s, partial(self.execute, s, f, self.targets[p], now=now if s is Step.BLOCKED else None),
                          phase=str(f.phase)) for s, f, p in intents.steps]
        self._requeues = self._drains = self._holds = self._wakes = None
        out += [self._try("scale_failed", p, SCALE_POINT, partial(self.scale_pool, self.targets[p], n), replicas=n)
                for p, n in intents.scales]
        out += [self._try("slurm_release_failed", j, RELEASE_POINT, partial(self.release_job, j, LAUNCH_FAILED_HELD, n))
                for j, n in intents.releases]
        return out

    def _try(self, failed: str, node: str, point: Step | str, write: Callable[[], StepRecord | bool], **kw: str | int) -> StepRecord:
        try:
            got = write()
        except AdapterError as exc:
            log.warning(failed, node=node, step=str(point), error=str(exc), **kw)
            return StepRecord(node, point, False, self.clock(), error=exc)
        return got if isinstance(got, StepRecord) else StepRecord(node, point, got, self.clock())

    def start(self, action: Action, *, now: float, jobs: Mapping[str, SlurmJob] | None = None) -> bool:
        """Begin a policy action: record the first transit phase on the node, and tell each
        job a reclaim preempts on the node, with the work it loses (``gpu-bridge web`` reads it)."""
        phase = Phase.LENDING if action.kind is ActionKind.LEND else Phase.RECLAIMING
        if action.kind is ActionKind.LEND and self.tiers:  # the tier lives in Slurm, set before the mark
            if self.slurm.set_tier(action.node, self.tiers[action.tier]):
                self.after_write(TIER_POINT)
        changed = self._mark(action.node, phase, action.detail, now)
        if changed:
            self.after_write(START_POINTS[action.kind])
        log.info("node_transition_started", node=action.node, pool=action.pool, phase=str(phase),
                 reason=str(action.reason), detail=action.detail, jobs=list(action.jobs))
        for job in (jobs[j] for j in action.jobs if jobs is not None and j in jobs):
            grace_s = self.grace_s or 0.0
            # a Normal Event: a fact people (and ``gpu-bridge web``) read back
            message = preemption_message(job_id=job.job_id, node=action.node, grace_s=grace_s,
                                         lost_gpu_hours=job_loss_gpu_hours(job, now, grace_s),
                                         checkpoint_time=job.checkpoint_time)
            self._event(action.node, PREEMPTION_EVENT, message)
        return changed

    def request(self, node: str, request: str, outcome: Action | str, *, now: float) -> bool:
        """Carry out an operator's request that passed the safety checks, or say why not;
        either way the request is removed from the node."""
        if isinstance(outcome, Action):
            log.info("request_accepted", node=node, request=request)
            self.start(outcome, now=now)
        else:
            log.warning("request_refused", node=node, request=request, reason=outcome)
            self._event(node, "GpuBridgeRequestRefused", f"{request} refused: {outcome}", "Warning")
        self.kube.set_request(node, None)
        return True

    def execute(self, step: Step, facts: NodeFacts, pool: PoolTarget, *, now: float | None = None) -> StepRecord:
        """Run one step for a node (``_STEPS``: each step's write) at ``now`` (default: the clock's)."""
        now = self.clock() if now is None else now
        handler = _STEPS.get(step)
        changed, detail = handler(self, step, facts, pool, now) if handler is not None else (False, "")
        said = (step not in WAITS or step is Step.BLOCKED) and (changed or step is not Step.CHECK_ASLEEP)
        if said and self._news(step, facts.name, changed, detail, now):
            log.info("node_step", node=facts.name, pool=pool.name, phase=str(facts.phase), step=str(step), changed=changed, detail=detail)
        if changed:
            self.after_write(str(step))
        return StepRecord(facts.name, step, changed, self.clock(), detail)

    def _news(self, step: Step, node: str, changed: bool, detail: str, now: float) -> bool:
        """A sleep vLLM refuses is retried each pass (``sleep_retry_s``): said when it starts,
        then only for a new reason or every ``RETRY_LOG_S``, not on every pass."""
        if step is not Step.SLEEP_REPLICA or changed:
            self._refused.pop(node, None)
            return True
        said = self._refused.get(node)
        if said is not None and said[0] == detail and now - said[1] < RETRY_LOG_S:
            return False
        self._refused[node] = (detail, now)
        return True

    def release_job(self, job_id: str, reason: str, node: str | None) -> StepRecord:
        """Release a research job Slurm itself held (``reason``), logged and, when the node
        it last ran on is known and ours, shown as an Event there."""
        changed = self.slurm.release(job_id, reason)
        if changed:
            msg = f"Slurm job {job_id} released: Slurm had held it ({reason}) after a failed launch; its run is gone"
            log.warning("slurm_job_released", job=job_id, node=node or "", reason=reason)
            if node:
                self._event(node, "GpuBridgeJobReleased", msg, "Warning")
            self.after_write(RELEASE_POINT)
        return StepRecord(node or "", RELEASE_POINT, changed, self.clock(), job_id)

    def requeue(self, due: Sequence[PreemptedJob]) -> dict[str, RequeueOutcome]:
        """Each of ``due``'s outcome: from the pass's one ``requeue_jobs`` (made at its first
        REQUEUE_JOBS step, for every node's due jobs), or a call of its own outside a pass."""
        batch = self._requeues
        if batch is None or any(j.job_id not in batch.todo for j in due):
            return self.slurm.requeue_jobs({j.job_id: j.restart_count for j in due})
        return batch.outcomes(self.slurm.requeue_jobs)

    def scale_pool(self, pool: PoolTarget, replicas: int) -> bool:
        changed = self.kube.scale(pool.namespace, pool.deployment, replicas)
        if changed:
            log.info("pool_scaled", pool=pool.name, deployment=pool.deployment, replicas=replicas)
            self.after_write(SCALE_POINT)
        return changed

    def _mark(self, node: str, phase: Phase, reason: str, now: float) -> bool:
        changed = self.kube.set_phase(node, phase, reason, now)
        if changed:
            self._event(node, EVENT_REASONS[phase], reason or f"phase {phase}")
        return changed

    def _event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None:
        try:
            self.kube.emit_event(node, reason, message, event_type)
        except AdapterError as exc:  # an Event is a courtesy: never fail a transition on it
            log.warning("event_not_emitted", node=node, reason=reason, error=str(exc))


def _mark_reason(step: Step, facts: NodeFacts) -> str:
    if step is Step.ADOPT:
        return "adopted by gpu-bridge as a serving node"
    if step is Step.ADOPT_LENT:
        return f"adopted by gpu-bridge as lent: Slurm jobs {', '.join(facts.research_jobs)} run on it"
    if step is Step.MARK_LENT:
        if facts.warm is not None and facts.warm.state is WarmState.ASLEEP:
            return f"replica {facts.warm.pod} asleep, out of the Service; released to the Slurm preemptible partition"
        return "no serving pod left; released to the Slurm preemptible partition"
    if step is Step.MARK_RETURNING:
        return "research jobs requeued and node drained in Slurm; returning to serving"
    return "serving replica Ready"


def _requeue_detail(requeued: list[str], not_running: list[str]) -> str:
    """What the requeue step did, and only that."""
    parts = []
    if requeued:
        parts.append(f"requeued {', '.join(requeued)}")
    if not_running:
        parts.append(f"{', '.join(not_running)} no longer running preempted (ended or requeued by Slurm): nothing to requeue")
    return "GraceTime over: " + "; ".join(parts)


def _blocked_reason(facts: NodeFacts) -> str:
    if facts.slurm_drained_by_other:
        return "drained in Slurm by someone else: gpu-bridge never undoes an administrator's drain"
    if facts.research_jobs:
        return f"research jobs {', '.join(facts.research_jobs)} still on a node returning to serving"
    return "blocked"


# --- each step's write: (changed, detail) ------------------------------------------------------

def _mark_step(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    detail = _mark_reason(step, f)
    return a._mark(f.name, _MARKS[step], detail, now), detail


def _drain_text(pool: PoolTarget) -> str:
    return f"serving (pool {pool.name})"


def _drain(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """The node drained for serving: with the pass's other drains (one Slurm read for all, at the
    first DRAIN step: ``_PassBatch``), or on its own outside a pass."""
    return _batched(a._drains, f.name, a.slurm.drain_nodes, lambda: a.slurm.drain(f.name, _drain_text(pool))), ""


def _hold(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """The node's hold job: with the pass's other holds (one Slurm read for all, at the first:
    ``_PassBatch``), or on its own outside a pass."""
    return True, _batched(a._holds, f.name, a.slurm.submit_holds, lambda: a.slurm.submit_hold(f.name))


def _deletion_cost(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """MARK_POD: the lending node's replica is the one the scale-down removes; UNMARK_POD undoes it."""
    marking, changed = step is Step.MARK_POD, False
    for pod in f.pods:
        if not pod.terminating and (pod.deletion_cost == LENDING_POD_DELETION_COST) is not marking:
            changed |= a.kube.set_pod_deletion_cost(pool.namespace, pod.name, LENDING_POD_DELETION_COST if marking else 0)
    return changed, ""


def _evict(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    outcomes = [(pod.name, str(a.kube.evict(pool.namespace, pod.name))) for pod in f.pods if not pod.terminating]
    detail = ", ".join(f"{name}: {outcome}" for name, outcome in outcomes)
    # A PDB-blocked eviction wrote nothing: not "changed", so the loop does not chain
    # it again at once (it hammered the API ~50 evictions/s with an Event each).
    changed = any(outcome != "blocked" for _, outcome in outcomes)
    if changed:
        a._event(f.name, EVENT_REASONS[Step.EVICT_POD], f"evicting serving pod(s) left after scale-down: {detail}")
    return changed, detail


def _abort_lend(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    live = [p.name for p in f.pods if not p.terminating]
    if f.warm is not None and f.warm.state is WarmState.ASLEEP and f.mem_hold is None:
        detail = (f"lend abandoned: no memory hold for the sleeping replica {f.warm.pod} after {now - f.phase_since:.0f} s "
                  "(Slurm refused it: slurm.warm_partition missing, pools[].warm_hold_mb over the node's memory?); serving again")
    else:
        detail = (f"lend abandoned: serving pod(s) {', '.join(live)} still running after {now - f.phase_since:.0f} s "
                  "(a PodDisruptionBudget refusing the eviction?); serving again")
    changed = a.kube.set_phase(f.name, Phase.SERVING, detail, now)
    if changed:
        log.warning("lend_abandoned", node=f.name, pool=pool.name, phase=str(Phase.SERVING), detail=detail)
        a._event(f.name, EVENT_REASONS[Step.ABORT_LEND], detail, "Warning")
    return changed, detail


def _cancel_hold(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """CANCEL_HOLD: the node's hold job; CANCEL_MEM_HOLD: its memory hold (warm lending)."""
    mem = step is Step.CANCEL_MEM_HOLD
    cancelled = (a.slurm.cancel_mem_hold if mem else a.slurm.cancel_hold)(f.name)
    ids = ", ".join(cancelled)
    return bool(cancelled), (f"memory hold {ids} cancelled" if mem else f"cancelled {ids}") if cancelled else ""


def _requeue(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """The node's jobs past their grace, requeued with the pass's others (``Actuator.requeue``);
    a job refused or whose requeue failed fails the step with its error, after the Event."""
    due = past_grace(f, a.grace_s)
    outcomes = a.requeue(due)
    got = [outcomes[j.job_id] for j in due]
    requeued = [o.job_id for o in got if o.requeued]
    detail = _requeue_detail(requeued, [o.job_id for o in got if not o.requeued and o.error is None])
    if requeued:
        a._event(f.name, EVENT_REASONS[Step.REQUEUE_JOBS], detail)
    failed = next((o.error for o in got if o.error is not None), None)
    if failed is not None:
        raise failed
    return bool(requeued), detail


def _own_drain(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    own = f.slurm_own_drain
    if own is None:
        return False, ""
    if step is Step.CLEAR_SLURM_DRAIN:
        changed = a.slurm.clear_own_drain(f.name, own)
        detail = f"Slurm's own drain {own!r} lifted: nothing runs on the node any more; lent again"
    else:
        changed = a.slurm.take_over_drain(f.name, own, f"serving (pool {pool.name})")
        detail = f"Slurm's own drain {own!r} replaced by gpu-bridge's: the node stays drained"
    if not changed:
        return False, f"Slurm's own drain {own!r} not handled: the node changed since it was read"
    log.warning("slurm_own_drain_handled", node=f.name, pool=pool.name, phase=str(f.phase), step=str(step), slurm_reason=own)
    a._event(f.name, EVENT_REASONS[step], detail, "Warning")
    return True, detail


def _gate(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """CLOSE_GATE: every live pod out of the Service (a lent node has only its sleeping one);
    OPEN_GATE: every live pod's gate open (the lifecycle never asks while research runs)."""
    awake = step is Step.OPEN_GATE
    pods = [p for p in f.pods if not p.terminating and p.awake is not awake]
    changed = False
    for pod in pods:
        changed |= a.kube.set_pod_awake(pool.namespace, pod.name, awake)
    return changed, ", ".join(p.name for p in pods)


def _warm_call(a: Actuator, pool: PoolTarget, pod: PodFacts, wake: bool) -> None:
    """Sleep (level 1) or wake the pod's engine and check it says so; AdapterError if not."""
    ctl = a.sleep_control(pool.name, pod.ip)
    if wake:
        ctl.wake_up()
    elif not ctl.is_sleeping():  # a sleep repeated after a crash: already asleep is done
        ctl.sleep(1)
    if ctl.is_sleeping() is wake:
        raise AdapterError("vllm", f"{pod.name}: still {'asleep' if wake else 'awake'} after {'wake_up' if wake else 'sleep'}")


def _wake(a: Actuator, f: NodeFacts, pool: PoolTarget, pod: PodFacts) -> None:
    """Wake ``pod``'s engine: with the pass's other wakes, all at once at the first of them
    (``_PassBatch``), or on its own outside a pass; AdapterError if it did not wake."""
    batch = a._wakes
    if batch is None or f.name not in batch.todo:
        _warm_call(a, pool, pod, True)
        return
    err = batch.outcomes(partial(_wake_all, a))[f.name]
    if err is not None:
        raise err


def _wake_all(a: Actuator, todo: Mapping[str, tuple[PoolTarget, PodFacts]]) -> dict[str, AdapterError | None]:
    """Each node's wake, concurrently (vLLM answers ``/wake_up`` once awake); its error or None."""

    def one(node: str) -> AdapterError | None:
        pool, pod = todo[node]
        try:
            _warm_call(a, pool, pod, True)
        except AdapterError as exc:
            return exc
        return None

    if len(todo) == 1:
        return {n: one(n) for n in todo}
    with ThreadPoolExecutor(max_workers=min(len(todo), MAX_PARALLEL_WAKES), thread_name_prefix="wake") as ex:
        return dict(zip(todo, ex.map(one, todo), strict=True))


def _sleep_or_wake(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """The engine's call, then the record: asleep/awake on success, cold on any failure (the
    lifecycle then deletes the pod and takes the cold path), except a sleep that fails within
    the pool's ``sleep_retry_s`` of the lend's start: vLLM refuses to sleep while requests are
    in flight, so it is tried again next pass, the gate still closed. The record is written last, so a
    crash before it repeats the call, which is harmless (sleep is skipped when asleep, a
    wake of an awake engine is a no-op)."""
    wake = step is Step.WAKE_REPLICA
    pod = warm_pod(f) if wake else next((p for p in f.pods if not p.terminating), None)
    if pod is None:
        return False, "no pod"
    try:
        if wake:
            _wake(a, f, pool, pod)
        else:
            _warm_call(a, pool, pod, wake)
    except AdapterError as exc:
        retry_s = a.sleep_retry_s.get(pool.name, 0.0)
        if not wake and now - f.phase_since < retry_s:  # its in-flight requests may still be running: next pass
            return False, (f"sleep of {pod.name} not done ({exc}): retried until {retry_s:g} s into the lend "
                           "(pools[].drain_s), then lent cold")
        return _fall_back_cold(a, step, f, pool, pod.name,
                               f"{'wake' if wake else 'sleep'} of {pod.name} failed ({exc}): {'reclaimed' if wake else 'lent'} cold")
    state = WarmState.AWAKE if wake else WarmState.ASLEEP
    changed = a.kube.set_warm(f.name, WarmRecord(state, pod.name))
    detail = f"{pod.name} {state}"
    if changed:
        a._event(f.name, EVENT_REASONS[step], detail)
    return changed, detail


def _fall_back_cold(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, pod: str, detail: str) -> tuple[bool, str]:
    """A warm call that failed: the node's record turns ``cold/<pod>`` (the lifecycle then takes
    the cold path), with a Warning Event and log."""
    changed = a.kube.set_warm(f.name, WarmRecord(WarmState.COLD, pod))
    log.warning("warm_fallback", node=f.name, pool=pool.name, phase=str(f.phase), step=str(step), reason=detail)
    a._event(f.name, WARM_FAILED_EVENT, detail, "Warning")
    return changed, detail


def _lost_cold(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, detail: str) -> tuple[bool, str]:
    """What a sleeping replica needs is gone (its pod, its memory hold): the record turns cold,
    with the step's Warning Event and log, once."""
    if f.warm is None:
        return False, ""
    changed = a.kube.set_warm(f.name, WarmRecord(WarmState.COLD, f.warm.pod))
    if changed:
        log.warning("warm_lost", node=f.name, pool=pool.name, phase=str(f.phase), step=str(step), reason=detail)
        a._event(f.name, EVENT_REASONS[step], detail, "Warning")
    return changed, detail


def _warm_lost(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    pod = f.warm.pod if f.warm is not None else ""
    return _lost_cold(a, step, f, pool, f"the sleeping replica {pod} is gone (phase {f.phase}): the node is reclaimed cold")


def _check_asleep(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """A lent node's engine must still sleep: awake (restarted under Slurm's jobs, weights back
    on their GPUs) or not answering, it is recorded cold with a Warning; the lifecycle then
    evicts its pod and the node stays lent, counted cold."""
    pod = warm_pod(f)
    if pod is None:
        return False, "no pod"
    try:
        why = "" if a.sleep_control(pool.name, pod.ip).is_sleeping() else f"{pod.name} is awake on a lent node"
    except AdapterError as exc:
        why = f"{pod.name} does not answer ({exc})"
    if not why:
        return False, ""
    return _fall_back_cold(a, step, f, pool, pod.name, f"{why}: its pod is evicted, the node stays lent and counts as cold")


def _submit_mem_hold(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """The memory hold of a node lent warm, queued before it is released to Slurm. A pool with
    no size for it (warm lending turned off mid-lend) lends the node cold instead."""
    mb = a.mem_hold_mb.get(pool.name)
    if mb is None:
        pod = f.warm.pod if f.warm is not None else ""
        return _fall_back_cold(a, step, f, pool, pod,
                               f"no pools[].warm_hold_mb for pool {pool.name} (warm_lending off?): {pod} lent cold")
    return True, f"memory hold {a.slurm.submit_mem_hold(f.name, mb)}: {mb} MB"


def _mem_hold_lost(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """A node lent asleep without its memory hold (an administrator cancelled it, it failed):
    Slurm may give research jobs the memory the sleeping weights hold, so the replica goes
    (recorded cold, then evicted: its memory is freed) rather than a new hold preempting them."""
    pod = f.warm.pod if f.warm is not None else ""
    return _lost_cold(a, step, f, pool, f"the memory hold of the sleeping replica {pod} is gone from Slurm: its memory is no "
                                        "longer kept from research jobs; the replica is evicted and the node counts as cold")


def _gpu_held(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """The GPUs of a node returning asleep stayed short of free memory (or unknown) past
    ``pools[].wake_gpu_wait_s``: the wake is given up, the same cold fallback as a failed wake."""
    pod = f.warm.pod if f.warm is not None else ""
    free = "unknown" if f.gpu_free_mib is None else f"{f.gpu_free_mib:g} MiB"
    return _fall_back_cold(a, step, f, pool, pod, f"gpu_memory_held: lowest free GPU memory {free} (less the engine's "
                                                  f"need with auto) {now - f.phase_since:.0f} s into returning "
                                                  f"(pools[].wake_gpu_free_mib): {pod} not woken, reclaimed cold; "
                                                  f"{gpu_holders(f)}")


def gpu_holders(f: NodeFacts) -> str:
    """What Slurm says may still hold a node's GPU memory, for the operator who must free it
    (the bridge only waits, it never kills): research jobs still on it, an administrator's or
    Slurm's drain (``Kill task failed``), or nothing Slurm knows of."""
    jobs = sorted({*f.research_jobs, *(j.job_id for j in f.research_preempted)})
    said = [f"research job(s) still on it in Slurm: {', '.join(jobs[:5])}{' ...' if len(jobs) > 5 else ''}"] if jobs else []
    if f.slurm_drained_by_other:
        said.append("drained in Slurm, not by gpu-bridge (Slurm drains a node 'Kill task failed' when a job's processes "
                    "outlive it)")
    return "; ".join(said) or "Slurm shows no research job on it: look for a process outside Slurm (nvidia-smi on the node)"


def _delete_asleep(a: Actuator, step: Step, f: NodeFacts, pool: PoolTarget, now: float) -> tuple[bool, str]:
    """The cold fallback's pod, marked and left out of the scale, still there: evict it (the
    ReplicaSet normally removes it first; a PodDisruptionBudget may refuse, retried with backoff)."""
    pod = warm_pod(f)
    if pod is None:
        return False, ""
    outcome = str(a.kube.evict(pool.namespace, pod.name))
    detail = f"{pod.name}: {outcome}"
    changed = outcome != "blocked"
    if changed:
        a._event(f.name, EVENT_REASONS[step], f"evicting the replica that was asleep: {detail}")
    return changed, detail


_STEPS: Mapping[Step, Handler] = {
    **{s: _mark_step for s in _MARKS},
    Step.ENSURE_DRAINED: _drain, Step.DRAIN: _drain,
    Step.ENSURE_HOLD: _hold, Step.SUBMIT_HOLD: _hold,
    Step.FENCE: lambda a, s, f, p, now: (a.kube.fence(f.name), ""),
    Step.UNFENCE: lambda a, s, f, p, now: (a.kube.unfence(f.name), ""),
    Step.MARK_POD: _deletion_cost, Step.UNMARK_POD: _deletion_cost,
    Step.EVICT_POD: _evict,
    Step.ABORT_LEND: _abort_lend,
    Step.CANCEL_HOLD: _cancel_hold, Step.CANCEL_MEM_HOLD: _cancel_hold,
    Step.REQUEUE_JOBS: _requeue,
    Step.RESUME: lambda a, s, f, p, now: (a.slurm.resume(f.name), ""),
    Step.CLEAR_SLURM_DRAIN: _own_drain, Step.TAKE_OVER_DRAIN: _own_drain,
    Step.BLOCKED: lambda a, s, f, p, now: (False, _blocked_reason(f)),
    Step.CLOSE_GATE: _gate, Step.OPEN_GATE: _gate,
    Step.SLEEP_REPLICA: _sleep_or_wake, Step.WAKE_REPLICA: _sleep_or_wake,
    Step.WARM_LOST: _warm_lost,
    Step.CHECK_ASLEEP: _check_asleep,
    Step.DELETE_ASLEEP: _delete_asleep,
    Step.CLEAR_WARM: lambda a, s, f, p, now: (a.kube.set_warm(f.name, None), ""),
    Step.SUBMIT_MEM_HOLD: _submit_mem_hold,
    Step.MEM_HOLD_LOST: _mem_hold_lost,
    Step.GPU_HELD: _gpu_held,
}
