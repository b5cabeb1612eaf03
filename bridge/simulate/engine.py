"""The simulator's engine: one pool of nodes, a serving load, a Slurm partition, a controller.

Discrete-event with a fixed policy tick. Every ``tick_s`` the engine builds a
``bridge.model.ClusterView`` (the same type the daemon's observer builds) and asks the
controller for actions; the modelled delays then play out as timed events:

- **scrape**: vLLM gauges are scraped every ``scrape_s``; a tick sees the last scrape
  strictly before it, i.e. up to one scrape interval old (a full interval when the tick and
  the scrape grid align, the worst case);
- **lend**: the node leaves the serving endpoints at once (its capacity is gone), vLLM drains
  for ``drain_s`` (``--shutdown-timeout``), then the node is lent and Slurm may start jobs;
- **reclaim**: the jobs on the node (and every node of a multi-node job) are preempted at
  once; the node is free after the Slurm grace period (at once if it was idle), then the vLLM
  pod cold-starts for ``cold_start_s`` before it is Ready. So a reclaimed node with a job is
  never Ready before ``grace_s + cold_start_s``. A pool with ``warm_lending`` keeps its replica
  asleep on the lent node: it is Ready ``wake_s`` after the release instead; a share
  ``wake_fail_rate`` of the wakes does not happen (a failed or hung wake, GPU memory a stuck job
  still holds): that node is cold-started after the wait the daemon gives the wake
  (``wake_gpu_wait_s`` with the free-GPU check, else the wake's timeout ``wake_s``);
- **research**: ``bridge.simulate.research`` starts, completes, preempts and requeues jobs;
- **tiers**: with ``slurm.fast_partition`` a lend carries its tier (``Action.tier``); a
  fast-tier node runs only fast-tier jobs and releases after ``slurm.fast_grace_s``.

Metrics: lent GPU-hours (time nodes spend lent to Slurm), research work kept and lost,
preemptions, lends, reclaims, and SLO-violation minutes: minutes in which the offered load
exceeds the Ready serving capacity (Ready replicas at the per-replica target), capacity
taken as its minimum over the minute.

Everything is deterministic for a given seed: ties break by node name or event order.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol

import numpy as np

from bridge.config import Config, PoolConfig
from bridge.model import (
    Action,
    ActionKind,
    ClusterView,
    LoadSignals,
    NodeState,
    Phase,
    PoolState,
    SlurmJob,
    Tier,
)
from bridge.policy.forecast import lends_warm, measured_horizon
from bridge.simulate.research import JobMix, Research
from bridge.simulate.workload import Workload, signals

# 2026-11-02 (a Monday) 00:00 UTC: the trace's t = 0 (its local midnight) is mapped here, so
# calendar rules in UTC line up with the trace's hours.
DEFAULT_START_UNIX = 1793577600.0

# Event kinds, in the order they are handled at the same instant (before the tick).
_LENT, _JOB_END, _RELEASE, _FREE, _READY = 0, 1, 2, 3, 4


class Controller(Protocol):
    """A lending policy under test: the real ``bridge.policy.plan`` or a baseline."""

    name: str

    def decide(self, view: ClusterView) -> Sequence[Action]:
        """Actions to take now; the engine ignores any that do not fit the node's phase."""
        ...


