"""What the policy remembers of a pool between ticks: the load history, the calibration's input
and the measured reclaim delays. Fed samples, never reads them: the daemon (after the start-up
back-fill from Prometheus, ``bridge.wiring.policy_memory``) and the simulator keep one each."""

from __future__ import annotations

import math
from dataclasses import replace

from bridge.config import Config, PoolConfig
from bridge.model import LoadSignals, PoolState, ReclaimMode, Tier
from bridge.policy.calibrate import Calibrator
from bridge.policy.forecast import history_windows, lends_warm, measured_horizon
from bridge.policy.history import HistoryRecorder


MAX_DELAYS = 512  # measured reclaims kept per tier (the newest)


class PoolMemory:
    def __init__(self, config: Config, pool: PoolConfig) -> None:
        self.config, self.pool = config, pool
        self.recorder = HistoryRecorder(history_windows(config, pool))
        self.calibrator = Calibrator(config, pool) if config.policy.calibration.enabled else None
        self.delays: list[float] = []  # measured reclaims: decision -> Ready, s (the newest MAX_DELAYS)
        self.fast_delays: list[float] = []  # the same, of nodes lent to the fast tier
        self.last_t = -math.inf  # the newest sample in the history

    def add(self, sample: LoadSignals, *, history: bool = True, calibration: bool = True) -> None:
        """One sample; the history takes only samples newer than its newest."""
        if history and sample.t > self.last_t:
            self.recorder.add(sample)
            self.last_t = sample.t
        elif history:
            return  # already seen: not counted twice by the calibration either
        if calibration and self.calibrator is not None:
            self.calibrator.add(sample)

    def add_delay(self, seconds: float, tier: Tier = Tier.NORMAL, mode: ReclaimMode = ReclaimMode.COLD) -> None:
        """A measured reclaim. A warm pool plans with both modes (a failed wake costs a cold
        start: the quantile covers it); a cold one never with a wake (a node lent warm before
        the pool stopped lending warm), which would lower its horizon below its cold starts."""
        if mode is ReclaimMode.WARM and not lends_warm(self.pool):
            return
        delays = self.fast_delays if tier is Tier.FAST else self.delays
        delays.append(seconds)
        del delays[:-MAX_DELAYS]

    def pool_state(self, ps: PoolState, now: float, nodes: int) -> PoolState:
        """The pool's state with its history, reclaim horizon (the view's if it brings one, as
        the simulator's does, else the measured delays'; the fast tier's from its own), calibration
        and governor."""
        h = ps.horizon_s if ps.horizon_s is not None else measured_horizon(self.config, self.pool, self.delays)
        hf = (ps.fast_horizon_s if ps.fast_horizon_s is not None
              else measured_horizon(self.config, self.pool, self.fast_delays, fast=True))
        cal = gov = None
        if self.calibrator is not None:
            capacity = nodes * self.pool.replicas_per_node
            gov = self.calibrator.governor(now, capacity=capacity, nodes=nodes, horizon_s=h)
            cal = self.calibrator.calibration(now, capacity=capacity, horizon_s=h, governor=gov)
        return replace(ps, history=self.recorder.history(now), horizon_s=h, fast_horizon_s=hf, calibration=cal, governor=gov)
