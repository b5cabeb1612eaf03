"""plan() with the fast-grace tier (``slurm.fast_partition``): which tier a lend goes to, more
lending when more of the backlog is fast-tier (its shorter release time), fast-tier victims
first on a surprise and normal-tier victims for the normal horizon's shortfall, no reclaim
right after its own lend, and the simulated SLO bound with the tier on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bridge.config import Config
from bridge.model import ActionKind, ClusterView, LoadSignals, NodeState, Phase, Plan, Tier
from bridge.policy import plan
from bridge.simulate.baselines import make_controller
from bridge.cli.simulate import apply_overrides
from bridge.simulate.engine import Setup, simulate
from bridge.simulate.research import TIERED_MIX, JobMix
from bridge.simulate.workload import build_workload
from bridge.trace import load_trace
from tests.unit.test_policy import NOW, jobs_for, lent, node, serving, sig, view, with_policy

ROOT = Path(__file__).resolve().parents[2]


def tiered(cfg: Config, *, on: bool = True, grace_s: float = 1800.0) -> Config:
    """A long normal grace (30 min) makes the two tiers' horizons differ by far more than a
    tick, so the forecasts over them differ on a rising load."""
    return dataclasses.replace(
        cfg, slurm=dataclasses.replace(cfg.slurm, grace_s=grace_s, fast_partition="preempt-fast" if on else None)
    )


CFG = with_policy(max_lends_per_tick=20)


def rising(lo: float, hi: float, span_s: float = 7200.0, step_s: float = 30.0) -> tuple[LoadSignals, ...]:
    n = int(span_s // step_s)
    return tuple(sig(NOW - (n - i) * step_s, lo + (hi - lo) * i / n) for i in range(n))


def rising_view(pending_fast: int, pending: int = 10) -> ClusterView:
    v = view(serving(20), history=rising(2.0, 6.0), signals=sig(NOW, 6.0, 20))
    return dataclasses.replace(v, pending_fast_nodes=pending_fast, pending_research_nodes=pending)


def lends(p: Plan) -> tuple[int, int]:
    """(lends, of which to the fast tier)."""
    got = [a for a in p.actions if a.kind is ActionKind.LEND]
    return len(got), sum(a.tier is Tier.FAST for a in got)


def test_without_a_fast_partition_every_lend_is_normal_tier() -> None:
    p = plan(rising_view(10), tiered(CFG, on=False))
    assert lends(p)[0] > 0 and lends(p)[1] == 0


def test_tier_on_without_fast_backlog_lends_what_the_single_tier_plan_lends() -> None:
    off = plan(rising_view(0), tiered(CFG, on=False))
    on = plan(rising_view(0), tiered(CFG))
    assert [(a.kind, a.node, a.tier) for a in on.actions] == [(a.kind, a.node, a.tier) for a in off.actions]


def test_more_of_the_backlog_fast_tier_lends_more() -> None:
    """The fast tier's shorter release time lets its nodes be lent against the forecast over a
    shorter horizon; the fast share of the lends follows the backlog's."""
    single = lends(plan(rising_view(0), tiered(CFG, on=False)))[0]
    half = lends(plan(rising_view(5), tiered(CFG)))
    all_fast = lends(plan(rising_view(10), tiered(CFG)))
    assert single < half[0] <= all_fast[0]
    assert 0 < half[1] < half[0] and all_fast[1] == all_fast[0]


def test_a_tiered_lend_is_not_undone_on_the_next_tick() -> None:
    """After the plan's own lends (the nodes now lending, each in its tier), the next plan
    reclaims nothing: the lend and reclaim rules use the same horizons per tier."""
    cfg = tiered(CFG)
    v = rising_view(5)
    p = plan(v, cfg)
    moved = {a.node: a.tier for a in p.actions if a.kind is ActionKind.LEND}
    assert moved
    nodes = [
        dataclasses.replace(n, phase=Phase.LENDING, phase_since=NOW, serving_ready=False, serving_pods=0, tier=moved[n.name])
        if n.name in moved else n
        for n in v.nodes
    ]
    nxt = dataclasses.replace(v, nodes=tuple(nodes), now=NOW + 30)
    assert not [a for a in plan(nxt, cfg).actions if a.kind is ActionKind.RECLAIM]


def _mixed_lent() -> list[NodeState]:
    """Four lent nodes: two normal-tier (50, 51) and two fast-tier (52, 53), jobs all 2 h old."""
    out = lent(4)
    return [dataclasses.replace(n, tier=Tier.FAST if i >= 2 else Tier.NORMAL) for i, n in enumerate(out)]


