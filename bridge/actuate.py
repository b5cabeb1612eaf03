"""Carries out lifecycle steps and policy actions through the adapters' write sides.

The actuator decides nothing: ``bridge.lifecycle.next_step`` names the step, the policy
names the nodes to move. Each write is idempotent, so a step repeated after a crash is
harmless. Every transition is logged (``node``, ``phase``, ``step``, ``reason``) and shown
as a Kubernetes Event on the node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bridge import logs
from bridge.adapters.protocols import KubeWriter, PoolTarget, SlurmWriter
from bridge.errors import AdapterError
from bridge.lifecycle import LENDING_POD_DELETION_COST, NodeFacts, Step, past_grace
from bridge.model import Action, ActionKind, Phase

log = logs.get(__name__)

# Write points reported to ``Actuator.after_write`` besides the lifecycle's own step names.
SCALE_POINT = "scale"  # a pool's Deployment scale
START_POINTS = {ActionKind.LEND: "start_lending", ActionKind.RECLAIM: "start_reclaiming"}  # a policy action's first mark


def _no_hook(point: str) -> None:
    """The product's default: nothing happens after a write."""


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
}

_MARKS: Mapping[Step, Phase] = {
    Step.ADOPT: Phase.SERVING,
    Step.ADOPT_LENT: Phase.LENT,
    Step.MARK_LENT: Phase.LENT,
    Step.MARK_RETURNING: Phase.RETURNING,
    Step.MARK_SERVING: Phase.SERVING,
}


@dataclass(slots=True)
class StepRecord:
    """What one executed step did (for logs, metrics and the latency breakdown)."""

    node: str
    step: Step
    changed: bool
    at: float
    detail: str = ""


