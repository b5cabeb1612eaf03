"""The policy's parts on their own: demand from signals, victims, forecast, calendar windows,
the history recorder. Fixed ``NOW`` (Thursday 2026-01-01 00:00 UTC)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import CalendarEffect, CalendarRule, TargetConfig, VictimRule, default_config
from bridge.model import LoadSignals, NodeState, Phase, SlurmJob
from bridge.policy import calendar
from bridge.policy.demand import demand, nodes_for, replicas_needed
from bridge.policy.forecast import forecast, history_span_s, history_windows, horizon_s, lend_horizon_s, lend_span_s
from bridge.policy.history import HistoryRecorder, merge_max
from bridge.policy.victims import choose_victims, job_loss_gpu_hours

NOW = 1_767_225_600.0
H = 3600.0


# --------------------------------------------------------------------------- demand

T = TargetConfig(concurrency_per_replica=20.0, kv_cache_usage=0.8, tokens_per_s_per_replica=1000.0, waiting_per_replica=5.0)


def s(running: float | None = 10.0, waiting: float | None = 0.0, kv: float | None = 0.4, tok: float | None = 500.0) -> LoadSignals:
    return LoadSignals(NOW, running, waiting, kv, tok, 3)


@pytest.mark.parametrize(
    "sample, replicas, by, missing",
    [
        pytest.param(s(), 0.5, "concurrency_per_replica", (), id="all-equal-first-wins"),
        pytest.param(s(kv=1.6), 2.0, "kv_cache_usage", (), id="kv-highest"),
        pytest.param(s(tok=3000.0), 3.0, "tokens_per_s_per_replica", (), id="tokens-highest"),
        pytest.param(s(waiting=20.0), 4.0, "waiting_per_replica", (), id="queue-highest"),
        pytest.param(s(running=None), 0.5, "kv_cache_usage", ("concurrency_per_replica",), id="running-missing"),
        pytest.param(s(kv=float("nan")), 0.5, "concurrency_per_replica", ("kv_cache_usage",), id="nan"),
        pytest.param(s(tok=-1.0), 0.5, "concurrency_per_replica", ("tokens_per_s_per_replica",), id="negative"),
        pytest.param(
            s(None, None, None, None),
            None,
            "",
            ("concurrency_per_replica", "kv_cache_usage", "tokens_per_s_per_replica", "waiting_per_replica"),
            id="all-missing",
        ),
    ],
)
def test_demand_is_the_most_demanding_signal(
    sample: LoadSignals, replicas: float | None, by: str, missing: tuple[str, ...]
) -> None:
    d = demand(sample, T)
    assert (d.replicas, d.by, d.missing) == (replicas, by, missing)
    assert replicas_needed(sample, T) == replicas


def test_disabled_signals_do_not_count() -> None:
    t = TargetConfig(concurrency_per_replica=20.0, kv_cache_usage=None)
    d = demand(s(kv=None, tok=None), t)
    assert (d.replicas, d.missing) == (0.5, ())


@pytest.mark.parametrize(
    "replicas, headroom, extra, per_node, nodes",
    [(0.0, 0.15, 0.0, 1, 0), (0.0, 0.15, 0.5, 1, 1), (10.0, 0.15, 0.5, 1, 12), (10.0, 0.0, 0.0, 1, 10), (10.0, 0.0, 0.0, 2, 5), (9.0, 0.0, 0.0, 2, 5)],
)
def test_nodes_for(replicas: float, headroom: float, extra: float, per_node: int, nodes: int) -> None:
    assert nodes_for(replicas, headroom=headroom, headroom_replicas=extra, replicas_per_node=per_node) == nodes


# --------------------------------------------------------------------------- victims


def lent(name: str, *jobs: str) -> NodeState:
    return NodeState(name, "p", Phase.LENT, NOW - 7200, jobs=jobs, slurm_state="allocated" if jobs else "idle")


def job(jid: str, nodes: tuple[str, ...], start_h_ago: float, ckpt_h_ago: float | None = None) -> SlurmJob:
    return SlurmJob(
        jid, "train", "alice", "preempt", "running", nodes, NOW - start_h_ago * H,
        checkpoint_time=None if ckpt_h_ago is None else NOW - ckpt_h_ago * H,
    )


def test_job_loss_counts_every_gpu_since_checkpoint() -> None:
    assert job_loss_gpu_hours(job("a", ("n1", "n2"), 5, ckpt_h_ago=1), NOW) == pytest.approx(8.0)
    assert job_loss_gpu_hours(job("a", ("n1",), 5), NOW) == pytest.approx(20.0)


CANDS = [lent("n1", "a"), lent("n2", "b"), lent("n3", "c"), lent("n4", "c"), lent("n5")]
JOBS = {
    "a": job("a", ("n1",), 3.0),  # 12 GPU-h
    "b": job("b", ("n2",), 10.0, ckpt_h_ago=0.5),  # 2 GPU-h
    "c": job("c", ("n3", "n4"), 4.0, ckpt_h_ago=1.0),  # 8 GPU-h for both nodes
}


# Idle nodes come first, then the cheapest set (in name order).
@pytest.mark.parametrize(
    "count, rule, nodes, lost",
    [
        pytest.param(1, VictimRule.LEAST_LOST_WORK, ("n5",), 0.0, id="idle-first"),
        pytest.param(2, VictimRule.LEAST_LOST_WORK, ("n5", "n2"), 2.0, id="then-least-lost"),
        # needing 2 more: the 2-node job frees both for 8, cheaper than a + b = 14
        pytest.param(3, VictimRule.LEAST_LOST_WORK, ("n5", "n3", "n4"), 8.0, id="multi-node-job-paid-once"),
        pytest.param(4, VictimRule.LEAST_LOST_WORK, ("n5", "n2", "n3", "n4"), 10.0, id="four"),
        pytest.param(9, VictimRule.LEAST_LOST_WORK, ("n5", "n1", "n2", "n3", "n4"), 22.0, id="more-than-there-are"),
        pytest.param(2, VictimRule.NEWEST_FIRST, ("n5", "n1"), 12.0, id="naive-newest-job-first"),
    ],
)
def test_victims(count: int, rule: VictimRule, nodes: tuple[str, ...], lost: float) -> None:
    v = choose_victims(CANDS, count, JOBS, NOW, rule=rule)
    assert v.nodes == nodes
    assert v.lost_gpu_hours == pytest.approx(lost)
    assert v.short == max(0, count - 5)


def test_victims_one_node_of_a_two_node_job_costs_the_whole_job() -> None:
    cands = [lent("n3", "c"), lent("n4", "c"), lent("n6", "d")]
    jobs = {"c": JOBS["c"], "d": job("d", ("n6",), 2.5)}  # d: 10 GPU-h > c's 8 but frees only what is needed
    v = choose_victims(cands, 1, jobs, NOW)
    assert (v.nodes, v.lost_gpu_hours) == (("n3",), pytest.approx(8.0))


def test_victims_spare_young_jobs_unless_urgent() -> None:
    cands = [lent("n1", "y"), lent("n2", "o")]
    jobs = {"y": job("y", ("n1",), 0.1), "o": job("o", ("n2",), 5.0)}
    calm = choose_victims(cands, 2, jobs, NOW, min_runtime_s=900)
    assert (calm.nodes, calm.short, calm.short_because_young) == (("n2",), 1, 1)
    urgent = choose_victims(cands, 2, jobs, NOW, min_runtime_s=900, allow_young=True)
    assert urgent.nodes == ("n2", "n1")


def test_a_job_that_saves_on_the_signal_within_the_grace_is_free() -> None:
    saver = dataclasses.replace(job("s", ("n1",), 6.0), signal_save_s=60.0)  # 24 GPU-h since start
    cands = [lent("n1", "s"), lent("n2", "b")]
    jobs = {"s": saver, "b": JOBS["b"]}  # b: 2 GPU-h since its checkpoint
    assert job_loss_gpu_hours(saver, NOW, grace_s=120) == 0.0
    assert job_loss_gpu_hours(saver, NOW) == pytest.approx(24.0)  # no grace known: not trusted
    assert job_loss_gpu_hours(saver, NOW, grace_s=30) == pytest.approx(24.0)  # save longer than the grace
    assert job_loss_gpu_hours(dataclasses.replace(saver, requeueable=False), NOW, grace_s=120) > 0
    v = choose_victims(cands, 1, jobs, NOW, grace_s=120)
    assert (v.nodes, v.lost_gpu_hours) == (("n1",), 0.0)
    assert choose_victims(cands, 1, jobs, NOW, grace_s=30).nodes == ("n2",)


def test_unknown_jobs_are_a_last_resort() -> None:
    cands = [lent("n1", "ghost"), lent("n2", "o")]
    v = choose_victims(cands, 1, {"o": job("o", ("n2",), 50.0)}, NOW)
    assert v.nodes == ("n2",)


def test_victims_tie_break_by_name_and_ignore_input_order() -> None:
    cands = [lent("n9", "x"), lent("n1", "y")]
    jobs = {"x": job("x", ("n9",), 1.0), "y": job("y", ("n1",), 1.0)}
    assert choose_victims(cands, 1, jobs, NOW).nodes == ("n1",)
    assert choose_victims(cands[::-1], 1, jobs, NOW).nodes == ("n1",)


# --------------------------------------------------------------------------- forecast

# the forecast with the learned burst factor and the seasonal lags on (optional since calibration)
_c = default_config()
CFG = dataclasses.replace(
    _c,
    policy=dataclasses.replace(
        _c.policy,
        forecast=dataclasses.replace(_c.policy.forecast, burst_history_s=86400.0, seasonal_lags_s=(86400.0, 604800.0)),
    ),
)
POOL = CFG.pools[0]


def series(f, start: float, end: float, step: float) -> tuple[LoadSignals, ...]:  # type: ignore[no-untyped-def]
    n = int((end - start) // step)
    return tuple(LoadSignals(start + i * step, f(start + i * step) * 24, 0.0, None, None, 10) for i in range(n + 1))


def test_horizons() -> None:
    # grace 120 + cold start 300 + margin 120 + tick 30 + scrape 15
    assert horizon_s(CFG, POOL) == 585.0
    assert lend_horizon_s(CFG, POOL) == 585.0 + 900.0  # + max(min_lend_s 600, min_runtime_s 900)


def test_history_windows_are_small_and_declared() -> None:
    ws = history_windows(CFG)
    # per seasonal lag: 30 min before (compare window) to the lend horizon after, at 60 s;
    # the last day at 5 min (burst factor, last hour's peak); the last 30.5 min at 30 s
    assert [(w.start_s, w.end_s, w.step_s) for w in ws] == [
        (-604800.0 - 1800.0, -604800.0 + 1485.0, 60.0),
        (-86400.0 - 1800.0, -86400.0 + 1485.0, 60.0),
        (-86400.0, 0.0, 300.0),
        (-1830.0, 0.0, 30.0),
    ]
    assert history_span_s(CFG) == 604800.0 + 1800.0
    off = dataclasses.replace(CFG, policy=dataclasses.replace(CFG.policy, forecast=dataclasses.replace(CFG.policy.forecast, enabled=False)))
    assert len(history_windows(off)) == 1


def test_seasonal_profile_sees_yesterdays_peak_coming() -> None:
    # every day: 2 replicas, but 10 between 00:05 and 00:15; now is 00:00
    def load(t: float) -> float:
        return 10.0 if 300 <= (t - NOW) % 86400 < 900 else 2.0

    hist = series(load, NOW - 2 * 86400, NOW, 60.0)
    fc = forecast(hist, None, NOW, config=CFG, pool=POOL)
    assert fc.recent_peak == pytest.approx(2.0)
    assert 86400.0 in fc.seasonal_lags_used
    assert fc.peak == pytest.approx(10.0)  # same level as yesterday: ratio 1
    flat = series(lambda t: 2.0, NOW - 2 * 86400, NOW, 60.0)
    assert forecast(flat, None, NOW, config=CFG, pool=POOL).peak == pytest.approx(2.0)


def test_rising_trend_is_extrapolated() -> None:
    hist = series(lambda t: 2.0 + (t - NOW + 1200) / 600, NOW - 1200, NOW, 30.0)  # +1 replica / 10 min
    fc = forecast(hist, None, NOW, config=CFG, pool=POOL)
    assert fc.trend_peak == pytest.approx(4.0 + 585 / 600, rel=1e-6)
    assert fc.peak >= fc.trend_peak


def test_burst_factor_is_learned_from_history() -> None:
    # a day where the load doubles for 10 minutes every 50: peaks come suddenly
    def load(t: float) -> float:
        return 8.0 if (t - NOW) % 3000 < 600 else 4.0

    hist = series(load, NOW - 86400 - 1800, NOW - 1200, 60.0) + series(lambda t: 4.0, NOW - 1140, NOW, 30.0)
    fc = forecast(hist, None, NOW, config=CFG, pool=POOL)
    assert fc.burst_factor == pytest.approx((8 + 1) / (4 + 1))
    assert fc.peak == pytest.approx(4.0 * 9 / 5)
    assert fc.lend_peak >= fc.peak


def test_stable_needs_the_whole_window() -> None:
    full = series(lambda t: 1.0, NOW - 600, NOW, 30.0)
    assert forecast(full, None, NOW, config=CFG, pool=POOL).stable
    assert not forecast(full[-5:], None, NOW, config=CFG, pool=POOL).stable
    holed = full[:-8] + full[-3:]
    assert not forecast(holed, None, NOW, config=CFG, pool=POOL).stable


# --------------------------------------------------------------------------- calendar

BERLIN_DAY = CalendarRule(
    name="day", effect=CalendarEffect.NO_LEND, start="08:00", end="20:00",
    days=("mon", "tue", "wed", "thu", "fri"), timezone="Europe/Berlin",
)
NIGHT = CalendarRule(name="night", effect=CalendarEffect.LEND_ONLY, start="20:00", end="08:00", timezone="UTC")


def ts(text: str, tz: str = "UTC") -> float:
    from zoneinfo import ZoneInfo

    return dt.datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp()


@pytest.mark.parametrize(
    "rules, lo, hi, floor",
    [
        pytest.param((BERLIN_DAY,), ts("2026-01-01 03:00"), ts("2026-01-01 04:00"), 0, id="thu-night"),
        pytest.param((BERLIN_DAY,), ts("2026-01-01 06:50"), ts("2026-01-01 07:05"), calendar.INFINITE, id="thu-window-opens-07utc"),
        pytest.param((BERLIN_DAY,), ts("2026-01-03 10:00"), ts("2026-01-03 11:00"), 0, id="saturday"),
        # summer time: 08:00 Berlin = 06:00 UTC
        pytest.param((BERLIN_DAY,), ts("2026-07-01 06:10"), ts("2026-07-01 06:20"), calendar.INFINITE, id="dst"),
        pytest.param((BERLIN_DAY,), ts("2026-07-01 05:00"), ts("2026-07-01 05:50"), 0, id="dst-before"),
        pytest.param((NIGHT,), ts("2026-01-01 23:00"), ts("2026-01-02 01:00"), 0, id="inside-night"),
        pytest.param((NIGHT,), ts("2026-01-02 07:30"), ts("2026-01-02 08:10"), calendar.INFINITE, id="night-ends"),
        pytest.param((NIGHT,), ts("2026-01-01 12:00"), ts("2026-01-01 12:10"), calendar.INFINITE, id="daytime"),
        pytest.param(
            (CalendarRule(name="busy", effect=CalendarEffect.MIN_SERVING, start="09:00", end="17:00", min_serving=6),),
            ts("2026-01-01 08:55"), ts("2026-01-01 09:05"), 6, id="min-serving",
        ),
    ],
)
def test_calendar_floor(rules: tuple[CalendarRule, ...], lo: float, hi: float, floor: int) -> None:
    assert calendar.floor(rules, "p", lo, hi)[0] == floor


def test_calendar_rule_limited_to_other_pools_does_not_apply() -> None:
    rule = dataclasses.replace(BERLIN_DAY, pools=("other",))
    assert calendar.floor((rule,), "p", ts("2026-01-01 10:00"), ts("2026-01-01 11:00")) == (0, None)


# --------------------------------------------------------------------------- history


def test_merge_max_keeps_peaks_and_missing() -> None:
    a = LoadSignals(1.0, 5.0, 1.0, 0.5, None, 3)
    b = LoadSignals(2.0, 3.0, 4.0, 0.7, 10.0, 2)
    m = merge_max(a, b)
    assert m == LoadSignals(2.0, 5.0, 4.0, 0.7, None, 2)
    assert merge_max(a, dataclasses.replace(b, running=math.nan)).running is None


def test_recorder_keeps_only_declared_windows_at_their_resolution() -> None:
    rec = HistoryRecorder(history_windows(CFG))
    start = NOW - 8 * 86400
    t = start
    while t <= NOW:
        rec.add(LoadSignals(t, 24.0, 0.0, None, None, 1))
        t += 30.0
    h = rec.history(NOW)
    assert all(a.t < b.t for a, b in zip(h, h[1:]))
    assert len(h) < 600  # 8 days of 30 s samples = 23 041; the windows need a few hundred
    recent = [x for x in h if x.t > NOW - 1800]
    assert all(b.t - a.t == 30.0 for a, b in zip(recent, recent[1:]))
    lag = [x for x in h if NOW - 86400 - 1800 <= x.t <= NOW - 86400 + 1400]
    assert lag and all(b.t - a.t <= 60.0 for a, b in zip(lag, lag[1:]))
    assert h[0].t >= NOW - 604800 - 1800 - 60


def test_recorder_rejects_time_going_back_and_ignores_repeats() -> None:
    rec = HistoryRecorder(history_windows(CFG))
    rec.add(LoadSignals(NOW, 1.0, 0.0, None, None, 1))
    rec.add(LoadSignals(NOW, 9.0, 0.0, None, None, 1))
    assert [x.running for x in rec.history(NOW)] == [1.0]


@settings(max_examples=60, deadline=None)
@given(offset=st.integers(0, 299), ticks_after=st.integers(0, 200))
def test_a_peak_stays_in_the_history_until_the_lend_lookback_has_passed_it(offset: int, ticks_after: int) -> None:
    """A peak leaves the fine window while the coarse bucket holding it still ends later: it
    must not vanish in between (it did for up to a step, and a lend slipped through: the
    saw hypothesis found in test_governor's no-thrash test, level 0.75, cv 0.15, seed 6568)."""
    cfg = CFG
    rec = HistoryRecorder(history_windows(cfg))
    t0 = NOW - 4 * 3600 + offset
    peak_t = t0 + 1800
    now = peak_t + ticks_after * 30.0
    t = t0
    while t <= now:
        rec.add(LoadSignals(t, 48.0 if t == peak_t else 24.0, 0.0, None, None, 1))
        t += 30.0
    lookback = lend_span_s(cfg)
    h = [x for x in rec.history(now) if now - lookback <= x.t <= now]
    if now - peak_t <= lookback - cfg.policy.forecast.burst_step_s:  # the whole bucket still inside
        assert max(x.running for x in h if x.running is not None) == 48.0, now - peak_t
