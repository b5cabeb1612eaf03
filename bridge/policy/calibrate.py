"""The pool's safety margin, calibrated on its own history to spend the SLO budget.

The operator states one number per pool, ``pools[].slo_budget``: the share of minutes that may
see offered load above Ready capacity. Whether a given margin keeps that promise depends on
the traffic (how fast and how far it moves within a reclaim horizon), so the margin is
measured, not configured:

- **score** of history step ``i``: how far demand at ``i`` rose above the base forecast made a
  reclaim horizon earlier, ``(d'[i] + c) / (b[i - h] + c)``, ``d'`` the largest capacity in whole
  nodes that would *not* have served ``d`` (capacity is rounded up to nodes); ``b`` is the peak over the lend
  lookback (what a lend must fit under), ``h`` the reclaim horizon in steps (capacity wanted
  at ``i`` must have been asked for at ``i - h``), ``c`` a smoothing term in replicas so that
  a near-idle pool does not give wild ratios;
- **margin** = the conformal quantile of the scores at level ``1 - a``: keeping
  ``margin * (b + c) - c`` replicas would have let through a share ``a`` of the steps;
- **adaptive level** (adaptive conformal inference, unrolled so it is a function of history
  rather than of kept state): ``a = budget * (AIM * allowed + 1) / (spent + 1)``, where ``spent``
  is the steps of the same window in which demand *did* exceed the Ready replicas (the
  violations the policy really had, the unavoidable ones above the whole pool excluded) and
  ``allowed = budget * steps``. Spending less than ``AIM`` (80 %) of the budget loosens the
  margin, spending more tightens it, so the realised rate is pulled just under the budget
  whatever the traffic. The numerator's one minute of prior credit (mirroring the
  denominator's +1) is earned with the budget, ``min(1, AIM * allowed)``, and the numerator
  is at least 1: a fresh pool is never looser than the budget before it has earned half a
  minute of it (about 10 h at 0.1 %), and reaches the full credit after about 21 h;
- **short history**: with fewer scores than the level can rank (about ``1 / a``), the margin
  is an exponential tail extrapolated from the largest scores (``_quantile``), above the
  largest rise seen, relaxing to the plain rank as the history grows.

Everything is computed from arrays of history (one value per step), vectorised with numpy:
the daemon fills them from Prometheus (``query_range``) at start-up, the simulator from the
trace; ``Calibrator`` keeps them incrementally and recomputes every ``interval_s``.
"""

from __future__ import annotations

import math

import numpy as np

from bridge.config import Config, PoolConfig
from bridge.model import Calibration, Governor, LoadSignals
from bridge.policy.demand import nodes_for, replicas_needed
from bridge.policy.governor import Incident, ViolationLedger, gap_steps, govern, pace


# The feedback aims at this share of the budget: violations come in clusters (a level shift
# costs several minutes before reclaimed capacity is Ready) and the level reacts only after
# them, so aiming at the whole budget would overshoot it about half the time.
AIM = 0.8


def sliding_max(x: np.ndarray, w: int) -> np.ndarray:
    """``out[i] = max(x[i - w + 1 .. i])`` ignoring NaN (``-inf`` where all are NaN), in
    O(n log w) by doubling."""
    y = np.where(np.isnan(x), -np.inf, x).astype(float)
    if w <= 1 or y.size == 0:
        return y
    span = 1
    while span * 2 <= w:
        z = y.copy()
        z[span:] = np.maximum(y[span:], y[:-span])
        y, span = z, span * 2
    rest = w - span
    if rest > 0:
        z = y.copy()
        z[rest:] = np.maximum(y[rest:], y[:-rest])
        y = z
    return y