@dataclass
class Actuator:
    kube: KubeWriter
    slurm: SlurmWriter
    clock: Callable[[], float]
    on_step: Callable[[StepRecord], None] = field(default=lambda record: None)
    # Called with the write point (a Step value, SCALE_POINT or a START_POINTS value) after each
    # write that changed something: the lab's crash injection hooks in here; nothing by default.
    after_write: Callable[[str], None] = field(default=_no_hook)
    # the preempt partition's GraceTime (Slurm's, read at start-up): only jobs Slurm preempted
    # whose grace is over are requeued; None = none ever is
    grace_s: float | None = None

    def start(self, action: Action, *, now: float) -> None:
        """Begin a policy action: record the first transit phase on the node."""
        phase = Phase.LENDING if action.kind is ActionKind.LEND else Phase.RECLAIMING
        if self._mark(action.node, phase, action.detail, now):
            self.after_write(START_POINTS[action.kind])
        log.info(
            "node_transition_started",
            node=action.node,
            pool=action.pool,
            phase=str(phase),
            reason=str(action.reason),
            detail=action.detail,
            jobs=list(action.jobs),
        )

    def execute(self, step: Step, facts: NodeFacts, pool: PoolTarget, *, now: float) -> bool:
        """Run one step for a node; True if something was written."""
        node = facts.name
        changed = False
        detail = ""
        if step in _MARKS:
            phase = _MARKS[step]
            detail = _mark_reason(step, facts)
            changed = self._mark(node, phase, detail, now)
        elif step in (Step.ENSURE_DRAINED, Step.DRAIN):
            changed = self.slurm.drain(node, f"serving (pool {pool.name})")
        elif step in (Step.ENSURE_HOLD, Step.SUBMIT_HOLD):
            detail = self.slurm.submit_hold(node)
            changed = True
        elif step is Step.FENCE:
            changed = self.kube.fence(node)
        elif step is Step.UNFENCE:
            changed = self.kube.unfence(node)
        elif step is Step.MARK_POD:
            for pod in facts.pods:
                if not pod.terminating and pod.deletion_cost != LENDING_POD_DELETION_COST:
                    changed |= self.kube.set_pod_deletion_cost(pool.namespace, pod.name, LENDING_POD_DELETION_COST)
        elif step is Step.EVICT_POD:
            outcomes = []
            for pod in facts.pods:
                if not pod.terminating:
                    outcomes.append((pod.name, str(self.kube.evict(pool.namespace, pod.name))))
            detail = ", ".join(f"{name}: {outcome}" for name, outcome in outcomes)
            # A PDB-blocked eviction wrote nothing: not "changed", so the loop does not chain
            # it again at once (it hammered the API ~50 evictions/s with an Event each).
            changed = any(outcome != "blocked" for _, outcome in outcomes)
            if changed:
                self._event(node, EVENT_REASONS[Step.EVICT_POD], f"evicting serving pod(s) left after scale-down: {detail}")
        elif step is Step.ABORT_LEND:
            live = [p.name for p in facts.pods if not p.terminating]
            detail = (
                f"lend abandoned: serving pod(s) {', '.join(live)} still running after "
                f"{now - facts.phase_since:.0f} s (a PodDisruptionBudget refusing the eviction?); serving again"
            )
            changed = self.kube.set_phase(node, Phase.SERVING, detail, now)
            if changed:
                log.warning("lend_abandoned", node=node, pool=pool.name, phase=str(Phase.SERVING), detail=detail)
                self._event(node, EVENT_REASONS[Step.ABORT_LEND], detail, "Warning")
        elif step is Step.UNMARK_POD:
            for pod in facts.pods:
                if not pod.terminating and pod.deletion_cost == LENDING_POD_DELETION_COST:
                    changed |= self.kube.set_pod_deletion_cost(pool.namespace, pod.name, 0)
        elif step is Step.CANCEL_HOLD:
            cancelled = self.slurm.cancel_hold(node)
            changed = bool(cancelled)
            detail = f"cancelled {', '.join(cancelled)}" if cancelled else ""
        elif step is Step.REQUEUE_JOBS:
            due = past_grace(facts, self.grace_s)
            requeued = [j.job_id for j in due if self.slurm.requeue(j.job_id, restart_count=j.restart_count)]
            changed = bool(requeued)
            detail = _requeue_detail(requeued, [j.job_id for j in due if j.job_id not in requeued])
            if changed:
                self._event(node, EVENT_REASONS[Step.REQUEUE_JOBS], detail)
        elif step is Step.RESUME:
            changed = self.slurm.resume(node)
        elif step in (Step.CLEAR_SLURM_DRAIN, Step.TAKE_OVER_DRAIN) and facts.slurm_own_drain is not None:
            own = facts.slurm_own_drain
            if step is Step.CLEAR_SLURM_DRAIN:
                changed = self.slurm.clear_own_drain(node, own)
                detail = f"Slurm's own drain {own!r} lifted: nothing runs on the node any more; lent again"
            else:
                changed = self.slurm.take_over_drain(node, own, f"serving (pool {pool.name})")
                detail = f"Slurm's own drain {own!r} replaced by gpu-bridge's: the node stays drained"
            if changed:
                log.warning("slurm_own_drain_handled", node=node, pool=pool.name, phase=str(facts.phase),
                            step=str(step), slurm_reason=own)
                self._event(node, EVENT_REASONS[step], detail, "Warning")
            else:
                detail = f"Slurm's own drain {own!r} not handled: the node changed since it was read"
        elif step is Step.BLOCKED:
            detail = _blocked_reason(facts)
        record = StepRecord(node, step, changed, self.clock(), detail)
        if step not in (Step.WAIT_HOLD, Step.WAIT_PODS_GONE, Step.WAIT_DRAIN_SAVED, Step.WAIT_READY):
            log.info("node_step", node=node, pool=pool.name, phase=str(facts.phase), step=str(step), changed=changed, detail=detail)
        self.on_step(record)
        if changed:
            self.after_write(str(step))
        return changed

    def release_job(self, job_id: str, reason: str, node: str | None) -> bool:
        """Release a research job Slurm itself held (``reason``), logged and, when the node
        it last ran on is known and ours, shown as an Event there."""
        changed = self.slurm.release(job_id, reason)
        if changed:
            msg = f"Slurm job {job_id} released: Slurm had held it ({reason}) after a failed launch; its run is gone"
            log.warning("slurm_job_released", job=job_id, node=node or "", reason=reason)
            if node:
                self._event(node, "GpuBridgeJobReleased", msg, "Warning")
            self.after_write("release_job")
        return changed

    def report(self, node: str, reason: str, message: str) -> None:
        """A Warning Event on the node, for what an operator must look at."""
        self._event(node, reason, message, "Warning")

    def note(self, node: str, reason: str, message: str) -> None:
        """A Normal Event on the node: a fact people (and ``gpu-bridge web``) read back."""
        self._event(node, reason, message)

    def refuse(self, node: str, request: str, why: str) -> None:
        """Show an operator why their request was not carried out."""
        self._event(node, "GpuBridgeRequestRefused", f"{request} refused: {why}", "Warning")

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