@dataclass(frozen=True, slots=True)
class Setup:
    """Everything one simulation needs; the delays come from ``config`` (the daemon's own)."""

    config: Config
    workload: Workload
    nodes: int
    gpus_per_node: int = 4
    pool_name: str | None = None  # None: the config's first pool
    mix: JobMix = field(default_factory=JobMix)
    seed: int = 1
    start_unix: float = DEFAULT_START_UNIX
    # what Prometheus already holds when the run starts (ends at start_unix); None = nothing
    history: Workload | None = None
    # cold starts are drawn from a lognormal with mean cold_start_s and this coefficient of
    # variation (0 = always cold_start_s)
    cold_start_cv: float = 0.0
    # stretches (simulation seconds, [start, end)) in which Prometheus answers nothing: the
    # policy sees no signal while the load goes on (outages, the stress suite's data gaps)
    signal_gaps: tuple[tuple[float, float], ...] = ()
    # whether Prometheus kept scraping through those gaps (only its queries failed): the
    # policy then reads the gap's samples once the signals are back, as the daemon does
    signal_gaps_recorded: bool = True
    # whether the daemon reads the Ready replicas themselves while Prometheus answers nothing
    # (``prometheus.direct_fallback``, the replicas reachable): the policy then sees no gap
    direct_reads: bool = False
    # warm lending: the share of wakes that do not happen (cold-started after the wake's wait);
    # drawn from a stream of its own, so 0 leaves every other draw as it was
    wake_fail_rate: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.wake_fail_rate <= 1.0:
            raise ValueError(f"wake_fail_rate: expected a share between 0 and 1, got {self.wake_fail_rate!r}")

    @property
    def pool(self) -> PoolConfig:
        return self.config.pools[0] if self.pool_name is None else self.config.pool(self.pool_name)

    @property
    def tick_s(self) -> float:
        return self.config.policy.tick_s

    @property
    def scrape_s(self) -> float:
        return self.config.prometheus.scrape_interval_s

    @property
    def grace_s(self) -> float:
        return self.config.slurm.grace_s

    @property
    def cold_start_s(self) -> float:
        return self.pool.cold_start_s

    @property
    def drain_s(self) -> float:
        return self.pool.drain_s

    @property
    def replicas_per_node(self) -> int:
        return self.pool.replicas_per_node

    @property
    def warm(self) -> bool:
        """The pool lends warm (``forecast.lends_warm``, as the plan reads it): a reclaimed node wakes
        its sleeping replica (``wake_s``); the lifecycle keeps a replica only when it is the node's one pod."""
        return lends_warm(self.pool)

    def cold_start_quantile(self, q: float) -> float:
        """The ``q``-quantile of the drawn cold starts (the oracle plans with a high one); the
        wake time for a pool that lends warm (the wake's wait and a cold start when more than
        ``1 - q`` of the wakes fail)."""
        if self.warm and self.wake_fail_rate <= 1.0 - q:
            return self.pool.wake_s
        return (self.wake_wait_s if self.warm else 0.0) + self._cold_quantile(q)

    @property
    def wake_wait_s(self) -> float:
        """How long the daemon waits for a wake before it cold-starts the replica instead."""
        pool = self.pool
        return pool.wake_gpu_wait_s if pool.wake_gpu_free_mib is not None else pool.wake_s

    def _cold_quantile(self, q: float) -> float:
        mean, cv = self.cold_start_s, self.cold_start_cv
        if cv <= 0 or mean <= 0:
            return mean
        from statistics import NormalDist

        sigma = math.sqrt(math.log1p(cv * cv))
        return math.exp(math.log(mean) - sigma * sigma / 2 + sigma * NormalDist().inv_cdf(q))

    def node_names(self) -> tuple[str, ...]:
        width = max(2, len(str(self.nodes - 1)))
        return tuple(f"gpu-node-{i:0{width}d}" for i in range(self.nodes))


