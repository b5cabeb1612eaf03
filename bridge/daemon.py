"""The daemon's loop: observe -> plan -> act, as the Lease holder, once per iteration.

Each iteration reads the Kubernetes watch cache, Slurm (sinfo/squeue) and Prometheus, joins
them (``bridge.observe``), runs the policy every ``policy.tick_s`` (``bridge.policy.plan``:
the same function ``--dry-run`` and ``gpu-bridge simulate`` run), starts the actions it
returns, and advances every node in transit through its lifecycle (``bridge.lifecycle``),
chaining steps while they are immediate so the daemon adds little latency of its own. While
anything is in transit it iterates every ``transit_poll_s``; otherwise it waits for the next
policy tick or a watch event.

The daemon keeps no state it cannot rebuild: phases live on the nodes, the load history is
refilled from Prometheus at start. What it keeps in memory (the history, timestamps for the
latency breakdown) only makes it faster or better informed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from bridge import logs
from bridge.actuate import Actuator, StepRecord
from bridge.adapters.prom.types import PromPool
from bridge.adapters.protocols import KubeAdapterProtocol, Leader, PoolTarget, PromReader, SlurmAdapterProtocol
from bridge.config import Config, PoolConfig
from bridge.config import replace as cfg_replace
from bridge.errors import AdapterError
from bridge.lifecycle import WAITS, NodeFacts, Step, desired_replicas, next_step
from bridge.manual import check_request
from bridge.metrics import BridgeMetrics
from bridge.model import Action, ActionKind, LoadSignals, Phase, Plan, SlurmJob
from bridge.observe import LAUNCH_FAILED_HELD, Observation, Readings, SlurmNodeLike, join
from bridge.policy.calibrate import Calibrator
from bridge.policy.forecast import history_windows, horizon_s, measured_horizon
from bridge.policy.history import HistoryRecorder
from bridge.policy.plan import plan as policy_plan
from bridge.policy.victims import job_loss_gpu_hours
from bridge.preemption import EVENT_REASON as PREEMPTION_EVENT
from bridge.preemption import preemption_message

log = logs.get(__name__)

MAX_CHAINED_STEPS = 12
# Steps that something outside us may refuse for long (a PDB, an administrator's drain):
# retried with exponential backoff up to this, not every iteration.
RETRIED_STEPS = frozenset({Step.EVICT_POD, Step.BLOCKED})
MAX_RETRY_BACKOFF_S = 60.0


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


class Daemon:
    """One gpu-bridge instance. ``tick()`` is one iteration (tests call it directly)."""

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
    ) -> None:
        self.config = config
        self.kube = kube
        self.slurm = slurm
        self.prom = prom
        self.prom_pools = prom_pools
        self.leader = leader
        self.metrics = metrics
        self.clock = clock
        self.dry_run = dry_run
        self.transit_poll_s = transit_poll_s
        self.max_cache_age_s = max_cache_age_s  # watch timeout (60 s) + request timeout + slack
        self.targets = {p.name: PoolTarget(p.name, p.namespace, p.deployment) for p in config.pools}
        self.actuator = Actuator(kube=kube, slurm=slurm, clock=clock, on_step=self._on_step, grace_s=config.slurm.grace_s)
        if after_write is not None:  # a lab's hook (crash injection); the product sets none
            self.actuator.after_write = after_write
        self._recorders: dict[str, HistoryRecorder] = {}
        self._calibrators: dict[str, Calibrator] = {}
        self._last_sample_t: dict[str, float] = {}
        self._reported_stuck: set[str] = set()
        # preempt-partition jobs released after a failed launch: a job held so again failed for
        # its own reason (a broken prolog, ...) and is left to people, never released in a loop
        self._released_jobs: set[str] = set()
        self._held_again: set[str] = set()
        self._tick_records: list[StepRecord] = []
        self._backoff: dict[str, tuple[Step, float, float]] = {}  # node -> (step, next try, delay)
        self._last_plan_at: float | None = None
        self._outlook_at: dict[str, float] = {}  # pool -> when its outlook metric was last refreshed
        self._reclaims: dict[str, ReclaimTimes] = {}
        self._reclaim_delays: dict[str, list[float]] = {}  # pool -> measured reclaim delays, s
        self.completed_reclaims: list[ReclaimTimes] = []
        self.last_plan: Plan | None = None
        self.last_observation: Observation | None = None
        self.wake = threading.Event()
        self._progress_mono = time.monotonic()  # the loop's heartbeat (LeaseKeeper's alive())

    # --- history -------------------------------------------------------------------------

    def _recorder(self, pool: PoolConfig, now: float) -> HistoryRecorder:
        rec = self._recorders.get(pool.name)
        if rec is None:
            windows = history_windows(self.config, pool)
            rec = HistoryRecorder(windows)
            # Rebuild what a restart lost from Prometheus, oldest window first.
            samples: list[LoadSignals] = []
            for w in windows:
                try:
                    samples.extend(
                        self.prom.history(
                            self.prom_pools[pool.name], start=now + w.start_s, end=min(now, now + w.end_s), step_s=w.step_s
                        )
                    )
                except AdapterError as exc:
                    log.warning("history_unavailable", pool=pool.name, error=str(exc))
            last = float("-inf")
            for s in sorted(samples, key=lambda s: s.t):
                if s.t > last:
                    rec.add(s)
                    last = s.t
            self._last_sample_t[pool.name] = last
            self._recorders[pool.name] = rec
        return rec

    def _refresh_outlook(self, now: float, obs: Observation, metrics: BridgeMetrics) -> None:
        """The lendable-capacity outlook for the metric, every ``OUTLOOK_STEP_S`` per pool:
        read-only range queries, the same ``lendable_outlook`` as ``gpu-bridge forecast``.
        A failed read sets NaN (never 0) and never fails the tick."""
        from bridge.adapters.prom.history import history_chunked
        from bridge.policy.outlook import OUTLOOK_HOURS, OUTLOOK_STEP_S, lendable_outlook, outlook_span_s

        for pool in self.config.pools:
            last = self._outlook_at.get(pool.name)
            if last is not None and now - last < OUTLOOK_STEP_S:
                continue
            self._outlook_at[pool.name] = now
            nodes = sum(1 for n in obs.view.nodes if n.pool == pool.name)
            try:
                start = math.floor((now - outlook_span_s(self.config, OUTLOOK_HOURS)) / OUTLOOK_STEP_S) * OUTLOOK_STEP_S
                hist = history_chunked(self.prom, self.prom_pools[pool.name], start=start, end=now, step_s=OUTLOOK_STEP_S)
                ps = obs.view.pools.get(pool.name)  # the calibration the policy has now (``_calibrate``)
                outlook = lendable_outlook(
                    hist, now, config=self.config, pool=pool, nodes=nodes, hours=OUTLOOK_HOURS,
                    calibration=ps.calibration if ps is not None else None,
                )
            except AdapterError as exc:
                log.warning("outlook_unavailable", pool=pool.name, error=str(exc))
                outlook = None
            metrics.record_outlook(pool.name, outlook, OUTLOOK_HOURS)

    def _calibrator(self, pool: PoolConfig, now: float) -> Calibrator | None:
        """The pool's calibration input, rebuilt from Prometheus (``query_range`` over
        ``policy.calibration.window_s``) the first time: day one is not blind when Prometheus
        already holds the pool's vLLM history."""
        cc = self.config.policy.calibration
        if not cc.enabled:
            return None
        cal = self._calibrators.get(pool.name)
        if cal is None:
            cal = Calibrator(self.config, pool)
            # Prometheus answers at most 11 000 points per series and query: ask in chunks
            chunk = 10_000 * cc.step_s
            start = now - cal.span_s  # the calibration's window and the governor's
            got = 0
            while start < now:
                end = min(now, start + chunk)
                try:
                    for sample in self.prom.history(self.prom_pools[pool.name], start=start, end=end, step_s=cc.step_s):
                        cal.add(sample)
                        got += 1
                except AdapterError as exc:
                    log.warning("calibration_history_unavailable", pool=pool.name, error=str(exc))
                start = end + cc.step_s
            log.info("calibration_history", pool=pool.name, samples=got, window_s=cal.span_s)
            self._calibrators[pool.name] = cal
        return cal

    def _calibrate(self, obs: Observation, now: float) -> Observation:
        """The view with each pool's calibrated margin and measured reclaim horizon."""
        pools = dict(obs.view.pools)
        for p in self.config.pools:
            ps = pools.get(p.name)
            if ps is None:
                continue
            delays = self._reclaim_delays.get(p.name, [])
            h = measured_horizon(self.config, p, delays)
            cal_in = self._calibrators.get(p.name)
            cal = gov = None
            if cal_in is not None:
                nodes = sum(1 for n in obs.view.nodes if n.pool == p.name)
                gov = cal_in.governor(now, capacity=nodes * p.replicas_per_node, nodes=nodes, horizon_s=h)
                cal = cal_in.calibration(now, capacity=nodes * p.replicas_per_node, horizon_s=h, governor=gov)
                if self.metrics is not None:
                    self.metrics.record_calibration(pool=p.name, calibration=cal)
                    if gov is not None:
                        self.metrics.record_governor(pool=p.name, governor=gov)
            if self.metrics is not None:
                self.metrics.record_horizon(pool=p.name, horizon_s=h if h is not None else horizon_s(self.config, p))
            pools[p.name] = replace(ps, calibration=cal, horizon_s=h, governor=gov)
        return replace(obs, view=replace(obs.view, pools=pools))

    # --- one iteration ------------------------------------------------------------------------

    def observe(self, now: float) -> Observation:
        kube_nodes = self.kube.nodes()
        pods = {p.name: self.kube.pods(p.name) for p in self.config.pools}
        desired: dict[str, int] = {}
        pool_problems: dict[str, str] = {}
        for p in self.config.pools:
            dep = self.kube.deployment(p.name)
            if dep is not None:
                desired[p.name] = dep.replicas
                if dep.problem:
                    pool_problems[p.name] = f"deployment {p.namespace}/{p.deployment}: {dep.problem}"
        slurm_now: float | None = None
        try:
            slurm_nodes: Sequence[SlurmNodeLike] | None = self.slurm.nodes()
            slurm_jobs: Sequence[SlurmJob] | None = self.slurm.jobs()
            slurm_now = self.slurm.clock()  # after both reads: no time of theirs is later than it
        except AdapterError as exc:
            log.warning("slurm_unavailable", error=str(exc))
            self._count_error("slurm")
            slurm_nodes = slurm_jobs = None
        readings: dict[str, Readings] = {}
        for p in self.config.pools:
            rec = self._recorder(p, now)
            try:
                # the pool's pods as Kubernetes knows them: a stale series of a pod deleted
                # during a Prometheus outage is then dropped instead of blocking lending
                reading = self.prom.current(self.prom_pools[p.name], live_pods={pod.name for pod in pods[p.name]})
                current: LoadSignals | None = reading.signals
                problem = "; ".join(f"{k}: {v}" for k, v in reading.problems.items()) or None
                inflight = reading.inflight_by_pod
            except AdapterError as exc:
                self._count_error("prometheus")
                log.warning("prometheus_unavailable", pool=p.name, error=str(exc))
                current, problem, inflight = None, str(exc), {}
            calin = self._calibrator(p, now)
            if current is not None and current.t > self._last_sample_t.get(p.name, float("-inf")):
                rec.add(current)
                if calin is not None:
                    calin.add(current)
                self._last_sample_t[p.name] = current.t
            readings[p.name] = Readings(current, rec.history(now), problem, inflight)
        obs = join(
            now=now,
            config=self.config,
            kube_nodes=kube_nodes,
            pods=pods,
            desired_replicas=desired,
            slurm_nodes=slurm_nodes,
            slurm_jobs=slurm_jobs,
            readings=readings,
            pool_problems=pool_problems,
            slurm_now=slurm_now,
        )
        return self._calibrate(obs, now)

    def _record_preemption(self, node: str, pool: str, job: SlurmJob, now: float) -> None:
        """A job this reclaim preempts: counted, and told on the node as an Event with the
        work it loses (what ``gpu-bridge web`` shows on the job's page)."""
        grace_s = self.config.slurm.grace_s
        if self.metrics is not None:
            self.metrics.record_preemption(pool=pool, job=job, now=now, grace_s=grace_s)
        lost = job_loss_gpu_hours(job, now, grace_s)
        self.actuator.note(
            node,
            PREEMPTION_EVENT,
            preemption_message(
                job_id=job.job_id, node=node, grace_s=grace_s, lost_gpu_hours=lost, checkpoint_time=job.checkpoint_time
            ),
        )

    def loop_alive(self, stall_s: float) -> bool:
        """The loop started a tick or a chained round within ``stall_s``: a slow tick is
        alive, a wedged one is not (the LeaseKeeper then lets the Lease lapse)."""
        return time.monotonic() - self._progress_mono < stall_s

    def tick(self) -> TickResult:
        self._progress_mono = time.monotonic()
        now = self.clock()
        if self.leader is not None:
            try:
                leading = self.leader.try_acquire_or_renew()
            except AdapterError as exc:
                log.warning("lease_error", error=str(exc))
                leading = False
            if self.metrics is not None:
                self.metrics.set_leader(leading)
            if not leading:
                return TickResult(observed=False)
        status = self.kube.cache_status()
        age = status.last_event_age_s
        if not status.synced or (age is not None and age > self.max_cache_age_s):
            # A watch cut silently keeps "synced" until its read timeout: fail closed on age too.
            log.warning("kube_cache_not_fresh", synced=status.synced, last_event_age_s=age)
            self._count_error("kubernetes")
            return TickResult(observed=False, error="kubernetes watch cache not synced or stale")
        obs = self.observe(now)
        self.last_observation = obs
        result = TickResult(observed=True)
        self._report_stuck(obs)
        if self.metrics is not None:
            self.metrics.record_view(obs.view)
        due = self._last_plan_at is None or now - self._last_plan_at >= self.config.policy.tick_s - 1e-6
        if due:
            plan = policy_plan(obs.view, self.config)
            self._last_plan_at = now
            self.last_plan = plan
            result.planned = plan
            if self.metrics is not None:
                self.metrics.record_plan(plan)
                self._refresh_outlook(now, obs, self.metrics)
            for d in plan.pools:
                log.info(
                    "pool_decision",
                    pool=d.pool,
                    reason=str(d.reason),
                    demand=d.demand_now,
                    forecast=d.forecast_peak,
                    serving=d.serving_now,
                    desired=d.desired_serving,
                    detail=d.detail,
                )
            for action in plan.actions:
                log.info("decision", node=action.node, action=str(action.kind), reason=str(action.reason), detail=action.detail)
                if self.dry_run:
                    continue
                try:
                    self.actuator.start(action, now=now)
                except AdapterError as exc:
                    self._count_error("kubernetes")
                    log.warning("action_not_started", node=action.node, error=str(exc))
                    continue
                if action.kind is ActionKind.RECLAIM:
                    sig = obs.view.pools[action.pool].signals
                    self._reclaims[action.node] = ReclaimTimes(
                        action.node, action.pool, decided=now, signal_t=sig.t if sig else None
                    )
                    for job_id in action.jobs:
                        job = obs.view.jobs.get(job_id)
                        if job is not None:
                            self._record_preemption(action.node, action.pool, job, now)
            if plan.actions and not self.dry_run:
                obs = self.observe(self.clock())
        if obs.requests and not self.dry_run:
            self._handle_requests(obs, now)
            obs = self.observe(self.clock())
        if not self.dry_run:
            result.steps = self._advance(obs)
            if obs.slurm_held:
                self._release_held(obs)
        result.in_transit = sum(1 for f in obs.facts.values() if f.phase not in (None, Phase.SERVING, Phase.LENT))
        if self.metrics is not None:
            self.metrics.record_tick(duration_s=self.clock() - now, ok=True, now=now)
        return result

    def _release_held(self, obs: Observation) -> None:
        """Release the preempt partition's jobs Slurm held itself after a failed launch (a
        controller restarted from a state that missed their start launches them again on the
        node where the first run goes on: "Duplicate jobid"). ``observe`` lists only jobs whose
        failed run is gone (pending, not completing), so the release cannot start a second run.
        Once per job: a job held again after its release failed to launch for a reason of its
        own, and stays held for people to look at (reported once)."""
        for job_id, host in sorted(obs.slurm_held.items()):
            node = host if host in obs.pool_of else None
            if job_id in self._released_jobs:
                if job_id not in self._held_again:
                    self._held_again.add(job_id)
                    log.warning("slurm_job_held_again", job=job_id, node=node or "", reason=LAUNCH_FAILED_HELD,
                                detail="held again after gpu-bridge released it once: left held")
                continue
            try:
                released = self.actuator.release_job(job_id, LAUNCH_FAILED_HELD, node)
                if released:
                    self._released_jobs.add(job_id)
                if released and self.metrics is not None:
                    self.metrics.record_slurm_repair(kind="job_released", pool=obs.pool_of.get(node or "", ""))
            except AdapterError as exc:
                self._count_error(exc.system)
                log.warning("slurm_release_failed", job=job_id, error=str(exc))

    def _report_stuck(self, obs: Observation) -> None:
        """A returning node that never gets a Ready replica: say so once (log, Event, metric)."""
        for node, problem in obs.problems.items():
            facts = obs.facts.get(node)
            if facts is None or facts.phase is not Phase.RETURNING or not problem.startswith("returning for"):
                continue
            if node in self._reported_stuck:
                continue
            self._reported_stuck.add(node)
            pool = obs.pool_of[node]
            log.error("node_not_ready", node=node, pool=pool, phase=str(facts.phase), reason=problem)
            if not self.dry_run:
                self.actuator.report(node, "GpuBridgeNotReady", problem)
            if self.metrics is not None:
                self.metrics.record_reclaim_failure(pool=pool, reason="not_ready")
        self._reported_stuck &= {n for n, f in obs.facts.items() if f.phase is Phase.RETURNING}

    def _handle_requests(self, obs: Observation, now: float) -> None:
        """Carry out operators' requests that pass the safety checks; refuse the others.
        Either way the request is removed, and the outcome shown as an Event on the node."""
        for node, request in sorted(obs.requests.items()):
            outcome = check_request(obs.view, self.config, node, request)
            try:
                if isinstance(outcome, Action):
                    log.info("request_accepted", node=node, request=request)
                    self.actuator.start(outcome, now=now)
                    if outcome.kind is ActionKind.RECLAIM:
                        self._reclaims[node] = ReclaimTimes(node, outcome.pool, decided=now, signal_t=None)
                else:
                    log.warning("request_refused", node=node, request=request, reason=outcome)
                    self.actuator.refuse(node, request, outcome)
                self.kube.set_request(node, None)
            except AdapterError as exc:
                self._count_error(exc.system)
                log.warning("request_failed", node=node, request=request, error=str(exc))

    def _advance(self, obs: Observation) -> list[StepRecord]:
        """Advance every node that has a next step, chaining immediate steps."""
        records: list[StepRecord] = []
        self._tick_records = records
        for _ in range(MAX_CHAINED_STEPS):
            self._progress_mono = time.monotonic()
            progressed = False
            # once per pool, not per node: the same snapshot for every node (per node is O(nodes^2))
            wants = {
                p.name: desired_replicas([f for n, f in obs.facts.items() if obs.pool_of[n] == p.name])
                for p in self.config.pools
            }
            for name, facts in sorted(obs.facts.items()):
                if name in obs.problems and facts.phase is None:
                    continue  # invalid labels of ours: hold, never guess a phase
                pool = self.targets[obs.pool_of[name]]
                dep_desired = obs.view.pools[pool.name].desired_replicas
                want = wants[pool.name]
                step = next_step(
                    facts,
                    now=obs.view.now,
                    scaled_down=dep_desired <= want,
                    grace_s=self.config.slurm.grace_s,
                    lend_timeout_s=self.config.policy.lend_timeout_s,
                    drain_saved_after_s=self.config.slurm.state_save_s,
                )
                if step in RETRIED_STEPS and not self._retry_due(name, step, obs.view.now):
                    continue  # blocked by something outside us (a PDB, an admin): backing off
                if step is None or step in WAITS:
                    if step is Step.BLOCKED:
                        self.actuator.execute(step, facts, pool, now=obs.view.now)
                        self._retry_later(name, step, obs.view.now, facts)
                    continue
                try:
                    # chain only after a real write: a no-op (e.g. a PDB-blocked eviction)
                    # would otherwise be repeated MAX_CHAINED_STEPS times per iteration
                    changed = self.actuator.execute(step, facts, pool, now=self.clock())
                    progressed |= changed
                    if step in RETRIED_STEPS and not changed:
                        self._retry_later(name, step, obs.view.now, facts)
                except AdapterError as exc:
                    self._count_error(exc.system)
                    log.warning("step_failed", node=name, step=str(step), phase=str(facts.phase), error=str(exc))
            for pool_cfg in self.config.pools:
                pool_facts = [f for n, f in obs.facts.items() if obs.pool_of[n] == pool_cfg.name]
                if not pool_facts or any(
                    n in obs.problems and (n not in obs.facts or obs.facts[n].phase is None)
                    for n, pool_name in obs.pool_of.items()
                    if pool_name == pool_cfg.name
                ):  # a node of this pool without facts (unknown to Slurm): its share of the scale is unknown too
                    continue
                want = wants[pool_cfg.name]  # same facts as the steps above: computed once per round
                if obs.view.pools[pool_cfg.name].desired_replicas != want:
                    try:
                        progressed |= self.actuator.scale_pool(self.targets[pool_cfg.name], want)
                    except AdapterError as exc:
                        self._count_error(exc.system)
                        log.warning("scale_failed", pool=pool_cfg.name, replicas=want, error=str(exc))
            if not progressed:
                break
            obs = self.observe(self.clock())
            self.last_observation = obs
        return records

    def _retry_due(self, node: str, step: Step, now: float) -> bool:
        due = self._backoff.get(node)
        return due is None or due[0] is not step or now >= due[1]

    def _retry_later(self, node: str, step: Step, now: float, facts: NodeFacts) -> None:
        """Back off a step that something outside us refuses (1 s, doubling to a minute),
        with one warning per attempt, so a PDB that never allows the eviction is visible
        without flooding the API server, the Events and the log."""
        prev = self._backoff.get(node)
        delay = min(MAX_RETRY_BACKOFF_S, prev[2] * 2) if prev is not None and prev[0] is step else 1.0
        self._backoff[node] = (step, now + delay, delay)
        log.warning("step_refused", node=node, step=str(step), phase=str(facts.phase), retry_in_s=delay)

    def _on_step(self, record: StepRecord) -> None:
        self._tick_records.append(record)
        if record.step is Step.MARK_LENT and record.changed and self.metrics is not None and self.last_observation:
            self.metrics.record_lend(self.last_observation.pool_of.get(record.node, ""))
        if record.step in (Step.CLEAR_SLURM_DRAIN, Step.TAKE_OVER_DRAIN) and record.changed and self.metrics is not None:
            pool = self.last_observation.pool_of.get(record.node, "") if self.last_observation else ""
            self.metrics.record_slurm_repair(kind=str(record.step), pool=pool)
        if record.step is Step.ABORT_LEND and record.changed:
            self._backoff.pop(record.node, None)  # the eviction retries are over
            if self.metrics is not None and self.last_observation:
                self.metrics.record_lend_failure(pool=self.last_observation.pool_of.get(record.node, ""), reason="pod_not_gone")
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
                delays = self._reclaim_delays.setdefault(times.pool, [])
                delays.append(times.ready - times.decided)
                del delays[:-512]
            log.info("node_reclaimed", node=record.node, pool=times.pool, **times.breakdown())
            if self.metrics is not None:
                self.metrics.record_reclaim(pool=times.pool, reason="policy", **_reclaim_kwargs(times))

    def _count_error(self, system: str) -> None:
        if self.metrics is not None:
            self.metrics.adapter_errors.labels(system=system).inc()

    # --- running ------------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, on_tick: Callable[[TickResult], None] | None = None) -> None:
        """Iterate until ``stop`` is set; an iteration is never cut in half."""
        while not stop.is_set():
            started = self.clock()
            try:
                result = self.tick()
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
