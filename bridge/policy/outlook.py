"""The lendable-capacity outlook: per clock hour ahead, the serving demand the policy's
forecast expects and the nodes left to lend (``gpu-bridge forecast`` and the daemon's
``gpu_bridge_pool_lendable_nodes_forecast``). Pure, read-only, over the same history as the
policy (``LoadSignals``) and the daemon's config.

Kept apart from ``forecast.py`` on purpose: it only calls the policy's public ``forecast()``
and window spans, and it applies the serving margin in one place (``lendable_outlook``), so a
calibrated margin replaces it there.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bridge.config import Config, PoolConfig
from bridge.model import Calibration, Governor, LoadSignals
from bridge.policy.calibrate import Calibrator, nodes_with_margin
from bridge.policy.demand import replicas_needed
from bridge.policy.forecast import forecast, lend_span_s, recent_span_s


def _window(history: Sequence[LoadSignals], lo: float, hi: float, pool: PoolConfig) -> list[float]:
    """Usable demand (replicas) of the samples in [lo, hi] (history sorted by time)."""
    i = bisect.bisect_left(history, lo, key=lambda s: s.t)
    j = bisect.bisect_right(history, hi, key=lambda s: s.t)
    return [d for s in history[i:j] if (d := replicas_needed(s, pool.target)) is not None]

HOUR_S = 3600.0
OUTLOOK_STEP_S = 300.0  # resolution of the history the outlook reads (max per step keeps peaks)
OUTLOOK_HOURS = 24  # hours the daemon's metric covers
# The outlook's own seasonal lags (same time yesterday, same time last week), independent of
# the policy's optional ``forecast.seasonal_lags_s``: the outlook always needs a daily profile.
OUTLOOK_LAGS_S = (86400.0, 7 * 86400.0)


@dataclass(frozen=True, slots=True)
class HourOutlook:
    """One hour ahead: what serving may need then and what that leaves to lend.
    ``None`` = the history says nothing about that hour (too young a pool)."""

    start: float  # unix s
    demand: float | None  # replicas: the forecast peak of the hour
    serving_nodes: int | None  # nodes serving keeps, with the policy's margin and floors
    lendable_nodes: int | None
    basis: str  # what the demand came from: "now" (the policy's forecast), "1d", "7d"
    margin: float | None = None  # the calibrated margin applied (None: calibrating / not calibrated)
    held: str = ""  # why the SLO budget's governor lends less than the forecast leaves ("": it does not)


def outlook_span_s(config: Config, hours: int) -> float:
    """How far back the outlook reads: the longest of its lags plus the compare window (the
    hours ahead of ``now - lag`` lie inside it as long as ``hours`` <= 1 d), and at least what
    the policy's forecast reads."""
    f = config.policy.forecast
    return max(OUTLOOK_LAGS_S) + f.compare_window_s + max(recent_span_s(config), lend_span_s(config), f.burst_history_s)


def outlook_calibration(
    history: Sequence[LoadSignals], now: float, *, config: Config, pool: PoolConfig, nodes: int,
) -> tuple[Calibration | None, Governor | None]:
    """The pool's calibration and SLO-budget governor as the policy would have them now, built
    the way the daemon rebuilds them at start-up (``Calibrator`` over ``Calibrator.span_s`` of
    history, the configured reclaim horizon); (None, None) when calibration is off."""
    if not config.policy.calibration.enabled:
        return None, None
    cal = Calibrator(config, pool)
    for s in history:
        if s.t <= now:
            cal.add(s)
    capacity = nodes * pool.replicas_per_node
    gov = cal.governor(now, capacity=capacity, nodes=nodes)
    return cal.calibration(now, capacity=capacity, governor=gov), gov


def governed(hour: HourOutlook, governor: Governor | None) -> HourOutlook:
    """The hour as the governor lets it be lent: nothing before a held pool may lend again
    (``Governor.resume_t``; unknown: the whole outlook), at most its cap while capped."""
    if governor is None or hour.lendable_nodes is None:
        return hour
    cap = governor.cap(lending=True)
    if cap is None:
        return hour
    if cap == 0:
        if governor.resume_t is not None and governor.resume_t <= hour.start:
            return hour
        until = "" if governor.resume_utc is None else f" until {governor.resume_utc}"
        return replace(hour, lendable_nodes=0, held=f"SLO budget spent: lending held{until}")
    if hour.lendable_nodes <= cap:
        return hour
    return replace(hour, lendable_nodes=cap, held=f"SLO budget low: at most {cap} nodes lent")