def calibrate(
    demand: np.ndarray,
    ready: np.ndarray,
    *,
    step_s: float,
    horizon_s: float,
    lookback_s: float,
    budget: float,
    smoothing: float,
    capacity: float,
    min_samples: int,
    at: float = 0.0,
    hours: np.ndarray | None = None,
    replicas_per_node: int = 1,
    pace: float = 1.0,
    rises: tuple[np.ndarray, np.ndarray] | None = None,
) -> Calibration:
    """The margin from per-step arrays (oldest first; NaN = unknown): ``demand`` the peak
    demand of each step in replicas, ``ready`` the fewest Ready replicas in it. ``capacity``:
    replicas the whole pool can serve (demand above it is no one's violation). ``rises``:
    ``_rises`` of ``demand`` with these arguments when the caller has it already."""
    d = np.asarray(demand, dtype=float)
    r = np.asarray(ready, dtype=float)
    c = smoothing
    if rises is None:
        rises = _rises(d, step_s=step_s, horizon_s=horizon_s, lookback_s=lookback_s, replicas_per_node=replicas_per_node, smoothing=c)
    scores, where = rises
    scores = scores * (1.0 + 1e-9)
    n = int(scores.size)
    known = np.isfinite(d) & np.isfinite(r)
    spent = int(np.count_nonzero(known & (d > r + 1e-6) & (d <= capacity + 1e-6)))
    allowed = budget * int(np.count_nonzero(known))
    # the one unspent minute of prior credit (the +1 that mirrors the denominator's) is earned
    # with the budget: a fresh pool, with less than a minute of budget accrued, gets as much
    # credit as it has earned, and is never looser than the budget before half a minute
    credit = min(1.0, AIM * allowed)
    # ``pace`` (the governor's share of its usable budget still left, 0..1) scales the level:
    # the margin tightens smoothly as the hard cap nears instead of meeting it at full speed
    alpha = min(0.5, budget * max(AIM * allowed + credit, 1.0) / (spent + 1.0)) * min(max(pace, 0.0), 1.0)
    margin: float | None = None
    by_hour: tuple[float, ...] = ()
    if n >= max(1, min_samples):
        k = math.ceil((n + 1) * (1.0 - alpha))  # conformal rank (1-based)
        logs = np.log(scores)
        margin = max(1.0, math.exp(_quantile(logs, k, alpha)))
        if hours is not None:
            by_hour = _by_hour(logs, np.asarray(hours)[where], k, alpha)
    return Calibration(
        margin=margin,
        level=1.0 - alpha,
        samples=n,
        needed=max(1, min_samples),
        spent=spent,
        allowed=allowed,
        budget=budget,
        horizon_s=horizon_s,
        smoothing=c,
        at=at,
        by_hour=by_hour,
        peak_seen=float(np.nanmax(d)) if np.isfinite(d).any() else 0.0,
        pace=pace,
    )


