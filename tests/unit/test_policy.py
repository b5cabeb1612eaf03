"""plan(): one table of situations -> expected actions, reason codes and sentences.

Fixed ``NOW`` (Thursday 2026-01-01 00:00 UTC); views built from plain values, no fakes
needed: the policy is pure. Covers signals (stale, missing, NaN, partial, blind), lending
(stabilization, floors, calendar, rate limits, max_lent, capacity in transit, which node),
reclaiming (spike vs forecast, min_lend_s, min_runtime_s), and held nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from bridge.config import CalendarEffect, CalendarRule, Config, default_config
from bridge.model import (
    ActionKind,
    ClusterView,
    HoldReason,
    LoadSignals,
    NodeState,
    Phase,
    Pin,
    Plan,
    PoolState,
    Reason,
    SlurmJob,
)
from bridge.policy import plan


def _floors(cfg: Config) -> Config:
    f = dataclasses.replace(cfg.policy.forecast, burst_history_s=86400.0)
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, forecast=f))


NOW = 1_767_225_600.0  # Thursday 2026-01-01 00:00:00 UTC
POOL = "default"
# plan() without a calibration (PoolState.calibration None): the configured headroom and the
# learned burst factor, the floors an operator may still set (the calibrated path is tested
# in test_calibrate.py)
CFG = _floors(default_config(headroom=0.2, headroom_replicas=0.5))


def sig(t: float, replicas: float, reporting: int = 99, **kw: float | None) -> LoadSignals:
    """A sample whose running+waiting means ``replicas`` at the default target (24)."""
    fields: dict[str, object] = dict(
        t=t, running=replicas * 24.0, waiting=0.0, kv_cache_usage_sum=replicas * 0.5, tokens_per_s=None,
        replicas_reporting=reporting,
    )
    fields.update(kw)
    return LoadSignals(**fields)  # type: ignore[arg-type]


def flat(level: float, span_s: float = 7200.0, step_s: float = 30.0, reporting: int = 99) -> tuple[LoadSignals, ...]:
    n = int(span_s // step_s)
    return tuple(sig(NOW - (n - i) * step_s, level, reporting) for i in range(n))


def node(name: str, phase: Phase = Phase.SERVING, since: float = NOW - 86400, **kw: object) -> NodeState:
    ready = phase is Phase.SERVING
    base: dict[str, object] = dict(serving_pods=1 if ready else 0, serving_ready=ready)
    base.update(kw)
    return NodeState(name=name, pool=POOL, phase=phase, phase_since=since, **base)  # type: ignore[arg-type]


def serving(n: int, start: int = 0) -> list[NodeState]:
    return [node(f"gpu-node-{i:02d}") for i in range(start, start + n)]


def lent(n: int, start: int = 50, since: float = NOW - 7200, job_start: float | None = NOW - 7200) -> list[NodeState]:
    out = []
    for i in range(start, start + n):
        jobs = (f"j{i}",) if job_start is not None else ()
        out.append(node(f"gpu-node-{i:02d}", Phase.LENT, since, slurm_state="allocated" if jobs else "idle", jobs=jobs))
    return out


def jobs_for(nodes: list[NodeState], start: float = NOW - 7200) -> dict[str, SlurmJob]:
    return {
        j: SlurmJob(j, "train", "alice", "preempt", "running", (n.name,), start)
        for n in nodes
        for j in n.jobs
    }


def view(
    nodes: list[NodeState],
    level: float | None = 2.0,
    *,
    history: tuple[LoadSignals, ...] | None = None,
    signals: LoadSignals | None | str = "auto",
    jobs: Mapping[str, SlurmJob] | None = None,
    now: float = NOW,
) -> ClusterView:
    ready = sum(1 for n in nodes if n.serving_ready)
    hist = history if history is not None else (flat(level, reporting=ready) if level is not None else ())
    if signals == "auto":
        signals = sig(now, level, ready) if level is not None else None
    lent_nodes = [n for n in nodes if n.jobs]
    return ClusterView(
        now=now,
        nodes=tuple(nodes),
        pools={POOL: PoolState(POOL, signals, hist, ready, ready)},  # type: ignore[arg-type]
        jobs=jobs if jobs is not None else jobs_for(lent_nodes),
    )


def with_policy(cfg: Config = CFG, **kw: object) -> Config:
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, **kw))


def with_pool(cfg: Config = CFG, **kw: object) -> Config:
    return dataclasses.replace(cfg, pools=(dataclasses.replace(cfg.pools[0], **kw),))


def kinds(p: Plan) -> list[tuple[str, str, str]]:
    return [(a.kind.value, a.node, str(a.reason)) for a in p.actions]


def decision(p: Plan) -> tuple[str, int, int]:
    d = p.pools[0]
    return str(d.reason), d.serving_now, d.desired_serving


# --------------------------------------------------------------------------- lending


def test_low_steady_load_lends_with_a_sentence() -> None:
    p = plan(view(serving(10), 2.0), CFG)
    assert kinds(p) == [
        ("lend", "gpu-node-00", "low_forecast"),
        ("lend", "gpu-node-01", "low_forecast"),
    ]
    # 2 replicas x 1.15 + 0.5 = 2.8 -> 3 nodes; room for 7 lends, 2 per tick
    assert decision(p) == ("low_forecast", 10, 3)
    assert p.actions[0].detail == (
        "lend gpu-node-00: forecast peak 2.0 replicas over next 25 min (+20% +0.5 headroom) "
        "needs 3 < 10 serving - 7"
    )
    assert p.pools[0].detail.endswith("; 2 of 7 lends this tick (max_lends_per_tick)")


@pytest.mark.parametrize(
    "nodes, level, cfg, expected",
    [
        pytest.param(serving(3), 2.0, CFG, ("steady", 3, 3), id="needs-every-node"),
        pytest.param(serving(3), 0.0, with_pool(min_serving=3), ("at_floor", 3, 3), id="min-serving-floor"),
        pytest.param(
            serving(10) + [node("gpu-node-90", Phase.RETURNING, NOW - 60)],
            2.0,
            CFG,
            ("capacity_in_transit", 11, 11),
            id="capacity-in-transit",
        ),
        pytest.param(serving(10) + lent(2), 2.0, with_pool(max_lent=2), ("max_lent", 10, 10), id="max-lent"),
        pytest.param(
            serving(10), 2.0, with_policy(require_pending_jobs=True), ("no_research_demand", 10, 10), id="no-research-demand"
        ),
        pytest.param(serving(10), 2.0, with_policy(max_lends_per_tick=0), ("rate_limited", 10, 3), id="rate-limited"),
    ],
)
def test_lending_blocked(nodes: list[NodeState], level: float, cfg: Config, expected: tuple[str, int, int]) -> None:
    p = plan(view(nodes, level), cfg)
    assert [a for a in p.actions if a.kind is ActionKind.LEND] == []
    assert decision(p) == expected


def test_lends_the_node_with_least_inflight_work() -> None:
    nodes = [
        node("gpu-node-00", inflight=30.0),
        node("gpu-node-01", inflight=3.0),
        node("gpu-node-02", inflight=None),
        node("gpu-node-03", serving_pods=0, serving_ready=False),  # nothing to drain: first
        node("gpu-node-04", inflight=3.0),
    ] + serving(5, start=10)
    p = plan(view(nodes, 2.0), with_policy(max_lends_per_tick=3))
    assert [a.node for a in p.actions] == ["gpu-node-03", "gpu-node-01", "gpu-node-04"]


def test_stabilization_window_must_be_observed() -> None:
    short = flat(2.0, span_s=120, reporting=10)  # only 2 minutes of history (e.g. a new pool)
    p = plan(view(serving(10), 2.0, history=short), CFG)
    assert kinds(p) == []
    assert decision(p) == ("stabilizing", 10, 10)


def test_a_gap_in_the_window_blocks_lending() -> None:
    hist = tuple(s for s in flat(2.0, reporting=10) if not (NOW - 200 < s.t < NOW - 60))
    p = plan(view(serving(10), 2.0, history=hist), CFG)
    assert decision(p)[0] == "stabilizing"


def test_a_recent_peak_holds_capacity() -> None:
    # load was 7.5 replicas four minutes ago (x 1.2 + 0.5 = all 10 nodes): the burst window still sees it
    hist = tuple(sig(s.t, 7.5 if NOW - 300 < s.t < NOW - 200 else 2.0, 10) for s in flat(2.0, reporting=10))
    p = plan(view(serving(10), 2.0, history=hist), CFG)
    assert kinds(p) == []
    assert decision(p)[0] == "steady"


# --------------------------------------------------------------------------- signals


@pytest.mark.parametrize(
    "signals, reason",
    [
        pytest.param(None, "signals_missing", id="no-sample"),
        pytest.param(sig(NOW - 200, 2.0, 10), "signals_stale", id="stale"),
        pytest.param(sig(NOW, 2.0, 10, running=float("nan"), kv_cache_usage_sum=None), "signals_missing", id="nan-and-none"),
        pytest.param(sig(NOW, 2.0, 10, waiting=-1.0), "signals_missing", id="negative"),
        pytest.param(sig(NOW, 2.0, 10, kv_cache_usage_sum=float("inf")), "signals_missing", id="infinite"),
        pytest.param(sig(NOW, 2.0, 7), "signals_partial", id="partial"),
    ],
)
def test_bad_signals_block_lending(signals: LoadSignals | None, reason: str) -> None:
    p = plan(view(serving(10), 2.0, signals=signals), CFG)
    assert kinds(p) == []
    assert decision(p)[0] == reason
    assert p.pools[0].detail.startswith("not lending: ")


def test_missing_signal_detail_names_the_signal() -> None:
    p = plan(view(serving(10), 2.0, signals=sig(NOW, 2.0, 10, kv_cache_usage_sum=None)), CFG)
    assert p.pools[0].detail == "not lending: missing kv_cache_usage"


def test_blind_for_too_long_reclaims_toward_blind_serving() -> None:
    nodes = serving(4) + lent(6)
    old = flat(2.0, reporting=4)
    hist = tuple(s for s in old if s.t < NOW - 600)  # nothing valid for 10 minutes
    cfg = with_pool(blind_serving=7)
    p = plan(view(nodes, None, history=hist, signals=None), cfg)
    assert [(a.kind.value, str(a.reason)) for a in p.actions] == [("reclaim", "signals_lost")] * 3
    assert decision(p) == ("signals_lost", 4, 7)
    assert p.pools[0].detail == "no valid load sample for > 300 s (no usable load signal); serve 7 of 10 nodes blind"


def test_blind_with_no_history_at_all_and_blind_serving_null_serves_everything() -> None:
    cfg = with_policy(with_pool(blind_serving=None), max_reclaims_per_tick=8)
    p = plan(view(serving(2) + lent(3), None, history=(), signals=None), cfg)
    assert len(p.actions) == 3 and all(a.reason == Reason.SIGNALS_LOST for a in p.actions)


def test_blind_by_default_holds_what_serves_and_reclaims_no_lent_node() -> None:
    # issue 21: a signal outage (or a foreign NaN series) must not preempt every research job;
    # the default blind_serving is 0: the floor (min_serving) is restored, nothing else moves
    assert CFG.pools[0].blind_serving == 0
    p = plan(view(serving(2) + lent(3), None, history=(), signals=None), with_policy(max_reclaims_per_tick=8))
    assert p.actions == ()
    assert decision(p) == ("signals_missing", 2, 2)
    assert p.pools[0].detail == "no valid load sample for > 300 s (no usable load signal); serve 1 of 5 nodes blind"
    below_floor = plan(view(serving(0) + lent(3), None, history=(), signals=None), with_pool(min_serving=2))
    assert [str(a.reason) for a in below_floor.actions] == ["signals_lost"] * 2


def test_blind_but_recent_valid_sample_only_holds() -> None:
    hist = flat(2.0, reporting=4)[:-4]  # last valid sample 150 s ago: stale, not blind yet
    p = plan(view(serving(4) + lent(6), None, history=hist, signals=None), CFG)
    assert kinds(p) == []
    assert decision(p)[0] == "signals_missing"


# --------------------------------------------------------------------------- reclaiming


def test_spike_reclaims_at_once_even_recently_lent_nodes() -> None:
    nodes = serving(3) + lent(4, since=NOW - 60)  # lent a minute ago
    p = plan(view(nodes, 5.0, history=flat(2.0, reporting=3)), CFG)
    assert [(a.kind.value, str(a.reason), a.urgent) for a in p.actions] == [("reclaim", "spike", True)] * 4
    d = p.pools[0]
    assert d.reason == "spike"
    assert d.detail.startswith("demand 5.0 replicas (concurrency_per_replica) > 3 Ready; need 7 nodes, 3 serving or returning")


def test_forecast_rise_waits_for_min_lend_duration() -> None:
    nodes = serving(4) + lent(3, since=NOW - 120)
    # demand 3 now (< 4 Ready) but 4.5 two minutes ago -> forecast above capacity
    hist = tuple(sig(s.t, 4.5 if NOW - 150 < s.t < NOW - 100 else 3.0, 4) for s in flat(3.0, reporting=4))
    p = plan(view(nodes, 3.0, history=hist), CFG)
    assert kinds(p) == []
    assert decision(p)[0] == "min_lend_duration"
    assert p.pools[0].detail.endswith("; 0 of 2 reclaims: other lent nodes were lent < 600 s ago")


def test_forecast_rise_reclaims_old_lends_and_names_the_jobs() -> None:
    nodes = serving(4) + lent(3, since=NOW - 7200)
    hist = tuple(sig(s.t, 4.5 if NOW - 150 < s.t < NOW - 100 else 3.0, 4) for s in flat(3.0, reporting=4))
    p = plan(view(nodes, 3.0, history=hist), CFG)
    assert [(a.kind.value, a.node, str(a.reason), a.urgent) for a in p.actions] == [
        ("reclaim", "gpu-node-50", "forecast_rise", False),
        ("reclaim", "gpu-node-51", "forecast_rise", False),
    ]
    assert p.actions[0].jobs == ("j50",)
    assert p.actions[0].lost_gpu_hours == pytest.approx(16.0)  # 2 jobs x 2 h x 4 GPUs, on the first action
    assert p.actions[0].detail.startswith("reclaim gpu-node-50: forecast peak ")
    assert p.actions[0].detail.endswith("; preempts j50")


def test_voluntary_reclaim_spares_young_jobs() -> None:
    nodes = serving(4) + lent(2, since=NOW - 7200, job_start=NOW - 60)
    hist = tuple(sig(s.t, 4.5 if NOW - 150 < s.t < NOW - 100 else 3.0, 4) for s in flat(3.0, reporting=4))
    jobs = jobs_for(nodes, start=NOW - 60)
    p = plan(view(nodes, 3.0, history=hist, jobs=jobs), CFG)
    assert kinds(p) == []
    assert decision(p)[0] == "min_runtime"


def test_urgent_reclaim_takes_young_jobs_last() -> None:
    nodes = serving(2) + lent(2, start=50, job_start=NOW - 60) + lent(1, start=60)
    jobs = {**jobs_for(nodes[2:4], start=NOW - 60), **jobs_for(nodes[4:], start=NOW - 7200)}
    p = plan(view(nodes, 3.5, history=flat(1.0, reporting=2), jobs=jobs), CFG)  # needs 5 nodes
    assert [a.node for a in p.actions] == ["gpu-node-60", "gpu-node-50", "gpu-node-51"]


def test_below_min_serving_reclaims() -> None:
    p = plan(view(serving(1) + lent(3), 0.0), with_pool(min_serving=3))
    assert [str(a.reason) for a in p.actions] == ["min_serving", "min_serving"]
    assert p.pools[0].detail == "min_serving 3 > 1 serving"


def test_reclaims_are_rate_limited_urgent_pools_first() -> None:
    cfg = _floors(default_config("a", "b", headroom=0.2, headroom_replicas=0.5))
    cfg = with_policy(cfg, max_reclaims_per_tick=3)
    nodes = [
        NodeState(f"a-{i}", "a", Phase.SERVING, NOW - 86400, serving_pods=1, serving_ready=True) for i in range(2)
    ] + [NodeState(f"a-l{i}", "a", Phase.LENT, NOW - 7200) for i in range(3)]
    nodes += [NodeState(f"b-{i}", "b", Phase.SERVING, NOW - 86400, serving_pods=1, serving_ready=True) for i in range(2)]
    nodes += [NodeState(f"b-l{i}", "b", Phase.LENT, NOW - 7200) for i in range(3)]
    pools = {
        "a": PoolState("a", sig(NOW, 1.9, 2), flat(1.0, reporting=2)),  # forecast rise, not urgent
        "b": PoolState("b", sig(NOW, 4.0, 2), flat(1.0, reporting=2)),  # spike: urgent
    }
    p = plan(ClusterView(NOW, tuple(nodes), pools), cfg)
    assert [(a.pool, str(a.reason)) for a in p.actions] == [("b", "spike")] * 3
    assert {d.pool: str(d.reason) for d in p.pools}["a"] == "rate_limited"


# --------------------------------------------------------------------------- calendar


BUSINESS = CalendarRule(
    name="business-hours", effect=CalendarEffect.NO_LEND, start="08:00", end="20:00",
    days=("mon", "tue", "wed", "thu", "fri"), timezone="Europe/Berlin",
)


@pytest.mark.parametrize(
    "now, expected",
    [
        pytest.param(NOW + 3 * 3600, "low_forecast", id="thu-04h-berlin-lends"),
        pytest.param(NOW + 6.9 * 3600, "calendar_no_lend", id="thu-07h54-window-within-lend-horizon"),
        pytest.param(NOW + 12 * 3600, "calendar_no_lend", id="thu-13h-inside"),
        pytest.param(NOW + 2 * 86400 + 12 * 3600, "low_forecast", id="sat-13h-lends"),
    ],
)
def test_calendar_no_lend(now: float, expected: str) -> None:
    hist = tuple(dataclasses.replace(s, t=s.t - NOW + now) for s in flat(2.0, reporting=10))
    p = plan(view(serving(10), 2.0, history=hist, now=now), with_policy(calendar=(BUSINESS,)))
    assert decision(p)[0] == expected


def test_calendar_reclaims_so_nodes_are_ready_when_the_window_opens() -> None:
    now = NOW + 6.9 * 3600  # 07:54 Berlin: the window opens within the reclaim horizon
    hist = tuple(dataclasses.replace(s, t=s.t - NOW + now) for s in flat(2.0, reporting=3))
    p = plan(view(serving(3) + lent(2), 2.0, history=hist, now=now), with_policy(calendar=(BUSINESS,)))
    assert [str(a.reason) for a in p.actions] == ["calendar", "calendar"]
    assert p.pools[0].detail == "calendar rule business-hours needs 5 nodes serving within 10 min, 3 serving"


# --------------------------------------------------------------------------- held nodes


def test_pinned_problem_transit_and_foreign_nodes_are_held() -> None:
    nodes = [
        node("gpu-node-00", pin=Pin.SERVING),
        node("gpu-node-01", problem="slurm: drained by admin (reason 'bad gpu')"),
        node("gpu-node-02", Phase.LENDING, NOW - 30),
        node("gpu-node-03", Phase.LENT, pin=Pin.SLURM),
        dataclasses.replace(node("gpu-node-04"), pool="other"),
    ] + serving(8, start=10)
    p = plan(view(nodes, 2.0), with_policy(max_lends_per_tick=10))
    assert p.hold_reasons == {
        "gpu-node-00": "pinned",
        "gpu-node-01": "problem",
        "gpu-node-02": "in_transit",
        "gpu-node-03": "pinned",
        "gpu-node-04": "unknown_pool",
    }
    assert p.held["gpu-node-01"] == "problem: slurm: drained by admin (reason 'bad gpu')"
    assert p.held["gpu-node-02"] == "in_transit: lending for 30 s"
    assert p.held["gpu-node-04"] == "unknown_pool: pool 'other' is not in the config"
    assert {a.node for a in p.actions}.isdisjoint(p.held)
    assert HoldReason.PINNED == "pinned"


def test_pinned_lent_node_is_never_reclaimed_even_on_a_spike() -> None:
    nodes = serving(1) + [node("gpu-node-50", Phase.LENT, pin=Pin.SLURM), node("gpu-node-51", Phase.LENT, problem="x")]
    p = plan(view(nodes, 5.0, history=flat(1.0, reporting=1)), CFG)
    assert kinds(p) == []
    assert decision(p)[0] == "no_candidates"