def lendable_outlook(
    history: Sequence[LoadSignals], now: float, *, config: Config, pool: PoolConfig, nodes: int, hours: int = 24,
    calibration: Calibration | None = None, governor: Governor | None = None,
) -> tuple[HourOutlook, ...]:
    """Per clock hour ahead (hour 0 holds ``now``), the serving demand the policy's forecast
    expects and the nodes left to lend (pure; read-only callers: ``gpu-bridge forecast`` and
    the daemon's metric).

    Hour 0 is the policy's own forecast now (``forecast(...).lend_peak``: recent peak x burst
    factor, trend, seasonal). Each hour h is the seasonal part of the same forecast stretched
    over the hours: for each lag L (1 d, 7 d) the peak of [now + h - L, now + h + 1 h - L],
    times how today compares with then (the policy's clamped ratio); the highest lag wins.
    Serving nodes = the policy's own ``nodes_with_margin`` on that demand: the pool's
    ``calibration`` (as the policy has it now: ``outlook_calibration`` or the daemon's) for
    that hour, the headroom settings as floors, then ``min_serving`` and calendar rules over
    the hour; lendable = the rest of ``nodes``, at most ``max_lent``. While the pool is still
    calibrating (``calibration.margin`` None) the policy lends nothing: every known hour says
    0 lendable and ``margin`` None (callers say why). The SLO budget's ``governor`` (as the
    policy has it now) holds or caps the hours before it may lend again (``governed``)."""
    from bridge.policy import calendar

    if hours < 1:
        raise ValueError(f"hours: must be >= 1, got {hours}")
    f = config.policy.forecast
    now_fc = forecast(history, None, now, config=config, pool=pool)
    now_vals = _window(history, now - f.compare_window_s, now, pool)
    now_mean = sum(now_vals) / len(now_vals) if now_vals else None
    ratios: dict[float, float] = {}
    if now_mean is not None:
        for lag in OUTLOOK_LAGS_S:
            then = _window(history, now - lag - f.compare_window_s, now - lag, pool)
            if len(then) >= 2:
                then_mean = sum(then) / len(then)
                ratios[lag] = min(max((now_mean + 1.0) / (then_mean + 1.0), f.ratio_min), f.ratio_max)
    out: list[HourOutlook] = []
    base = math.floor(now / HOUR_S) * HOUR_S  # clock hours; hour 0 holds now
    for k in range(hours):
        lo, hi = base + k * HOUR_S, base + (k + 1) * HOUR_S
        demand: float | None = None
        basis = ""
        if k == 0 and now_fc.lend_peak is not None:
            demand, basis = now_fc.lend_peak, "now"
        for lag, ratio in ratios.items():
            if hi - lag > now:  # that part of the profile is in the future itself
                continue
            vals = _window(history, lo - lag, hi - lag, pool)
            if vals:
                v = max(vals) * ratio
                if demand is None or v > demand:
                    demand, basis = v, f"{lag / 86400:g}d"
        if demand is None:
            out.append(HourOutlook(lo, None, None, None, ""))
            continue
        need, margin, _ = nodes_with_margin(demand, calibration, pool, lo, hi)
        cal, _ = calendar.floor(config.policy.calendar, pool.name, lo, hi)
        serving = min(nodes, max(need, pool.min_serving, cal))
        lendable = nodes - serving
        if pool.max_lent is not None:
            lendable = min(lendable, pool.max_lent)
        if calibration is not None and calibration.margin is None:
            lendable = 0  # the policy's calibrating state: nothing is lent yet
        out.append(governed(HourOutlook(lo, demand, serving, max(0, lendable), basis, margin), governor))
    return tuple(out)


def first_free_window(outlook: Sequence[HourOutlook], nodes: int, hours: float) -> HourOutlook | None:
    """The first hour from which ``nodes`` are expected lendable for ``hours`` hours in a row
    (every hour of it known), or None within the outlook."""
    need = max(1, math.ceil(hours - 1e-9))
    run = 0
    for i, h in enumerate(outlook):
        run = run + 1 if h.lendable_nodes is not None and h.lendable_nodes >= nodes else 0
        if run >= need:
            return outlook[i - need + 1]
    return None
