"""Forecast of demand (in replicas) over a horizon, from the load history of a pool.

The history is rebuildable state (the daemon refills it from Prometheus after a restart),
so every time-based rule lives here instead of in memory: the stabilization window, the
blind timer, the seasonal profile. To stay cheap, the policy *declares* the windows it
reads (``history_windows``); callers fill only those, at the declared resolution, and the
policy finds them by bisection, so even a long history costs O(log n) plus the window sizes.

Forecast peak = max of
- the recent peak: the highest demand over max(burst window, scale-down window) - peaks, not
  the mean, because vLLM load is bursty - times the learned burst factor: the
  ``burst_quantile`` of (peak over the next horizon) / (peak of the burst window before it),
  measured over the last ``burst_history_s`` at ``burst_step_s`` resolution; it is >= 1 and
  at most ``ratio_max``, large in a bursty regime and near 1 in a calm one;
- the recent trend: least-squares slope over the trend window, only rises, extrapolated;
- for each seasonal lag L (1 d, 7 d): the peak of [now - L, now - L + horizon], scaled by
  how today compares to then, (mean_now + 1) / (mean_then + 1) clamped to
  [ratio_min, ratio_max] (the +1 replica keeps quiet nights from producing wild ratios).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from bridge.config import Config, ForecastConfig, PoolConfig, TargetConfig
from bridge.model import LoadSignals
from bridge.policy.demand import replicas_needed


@dataclass(frozen=True, slots=True)
class HistoryWindow:
    """A stretch of history the policy reads: offsets from ``now`` in seconds (negative =
    past) and the resolution it needs. Fill a step with the *maximum* of its samples
    (``max_over_time``) so peaks survive down-sampling."""

    start_s: float
    end_s: float
    step_s: float


def horizon_s(config: Config, pool: PoolConfig, *, fast: bool = False) -> float:
    """Time from deciding to reclaim until the capacity serves: Slurm grace + cold start (the
    wake, ``wake_s``, for a pool that lends warm) + margin + one tick + one scrape (the load we
    react to is that old). ``fast``: a node of the fast tier (its partition's shorter grace).
    A failed wake costs a cold start on top: measured delays (``measured_delays``) raise the
    horizon when wakes fail."""
    grace_s = config.slurm.fast_grace_s if fast else config.slurm.grace_s
    p = config.policy
    return grace_s + return_s(pool) + p.forecast.margin_s + p.tick_s + config.prometheus.scrape_interval_s


def return_s(pool: PoolConfig) -> float:
    """The vLLM part of a reclaim once Slurm released the node: the wake for a pool that
    lends warm (docs/warm-lending.md; the lifecycle keeps a node's replica only when it is the
    node's one pod), else the cold start. With ``wake_gpu_free_mib``, the wake may first wait
    up to ``wake_gpu_wait_s`` for the GPUs to be free: that wait is part of a warm reclaim."""
    if not lends_warm(pool):
        return pool.cold_start_s
    return pool.wake_s + (pool.wake_gpu_wait_s if pool.wake_gpu_free_mib is not None else 0.0)


def lends_warm(pool: PoolConfig) -> bool:
    """The pool's reclaims wake a sleeping replica (else, or when a wake fails, cold-start one)."""
    return pool.warm_lending and pool.replicas_per_node == 1


def measured_horizon(config: Config, pool: PoolConfig, delays: Sequence[float], *, fast: bool = False) -> float | None:
    """The reclaim horizon from measured reclaims (decision to Ready replica: Slurm release +
    cold start, each observed): their ``calibration.delay_quantile`` plus what the configured
    horizon adds on top of grace and cold start (margin, tick, scrape). None until
    ``delay_min_samples`` reclaims were measured or when ``pools[].measured_delays`` is off;
    never below the configured horizon (the configured delays are a floor). ``fast``: the
    delays measured on fast-tier nodes, against the fast horizon."""
    cal = config.policy.calibration
    if not pool.measured_delays or len(delays) < cal.delay_min_samples:
        return None
    q = _delay_quantile(tuple(delays[-512:]), cal.delay_quantile)
    extra = config.policy.forecast.margin_s + config.policy.tick_s + config.prometheus.scrape_interval_s
    # whole ticks: the horizon (and the calibration keyed on it) moves in steps, not each reclaim
    tick = config.policy.tick_s
    return max(horizon_s(config, pool, fast=fast), math.ceil((q + extra) / tick - 1e-9) * tick)


@functools.lru_cache(maxsize=64)
def _delay_quantile(delays: tuple[float, ...], q: float) -> float:
    return float(np.quantile(np.asarray(delays, dtype=float), q))


def lend_horizon_s(config: Config, pool: PoolConfig, *, fast: bool = False) -> float:
    """A lent node is not voluntarily reclaimed for ``min_lend_s`` (and the job it gets is
    not for ``min_runtime_s``), so a lend must be safe for that long plus the time a reclaim
    then takes."""
    return horizon_s(config, pool, fast=fast) + max(config.policy.min_lend_s, config.slurm.min_runtime_s)


def recent_span_s(config: Config) -> float:
    p = config.policy
    f = p.forecast
    return max(f.burst_window_s, f.trend_window_s, f.compare_window_s, p.scale_down_window_s, p.blind_after_s) + p.tick_s


def lend_span_s(config: Config) -> float:
    f = config.policy.forecast
    return max(f.lend_lookback_s, f.burst_window_s, config.policy.scale_down_window_s)


def history_windows(config: Config, pool: PoolConfig | None = None) -> tuple[HistoryWindow, ...]:
    """The windows of ``PoolState.history`` the policy reads, oldest first. Samples outside
    them are ignored, so callers may pass more (but it costs them building it)."""
    pools = (pool,) if pool is not None else config.pools
    lend_h = max((lend_horizon_s(config, p) for p in pools), default=0.0)
    recent_step = min(config.policy.tick_s, config.policy.signal_max_age_s / 2)
    out = [HistoryWindow(-recent_span_s(config), 0.0, recent_step)]
    f = config.policy.forecast
    if f.enabled and f.burst_history_s > 0:
        out.append(HistoryWindow(-f.burst_history_s, 0.0, f.burst_step_s))
    elif f.enabled and lend_span_s(config) > recent_span_s(config):
        out.append(HistoryWindow(-lend_span_s(config), 0.0, f.burst_step_s))
    if f.enabled:
        for lag in sorted(f.seasonal_lags_s, reverse=True):
            out.append(HistoryWindow(-lag - f.compare_window_s, -lag + lend_h, config.prometheus.step_s))
    return tuple(sorted(out, key=lambda w: w.start_s))


def history_span_s(config: Config) -> float:
    """How far back the oldest needed sample lies (trim older history)."""
    return -min(w.start_s for w in history_windows(config))


@dataclass(frozen=True, slots=True)
class Forecast:
    """What the history says, in replicas. ``None`` = not enough data for that part."""

    recent_peak: float | None  # max over the burst / scale-down window (reclaims)
    trend_peak: float | None  # over the reclaim horizon, rises only
    seasonal_peak: float | None  # over the reclaim horizon, best of the lags
    peak: float | None  # what the reclaim horizon may need
    lend_peak: float | None  # what the lend horizon may need
    stable: bool  # the scale-down window is fully observed with valid samples
    last_valid_t: float | None  # newest sample with a usable value
    seasonal_lags_used: tuple[float, ...] = ()
    burst_factor: float = 1.0  # learned rise over the reclaim horizon (multiplies recent_peak)
    burst_factor_lend: float = 1.0  # the same over the lend horizon, relative to lend_base
    lend_base: float | None = None  # max over lend_lookback_s (lends)


class _Series:
    """Demand per sample, computed lazily per window from a sorted history."""

    __slots__ = ("hist", "newest", "target")

    def __init__(self, hist: Sequence[LoadSignals], newest: LoadSignals | None, target: TargetConfig) -> None:
        self.hist = hist
        # The newest sample counts only if it is newer than the history (callers may or may
        # not have appended it already).
        self.newest = newest if newest is not None and (not hist or newest.t > hist[-1].t) else None
        self.target = target

    def window(self, lo: float, hi: float) -> list[tuple[float, float | None]]:
        h = self.hist
        i = bisect.bisect_left(h, lo, key=_t)
        j = bisect.bisect_right(h, hi, key=_t)
        tg = self.target
        out = [(s.t, _demand(s, tg)) for s in h[i:j]]
        s = self.newest
        if s is not None and lo <= s.t <= hi:
            out.append((s.t, replicas_needed(s, tg)))
        return out


def _t(s: LoadSignals) -> float:
    return s.t


# Memo of replicas_needed by sample identity: a recorder hands out the same (frozen) sample
# objects tick after tick, so most of a window's demand is already known. The entry keeps the
# sample alive, so its id cannot be reused while cached; results are identical either way.
_MEMO: dict[int, tuple[LoadSignals, TargetConfig, float | None]] = {}
_MEMO_MAX = 1 << 15


def _demand(s: LoadSignals, tg: TargetConfig) -> float | None:
    e = _MEMO.get(id(s))
    if e is not None and e[0] is s and e[1] is tg:
        return e[2]
    v = replicas_needed(s, tg)
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.clear()
    _MEMO[id(s)] = (s, tg, v)
    return v


def _vals(w: list[tuple[float, float | None]]) -> list[float]:
    return [d for _, d in w if d is not None]


def forecast(
    history: Sequence[LoadSignals], newest: LoadSignals | None, now: float, *, config: Config, pool: PoolConfig,
    fast: bool = False,
) -> Forecast:
    """Forecast for one pool. ``history`` must be sorted by ``t`` (oldest first); ``newest``
    (``PoolState.signals``) is added unless the history already ends with it. Samples after
    ``now`` are ignored. ``fast``: over the fast tier's (shorter) horizons."""
    p = config.policy
    f: ForecastConfig = p.forecast
    series = _Series(history, newest, pool.target)
    h = horizon_s(config, pool, fast=fast)
    lh = lend_horizon_s(config, pool, fast=fast)

    span = max(recent_span_s(config), lend_span_s(config), f.burst_history_s if f.enabled else 0.0)
    long = series.window(now - span, now)
    ts = [t for t, _ in long]
    recent = long[bisect.bisect_left(ts, now - recent_span_s(config)) :]
    last_valid_t = next((t for t, d in reversed(recent) if d is not None), None)

    # Stabilization: the whole window observed, every sample valid, no gap longer than the
    # staleness limit. A restart with a rebuilt history keeps this; a fresh pool waits.
    w = p.scale_down_window_s
    win = recent[bisect.bisect_left(ts, now - w) - len(long) + len(recent) :] if recent else []
    stable = bool(win) and all(d is not None for _, d in win)
    if stable and w > 0:
        tol = p.signal_max_age_s
        stable = win[0][0] <= now - w + tol and all(b[0] - a[0] <= tol for a, b in zip(win, win[1:]))
    burst_lo = now - max(f.burst_window_s, w)
    burst = [d for t, d in recent if t >= burst_lo and d is not None]
    recent_peak = max(burst) if burst else None
    ls = lend_span_s(config)
    lend_vals = [d for t, d in long[bisect.bisect_left(ts, now - ls) :] if d is not None]
    lend_base = max(lend_vals) if lend_vals else recent_peak

    if not f.enabled or recent_peak is None:
        return Forecast(recent_peak, None, None, recent_peak, recent_peak, stable, last_valid_t, lend_base=recent_peak)

    trend_peak = trend_lend = None
    tw = [(t, d) for t, d in recent if t >= now - f.trend_window_s and d is not None]
    if len(tw) >= 4:
        slope, level = _fit(tw, now)
        if slope > 0:
            cap = recent_peak * f.ratio_max
            trend_peak = min(level + slope * h, cap)
            trend_lend = min(level + slope * lh, cap)

    now_vals = [d for t, d in recent if t >= now - f.compare_window_s and d is not None]
    now_mean = sum(now_vals) / len(now_vals) if now_vals else None
    seasonal = seasonal_lend = None
    used: list[float] = []
    if now_mean is not None:
        for lag in f.seasonal_lags_s:
            then = _vals(series.window(now - lag - f.compare_window_s, now - lag))
            prof = series.window(now - lag, now - lag + lh)
            pv_h = [d for t, d in prof if d is not None and t <= now - lag + h]
            pv_l = _vals(prof)
            if len(then) < 2 or not pv_h:
                continue
            then_mean = sum(then) / len(then)
            ratio = min(max((now_mean + 1.0) / (then_mean + 1.0), f.ratio_min), f.ratio_max)
            sh, sl = max(pv_h) * ratio, max(pv_l) * ratio
            seasonal = sh if seasonal is None else max(seasonal, sh)
            seasonal_lend = sl if seasonal_lend is None else max(seasonal_lend, sl)
            used.append(lag)
    bf = bf_lend = 1.0
    assert lend_base is not None
    if f.burst_history_s > 0:
        bf, bf_lend = _burst_factors(long, now, h, lh, f)
    peak = max(x for x in (recent_peak * bf, trend_peak, seasonal) if x is not None)
    # A lend must not make the reclaim rule fire while the sample that last justified a
    # reclaim is still in the lend lookback: the lend side uses the larger factor on the
    # longer window, so lend_peak >= peak and a reclaimed node stays at least that long.
    lend_peak = max(x for x in (lend_base * max(bf, bf_lend), trend_lend, seasonal_lend, peak) if x is not None)
    return Forecast(
        recent_peak, trend_peak, seasonal, peak, lend_peak, stable, last_valid_t, tuple(used), bf, bf_lend, lend_base
    )


def _burst_factors(
    samples: list[tuple[float, float | None]], now: float, h: float, lh: float, f: ForecastConfig
) -> tuple[float, float]:
    """Quantiles of how much the peak over the next horizon exceeded the peak before it:
    over ``h`` against the burst window, over ``lh`` against the lend lookback.

    Buckets are aligned to absolute time and only completed ones count, so within one step
    the inputs repeat and the memoized ``_ratio_quantiles`` answers at once."""
    step = f.burst_step_s
    if not samples:
        return 1.0, 1.0
    k_now = math.floor(now / step)
    k0 = math.floor(samples[0][0] / step)
    n = k_now - k0
    if n <= 0:
        return 1.0, 1.0
    m: list[float | None] = [None] * n
    for t, d in samples:
        if d is None:
            continue
        i = int(t // step) - k0
        if 0 <= i < n:
            cur = m[i]
            if cur is None or d > cur:
                m[i] = d
    c = f.burst_smoothing_replicas
    q, rmax = f.burst_quantile, f.ratio_max
    back_l = max(f.lend_lookback_s, f.burst_window_s)
    mt = tuple(m)
    return (
        _ratio_quantile(mt, max(1, math.ceil(f.burst_window_s / step)), max(1, math.ceil(h / step)), c, q, rmax),
        _ratio_quantile(mt, max(1, math.ceil(back_l / step)), max(1, math.ceil(lh / step)), c, q, rmax),
    )


@functools.lru_cache(maxsize=256)
def _ratio_quantile(m: tuple[float | None, ...], b: int, k: int, c: float, q: float, rmax: float) -> float:
    """The q-quantile over i of (max m[i+1..i+k] + c) / (max m[i-b+1..i] + c), in [1, rmax];
    windows with a missing bucket are skipped; fewer than 12 ratios give 1."""
    n = len(m)
    if n < b + k + 12:
        return 1.0
    a = np.array([np.nan if x is None else x for x in m], dtype=float)
    past = sliding_window_view(a, b).max(axis=1)  # past[j] = max a[j .. j+b-1]
    fut = sliding_window_view(a, k).max(axis=1)  # fut[j] = max a[j .. j+k-1]
    # bucket i = j + b - 1 ends the past window; its future starts at i + 1 = j + b
    pa = past[: n - b - k + 1]
    fu = fut[b : n - k + 1]
    ratios = (fu + c) / (pa + c)
    ratios = ratios[~np.isnan(ratios)]
    if ratios.size < 12:
        return 1.0
    ratios.sort()
    r = float(ratios[min(ratios.size - 1, int(q * ratios.size))])
    return min(max(r, 1.0), rmax)


def _fit(points: list[tuple[float, float]], now: float) -> tuple[float, float]:
    """Least-squares slope (replicas/s) and the fitted value at ``now``."""
    n = len(points)
    mt = sum(t - now for t, _ in points) / n
    md = sum(d for _, d in points) / n
    sxx = sum((t - now - mt) ** 2 for t, _ in points)
    if sxx <= 0 or not math.isfinite(sxx):
        return 0.0, md
    slope = sum((t - now - mt) * (d - md) for t, d in points) / sxx
    return slope, md - slope * mt
