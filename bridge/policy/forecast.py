"""Forecast of demand (in replicas) over a horizon, from the load history of a pool.

The history is rebuildable state (the daemon refills it from Prometheus after a restart),
so every time-based rule lives here instead of in memory: the stabilization window, the
blind timer, the seasonal profile. To stay cheap, the policy *declares* the windows it
reads (``history_windows``); callers fill only those, at the declared resolution, and the
policy finds them by bisection, so even a long history costs O(log n) plus the window sizes.

Forecast peak = max of
- the recent peak: the highest demand over max(burst window, scale-down window) - peaks, not
  the mean, because vLLM load is bursty;
- the recent trend: least-squares slope over the trend window, only rises, extrapolated;
- for each seasonal lag L (1 d, 7 d): the peak of [now - L, now - L + horizon], scaled by
  how today compares to then, (mean_now + 1) / (mean_then + 1) clamped to
  [ratio_min, ratio_max] (the +1 replica keeps quiet nights from producing wild ratios).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

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


def horizon_s(config: Config, pool: PoolConfig) -> float:
    """Time from deciding to reclaim until the capacity serves: Slurm grace + cold start +
    margin + one tick + one scrape (the load we react to is that old)."""
    return (
        config.slurm.grace_s
        + pool.cold_start_s
        + config.policy.forecast.margin_s
        + config.policy.tick_s
        + config.prometheus.scrape_interval_s
    )


def lend_horizon_s(config: Config, pool: PoolConfig) -> float:
    """A lent node is not voluntarily reclaimed for ``min_lend_s``, so a lend must be safe for
    that long plus the time a reclaim then takes."""
    return horizon_s(config, pool) + config.policy.min_lend_s


def recent_span_s(config: Config) -> float:
    p = config.policy
    f = p.forecast
    return max(f.burst_window_s, f.trend_window_s, f.compare_window_s, p.scale_down_window_s, p.blind_after_s) + p.tick_s


def history_windows(config: Config, pool: PoolConfig | None = None) -> tuple[HistoryWindow, ...]:
    """The windows of ``PoolState.history`` the policy reads, oldest first. Samples outside
    them are ignored, so callers may pass more (but it costs them building it)."""
    pools = (pool,) if pool is not None else config.pools
    lend_h = max((lend_horizon_s(config, p) for p in pools), default=0.0)
    recent_step = min(config.policy.tick_s, config.policy.signal_max_age_s / 2)
    out = [HistoryWindow(-recent_span_s(config), 0.0, recent_step)]
    f = config.policy.forecast
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

    recent_peak: float | None  # max over the burst / scale-down window
    trend_peak: float | None  # over the reclaim horizon, rises only
    seasonal_peak: float | None  # over the reclaim horizon, best of the lags
    peak: float | None  # what the reclaim horizon may need
    lend_peak: float | None  # what the lend horizon may need
    stable: bool  # the scale-down window is fully observed with valid samples
    last_valid_t: float | None  # newest sample with a usable value
    seasonal_lags_used: tuple[float, ...] = ()


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
        out = [(s.t, replicas_needed(s, tg)) for s in h[i:j]]
        s = self.newest
        if s is not None and lo <= s.t <= hi:
            out.append((s.t, replicas_needed(s, tg)))
        return out


def _t(s: LoadSignals) -> float:
    return s.t


def _vals(w: list[tuple[float, float | None]]) -> list[float]:
    return [d for _, d in w if d is not None]


def forecast(
    history: Sequence[LoadSignals],
    newest: LoadSignals | None,
    now: float,
    *,
    config: Config,
    pool: PoolConfig,
) -> Forecast:
    """Forecast for one pool. ``history`` must be sorted by ``t`` (oldest first); ``newest``
    (``PoolState.signals``) is added unless the history already ends with it. Samples after
    ``now`` are ignored."""
    p = config.policy
    f: ForecastConfig = p.forecast
    series = _Series(history, newest, pool.target)
    h = horizon_s(config, pool)
    lh = lend_horizon_s(config, pool)

    recent = series.window(now - recent_span_s(config), now)
    last_valid_t = next((t for t, d in reversed(recent) if d is not None), None)

    # Stabilization: the whole window observed, every sample valid, no gap longer than the
    # staleness limit. A restart with a rebuilt history keeps this; a fresh pool waits.
    w = p.scale_down_window_s
    win = [x for x in recent if x[0] >= now - w]
    stable = bool(win) and all(d is not None for _, d in win)
    if stable and w > 0:
        tol = p.signal_max_age_s
        stable = win[0][0] <= now - w + tol and all(b[0] - a[0] <= tol for a, b in zip(win, win[1:]))
    burst_lo = now - max(f.burst_window_s, w)
    burst = [d for t, d in recent if t >= burst_lo and d is not None]
    recent_peak = max(burst) if burst else None

    if not f.enabled or recent_peak is None:
        return Forecast(recent_peak, None, None, recent_peak, recent_peak, stable, last_valid_t)

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
    peak = max(x for x in (recent_peak, trend_peak, seasonal) if x is not None)
    lend_peak = max(x for x in (recent_peak, trend_lend, seasonal_lend) if x is not None)
    return Forecast(recent_peak, trend_peak, seasonal, peak, lend_peak, stable, last_valid_t, tuple(used))


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
