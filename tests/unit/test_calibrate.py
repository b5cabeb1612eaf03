"""The calibrated safety margin (bridge.policy.calibrate) and how plan() uses it; measured
reclaim delays; the simulator's history split and drawn cold starts."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import default_config
from bridge.model import Calibration, ClusterView, LoadSignals, NodeState, Phase, PoolState, Reason
from bridge.policy import plan
from bridge.policy.calibrate import Calibrator, calibrate, sliding_max
from bridge.policy.forecast import horizon_s, measured_horizon
from bridge.simulate.workload import Workload, split_history

NOW = 1_767_225_600.0
CFG = default_config()
POOL = CFG.pools[0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=0, max_size=80), st.integers(1, 20))
def test_sliding_max_matches_the_naive_one(xs: list[float | None], w: int) -> None:
    x = np.array([np.nan if v is None else v for v in xs], dtype=float)
    got = sliding_max(x, w)
    for i in range(len(xs)):
        vals = [v for v in xs[max(0, i - w + 1) : i + 1] if v is not None]
        assert got[i] == (max(vals) if vals else -math.inf)


def _cal(d: np.ndarray, r: np.ndarray, **kw: float) -> Calibration:
    args: dict = dict(step_s=60.0, horizon_s=600.0, lookback_s=3600.0, budget=0.001, smoothing=1.0, capacity=96.0, min_samples=60)
    args.update(kw)
    return calibrate(d, r, **args)


def _load(days: float, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(days * 1440)
    t = np.arange(n)
    return 10 + 5 * np.sin(2 * np.pi * t / 1440) + rng.gamma(2.0, 0.8, n)


def test_margin_is_the_conformal_quantile_of_the_rises() -> None:
    d = _load(3)
    c = _cal(d, np.full(d.size, 96.0))
    b = sliding_max(d, 60)
    # the largest whole-node capacity that would not have served d, against the base
    scores = (np.maximum(np.ceil(d[10:]) - 1, 0) + 1) / (b[:-10] + 1) * (1 + 1e-9)
    # nothing spent: the level loosens to budget x (80 % of the minutes allowed + the one
    # minute of credit, earned after 1250 minutes), conformal rank
    alpha = 0.001 * (0.8 * 0.001 * d.size + 1.0)
    k = math.ceil((scores.size + 1) * (1 - alpha))
    assert c.margin == pytest.approx(np.sort(scores)[k - 1])
    assert c.spent == 0 and c.allowed == pytest.approx(0.001 * d.size)
    assert c.level == pytest.approx(1 - alpha)
    assert "calibrated margin x" in c.describe() and "budget spent 0 of" in c.describe()


def test_spending_more_than_the_budget_tightens_the_margin() -> None:
    d = _load(3)
    under = _cal(d, np.full(d.size, 96.0))
    r = np.full(d.size, 96.0)
    r[::100] = 0.0  # 44 minutes with demand above Ready replicas (allowed: 4.3)
    over = _cal(d, r)
    assert over.spent == 44
    assert over.level > under.level
    assert over.margin is not None and under.margin is not None and over.margin >= under.margin
    # demand above the whole pool is no one's violation: not counted
    r2 = np.full(d.size, 96.0)
    d2 = d.copy()
    d2[::100] = 200.0
    assert _cal(d2, r2).spent == 0


def _scores(d: np.ndarray) -> np.ndarray:
    b = sliding_max(d, 60)
    return (np.maximum(np.ceil(d[10:]) - 1, 0) + 1) / (b[:-10] + 1) * (1 + 1e-9)


@pytest.mark.parametrize("days", [0.15, 0.3])
def test_a_fresh_pool_is_never_looser_than_its_budget(days: float) -> None:
    # less than half a minute of budget earned (0.001 x 432 minutes): nothing to loosen with
    d = _load(days)
    c = _cal(d, np.full(d.size, 96.0))
    assert 0.8 * c.allowed < 0.5 and c.level == pytest.approx(1 - 0.001)


@pytest.mark.parametrize("days", [0.6, 0.8])
def test_the_prior_credit_is_earned_with_the_budget(days: float) -> None:
    d = _load(days)
    c = _cal(d, np.full(d.size, 96.0))
    earned = 0.8 * c.allowed
    assert 0.5 < earned < 1.0
    # credit = what was earned, not a whole minute: looser than the budget, tighter than +1
    assert c.level == pytest.approx(1 - 0.001 * 2 * earned)
    assert 1 - 0.001 * (earned + 1) < c.level < 1 - 0.001


def test_a_short_history_extrapolates_the_tail_above_the_largest_rise() -> None:
    d = 4 * _load(0.3)  # 432 minutes: fewer scores than the 0.1 % level can rank
    s = _scores(d)
    assert np.sort(s)[-2] < s.max()  # a tail, not one repeated whole-node step
    assert (s.size + 1) * 0.001 < 1
    c = _cal(d, np.full(d.size, 96.0))
    assert c.margin is not None and c.margin > s.max()
    # the tail is read at the level: a larger budget keeps less
    c2 = _cal(d, np.full(d.size, 96.0), budget=0.002)
    assert c2.margin is not None and s.max() <= c2.margin < c.margin
    # and it relaxes as history accrues: from about 1 / budget scores on, the plain rank
    d_long = _load(3)
    c_long = _cal(d_long, np.full(d_long.size, 96.0))
    s_long = _scores(d_long)
    k = math.ceil((s_long.size + 1) * c_long.level)
    assert k <= s_long.size and c_long.margin == pytest.approx(np.sort(s_long)[k - 1])


def test_too_little_history_gives_no_margin_and_plan_does_not_lend() -> None:
    d = _load(0.02)  # 28 minutes
    c = _cal(d, np.full(d.size, 96.0), min_samples=180)
    assert c.margin is None and c.samples < 180
    view = _view(c, level=1.0, ready=6)
    p = plan(view, CFG)
    assert not p.actions
    assert p.pools[0].reason == Reason.CALIBRATING
    assert "minutes of history" in p.pools[0].detail


def _flat(level: float, span_s: float = 7200.0, step: float = 30.0) -> tuple[LoadSignals, ...]:
    n = int(span_s // step)
    return tuple(LoadSignals(NOW - (n - i) * step, level * 24, 0.0, level * 0.5, None, 99) for i in range(n))


def _view(cal: Calibration | None, *, level: float, ready: int) -> ClusterView:
    hist = _flat(level)
    nodes = tuple(
        NodeState(f"gpu-node-{i:02d}", POOL.name, Phase.SERVING, NOW - 86400, serving_pods=1, serving_ready=True)
        for i in range(ready)
    )
    sig = LoadSignals(NOW, level * 24, 0.0, level * 0.5, None, ready)
    return ClusterView(now=NOW, nodes=nodes, pools={POOL.name: PoolState(POOL.name, sig, hist, ready, ready, calibration=cal)})


def _fixed(margin: float) -> Calibration:
    return Calibration(margin, 0.999, 5000, 180, 2, 7.0, 0.001, 600.0, 1.0, NOW)


@pytest.mark.parametrize("margin, keep", [(1.0, 2), (1.5, 4), (3.0, 8)])
def test_plan_keeps_margin_times_the_base_and_says_so(margin: float, keep: int) -> None:
    # 2 replicas of load, 10 nodes: keep ceil(margin * (2 + 1) - 1) nodes (min 1), lend the rest
    p = plan(_view(_fixed(margin), level=2.0, ready=10), CFG)
    d = p.pools[0]
    want = max(1, math.ceil(margin * 3.0 - 1.0 - 1e-9))
    assert want == keep
    lends = [a for a in p.actions if a.kind.value == "lend"]
    assert len(lends) == min(CFG.policy.max_lends_per_tick, 10 - keep)
    assert f"calibrated margin x{margin:.2f}" in d.detail and "budget spent 2 of 7.0 min" in d.detail


def test_headroom_is_a_floor_on_top_of_the_margin() -> None:
    cfg = default_config(headroom=2.0)
    # margin 1 alone keeps 2 nodes for 2 replicas; the 200 % headroom floor keeps 6
    p = plan(_view(_fixed(1.0), level=2.0, ready=7), cfg)
    assert [a.kind.value for a in p.actions] == ["lend"]
    assert p.pools[0].desired_serving == 6
    assert "floor +200%" in p.pools[0].detail


def test_calibrator_is_deterministic_and_rebuilt_from_the_same_samples() -> None:
    d = _load(2)
    samples = [LoadSignals(NOW - (d.size - i) * 60 + 5, x * 24, 0.0, x * 0.5, None, 24) for i, x in enumerate(d)]
    a, b = Calibrator(CFG, POOL), Calibrator(CFG, POOL)
    for s in samples:
        a.add(s)
    for s in samples[: len(samples) // 2]:
        b.add(s)
    b2 = Calibrator(CFG, POOL)  # a restart: the same history, all at once
    for s in samples:
        b2.add(s)
    ca, cb = a.calibration(NOW, capacity=96), b2.calibration(NOW, capacity=96)
    assert ca == cb and ca.margin is not None and ca.margin >= 1.0


def test_measured_horizon_needs_samples_and_never_goes_below_the_configured_one() -> None:
    h = horizon_s(CFG, POOL)
    assert measured_horizon(CFG, POOL, [900.0] * 4) is None
    got = measured_horizon(CFG, POOL, [900.0] * 5)
    raw = 900.0 + CFG.policy.forecast.margin_s + CFG.policy.tick_s + CFG.prometheus.scrape_interval_s
    assert got == pytest.approx(math.ceil(raw / CFG.policy.tick_s) * CFG.policy.tick_s)  # whole ticks
    assert measured_horizon(CFG, POOL, [10.0] * 50) == pytest.approx(h)
    off = dataclasses.replace(CFG, pools=(dataclasses.replace(POOL, measured_delays=False),))
    assert measured_horizon(off, off.pools[0], [900.0] * 50) is None


def test_measured_horizon_lengthens_the_plan() -> None:
    view = _view(_fixed(1.0), level=2.0, ready=6)
    pools = {POOL.name: dataclasses.replace(view.pools[POOL.name], horizon_s=3000.0)}
    p = plan(dataclasses.replace(view, pools=pools), CFG)
    assert p.pools[0].horizon_s == 3000.0


def test_split_history_keeps_whole_days_and_the_rest() -> None:
    load = np.arange(3 * 1440, dtype=float)
    w = Workload(load, load.reshape(-1, 10).mean(axis=1), 60.0, 600.0, 1.0, 4.0, 1.0, 20.0)
    hist, rest = split_history(w, 1)
    assert hist is not None and hist.minutes == 1440 and rest.minutes == 2 * 1440
    assert rest.load[0] == 1440.0 and rest.window_load.size == 288
    assert split_history(w, 0) == (None, w)
    with pytest.raises(ValueError, match="history_days"):
        split_history(w, 3)


def test_hours_whose_load_habitually_jumps_get_a_larger_margin() -> None:
    rng = np.random.default_rng(5)
    days = 14
    n = days * 1440
    d = 10 + rng.gamma(2.0, 0.5, n)
    minute = np.arange(n) % 1440
    ramp = (minute >= 8 * 60) & (minute < 9 * 60)  # 08:00-09:00: the load jumps every day
    d[ramp] += 12 * ((minute[ramp] - 8 * 60) // 20 % 2)
    hours = (minute // 60).astype(np.int64)
    c = _cal(d, np.full(n, 96.0), hours=hours)
    assert c.by_hour and len(c.by_hour) == 24
    assert c.by_hour[8] > c.by_hour[2] * 1.1
    assert c.by_hour[8] >= c.margin >= c.by_hour[2]  # the calm hours gain what the ramp needs
    # a capacity that must hold across 07:30-08:10 takes the larger of the two hours
    day0 = NOW - NOW % 86400
    assert c.margin_over(day0 + 7.5 * 3600, day0 + 8.2 * 3600) == c.by_hour[8]
    assert c.margin_over(day0 + 2 * 3600, day0 + 2.5 * 3600) == c.by_hour[2]


def test_hours_not_in_the_history_yet_keep_capacity_for_the_peak_seen() -> None:
    d = _load(0.5)  # 12 hours seen: 00:00-12:00, peak about 20 replicas
    hours = (np.arange(d.size) // 60 % 24).astype(np.int64)
    c = _cal(d, np.full(d.size, 96.0), hours=hours)
    assert c.margin is not None and all(math.isfinite(m) for m in c.by_hour[:11])
    assert all(math.isinf(m) for m in c.by_hour[13:])
    assert c.peak_seen == pytest.approx(float(d.max()))
    day0 = NOW - NOW % 86400
    assert math.isfinite(c.margin_over(day0 + 3 * 3600, day0 + 3.5 * 3600) or 0)
    assert math.isinf(c.margin_over(day0 + 12.9 * 3600, day0 + 13.2 * 3600) or 0)
    t = day0 + 12.92 * 3600  # 12:55: both horizons reach 13:00, never seen
    nodes = tuple(
        NodeState(f"gpu-node-{i:02d}", POOL.name, Phase.SERVING if i < 4 else Phase.LENT, t - 86400,
                  serving_pods=1 if i < 4 else 0, serving_ready=i < 4)
        for i in range(30)
    )
    hist = tuple(LoadSignals(t - (240 - i) * 30.0, 48, 0.0, 1.0, None, 4) for i in range(240))
    ps = PoolState(POOL.name, LoadSignals(t, 48, 0.0, 1.0, None, 4), hist, 4, 4, calibration=c)
    p = plan(ClusterView(now=t, nodes=nodes, pools={POOL.name: ps}), CFG)
    # 2 replicas of load now, but the next hour is unknown: capacity for the peak seen comes back
    want = math.ceil(c.margin * (c.peak_seen + 1) - 1 - 1e-9)
    assert p.pools[0].desired_serving == want > 4
    assert len([a for a in p.actions if a.kind.value == "reclaim"]) == min(want - 4, CFG.policy.max_reclaims_per_tick)
    assert "an hour not yet in the history: at least the peak seen" in p.pools[0].detail
