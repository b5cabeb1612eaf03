"""The daemon's loop, as the Lease holder: read, reconcile, apply, remember.

A tick is one pass: ``Observer.read`` (the Kubernetes watch cache, one sinfo/squeue, one
Prometheus query per pool) -> ``bridge.reconcile`` (the policy every ``policy.tick_s``, the
same ``plan`` as ``gpu-bridge simulate``; operators' requests; each node's lifecycle step)
-> ``Actuator.apply`` (skipped by ``--dry-run``) -> the records feed the policy memory, the
metrics and the reclaim timings. ``iterate`` ticks again at once while a pass changed
something, so immediate steps chain and the daemon adds little latency of its own. While
anything is in transit it iterates every ``transit_poll_s``; otherwise it waits for the next
policy tick or a watch event.

The daemon keeps no state it cannot rebuild: phases live on the nodes, the load history is
refilled from Prometheus at start (``bridge.wiring.policy_memory``). What it keeps in memory
only makes it faster or better informed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from bridge import logs
from bridge.actuate import REQUEST_POINT, RELEASE_POINT, START_POINTS, Actuator, StepRecord
from bridge.adapters.prom.types import PromPool
from bridge.adapters.protocols import KubeAdapterProtocol, Leader, PoolTarget, PromReader, SlurmAdapterProtocol
from bridge.adapters.vllm import sleep_controls
from bridge.config import Config
from bridge.config import replace as cfg_replace
from bridge.errors import AdapterError
from bridge.lifecycle import Step
from bridge.metrics import BridgeMetrics
from bridge.model import Action, ActionKind, Phase, Plan
from bridge.observe import LAUNCH_FAILED_HELD, Observation, Snapshot
from bridge.observer import Observer
from bridge.policy.forecast import horizon_s
from bridge.policy.memory import PoolMemory
from bridge.reconcile import RETRIED_STEPS, Intents, LoopState, observation, reconcile

log = logs.get(__name__)

MAX_CHAINED_STEPS = 12  # passes of one iteration: immediate steps chain, never forever


def with_slurm_grace(config: Config, slurm: SlurmAdapterProtocol) -> Config:
    """The config with ``slurm.grace_s`` checked against the preempt partition's GraceTime as
    slurmctld has it (read once, at start-up). A config lower than Slurm's is raised to Slurm's
    (logged): the daemon never requeues a job before the grace Slurm promised it, and the
    policy plans reclaims with the grace they really take. A higher one is kept (the daemon
    then only waits longer; Slurm still ends the grace at its own GraceTime)."""
    partition = config.slurm.preempt_partition
    slurm_grace_s = slurm.grace_time_s(partition)
    if config.slurm.grace_s >= slurm_grace_s:
        log.info("slurm_grace", partition=partition, grace_s=config.slurm.grace_s, slurm_grace_s=slurm_grace_s)
        return config
    log.warning("slurm_grace_raised", partition=partition, grace_s=slurm_grace_s, configured_grace_s=config.slurm.grace_s,
                detail="slurm.grace_s is lower than the partition's GraceTime: Slurm's is used")
    return cfg_replace(config, slurm=cfg_replace(config.slurm, grace_s=slurm_grace_s))


@dataclass
class ReclaimTimes:
    """Timestamps of one reclaim, for the latency breakdown (logged and exported)."""

    node: str
    pool: str
    decided: float
    signal_t: float | None  # time of the load sample that called for it
    hold_submitted: float | None = None
    slurm_released: float | None = None  # hold job running / node drained
    unfenced: float | None = None
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


class Daemon:
    """One gpu-bridge instance: leadership, freshness and scheduling around the pass. ``tick()``
    is one pass, ``iterate()`` one iteration of ``run`` (tests call either directly)."""

    def __init__(
        self,
        config: Config,
        *,
        kube: KubeAdapterProtocol,
        slurm: SlurmAdapterProtocol,
        prom: PromReader,
        prom_pools: Mapping[str, PromPool],
        leader: Leader | None = None,
        metrics: BridgeMetrics | None = None,
        clock: Callable[[], float] = time.time,
        dry_run: bool = False,
        transit_poll_s: float = 0.25,
        max_cache_age_s: float = 75.0,
        after_write: Callable[[str], None] | None = None,
        memory: Mapping[str, PoolMemory] | None = None,
    ) -> None:
        self.config = config
        self.kube = kube
        self.prom = prom
        self.prom_pools = prom_pools
        self.leader = leader
        self.metrics = metrics if metrics is not None else BridgeMetrics()  # the null metrics: served by no one
        self.clock = clock
        self.dry_run = dry_run  # reconcile and log, never apply
        self.transit_poll_s = transit_poll_s
        self.max_cache_age_s = max_cache_age_s  # watch timeout (60 s) + request timeout + slack
        self.observer = Observer(config, kube, slurm, prom, prom_pools)
        targets = {p.name: PoolTarget(p.name, p.namespace, p.deployment) for p in config.pools}
        self.actuator = Actuator(kube=kube, slurm=slurm, clock=clock, targets=targets, grace_s=config.slurm.grace_s,
                                 sleep_control=sleep_controls(config.pools))  # vLLM clients for warm pools only
        if after_write is not None:  # a lab's hook (crash injection); the product sets none
            self.actuator.after_write = after_write
        # the policy's memory: empty unless given back-filled (bridge.wiring.policy_memory)
        self.memory = dict(memory) if memory is not None else {p.name: PoolMemory(config, p) for p in config.pools}
        self.state = LoopState()
        self._outlook_at: dict[str, float] = {}  # pool -> when its outlook metric was last refreshed
        self._reclaims: dict[str, ReclaimTimes] = {}
        self.completed_reclaims: list[ReclaimTimes] = []
        self.last_plan: Plan | None = None
        self.last_observation: Observation | None = None
        self.wake = threading.Event()
        self._progress_mono = time.monotonic()  # the loop's heartbeat (LeaseKeeper's alive())

    def observe(self, now: float) -> Observation:
        """What the loop would decide on now (``status``, the web view); remembers nothing."""
        return observation(self.observer.read(now), self.memory, self.config)

    def loop_alive(self, stall_s: float) -> bool:
        """The loop started a pass within ``stall_s``: a slow pass is alive, a wedged one is
        not (the LeaseKeeper then lets the Lease lapse)."""
        return time.monotonic() - self._progress_mono < stall_s

    # --- one pass -------------------------------------------------------------------------------

    def tick(self) -> TickResult:
        self._progress_mono = time.monotonic()
        now = self.clock()
        why_not = self._why_not_act()
        if why_not is not None:
            return TickResult(observed=False, error=why_not or None)
        snapshot = self.observer.read(now)
        self._remember(snapshot)
        intents = reconcile(snapshot, self.memory, self.config, self.state)
        records = [] if self.dry_run else self.actuator.apply(intents)
        return self._record(intents, records, now)

    def iterate(self) -> TickResult:
        """A pass, then at once another while the last one changed something (bounded)."""
        result = self.tick()
        for _ in range(MAX_CHAINED_STEPS - 1):
            if self.dry_run or not result.more:
                break
            nxt = self.tick()
            result = replace(nxt, planned=result.planned or nxt.planned, steps=result.steps + nxt.steps)
        return result

    def _why_not_act(self) -> str | None:
        """Not leading ("") or a watch cache not fresh enough to act on (why); None: go."""
        if self.leader is not None:
            try:
                leading = self.leader.try_acquire_or_renew()
            except AdapterError as exc:
                log.warning("lease_error", error=str(exc))
                leading = False
            self.metrics.set_leader(leading)
            if not leading:
                return ""
        status = self.kube.cache_status()
        age = status.last_event_age_s
        if not status.synced or (age is not None and age > self.max_cache_age_s):
            # A watch cut silently keeps "synced" until its read timeout: fail closed on age too.
            log.warning("kube_cache_not_fresh", synced=status.synced, last_event_age_s=age)
            self._count_error("kubernetes")
            return "kubernetes watch cache not synced or stale"
        return None

    def _remember(self, snapshot: Snapshot) -> None:
        """Each pool's new load sample into its memory; the read's errors counted."""
        for system in snapshot.errors:
            self._count_error(system)
        for name, r in snapshot.readings.items():
            if r.current is not None and name in self.memory:
                self.memory[name].add(r.current)

    def _record(self, intents: Intents, records: list[StepRecord], now: float) -> TickResult:
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
                self._count_error(r.error.system)
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
        self._reclaims[action.node] = ReclaimTimes(action.node, action.pool, decided=now, signal_t=sig.t if sig else None)
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
        if record.step is Step.SUBMIT_HOLD and times.hold_submitted is None:
            times.hold_submitted = record.at
        elif record.step is Step.DRAIN and times.slurm_released is None:
            times.slurm_released = record.at
        elif record.step is Step.UNFENCE:
            times.unfenced = record.at
        elif record.step is Step.MARK_SERVING:
            times.ready = record.at
            self.completed_reclaims.append(times)
            del self._reclaims[record.node]
            if times.slurm_released is not None:  # measured: decision -> Slurm release -> Ready
                self.memory[times.pool].add_delay(times.ready - times.decided)
            log.info("node_reclaimed", node=record.node, pool=times.pool, **times.breakdown())
            m.record_reclaim(pool=times.pool, reason="policy", **_reclaim_kwargs(times))

    def _refresh_outlook(self, now: float, obs: Observation) -> None:
        """The lendable-capacity outlook for the metric, every ``OUTLOOK_STEP_S`` per pool:
        read-only range queries, the same ``lendable_outlook`` as ``gpu-bridge forecast``.
        A failed read sets NaN (never 0) and never fails the tick."""
        from bridge.policy.outlook import OUTLOOK_HOURS, OUTLOOK_STEP_S, lendable_outlook, outlook_span_s

        for pool in self.config.pools:
            last = self._outlook_at.get(pool.name)
            if last is not None and now - last < OUTLOOK_STEP_S:
                continue
            self._outlook_at[pool.name] = now
            nodes = sum(1 for n in obs.view.nodes if n.pool == pool.name)
            try:
                start = math.floor((now - outlook_span_s(self.config, OUTLOOK_HOURS)) / OUTLOOK_STEP_S) * OUTLOOK_STEP_S
                hist = self.prom.history(self.prom_pools[pool.name], start=start, end=now, step_s=OUTLOOK_STEP_S)
                ps = obs.view.pools.get(pool.name)  # the calibration the policy has now
                outlook = lendable_outlook(
                    hist, now, config=self.config, pool=pool, nodes=nodes, hours=OUTLOOK_HOURS,
                    calibration=ps.calibration if ps is not None else None,
                )
            except AdapterError as exc:
                log.warning("outlook_unavailable", pool=pool.name, error=str(exc))
                outlook = None
            self.metrics.record_outlook(pool.name, outlook, OUTLOOK_HOURS)

    def _count_error(self, system: str) -> None:
        self.metrics.adapter_errors.labels(system=system).inc()

    # --- running ------------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, on_tick: Callable[[TickResult], None] | None = None) -> None:
        """Iterate until ``stop`` is set; an iteration is never cut in half."""
        while not stop.is_set():
            started = self.clock()
            try:
                result = self.iterate()
            except AdapterError as exc:
                self._count_error(exc.system)
                log.warning("tick_failed", error=str(exc))
                result = TickResult(observed=False, error=str(exc))
            if on_tick is not None:
                on_tick(result)
            busy = result.in_transit > 0
            interval = self.transit_poll_s if busy else min(self.config.policy.tick_s, 5.0)
            delay = max(0.0, interval - (self.clock() - started))
            self.wake.clear()
            if stop.wait(0) or self.wake.wait(delay):
                continue
        if self.leader is not None and self.leader.is_leader:
            try:
                self.leader.release()
            except AdapterError as exc:
                log.warning("lease_release_failed", error=str(exc))


def _reclaim_kwargs(times: ReclaimTimes) -> dict[str, float]:
    b = times.breakdown()
    return {
        "detection_s": max(0.0, b.get("detection_s", 0.0)),
        "slurm_release_s": max(0.0, b.get("slurm_release_s", 0.0)),
        "kubernetes_ready_s": max(0.0, b.get("kubernetes_ready_s", 0.0)),
    }
