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
    """A lent node is not voluntarily reclaimed for ``min_lend_s`` (and the job it gets is
    not for ``min_runtime_s``), so a lend must be safe for that long plus the time a reclaim
    then takes."""
    return horizon_s(config, pool) + max(config.policy.min_lend_s, config.slurm.min_runtime_s)


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
    ls = lend_span_s(config)
    long = series.window(now - max(f.burst_history_s, ls), now)
    lend_vals = [d for t, d in long if t >= now - ls and d is not None]
    lend_base = max(max(lend_vals), recent_peak) if lend_vals else recent_peak
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
    over ``h`` against the burst window, over ``lh`` against the lend lookback."""
    step = f.burst_step_s
    if not samples:
        return 1.0, 1.0
    first = math.floor((samples[0][0] - now) / step)
    n = -first + 1
    m: list[float | None] = [None] * n
    for t, d in samples:
        if d is None:
            continue
        i = math.floor((t - now) / step) - first
        if 0 <= i < n:
            cur = m[i]
            if cur is None or d > cur:
                m[i] = d
    c = f.burst_smoothing_replicas
    out = []
    for hor, back in ((h, f.burst_window_s), (lh, max(f.lend_lookback_s, f.burst_window_s))):
        k = max(1, math.ceil(hor / step))
        b = max(1, math.ceil(back / step))
        past = _sliding_max(m, b)
        fut = _sliding_max(m, k)
        ratios = [
            (fu + c) / (pa + c)
            for pa, fu in zip(past[b - 1 : n - k], fut[b - 1 + k :])
            if pa is not None and fu is not None
        ]
        if len(ratios) < 12:
            out.append(1.0)
            continue
        ratios.sort()
        q = ratios[min(len(ratios) - 1, int(f.burst_quantile * len(ratios)))]
        out.append(min(max(q, 1.0), f.ratio_max))
    return out[0], out[1]


def _sliding_max(m: list[float | None], w: int) -> list[float | None]:
    """out[i] = max(m[i-w+1 .. i]), None if any of them is None or the window is incomplete."""
    out: list[float | None] = [None] * len(m)
    dq: list[int] = []  # indices, values decreasing (a list used as a deque; head index below)
    head = 0
    last_none = -1
    for i, v in enumerate(m):
        if v is None:
            last_none = i
            dq, head = [], 0
            continue
        while len(dq) > head and m[dq[-1]] <= v:  # type: ignore[operator]
            dq.pop()
        dq.append(i)
        if dq[head] <= i - w:
            head += 1
        if i - w + 1 > last_none and i >= w - 1:
            out[i] = m[dq[head]]
    return out


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