def _rises(
    d: np.ndarray, *, step_s: float, horizon_s: float, lookback_s: float, replicas_per_node: int, smoothing: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each step's rise over the base forecast made a horizon earlier (the module docstring's
    score) where both are known, and the index of the step each is for."""
    h = max(1, math.ceil(horizon_s / step_s - 1e-9))
    b = sliding_max(d, max(1, math.ceil(lookback_s / step_s - 1e-9)))
    if d.size <= h:
        return np.empty(0), np.empty(0, dtype=np.int64)
    num, den = d[h:], b[:-h]
    ok = np.isfinite(num) & np.isfinite(den)
    # capacity comes in whole nodes: keeping margin * (b + c) - c replicas, rounded up to
    # nodes, serves d exactly when margin exceeds this score (so rounding is not counted twice)
    below = replicas_per_node * (np.ceil(num[ok] / replicas_per_node - 1e-9) - 1.0)
    return (np.maximum(below, 0.0) + smoothing) / (den[ok] + smoothing), np.nonzero(ok)[0] + h


def _rank(x: np.ndarray, k: int) -> float:
    """The k-th smallest (1-based) of ``x``; its maximum when ``k`` is beyond it."""
    if k >= x.size:
        return float(x.max())
    return float(np.partition(x, k - 1)[k - 1])


# An hour's typical rise is shrunk toward all hours' with this weight in scores (a week of
# one-minute steps of one hour): one day of history barely moves it, a week weighs half.
HOUR_PRIOR_SAMPLES = 420
HOUR_LEVEL = 0.9  # the hour's typical rise: this quantile of its log-scores
MIN_HOUR_SEEN = 30  # scores (minutes) of an hour of the day before anything is lent across it


def _quantile(x: np.ndarray, k: int, alpha: float) -> float:
    """The k-th smallest (1-based) of ``x``, the conformal rank at miss rate ``alpha``. When
    the history is too short to hold that rank (``k > n``: fewer than about ``1 / alpha``
    scores, a fresh pool's first hours), the largest score seen would promise a miss rate of
    ``1 / (n + 1)``, not ``alpha``; so the tail is extrapolated instead: an exponential tail
    fitted to the ``sqrt(n)`` largest values (their mean excess over the next one, the usual
    peaks-over-threshold estimate) read at level ``1 - alpha``. It is never below the
    largest value seen, and it meets the plain rank as the history reaches ``1 / alpha``."""
    n = int(x.size)
    if k <= n or n < 3 or alpha <= 0:
        return _rank(x, k)
    m = min(n - 1, max(2, math.ceil(math.sqrt(n))))
    top = np.sort(np.partition(x, n - m - 1)[n - m - 1 :])  # the m + 1 largest, ascending
    u = float(top[0])
    excess = float(np.mean(top[1:] - u))
    # P(x > u) ~ m / (n + 1), P(x > u + y) ~ that x exp(-y / excess): solve for alpha
    return max(float(top[-1]), u + excess * math.log(m / ((n + 1) * alpha)))


def _by_hour(logs: np.ndarray, hour: np.ndarray, k: int, alpha: float) -> tuple[float, ...]:
    """Margins by hour of the day (locally shifted conformal): each log-score minus its hour's
    typical rise is exchangeable across hours, so one conformal rank of the shifted scores
    plus each hour's own typical rise gives a margin per hour whose misses still total the
    level over the day: hours whose load habitually jumps (a morning ramp) get more, calm
    hours less. An hour's typical rise is shrunk toward the typical rise of all hours, by
    its number of scores (``HOUR_PRIOR_SAMPLES``), so a day of history barely moves it. An
    hour with fewer than ``MIN_HOUR_SEEN`` scores has no margin (``inf``)."""
    n = logs.size
    base = _rank(logs, int(HOUR_LEVEL * (n - 1)) + 1)
    # each hour's HOUR_LEVEL quantile (lower order statistic) in one sort, not 24 quantile calls
    order = np.lexsort((logs, hour))
    counts = np.bincount(hour, minlength=24)[:24]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    have = counts > 0
    q_hour = np.full(24, base)
    q_hour[have] = logs[order][starts[have] + (HOUR_LEVEL * (counts[have] - 1)).astype(np.int64)]
    w = counts / (counts + HOUR_PRIOR_SAMPLES)
    mu = w * q_hour + (1.0 - w) * base
    q = _quantile(logs - mu[hour], k, alpha)
    # an hour the history has not shown yet (a fresh pool's first day) gets no margin of its
    # own (inf): its rise is unknown (a morning ramp first seen live); plan() then keeps
    # capacity for the highest load seen so far
    return tuple(max(1.0, math.exp(q + m)) if c >= MIN_HOUR_SEEN else math.inf for m, c in zip(mu, counts, strict=True))


# Change points (recovery when the load changes character). Page-Hinkley on the normalised
# residuals of the forecast: each step's log-score (the rise over the base forecast made a
# reclaim horizon earlier) minus its hour's typical rise, divided by their robust spread (MAD);
# the statistic accumulates what exceeds ``CP_DELTA`` spreads and alarms above
# ``CP_LAMBDA``: a single burst of a minute does not reach it, a level shift (every step of a
# lookback far above its base) or a new burstiness (many steps beyond it) does, within minutes.
CP_DELTA = 4.0
CP_LAMBDA = 20.0
# The old regime is forgotten at this rate: from the step where the new regime's own scores
# begin (the base forecast no longer reaches back before the change), the history before it
# that the calibration keeps halves every ``CP_HALF_LIFE_S``; after about a day only the new
# regime's own history counts. The margins widened at once (the change's own scores are in).
CP_HALF_LIFE_S = 3 * 3600.0
# A change is a new regime only while its level holds: in most whole hours since it (the
# median), demand at least this many times the level of the same hour of the day before it.
# A burst episode that ends (BurstGPT's spikes: hours far above a near-idle level, then back)
# stops being one as soon as its calm hours outnumber its busy ones, and the history it would
# have forgotten (the earlier spikes, which recur) counts again. And only once it held for
# ``CP_HOLD_HOURS``: most of BurstGPT's episodes end sooner (with one hour, forgetting cost it
# 13 points of its harvest, with six 7), and a level shift's recovery is as fast (the x3 cases).
CP_LEVEL_RATIO = 1.5
CP_HOLD_HOURS = 6


def change_point(logs: np.ndarray, mu_hour: np.ndarray | None) -> int | None:
    """Index (into ``logs``) of the step of the last Page-Hinkley alarm, or None."""
    x = logs - (mu_hour if mu_hour is not None else 0.0)
    med = float(np.median(x))
    spread = 1.4826 * float(np.median(np.abs(x - med))) + 0.01
    z = (x - med) / spread - CP_DELTA
    last: int | None = None
    start = 0
    zs = z.tolist()
    while start < z.size:
        hit = _first_alarm(z, zs, start)
        if hit is None:
            break
        last, start = hit, hit + 1
    return last


def _first_alarm(z: np.ndarray, zs: list[float], start: int, near: int = 32) -> int | None:
    """The first step from ``start`` at which the Page-Hinkley statistic restarted there
    (the cumulative sum less its running minimum, floored at 0) exceeds ``CP_LAMBDA``.
    The ``near`` steps one by one (``zs``: ``z`` as floats), then chunks that double, each
    summed on from the last one's sum in the same order as one whole ``cumsum`` (the same
    numbers): a trace that alarms often costs linear time, not one pass over the rest of the
    window per alarm."""
    s0, m0, pos = 0.0, 0.0, start
    for v in zs[start : start + near]:
        s0 += v
        m0 = min(m0, s0)
        if s0 - m0 > CP_LAMBDA:
            return pos
        pos += 1
    size = 64
    while pos < z.size:
        s = np.cumsum(np.concatenate(([s0], z[pos : pos + size])))[1:]
        m = np.minimum(np.minimum.accumulate(s), m0)
        hit = np.nonzero(s - m > CP_LAMBDA)[0]
        if hit.size:
            return pos + int(hit[0])
        s0, m0, pos, size = float(s[-1]), float(m[-1]), pos + size, size * 2
    return None


def level_held(d: np.ndarray, at: int, hours: np.ndarray, steps_per_hour: int) -> bool:
    """Whether the load's level since step ``at`` held above ``CP_LEVEL_RATIO`` x the level
    before it: the median, over the whole hours since ``at``, of each hour's mean demand over
    the mean of the same hour of the day before ``at`` (the overall mean before ``at`` for an
    hour of the day it did not see). False before ``CP_HOLD_HOURS`` whole hours."""
    m = (d.size - at) // steps_per_hour
    if m < CP_HOLD_HOURS or at < steps_per_hour:
        return False
    pre, ph = d[:at], hours[:at]
    overall = float(np.nanmean(pre)) if np.isfinite(pre).any() else math.nan
    sums = np.bincount(ph, weights=np.nan_to_num(pre), minlength=24)[:24]
    counts = np.bincount(ph, weights=np.isfinite(pre).astype(float), minlength=24)[:24]
    profile = np.where(counts > 0, sums / np.maximum(counts, 1.0), overall)
    post = d[at : at + m * steps_per_hour].reshape(m, steps_per_hour)
    seen = np.isfinite(post).any(axis=1)
    if not seen.any() or not math.isfinite(overall):
        return False
    level = np.nanmean(post[seen], axis=1)
    before = profile[hours[at : at + m * steps_per_hour : steps_per_hour][seen]]
    return bool(np.median(level / np.maximum(before, 1e-9)) >= CP_LEVEL_RATIO)


def history_span_s(config: Config) -> float:
    """History a pool's policy memory is rebuilt from: the calibration's window and the governor's."""
    return max(config.policy.calibration.window_s, config.policy.governor.window_s)