@dataclass(slots=True)
class Metrics:
    policy: str
    lent_gpu_hours: float
    useful_gpu_hours: float
    lost_gpu_hours: float
    preemptions: int
    lends: int
    reclaims: int
    slo_violation_minutes: int
    trace_minutes: int
    early_preemptions: int = 0  # preempted within research.EARLY_PREEMPTION_S of (re)starting
    early_lost_gpu_hours: float = 0.0

    def as_dict(self) -> dict[str, object]:
        """Every field in order, GPU-hours rounded to 3 decimals."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: round(v, 3) if k.endswith("_gpu_hours") else v for k, v in d.items()}


@dataclass(slots=True)
class Result:
    """Metrics plus the time series behind them (plots, analysis of violations)."""

    metrics: Metrics
    wall_s: float
    cpu_s: float  # process CPU time of the run (the wall time includes other load on the machine)
    tick_t: np.ndarray  # simulation seconds of each tick
    tick_ready: np.ndarray  # Ready serving nodes after the tick's actions
    tick_lent: np.ndarray  # nodes lent to Slurm (phase lent)
    tick_committed: np.ndarray  # nodes serving or on their way back
    minute_ready_min: np.ndarray  # least Ready nodes in each minute
    violation_minutes: np.ndarray  # indices of violating minutes
    ignored_actions: int = 0
    completed_jobs: int = 0


@dataclass(slots=True)
class _Node:
    name: str
    phase: Phase
    since: float
    ready: bool
    lent_since: float = 0.0
    tier: Tier = Tier.NORMAL  # the partition it is lent to (lending .. reclaiming)


class Engine:
    """One run of one controller over a setup."""

    def __init__(self, setup: Setup, controller: Controller) -> None:
        self.s = setup
        self.ctl = controller
        self.pool = setup.pool
        self.rpn = setup.replicas_per_node
        self.nodes = {n: _Node(n, Phase.SERVING, -86400.0, True) for n in setup.node_names()}
        self.order = tuple(self.nodes)
        self.tiered = setup.config.slurm.fast_partition is not None
        self.research = Research.create(setup.mix, setup.gpus_per_node, setup.seed, tiered=self.tiered)
        self.heap: list[tuple[float, int, int, str, int]] = []
        self._n = 0
        self.ready_count = setup.nodes
        self.ready_t: list[float] = [0.0]
        self.ready_v: list[int] = [setup.nodes]
        self._unseen: list[float] = []  # scrape times of a recorded gap the policy has not been given
        self.lent_free: set[str] = set()
        self.lent_s = 0.0
        self.lends = 0
        self.reclaims = 0
        self.ignored = 0
        self._job_cache: dict[tuple[str, int, str, float | None], SlurmJob] = {}
        # cold starts: their own stream, so the job mix and the bursts stay as they were
        self._cold_rng = np.random.default_rng([setup.seed, 7])
        self._wake_rng = np.random.default_rng([setup.seed, 11])  # which wakes fail (wake_fail_rate)
        self._reclaim_at: dict[str, float] = {}
        self.reclaim_delays: list[float] = []  # measured: reclaim decided -> replica Ready, seconds
        self.fast_reclaim_delays: list[float] = []  # the same, of fast-tier nodes
        self.cold_starts: list[float] = []

    def _cold_start(self) -> float:
        """Release -> Ready: the wake of the sleeping replica (warm pool), else, or after the
        wake's wait when it fails (``wake_fail_rate``), a drawn cold start."""
        wait = 0.0
        if self.s.warm:
            if self.s.wake_fail_rate <= 0.0 or self._wake_rng.random() >= self.s.wake_fail_rate:
                return self.s.pool.wake_s
            wait = self.s.wake_wait_s
        mean, cv = self.s.cold_start_s, self.s.cold_start_cv
        if cv <= 0 or mean <= 0:
            return wait + mean
        sigma2 = math.log1p(cv * cv)
        v = float(self._cold_rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2)))
        self.cold_starts.append(v)
        return wait + v

    # --- events ------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, key: str, token: int = 0) -> None:
        self._n += 1
        heapq.heappush(self.heap, (t, kind, self._n, key, token))

    def _set_ready(self, t: float, delta: int) -> None:
        self.ready_count += delta
        if self.ready_t[-1] == t:
            self.ready_v[-1] = self.ready_count
        else:
            self.ready_t.append(t)
            self.ready_v.append(self.ready_count)

    def ready_at(self, t: float) -> int:
        i = bisect.bisect_right(self.ready_t, t) - 1
        return self.ready_v[i] if i >= 0 else self.s.nodes

    def _handle(self, t: float, kind: int, key: str, token: int) -> None:
        if kind == _LENT:
            n = self.nodes[key]
            if n.phase is Phase.LENDING:
                n.phase, n.since, n.lent_since = Phase.LENT, t, t
                self.lent_free.add(key)
                self._schedule(t)
        elif kind == _JOB_END:
            freed = self.research.complete(key, token, t)
            if freed:
                self._freed(t, freed)
        elif kind == _RELEASE:
            freed = self.research.release(key)
            if freed:
                self._freed(t, freed)
        elif kind == _FREE:
            n = self.nodes[key]
            if n.phase is Phase.RECLAIMING:
                n.phase, n.since = Phase.RETURNING, t
                self._push(t + self._cold_start(), _READY, key)
        elif kind == _READY:
            n = self.nodes[key]
            if n.phase is Phase.RETURNING:
                n.phase, n.since, n.ready = Phase.SERVING, t, True
                self._set_ready(t, +1)
                at = self._reclaim_at.pop(key, None)
                if at is not None:
                    (self.fast_reclaim_delays if n.tier is Tier.FAST else self.reclaim_delays).append(t - at)
                n.tier = Tier.NORMAL

    def _freed(self, t: float, nodes: Sequence[str]) -> None:
        for name in nodes:
            if self.nodes[name].phase is Phase.LENT:
                self.lent_free.add(name)
        self._schedule(t)

    def _schedule(self, t: float) -> None:
        if not self.lent_free:
            return
        free = sorted(self.lent_free)
        tiers = (False, True) if self.tiered else (False,)
        for fast in tiers:
            part = [n for n in free if (self.nodes[n].tier is Tier.FAST) == fast]
            for j in self.research.schedule(t, part, fast):
                for name in j.nodes:
                    self.lent_free.discard(name)
                self._push(t + j.remaining_s(), _JOB_END, j.job_id, j.run_token)

    # --- actions -----------------------------------------------------------------------------

    def _apply(self, t: float, a: Action) -> None:
        n = self.nodes.get(a.node)
        if n is None:
            self.ignored += 1
            return
        if a.kind is ActionKind.LEND:
            if n.phase is not Phase.SERVING or not n.ready:
                self.ignored += 1
                return
            n.phase, n.since, n.ready = Phase.LENDING, t, False
            n.tier = a.tier if self.tiered else Tier.NORMAL
            self._set_ready(t, -1)
            self._push(t + self.s.drain_s, _LENT, n.name)
            self.lends += 1
            return
        if n.phase is not Phase.LENT:
            self.ignored += 1
            return
        self.lent_s += t - n.lent_since
        n.phase, n.since = Phase.RECLAIMING, t
        self._reclaim_at[n.name] = t
        self.lent_free.discard(n.name)
        free_at = t
        jid = self.research.node_job.get(n.name)
        if jid is not None:
            job = self.research.jobs[jid]
            grace = self.s.config.slurm.fast_grace_s if n.tier is Tier.FAST else self.s.grace_s
            if job.state == "running" and self.research.preempt(jid, t, grace):
                self._push(job.free_at, _RELEASE, jid)
            free_at = max(free_at, job.free_at)
        self.reclaims += 1
        if free_at <= t:
            n.phase, n.since = Phase.RETURNING, t
            self._push(t + self._cold_start(), _READY, n.name)
        else:
            self._push(free_at, _FREE, n.name)

    # --- views -------------------------------------------------------------------------------

    def _jobs_view(self, t: float) -> dict[str, SlurmJob]:
        out: dict[str, SlurmJob] = {}
        base = self.s.start_unix
        for jid, j in self.research.running.items():
            ck = j.last_checkpoint(t) if (j.cls.publishes and j.state == "running") else None
            key = (jid, j.run_token, j.state, ck)
            got = self._job_cache.get(key)
            if got is None:
                assert j.run_start is not None
                slurm = self.s.config.slurm
                got = SlurmJob(
                    job_id=jid, name=j.cls.name, user="research",
                    partition=(slurm.fast_partition or "") if self.research.is_fast(j) else slurm.preempt_partition,
                    state=j.state, nodes=j.nodes, start_time=base + j.run_start,
                    checkpoint_time=None if ck is None else base + ck,
                    signal_save_s=j.cls.signal_save_s if j.cls.publishes else None, requeueable=True,
                    gpus_per_node=self.s.gpus_per_node, restart_count=j.restarts,
                )
                if len(self._job_cache) > 4096:
                    self._job_cache.clear()
                self._job_cache[key] = got
            out[jid] = got
        return out

    def _scraped(self, scrape_t: float) -> LoadSignals:
        """What Prometheus scraped at ``scrape_t`` (simulation seconds)."""
        s = self.s
        return signals(s.start_unix + scrape_t, s.workload.at(scrape_t), self.ready_at(scrape_t) * self.rpn, self.pool.target)

    def view(self, t: float) -> ClusterView:
        s = self.s
        base = s.start_unix
        scrape_t = (math.ceil(t / s.scrape_s - 1e-9) - 1) * s.scrape_s
        recovered: tuple[LoadSignals, ...] = ()
        if scrape_t < 0 or (not s.direct_reads and any(a <= scrape_t < b for a, b in s.signal_gaps)):
            sig = None
            if scrape_t >= 0 and s.signal_gaps_recorded and (not self._unseen or self._unseen[-1] < scrape_t):
                self._unseen.append(scrape_t)
        else:
            sig = self._scraped(scrape_t)
            recovered, self._unseen = tuple(self._scraped(u) for u in self._unseen), []
        ready = self.ready_count
        # requests on each serving replica, as scraped (the load is spread evenly)
        inflight = None
        if sig is not None and sig.running is not None and sig.waiting is not None and sig.replicas_reporting > 0:
            inflight = (sig.running + sig.waiting) / sig.replicas_reporting * self.rpn
        rj = self.research.node_job
        states: list[NodeState] = []
        for name in self.order:
            n = self.nodes[name]
            ph = n.phase
            in_slurm = ph is Phase.LENT or ph is Phase.RECLAIMING  # no serving pod; its job, if any
            serves = ph is Phase.SERVING and n.ready
            job = rj.get(name) if in_slurm else None
            st = "allocated" if job is not None else "idle" if ph is Phase.LENT else "drained"
            states.append(NodeState(
                name, self.pool.name, ph, base + n.since, s.gpus_per_node, None, 0 if in_slurm else self.rpn, serves,
                st, (job,) if job is not None else (), inflight=inflight if serves else None,
                # lent to that tier (lending .. reclaiming); a returning node's is not reported
                tier=n.tier if in_slurm or ph is Phase.LENDING else Tier.NORMAL,
            ))
        ready_rep = ready * self.rpn
        committed = sum(1 for n in self.nodes.values() if n.phase in (Phase.SERVING, Phase.RECLAIMING, Phase.RETURNING))
        h = measured_horizon(s.config, self.pool, self.reclaim_delays)
        hf = measured_horizon(s.config, self.pool, self.fast_reclaim_delays, fast=True) if self.tiered else None
        pools = {self.pool.name: PoolState(self.pool.name, sig, (), ready_rep, committed * self.rpn, horizon_s=h,
                                           fast_horizon_s=hf, recovered=recovered)}
        return ClusterView(
            now=base + t, nodes=tuple(states), pools=pools, jobs=self._jobs_view(t),
            pending_research_nodes=self.research.pending_nodes(),
            pending_fast_nodes=self.research.pending_nodes(fast=True) if self.tiered else 0,
        )

    # --- run ---------------------------------------------------------------------------------

    def run(self) -> Result:
        wall0 = time.perf_counter()
        cpu0 = time.process_time()
        s = self.s
        end = s.workload.duration_s
        tick = s.tick_s
        ticks = int(math.ceil(end / tick - 1e-9))
        tt = np.empty(ticks)
        tr = np.empty(ticks, dtype=np.int32)
        tl = np.empty(ticks, dtype=np.int32)
        tc = np.empty(ticks, dtype=np.int32)
        heap = self.heap
        for k in range(ticks):
            t = k * tick
            while heap and heap[0][0] <= t:
                et, kind, _, key, token = heapq.heappop(heap)
                self._handle(et, kind, key, token)
            v = self.view(t)
            for a in self.ctl.decide(v):
                self._apply(t, a)
            tt[k] = t
            tr[k] = self.ready_count
            phases = [n.phase for n in self.nodes.values()]
            tl[k] = lent = phases.count(Phase.LENT)
            tc[k] = len(phases) - lent - phases.count(Phase.LENDING)  # serving or on the way back
        while heap and heap[0][0] < end:
            et, kind, _, key, token = heapq.heappop(heap)
            self._handle(et, kind, key, token)
        for n in self.nodes.values():
            if n.phase is Phase.LENT:
                self.lent_s += end - n.lent_since
        self.research.finish(end)
        ready_min = minute_minimum(self.ready_t, self.ready_v, s.workload.minutes, s.workload.minute_s)
        cap = ready_min * self.rpn
        over = s.workload.load > cap + 1e-9
        if s.workload.usable is not None:  # bridged gaps of a history are not judged
            over &= s.workload.usable
        viol = np.nonzero(over)[0]
        acct = self.research.acct
        g = s.gpus_per_node
        m = Metrics(
            policy=self.ctl.name, lent_gpu_hours=self.lent_s * g / 3600.0, useful_gpu_hours=acct.useful_gpu_s / 3600.0,
            lost_gpu_hours=acct.lost_gpu_s / 3600.0, preemptions=acct.preemptions, lends=self.lends,
            reclaims=self.reclaims, slo_violation_minutes=int(viol.size),
            trace_minutes=s.workload.minutes if s.workload.usable is None else int(s.workload.usable.sum()),
            early_preemptions=acct.early_preemptions, early_lost_gpu_hours=acct.early_lost_gpu_s / 3600.0,
        )
        return Result(
            metrics=m, wall_s=time.perf_counter() - wall0, cpu_s=time.process_time() - cpu0, tick_t=tt, tick_ready=tr,
            tick_lent=tl, tick_committed=tc, minute_ready_min=ready_min, violation_minutes=viol,
            ignored_actions=self.ignored, completed_jobs=acct.completed,
        )


def minute_minimum(times: Sequence[float], values: Sequence[int], minutes: int, minute_s: float) -> np.ndarray:
    """Least value of a step function (``values[i]`` from ``times[i]`` on) within each minute."""
    ts = np.asarray(times, dtype=float)
    vs = np.asarray(values, dtype=float)
    starts = np.arange(minutes, dtype=float) * minute_s
    idx = np.searchsorted(ts, starts, side="right") - 1
    out = np.where(idx >= 0, vs[np.maximum(idx, 0)], vs[0])
    mi = np.floor(ts / minute_s).astype(np.int64)
    ok = (mi >= 0) & (mi < minutes)
    np.minimum.at(out, mi[ok], vs[ok])
    return out


def simulate(setup: Setup, controller: Controller) -> Result:
    """Run ``controller`` over ``setup`` and return its metrics and time series."""
    return Engine(setup, controller).run()
