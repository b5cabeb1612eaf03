"""The controllers the simulator compares, all behind ``engine.Controller``.

- ``bridge``: the daemon's own ``bridge.policy.plan(view, config)``, fed the history the
  daemon keeps (the same ``bridge.policy.memory.PoolMemory``);
- ``oracle``: knows the future load; keeps exactly the nodes the next
  ``grace + cold start + tick`` needs and lends the rest, so it never violates the SLO
  (within the pool's size) and lends the most a controller acting on ticks can: the upper bound;
- ``fixed-window``: the published practice: from 20:00 to 08:00 (trace-local time) lend what
  is above a fixed floor, reclaim reactively when load exceeds Ready capacity, take
  everything back at 08:00;
- ``reactive``: HPA-like on the current signal: scale up at once to ``ceil(demand)``, scale
  down to the highest recommendation of the last 5 minutes; no forecast, no headroom, no
  notion of cold start.

The baselines pick reclaim victims with the policy's own ``choose_victims`` and the rule in
``config.policy.victims``, so ``--victims`` compares the rules for every controller.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from bridge.config import Config, PoolConfig
from bridge.model import Action, ActionKind, Calibration, ClusterView, Governor, NodeState, Phase, Plan, Reason
from bridge.policy import plan
from bridge.policy.demand import demand, nodes_for
from bridge.policy.forecast import Forecast, forecast
from bridge.policy.memory import PoolMemory
from bridge.policy.victims import choose_victims
from bridge.simulate.engine import Controller, Setup
from bridge.simulate.workload import Workload, signals

POLICIES = ("bridge", "fixed-window", "reactive", "oracle")
NIGHT_START_S = 20 * 3600.0
NIGHT_END_S = 8 * 3600.0
# the fixed window's operator keeps the usual 20 % + half a replica over the p95 (the
# baseline's own rule of thumb; the policy has no such constant, it calibrates its margin)
FIXED_HEADROOM = 0.2
FIXED_HEADROOM_REPLICAS = 0.5


def _counts(view: ClusterView, pool: str) -> tuple[list[NodeState], list[NodeState], list[NodeState], int]:
    """The pool's nodes, its Ready serving nodes, its lent nodes, and how many are committed
    (serving + reclaiming + returning)."""
    nodes = [n for n in view.nodes if n.pool == pool]
    ready = [n for n in nodes if n.phase is Phase.SERVING and n.serving_ready]
    lent = [n for n in nodes if n.phase is Phase.LENT]
    committed = sum(1 for n in nodes if n.phase in (Phase.SERVING, Phase.RECLAIMING, Phase.RETURNING))
    return nodes, ready, lent, committed


class _Base:
    name = "base"

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.config: Config = setup.config
        self.pool: PoolConfig = setup.pool
        self.rpn = setup.replicas_per_node

    def _lend(self, ready: Sequence[NodeState], k: int, why: str) -> list[Action]:
        # most recently Ready last: lend the longest-serving nodes first, by name on ties
        order = sorted(ready, key=lambda n: (n.phase_since, n.name))
        return [Action(ActionKind.LEND, n.name, self.pool.name, Reason.LOW_FORECAST, f"{self.name}: {why}") for n in order[:k]]

    def _reclaim(self, view: ClusterView, lent: Sequence[NodeState], k: int, why: str) -> list[Action]:
        if k <= 0 or not lent:
            return []
        slurm = self.config.slurm
        choice = choose_victims(lent, k, view.jobs, view.now, rule=self.config.policy.victims,
                                min_runtime_s=slurm.min_runtime_s, allow_young=True, grace_s=slurm.grace_s)
        return [
            Action(ActionKind.RECLAIM, n, self.pool.name, Reason.SPIKE, f"{self.name}: {why}", urgent=True, jobs=choice.jobs.get(n, ()))
            for n in choice.nodes
        ]

    def _demand(self, view: ClusterView) -> float | None:
        ps = view.pools.get(self.pool.name)
        return None if ps is None else demand(ps.signals, self.pool.target).replicas

    def _nodes_for(self, replicas: float) -> int:
        return max(0, math.ceil(replicas / self.rpn - 1e-9))


class BridgeController(_Base):
    """The real policy. Keeps the load history the way the daemon does (one sample a tick)."""

    name = "bridge"

    def __init__(self, setup: Setup, explain_every: int = 0) -> None:
        super().__init__(setup)
        # the daemon's memory: its history, and the governor's rolling window (28 days: a run
        # up to that long lies in one window, so its budget is that window's)
        self.memory = PoolMemory(self.config, self.pool)
        self.governors: list[Governor] = []  # each tick's, for analysis
        self.capacity = setup.nodes * self.rpn
        self.calibrations: list[Calibration] = []  # each new one, for analysis
        # every ``explain_every`` ticks, the forecast's parts (analysis only; 0 = off)
        self.explain_every = explain_every
        self.explained: list[tuple[float, Forecast]] = []
        self._ticks = 0
        # per tick, for analysis: demand now, forecast peak, desired serving
        self.trace_t: list[float] = []
        self.trace_demand: list[float] = []
        self.trace_forecast: list[float] = []
        self.trace_desired: list[int] = []
        self.trace_reason: list[str] = []
        self.last_plan: Plan | None = None
        if setup.history is not None:
            self.prime(setup.history, setup.start_unix - setup.history.duration_s)

    def prime(self, history: Workload, start_unix: float) -> None:
        """Fill the history the way the daemon does at start-up from Prometheus: one sample
        per tick of a pool that served everything (nothing lent before the daemon)."""
        tick = self.setup.tick_s
        cap = self.capacity
        for k in range(int(history.duration_s // tick)):
            t = k * tick
            self.memory.add(signals(start_unix + t, history.at(t), cap, self.pool.target))

    def decide(self, view: ClusterView) -> Sequence[Action]:
        ps = view.pools[self.pool.name]
        for sample in (*ps.recovered, *((ps.signals,) if ps.signals is not None else ())):
            self.memory.add(sample)
        ps = self.memory.pool_state(ps, view.now, self.setup.nodes)
        hist, cal = ps.history, ps.calibration
        if ps.governor is not None:
            self.governors.append(ps.governor)
        if cal is not None and (not self.calibrations or self.calibrations[-1] is not cal):
            self.calibrations.append(cal)
        p = plan(replace(view, pools={**view.pools, self.pool.name: ps}), self.config)
        if self.explain_every and self._ticks % self.explain_every == 0:
            fc = forecast(hist, ps.signals, view.now, config=self.config, pool=self.pool)
            self.explained.append((view.now, fc))
        self._ticks += 1
        self.last_plan = p
        d = next((d for d in p.pools if d.pool == self.pool.name), None)
        self.trace_t.append(view.now)
        self.trace_demand.append(math.nan if d is None or d.demand_now is None else d.demand_now)
        self.trace_forecast.append(math.nan if d is None or d.forecast_peak is None else d.forecast_peak)
        self.trace_desired.append(-1 if d is None else d.desired_serving)
        self.trace_reason.append("" if d is None else str(d.reason))
        return p.actions


class OracleController(_Base):
    """Keeps ready what the future needs, lends everything else (exact over the load)."""

    name = "oracle"

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        w = setup.workload
        # it knows the load, not each cold start: it plans with their 99.9th percentile
        horizon = setup.grace_s + setup.cold_start_quantile(0.999) + setup.tick_s
        tick = setup.tick_s
        ticks = int(math.ceil(w.duration_s / tick - 1e-9))
        load = w.load
        need = np.zeros(ticks, dtype=np.int64)
        ms = w.minute_s
        for k in range(ticks):
            t = k * tick
            # every minute that overlaps [t, t + horizon)
            lo = int(math.floor(t / ms))
            hi = int(math.ceil((t + horizon) / ms))
            seg = load[lo : min(hi, w.minutes)]
            peak = float(seg.max()) if seg.size else 0.0
            need[k] = math.ceil(peak / self.rpn - 1e-9)
        self.need = np.maximum(need, self.pool.min_serving)

    def decide(self, view: ClusterView) -> Sequence[Action]:
        t = view.now - self.setup.start_unix
        k = min(int(round(t / self.setup.tick_s)), len(self.need) - 1)
        nodes, ready, lent, committed = _counts(view, self.pool.name)
        need = min(int(self.need[k]), len(nodes))
        if need > committed:
            return self._reclaim(view, lent, need - committed, f"the next minutes need {need} nodes")
        k_lend = min(len(ready) - need, committed - need)
        if k_lend > 0:
            return self._lend(ready, k_lend, f"the next minutes need only {need} nodes")
        return ()


class ReactiveController(_Base):
    """HPA-like: up at once to ceil(demand), down to the max of the last window."""

    name = "reactive"

    def __init__(self, setup: Setup, window_s: float = 300.0) -> None:
        super().__init__(setup)
        self.window_s = window_s
        self.recent: deque[tuple[float, int]] = deque()

    def _wanted(self, view: ClusterView) -> tuple[int | None, int | None]:
        d = self._demand(view)
        now = view.now
        while self.recent and self.recent[0][0] < now - self.window_s:
            self.recent.popleft()
        if d is None:
            self.recent.clear()  # no signal: no scale-down until a full window is seen again
            return None, None
        up = max(self.pool.min_serving, self._nodes_for(d))
        self.recent.append((now, up))
        full = now - self.recent[0][0] >= self.window_s - 1e-6
        down = max(v for _, v in self.recent) if full else None
        return up, down

    def decide(self, view: ClusterView) -> Sequence[Action]:
        up, down = self._wanted(view)
        if up is None:
            return ()
        nodes, ready, lent, committed = _counts(view, self.pool.name)
        up = min(up, len(nodes))
        if up > committed:
            return self._reclaim(view, lent, up - committed, f"demand needs {up} nodes")
        if down is not None and committed > down:
            return self._lend(ready, min(len(ready), committed - down), f"5-min max demand needs {down} nodes")
        return ()


class FixedWindowController(ReactiveController):
    """Lend above a fixed floor from 20:00 to 08:00; reactive reclaim; all back at 08:00."""

    name = "fixed-window"

    def __init__(self, setup: Setup, floor: int | None = None) -> None:
        super().__init__(setup)
        self.floor = floor if floor is not None else default_fixed_floor(setup)

    @staticmethod
    def in_window(t: float) -> bool:
        tod = t % 86400.0
        return tod >= NIGHT_START_S or tod < NIGHT_END_S

    def decide(self, view: ClusterView) -> Sequence[Action]:
        t = view.now  # the real clock (UTC): a trace's t = 0 is mapped to a UTC midnight
        up, down = self._wanted(view)
        nodes, ready, lent, committed = _counts(view, self.pool.name)
        if not self.in_window(t):
            return self._reclaim(view, lent, len(lent), "08:00: the lending window is over")
        if up is None:
            return ()
        if up > len(ready) and up > committed:  # load exceeds what serves, nothing on its way
            return self._reclaim(view, lent, min(up, len(nodes)) - committed, f"demand needs {up} nodes")
        keep = max(self.floor, down if down is not None else len(nodes))
        if committed > keep:
            return self._lend(ready, min(len(ready), committed - keep), f"night window, floor {self.floor} nodes")
        return ()


def default_fixed_floor(setup: Setup) -> int:
    """The floor an operator would set: the 95th percentile of the night's 10-minute demand,
    with the pool's headroom (the published practice keeps a fixed floor, not a forecast)."""
    w = setup.workload
    wl = w.window_load
    tod = (setup.start_unix + np.arange(wl.size) * w.window_s) % 86400.0
    night = wl[(tod >= NIGHT_START_S) | (tod < NIGHT_END_S)]
    p95 = float(np.percentile(night, 95)) if night.size else float(wl.max())
    need = nodes_for(p95, headroom=FIXED_HEADROOM, headroom_replicas=FIXED_HEADROOM_REPLICAS,
                     replicas_per_node=setup.replicas_per_node)
    return min(setup.nodes, max(setup.pool.min_serving, need))


def make_controller(name: str, setup: Setup, *, fixed_floor: int | None = None) -> Controller:
    """A fresh controller by its CLI name."""
    if name == "bridge":
        return BridgeController(setup)
    if name == "oracle":
        return OracleController(setup)
    if name == "fixed-window":
        return FixedWindowController(setup, fixed_floor)
    if name == "reactive":
        return ReactiveController(setup)
    raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {name!r}")
