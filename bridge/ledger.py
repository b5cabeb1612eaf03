"""What a pass did, into the log, the metrics, the policy memory and the reclaim timings.

The ``Ledger`` consumes each tick's snapshot (load samples into the memory), intents and step
records; it reads nothing, except the outlook metric's range queries (``Observer.outlook``),
and those only while metrics are served."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bridge import logs
from bridge.actuate import REQUEST_POINT, RELEASE_POINT, START_POINTS, StepRecord
from bridge.config import Config, PoolConfig
from bridge.lifecycle import Step
from bridge.metrics import BridgeMetrics, NullMetrics
from bridge.model import Action, ActionKind, Calibration, Governor, Phase, Plan, ReclaimMode, Tier, WarmState
from bridge.observe import LAUNCH_FAILED_HELD, Observation, Snapshot
from bridge.policy.forecast import horizon_s
from bridge.policy.memory import PoolMemory
from bridge.policy.outlook import OUTLOOK_HOURS, OUTLOOK_STEP_S, HourOutlook
from bridge.reconcile import RETRIED_STEPS, Intents, LoopState

log = logs.get(__name__)
Outlook = Callable[[PoolConfig, float, int, Calibration | None, Governor | None], tuple[HourOutlook, ...] | None]


@dataclass
class ReclaimTimes:
    """Timestamps of one reclaim, for the latency breakdown (logged and exported)."""

    node: str
    pool: str
    decided: float
    signal_t: float | None  # time of the load sample that called for it
    tier: Tier = Tier.NORMAL  # the tier the node was lent to (its grace bounds the Slurm release)
    slurm_released: float | None = None  # hold job running / node drained
    ready: float | None = None

    def breakdown(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.signal_t is not None:
            out["detection_s"] = self.decided - self.signal_t
        if self.slurm_released is not None:
            out["slurm_release_s"] = self.slurm_released - self.decided
        if self.ready is not None and self.slurm_released is not None:
            out["kubernetes_ready_s"] = self.ready - self.slurm_released
        if self.ready is not None:
            out["total_s"] = self.ready - (self.signal_t if self.signal_t is not None else self.decided)
        return out


@dataclass
class TickResult:
    observed: bool
    planned: Plan | None = None
    steps: list[StepRecord] = field(default_factory=list)
    in_transit: int = 0
    error: str | None = None
    more: bool = False  # the pass changed something or left work for the next: tick again at once


class Ledger:
    def __init__(self, config: Config, memory: Mapping[str, PoolMemory], state: LoopState,
                 metrics: BridgeMetrics | NullMetrics, outlook: Outlook, clock: Callable[[], float]) -> None:
        self.config, self.memory, self.state, self.metrics, self.outlook, self.clock = config, memory, state, metrics, outlook, clock
        self._outlook_at: dict[str, float] = {}  # pool -> when its outlook metric was last refreshed
        self._reclaims: dict[str, ReclaimTimes] = {}
        self.last_plan: Plan | None = None
        self.last_observation: Observation | None = None

    def count_error(self, system: str) -> None:
        self.metrics.adapter_errors.labels(system=system).inc()

    def remember(self, snapshot: Snapshot) -> Snapshot:
        """Each pool's new load sample into its memory (before the pass plans); errors counted."""
        for system in snapshot.errors:
            self.count_error(system)
        for name, r in snapshot.readings.items():
            if r.current is not None and name in self.memory:
                for sample in (*r.recovered, r.current):
                    self.memory[name].add(sample)
        return snapshot

    def consume(self, intents: Intents, records: list[StepRecord], now: float) -> TickResult:
        """What the pass saw, decided and did, into the log, the metrics and the loop state."""
        obs, plan, m, state = intents.observation, intents.plan, self.metrics, self.state
        self.last_observation = obs
        m.record_view(obs.view)
        for p in self.config.pools:
            ps = obs.view.pools.get(p.name)
            if ps is not None and ps.calibration is not None:
                m.record_calibration(pool=p.name, calibration=ps.calibration)
            if ps is not None and ps.governor is not None:
                m.record_governor(pool=p.name, governor=ps.governor)
            m.record_horizon(pool=p.name, horizon_s=ps.horizon_s if ps is not None and ps.horizon_s is not None else horizon_s(self.config, p))
        if plan is not None:
            state.last_plan_at, self.last_plan = now, plan
            m.record_plan(plan)
            self._refresh_outlook(now, obs)
            for d in plan.pools:
                log.info("pool_decision", pool=d.pool, reason=str(d.reason), demand=d.demand_now, forecast=d.forecast_peak,
                         serving=d.serving_now, desired=d.desired_serving, detail=d.detail)
            for a in plan.actions:
                log.info("decision", node=a.node, action=str(a.kind), reason=str(a.reason), detail=a.detail)
        for node, problem in intents.stuck:  # a returning node that never gets a Ready replica: said once
            log.error("node_not_ready", node=node, pool=obs.pool_of[node], phase=str(Phase.RETURNING), reason=problem)
            m.record_reclaim_failure(pool=obs.pool_of[node], reason="not_ready")
            state.reported_stuck.add(node)
        state.reported_stuck &= {n for n, f in obs.facts.items() if f.phase is Phase.RETURNING}
        for job_id, held_on in intents.held_again:
            state.held_again.add(job_id)
            log.warning("slurm_job_held_again", job=job_id, node=held_on or "", reason=LAUNCH_FAILED_HELD,
                        detail="held again after gpu-bridge released it once: left held")
        started = {a.node: a for a in intents.starts} | {n: o for n, _, o in intents.requests if isinstance(o, Action)}
        for r in records:
            if r.error is not None:
                self.count_error(r.error.system)
            elif r.step in (*START_POINTS.values(), REQUEST_POINT) and r.node in started:
                self._started(started[r.node], obs, now, policy=r.step != REQUEST_POINT)
            elif r.step == RELEASE_POINT and r.changed:
                state.released_jobs.add(r.detail)
                m.record_slurm_repair(kind="job_released", pool=obs.pool_of.get(r.node, ""))
            elif isinstance(r.step, Step):
                self._stepped(r, obs)
        m.record_tick(duration_s=self.clock() - now, ok=True, now=now)
        in_transit = sum(1 for f in obs.facts.values() if f.phase not in (None, Phase.SERVING, Phase.LENT))
        return TickResult(observed=True, planned=plan, steps=records, in_transit=in_transit,
                          more=intents.deferred or any(r.changed for r in records))

    def _started(self, action: Action, obs: Observation, now: float, *, policy: bool) -> None:
        """A reclaim started: its timings begin, the jobs it preempts are counted."""
        if action.kind is not ActionKind.RECLAIM:
            return
        sig = obs.view.pools[action.pool].signals if policy else None
        tier = next((n.tier for n in obs.view.nodes if n.name == action.node), Tier.NORMAL)
        self._reclaims[action.node] = ReclaimTimes(action.node, action.pool, now, sig.t if sig else None, tier)
        for job in (obs.view.jobs[j] for j in action.jobs if policy and j in obs.view.jobs):
            self.metrics.record_preemption(pool=action.pool, job=job, now=now, grace_s=self.config.slurm.grace_s)

    def _stepped(self, record: StepRecord, obs: Observation) -> None:
        """A lifecycle step's record: backoff, lend/repair/failure metrics, reclaim timings."""
        pool, m = obs.pool_of.get(record.node, ""), self.metrics
        if record.step in RETRIED_STEPS and not record.changed:  # refused by something outside us
            facts = obs.facts.get(record.node)
            delay = self.state.retry_later(record.node, Step(record.step), obs.view.now)
            log.warning("step_refused", node=record.node, step=str(record.step), phase=str(facts.phase if facts else None),
                        retry_in_s=delay)
        if record.step is Step.MARK_LENT and record.changed:
            m.record_lend(pool)
        if record.step in (Step.CLEAR_SLURM_DRAIN, Step.TAKE_OVER_DRAIN) and record.changed:
            m.record_slurm_repair(kind=str(record.step), pool=pool)
        if record.step is Step.ABORT_LEND and record.changed:
            self.state.backoff.pop(record.node, None)  # the eviction retries are over
            m.record_lend_failure(pool=pool, reason="pod_not_gone")
        times = self._reclaims.get(record.node)
        if times is None:
            return
        if record.step is Step.DRAIN and times.slurm_released is None:
            times.slurm_released = record.at
        elif record.step is Step.MARK_SERVING:
            times.ready = record.at
            del self._reclaims[record.node]
            f = obs.facts.get(record.node)  # woken: its warm record says awake until serving clears it
            mode = ReclaimMode.WARM if f and f.warm and f.warm.state is WarmState.AWAKE else ReclaimMode.COLD
            if times.slurm_released is not None:  # measured: decision -> Slurm release -> Ready
                self.memory[times.pool].add_delay(delay := times.ready - times.decided, times.tier, mode)
                m.record_measured_delay(pool=times.pool, seconds=delay, tier=str(times.tier), mode=str(mode))  # rebuilt at start
            b = times.breakdown()
            log.info("node_reclaimed", node=record.node, pool=times.pool, tier=str(times.tier), mode=str(mode), **b)
            m.record_reclaim(pool=times.pool, reason="policy", tier=str(times.tier), mode=str(mode),
                             **{k: max(0.0, b.get(k, 0.0)) for k in ("detection_s", "slurm_release_s", "kubernetes_ready_s")})

    def _refresh_outlook(self, now: float, obs: Observation) -> None:
        """Each pool's outlook metric every ``OUTLOOK_STEP_S`` (NaN when unreadable), if served."""
        for pool in self.config.pools:
            last = self._outlook_at.get(pool.name)
            if isinstance(self.metrics, NullMetrics) or (last is not None and now - last < OUTLOOK_STEP_S):
                continue
            self._outlook_at[pool.name] = now
            ps = obs.view.pools.get(pool.name)  # the calibration the policy has now
            nodes = sum(1 for n in obs.view.nodes if n.pool == pool.name)
            outlook = self.outlook(pool, now, nodes, ps.calibration if ps is not None else None,
                                   ps.governor if ps is not None else None)
            self.metrics.record_outlook(pool.name, outlook, OUTLOOK_HOURS)