def test_a_spike_takes_fast_tier_nodes_first() -> None:
    """5.2 replicas on 5 Ready needs 7 nodes: the 2 fast-tier nodes lent cover it within the
    fast horizon, so no normal-tier node is needed and the fast ones go, though the normal
    ones' jobs lose less work (the single-tier plan takes those)."""
    cfg = tiered(CFG, grace_s=120.0)
    nodes = serving(5) + _mixed_lent()
    jobs = jobs_for(nodes)
    for j in ("j50", "j51"):  # checkpointed a minute ago: the cheapest by lost work
        jobs[j] = dataclasses.replace(jobs[j], checkpoint_time=NOW - 60)
    v = view(nodes, 5.0, jobs=jobs, signals=sig(NOW, 5.2, 5))
    got = [a for a in plan(v, cfg).actions if a.kind is ActionKind.RECLAIM]
    assert all(a.urgent for a in got)
    assert sorted(a.node for a in got) == ["gpu-node-52", "gpu-node-53"]
    off = [a.node for a in plan(v, tiered(CFG, on=False, grace_s=120.0)).actions if a.kind is ActionKind.RECLAIM]
    assert sorted(off) == ["gpu-node-50", "gpu-node-51"]
    # a bigger spike: 8 nodes needed, one more than serving + the fast tier can give in time,
    # so one normal-tier node (the cheapest) and both fast ones
    v = view(nodes, 5.0, jobs=jobs, signals=sig(NOW, 5.5, 5))
    assert sorted(a.node for a in plan(v, cfg).actions) == ["gpu-node-50", "gpu-node-52", "gpu-node-53"]


def test_the_normal_horizons_shortfall_takes_normal_tier_nodes() -> None:
    """8 nodes needed, 5 serving, 1 fast-tier node lent: 2 nodes short even if the fast one came
    back, and only normal-tier nodes can fill that; the third may be the fast one."""
    cfg = tiered(CFG, grace_s=120.0)
    lent4 = [dataclasses.replace(n, tier=Tier.FAST if n.name == "gpu-node-53" else Tier.NORMAL) for n in lent(4)]
    nodes = serving(5) + lent4
    v = view(nodes, 6.0, history=tuple(sig(NOW - 30 * (240 - i), 6.0, 5) for i in range(240)), signals=sig(NOW, 6.0, 5))
    p = plan(v, cfg)
    got = [a.node for a in p.actions if a.kind is ActionKind.RECLAIM]
    off = [a.node for a in plan(v, tiered(CFG, on=False, grace_s=120.0)).actions if a.kind is ActionKind.RECLAIM]
    assert len(got) == len(off) >= 3
    normal = [n for n in got if n != "gpu-node-53"]
    assert len(normal) >= len(got) - 1 and "gpu-node-53" in got


def test_the_bound_holds_with_the_tier_on() -> None:
    """Two days of a dev trace, the job mix with both tiers: the tiered plan stays within the
    SLO bound (the oracle's violations + 0.1 % of the minutes) and lends to both tiers."""
    cfg = apply_overrides(tiered(with_policy(), grace_s=120.0), cold_start_s=300.0)
    w = build_workload(load_trace(ROOT / "bridge" / "data" / "traces" / "azure2024-code.csv"), peak_replicas=20.0, days=2, seed=1)
    s = Setup(cfg, w, 24, 4, seed=1, mix=JobMix(TIERED_MIX), cold_start_cv=0.25)
    b = simulate(s, make_controller("bridge", s))
    o = simulate(s, make_controller("oracle", s))
    assert b.metrics.slo_violation_minutes <= o.metrics.slo_violation_minutes + 0.001 * b.metrics.trace_minutes
    assert b.metrics.lent_gpu_hours > 0.5 * o.metrics.lent_gpu_hours


def test_bench_harvest_fast_tier_prints_off_and_on_per_trace() -> None:
    import subprocess
    import sys

    trace = ROOT / "bridge" / "data" / "traces" / "azure2024-code.csv"
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_harvest.py"), "--fast-tier", "--days", "1", "--trace", str(trace)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("azure2024-code ")]
    assert len(rows) == 1 and rows[0].split()[1] == "1"
    assert any(line.startswith("azure2024-code: tier on - off = ") for line in out.stdout.splitlines())