class Calibrator:
    """One pool's calibration input (peak demand and fewest Ready replicas per step) kept
    incrementally, and its ``Calibration`` recomputed at most every ``interval_s``.

    Only a cache: ``add`` the same samples (the daemon's Prometheus history at start-up, then
    each new sample) and the same calibration comes out."""

    def __init__(self, config: Config, pool: PoolConfig) -> None:
        cal = config.policy.calibration
        self.config = config
        self.pool = pool
        self.governor_window_s = config.policy.governor.window_s
        self.budget_steps = pool.slo_budget * self.governor_window_s / cal.step_s  # the governor's budget
        self.ledger = ViolationLedger(
            step_s=cal.step_s, window_s=self.governor_window_s, gap_steps=gap_steps(config, pool, cal.step_s, self.governor_window_s),
            stop=self.budget_steps if config.policy.governor.enabled else None,
        )
        self.step_s = cal.step_s
        self.window_steps = max(1, math.ceil(cal.window_s / cal.step_s))
        # a ring of one slot per step of the window: slot = step % size, with the step it holds
        self._size = self.window_steps + 1
        self._key = np.full(self._size, -1, dtype=np.int64)
        self._demand = np.full(self._size, np.nan)
        self._ready = np.full(self._size, np.nan)
        self._last = -1
        self._cached: tuple[tuple[int, float, float, float], Calibration] | None = None

    def add(self, s: LoadSignals) -> None:
        """Record a sample (in time order; older than the newest step is ignored)."""
        key = math.floor(s.t / self.step_s)
        if key < self._last:
            return
        d = replicas_needed(s, self.pool.target)
        self.ledger.add(s.t, d, float(s.replicas_reporting))
        dv = math.nan if d is None else d
        rv = float(s.replicas_reporting) if d is not None else math.nan
        i = key % self._size
        if key == self._last:
            pd, pr = float(self._demand[i]), float(self._ready[i])
            self._demand[i] = dv if math.isnan(pd) else (pd if math.isnan(dv) else max(pd, dv))
            self._ready[i] = rv if math.isnan(pr) else (pr if math.isnan(rv) else min(pr, rv))
            return
        self._key[i], self._demand[i], self._ready[i] = key, dv, rv
        self._last = key

    @property
    def span_s(self) -> float:
        """History to rebuild at start-up (``history_span_s``)."""
        return history_span_s(self.config)

    def governor(self, now: float, *, capacity: float, nodes: int, horizon_s: float | None = None) -> Governor | None:
        """The governor's state as of ``now`` (None when ``policy.governor.enabled`` is off):
        the avoidable violation minutes of its window, the budget, one incident's minutes."""
        if not self.config.policy.governor.enabled:
            return None
        from bridge.policy.forecast import horizon_s as configured_horizon

        h = max(configured_horizon(self.config, self.pool), horizon_s or 0.0)
        incident = Incident(
            horizon_s=h,
            scrape_s=self.config.prometheus.scrape_interval_s,
            drain_s=self.pool.drain_s,
            tick_s=self.config.policy.tick_s,
            max_reclaims_per_tick=self.config.policy.max_reclaims_per_tick,
            minute_s=self.step_s,
        )
        budget = self.budget_steps
        spent = self.ledger.spent(now, capacity=capacity)
        lend_max = incident.most_nodes(budget - spent, nodes, lending=True)
        resume = None
        if lend_max == 0:  # held: when one node's incident fits again, if nothing new is counted
            short = math.ceil(incident.minutes(1) - (budget - spent) - 1e-9)
            resume = self.ledger.leave_time(now, capacity=capacity, count=short)
        return govern(
            spent_min=spent,
            budget_min=budget,
            incident_min=incident.minutes(nodes),
            window_s=self.governor_window_s,
            keep_max=incident.most_nodes(budget - spent, nodes, lending=False),
            lend_max=lend_max,
            resume_t=resume,
        )

    def _forget(
        self, d: np.ndarray, r: np.ndarray, hours: np.ndarray | None, *, h: float, lookback_s: float, min_samples: int,
        level_hours: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[np.ndarray, np.ndarray] | None]:
        """The window with the regime before the last change point forgotten at the stated
        rate (``CP_HALF_LIFE_S``) while the change's level holds (``level_held``), never
        shorter than the history needed to calibrate. ``level_hours``: each step's hour of the day.
        Last, the window's ``_rises`` when nothing was forgotten (``calibrate`` takes them), else None."""
        hs = max(1, math.ceil(h / self.step_s - 1e-9))
        ls = max(1, math.ceil(lookback_s / self.step_s - 1e-9))
        whole = _rises(d, step_s=self.step_s, horizon_s=h, lookback_s=lookback_s,
                       replicas_per_node=self.pool.replicas_per_node,
                       smoothing=self.config.policy.forecast.burst_smoothing_replicas)
        rises, where = whole
        if rises.size == 0:
            return d, r, hours, whole
        logs = np.log(rises)
        mu = None
        if hours is not None:
            hh = hours[where]
            q = np.array([np.percentile(logs[hh == k], 90) if (hh == k).sum() >= 30 else np.nan for k in range(24)])
            q = np.where(np.isnan(q), float(np.percentile(logs, 90)), q)
            mu = q[hh]
        alarm = change_point(logs, mu)
        if alarm is None:
            return d, r, hours, whole
        n0 = int(where[alarm]) + hs + ls  # the new regime's own scores begin here
        age_s = (d.size - n0) * self.step_s
        if age_s <= 0:
            return d, r, hours, whole  # the change is still under way: its scores widen the margin at once
        if not level_held(d, n0, level_hours, round(3600.0 / self.step_s)):
            return d, r, hours, whole  # a burst that ended, not a new regime: its history still counts
        keep = int(n0 * 0.5 ** (age_s / CP_HALF_LIFE_S))
        start = min(n0 - keep, d.size - (min_samples + hs + ls))
        if start <= 0:
            return d, r, hours, whole
        return d[start:], r[start:], (hours[start:] if hours is not None else None), None

    def _keys(self, now: float) -> np.ndarray:
        """The steps of the window ending at ``now``'s step, oldest first."""
        k_now = math.floor(now / self.step_s)
        return np.arange(k_now - self.window_steps + 1, k_now + 1, dtype=np.int64)

    def arrays(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Per-step demand and ready over the window ending at ``now``'s step (NaN = gap)."""
        keys = self._keys(now)
        slots = keys % self._size
        held = self._key[slots] == keys
        return np.where(held, self._demand[slots], np.nan), np.where(held, self._ready[slots], np.nan)

    def _hours(self, now: float) -> np.ndarray:
        """UTC hour of the day of each step of the window ending at ``now``."""
        return ((self._keys(now) * self.step_s) % 86400.0 // 3600.0).astype(np.int64)

    def calibration(
        self, now: float, *, capacity: float, horizon_s: float | None = None, governor: Governor | None = None
    ) -> Calibration:
        """The calibration as of ``now`` (recomputed every ``policy.calibration.interval_s``),
        paced by the governor's usable budget left (``governor.pace``)."""
        cal = self.config.policy.calibration
        from bridge.policy.forecast import horizon_s as configured_horizon

        h = max(configured_horizon(self.config, self.pool), horizon_s or 0.0)
        slot = math.floor(now / cal.interval_s)
        pc = pace(governor) if governor is not None else 1.0
        key = (slot, capacity, h, pc)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        d, r = self.arrays(now)
        f = self.config.policy.forecast
        hours = self._hours(now) if cal.by_time_of_day else None
        lookback_s = max(f.lend_lookback_s, f.burst_window_s)
        min_samples = math.ceil(cal.min_history_s / self.step_s)
        rises = None
        if cal.change_points:
            d, r, hours, rises = self._forget(
                d, r, hours, h=h, lookback_s=lookback_s, min_samples=min_samples, level_hours=self._hours(now)
            )
        got = calibrate(
            d,
            r,
            step_s=self.step_s,
            horizon_s=h,
            lookback_s=lookback_s,
            budget=self.pool.slo_budget,
            smoothing=f.burst_smoothing_replicas,
            capacity=capacity,
            min_samples=min_samples,
            at=now,
            hours=hours,
            replicas_per_node=self.pool.replicas_per_node,
            pace=pc,
            rises=rises,
        )
        self._cached = (key, got)
        return got


def nodes_with_margin(
    replicas: float, cal: Calibration | None, pool: PoolConfig, lo: float, hi: float
) -> tuple[int, float | None, bool]:
    """Nodes serving must keep for a base forecast of ``replicas`` that must hold over [lo, hi]
    (unix s): the calibrated margin for those hours, the configured headroom as a floor. An hour
    of the day not in the history yet keeps capacity for the highest load seen so far, with the
    overall margin. Returns (nodes, margin applied or None, whether an unseen hour was hit);
    the one place the margin is applied (``plan`` and the outlook)."""
    rpn = pool.replicas_per_node
    n = nodes_for(replicas, headroom=pool.headroom, headroom_replicas=pool.headroom_replicas, replicas_per_node=rpn)
    if cal is None:
        return n, None, False
    m = cal.margin_over(lo, hi)
    unseen = False
    if m is not None and math.isinf(m):
        m = cal.margin
        replicas = max(replicas, cal.peak_seen)
        unseen = True
    if m is not None:
        s = cal.smoothing
        n = max(n, nodes_for(m * (replicas + s) - s, headroom=0.0, headroom_replicas=0.0, replicas_per_node=rpn))
    return n, m, unseen
