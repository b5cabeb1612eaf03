"""Invariants of plan() over random views (hypothesis). ``views`` explores everything
(phases, pins, problems, broken signals); ``lendable_views`` is biased toward calm pools
so the lending invariants are exercised often (about half its examples lend).

- deterministic: the same view gives the same plan, whatever the order of nodes;
- lends only serving nodes and reclaims only lent ones, never a pinned, problem, in-transit
  or foreign node, each node at most once, never both directions in one pool;
- a lend never takes a pool below min_serving;
- never lends when the newest sample is missing, stale, NaN/negative, or partial;
- never reclaims more than the pool's decision needs, nor more than the per-tick budgets.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import Config, default_config
from bridge.model import ActionKind, Calibration, ClusterView, LoadSignals, NodeState, Phase, Pin, PoolState, SlurmJob
from bridge.policy import plan
from bridge.policy.demand import valid

NOW = 1_767_225_600.0
POOLS = ("a", "b")

value = st.one_of(
    st.none(),
    st.just(math.nan),
    st.just(-1.0),
    st.floats(min_value=0.0, max_value=500.0, allow_nan=False),
    st.floats(min_value=0.0, max_value=500.0, allow_nan=False),
    st.floats(min_value=0.0, max_value=500.0, allow_nan=False),
)


@st.composite
def samples(draw: st.DrawFn, t: float) -> LoadSignals:
    return LoadSignals(
        t=t,
        running=draw(value),
        waiting=draw(st.one_of(st.just(0.0), value)),
        kv_cache_usage_sum=draw(value),
        tokens_per_s=draw(st.one_of(st.none(), value)),
        replicas_reporting=draw(st.integers(0, 12)),
    )


@st.composite
def pool_states(draw: st.DrawFn, name: str) -> PoolState:
    level = draw(st.one_of(st.floats(min_value=0.0, max_value=3.0), st.floats(min_value=0.0, max_value=15.0)))
    span = draw(st.sampled_from([0.0, 120.0, 1800.0, 7200.0, 7200.0, 7200.0]))
    step = 30.0
    n = int(span // step)
    noisy = draw(st.sampled_from([False, False, True]))
    hist = tuple(
        (draw(samples(NOW - (n - i) * step)) if noisy and i % 7 == 0 else LoadSignals(NOW - (n - i) * step, level * 24, 0.0, level * 0.5, None, 12))
        for i in range(n)
    )
    kind = draw(st.sampled_from(["fresh", "fresh", "random", "stale", "none"]))
    if kind == "none":
        newest = None
    elif kind == "stale":
        newest = LoadSignals(NOW - draw(st.floats(min_value=91, max_value=5000)), level * 24, 0.0, level * 0.5, None, 12)
    elif kind == "random":
        newest = draw(samples(NOW))
    else:
        newest = LoadSignals(NOW, level * 24, 0.0, level * 0.5, None, draw(st.sampled_from([0, 3, 12, 12, 12])))
    return PoolState(name, newest, hist, calibration=draw(calibrations()), horizon_s=draw(st.sampled_from([None, None, 900.0])))


@st.composite
def calibrations(draw: st.DrawFn) -> Calibration | None:
    """None (the headroom path), not enough history yet, or a calibrated margin."""
    kind = draw(st.sampled_from(["none", "calibrating", "margin", "margin"]))
    if kind == "none":
        return None
    margin = None if kind == "calibrating" else draw(st.floats(min_value=1.0, max_value=4.0))
    return Calibration(margin, 0.999, 5000 if margin else 10, 180, draw(st.integers(0, 30)), 10.0, 0.001, 600.0, 1.0, NOW)


@st.composite
def nodes(draw: st.DrawFn) -> tuple[tuple[NodeState, ...], dict[str, SlurmJob]]:
    count = draw(st.integers(1, 12))
    out = []
    jobs: dict[str, SlurmJob] = {}
    for i in range(count):
        phase = draw(st.sampled_from(list(Phase) + [Phase.SERVING] * 12 + [Phase.LENT] * 4))
        pin = draw(st.sampled_from([None, None, None, None, Pin.SERVING, Pin.SLURM]))
        problem = draw(st.sampled_from([None, None, None, None, "bad label"]))
        pool = draw(st.sampled_from(POOLS + ("zzz",) if i % 5 == 4 else POOLS))
        ready = phase in (Phase.SERVING, Phase.RETURNING) and draw(st.booleans())
        node_jobs: tuple[str, ...] = ()
        if phase is Phase.LENT and draw(st.booleans()):
            jid = f"j{i}"
            node_jobs = (jid,)
            start = NOW - draw(st.floats(min_value=0, max_value=86400))
            ck = draw(st.one_of(st.none(), st.floats(min_value=start, max_value=NOW)))
            jobs[jid] = SlurmJob(jid, "x", "u", "preempt", "running", (f"n{i:02d}",), start, ck)
        out.append(
            NodeState(
                name=f"n{i:02d}",
                pool=pool,
                phase=phase,
                phase_since=NOW - draw(st.floats(min_value=0, max_value=20000)),
                pin=pin,
                serving_pods=1 if ready else 0,
                serving_ready=ready,
                jobs=node_jobs,
                problem=problem,
                inflight=draw(st.one_of(st.none(), st.floats(min_value=0, max_value=50))),
            )
        )
    return tuple(out), jobs


@st.composite
def configs(draw: st.DrawFn) -> Config:
    cfg = default_config(*POOLS)
    pools = tuple(
        dataclasses.replace(
            p,
            min_serving=draw(st.integers(0, 4)),
            blind_serving=draw(st.one_of(st.none(), st.integers(0, 6))),
            max_lent=draw(st.one_of(st.none(), st.integers(0, 5))),
        )
        for p in cfg.pools
    )
    pol = dataclasses.replace(
        cfg.policy,
        max_lends_per_tick=draw(st.integers(0, 3)),
        max_reclaims_per_tick=draw(st.integers(1, 5)),
        min_lend_s=draw(st.sampled_from([0.0, 600.0])),
    )
    return dataclasses.replace(cfg, pools=pools, policy=pol)


@st.composite
def views(draw: st.DrawFn) -> ClusterView:
    ns, jobs = draw(nodes())
    pools = {name: draw(pool_states(name)) for name in POOLS}
    return ClusterView(now=NOW, nodes=ns, pools=pools, jobs=jobs, pending_research_nodes=draw(st.integers(0, 3)))


def fresh_and_complete(ps: PoolState, cfg: Config, ready: int) -> bool:
    s = ps.signals
    if s is None or NOW - s.t > cfg.policy.signal_max_age_s:
        return False
    if not (valid(s.running) and valid(s.waiting) and valid(s.kv_cache_usage_sum)):
        return False
    return s.replicas_reporting >= ready


COMMITTED = (Phase.SERVING, Phase.RECLAIMING, Phase.RETURNING)


@settings(max_examples=300, deadline=None)
@given(view=views(), cfg=configs())
def test_invariants(view: ClusterView, cfg: Config) -> None:
    p = plan(view, cfg)
    by_name = {n.name: n for n in view.nodes}

    # deterministic, whatever the order of the nodes
    assert plan(view, cfg) == p
    assert plan(dataclasses.replace(view, nodes=view.nodes[::-1]), cfg) == p

    moved = [a.node for a in p.actions]
    assert len(moved) == len(set(moved))
    assert set(moved).isdisjoint(p.held)
    assert sum(a.kind is ActionKind.LEND for a in p.actions) <= cfg.policy.max_lends_per_tick
    assert sum(a.kind is ActionKind.RECLAIM for a in p.actions) <= cfg.policy.max_reclaims_per_tick
    for a in p.actions:
        n = by_name[a.node]
        assert n.pin is None and n.problem is None and n.pool == a.pool
        assert n.phase is (Phase.SERVING if a.kind is ActionKind.LEND else Phase.LENT)
        assert a.reason and a.detail.startswith(f"{a.kind.value} {a.node}: ")

    for d in p.pools:
        pc = cfg.pool(d.pool)
        acts = [a for a in p.actions if a.pool == d.pool]
        lends = sum(a.kind is ActionKind.LEND for a in acts)
        reclaims = sum(a.kind is ActionKind.RECLAIM for a in acts)
        assert not (lends and reclaims)
        assert d.reason and d.detail
        if lends:
            assert d.serving_now - lends >= pc.min_serving
            ready = sum(1 for n in view.nodes if n.pool == d.pool and n.phase in (Phase.SERVING, Phase.RETURNING) and n.serving_ready)
            assert fresh_and_complete(view.pools[d.pool], cfg, ready)
            assert d.reason == "low_forecast"
        assert reclaims <= max(0, d.desired_serving - d.serving_now)


@settings(max_examples=100, deadline=None)
@given(view=views(), cfg=configs())
def test_never_lends_without_a_fresh_sample(view: ClusterView, cfg: Config) -> None:
    pools = {k: dataclasses.replace(v, signals=None) for k, v in view.pools.items()}
    p = plan(dataclasses.replace(view, pools=pools), cfg)
    assert not [a for a in p.actions if a.kind is ActionKind.LEND]
    stale = {
        k: dataclasses.replace(v, signals=LoadSignals(NOW - 91, 0.0, 0.0, 0.0, 0.0, 12)) for k, v in view.pools.items()
    }
    p = plan(dataclasses.replace(view, pools=stale), cfg)
    assert not [a for a in p.actions if a.kind is ActionKind.LEND]


@st.composite
def lendable_views(draw: st.DrawFn) -> ClusterView:
    """Views in which lending is plausible: one pool, calm flat history, fresh signals."""
    n_serving = draw(st.integers(1, 12))
    n_lent = draw(st.integers(0, 4))
    ns = []
    for i in range(n_serving + n_lent):
        is_serving = i < n_serving
        ns.append(
            NodeState(
                name=f"n{i:02d}",
                pool="a",
                phase=Phase.SERVING if is_serving else Phase.LENT,
                phase_since=NOW - draw(st.sampled_from([60.0, 7200.0])),
                pin=draw(st.sampled_from([None] * 8 + [Pin.SERVING, Pin.SLURM])),
                problem=draw(st.sampled_from([None] * 8 + ["bad"])),
                serving_pods=1 if is_serving else 0,
                serving_ready=is_serving,
                inflight=draw(st.one_of(st.none(), st.floats(min_value=0, max_value=50))),
            )
        )
    level = draw(st.floats(min_value=0.0, max_value=6.0))
    hist = tuple(LoadSignals(NOW - (240 - i) * 30.0, level * 24, 0.0, level * 0.5, None, 12) for i in range(240))
    cal = draw(calibrations())
    ps = PoolState("a", LoadSignals(NOW, level * 24, 0.0, level * 0.5, None, 12), hist, calibration=cal)
    return ClusterView(now=NOW, nodes=tuple(ns), pools={"a": ps})


BAD_NEWEST = st.sampled_from(
    [
        None,
        LoadSignals(NOW - 120, 0.0, 0.0, 0.0, None, 12),  # stale
        LoadSignals(NOW, math.nan, 0.0, 0.0, None, 12),
        LoadSignals(NOW, 1.0, -1.0, 0.0, None, 12),
        LoadSignals(NOW, 1.0, 0.0, None, None, 12),
        LoadSignals(NOW, 1.0, 0.0, math.inf, None, 12),
        LoadSignals(NOW, 1.0, 0.0, 0.1, None, 0),  # nobody reporting
    ]
)


@settings(max_examples=300, deadline=None)
@given(view=lendable_views(), cfg=configs(), bad=BAD_NEWEST)
def test_lending_invariants(view: ClusterView, cfg: Config, bad: LoadSignals | None) -> None:
    p = plan(view, cfg)
    d = p.pools[0]
    lends = [a for a in p.actions if a.kind is ActionKind.LEND]
    reclaims = [a for a in p.actions if a.kind is ActionKind.RECLAIM]
    pc = cfg.pool("a")
    assert d.serving_now - len(lends) >= min(pc.min_serving, d.serving_now)
    assert len(reclaims) <= max(0, d.desired_serving - d.serving_now)
    if lends:
        assert d.serving_now - len(lends) >= d.desired_serving
        assert all(" serving - " in a.detail for a in lends)
        cal = view.pools["a"].calibration
        assert cal is None or cal.margin is not None  # never lends before it is calibrated
        if cal is not None:  # the reason names the margin and the budget spent so far
            assert all(f"calibrated margin x{cal.margin:.2f}" in a.detail and f"budget spent {cal.spent} of" in a.detail for a in lends)
    # the same view with a bad newest sample never lends
    broken = dataclasses.replace(view, pools={"a": dataclasses.replace(view.pools["a"], signals=bad)})
    assert not [a for a in plan(broken, cfg).actions if a.kind is ActionKind.LEND]
    # ... nor does one whose pool is missing from the view altogether
    assert not [a for a in plan(dataclasses.replace(view, pools={}), cfg).actions if a.kind is ActionKind.LEND]
