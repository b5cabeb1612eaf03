"""The fast-grace tier outside the plan: the simulator (a node lent to one tier runs only
that tier's jobs and releases after its partition's grace; reclaim delays measured per
tier; each tier keeps its own backlog) and the victim order (fast-tier nodes first on a
surprise, idle nodes still before either)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from bridge.config import default_config
from bridge.model import Action, ActionKind, ClusterView, NodeState, Phase, SlurmJob, Tier
from bridge.policy.victims import choose_victims
from bridge.simulate.engine import Engine, Setup, simulate
from bridge.simulate.research import TIERED_MIX, JobClass, JobMix, Research
from bridge.simulate.workload import MINUTE_S, Workload

GRACE, FAST_GRACE, COLD, DRAIN, TICK = 120.0, 15.0, 300.0, 60.0, 30.0


def flat_workload(replicas: float, minutes: int) -> Workload:
    load = np.full(minutes, float(replicas))
    return Workload(load, load[::10].copy(), MINUTE_S, 600.0, 1.0, 4.0, replicas * 4.0, replicas, "synthetic")


def cfg(*, tiered: bool = True):
    c = default_config(cold_start_s=COLD, drain_s=DRAIN)
    slurm = dataclasses.replace(c.slurm, grace_s=GRACE, fast_grace_s=FAST_GRACE,
                                fast_partition="preempt-fast" if tiered else None)
    return dataclasses.replace(c, slurm=slurm)


MIX = JobMix((
    JobClass("slow", 1.0, 1, 10.0, 10.0, 1800.0),
    JobClass("quick", 1.0, 1, 10.0, 10.0, 600.0, signal_save_s=10.0, fast=True),
), queue_depth=4)


class Scripted:
    """Takes (kind, node, tier) actions at given simulation times; records every view."""

    name = "scripted"

    def __init__(self, script: dict[float, list[tuple[ActionKind, str, Tier]]], start: float) -> None:
        self.script = script
        self.start = start
        self.views: list[ClusterView] = []

    def decide(self, view: ClusterView) -> Sequence[Action]:
        self.views.append(view)
        t = view.now - self.start
        return [Action(k, n, "default", "test", "scripted", tier=tier) for k, n, tier in self.script.get(t, [])]

    def at(self, t: float) -> ClusterView:
        return next(v for v in self.views if math.isclose(v.now - self.start, t))


def _node(v: ClusterView, name: str) -> NodeState:
    return next(n for n in v.nodes if n.name == name)


def test_a_node_lent_to_the_fast_tier_runs_fast_jobs_and_comes_back_after_the_fast_grace() -> None:
    setup = Setup(cfg(), flat_workload(1.0, 60), nodes=3, mix=MIX)
    fast, slow = setup.node_names()[:2]
    t_re = 1200.0
    ctl = Scripted({0.0: [(ActionKind.LEND, fast, Tier.FAST), (ActionKind.LEND, slow, Tier.NORMAL)],
                    t_re: [(ActionKind.RECLAIM, fast, Tier.NORMAL), (ActionKind.RECLAIM, slow, Tier.NORMAL)]},
                    setup.start_unix)
    eng = Engine(setup, ctl)
    eng.run()
    v = ctl.at(t_re - TICK)
    nf, ns = _node(v, fast), _node(v, slow)
    assert nf.tier is Tier.FAST and ns.tier is Tier.NORMAL
    assert nf.jobs and ns.jobs
    assert v.jobs[nf.jobs[0]].name == "quick" and v.jobs[nf.jobs[0]].partition == "preempt-fast"
    assert v.jobs[ns.jobs[0]].name == "slow" and v.jobs[ns.jobs[0]].partition == "preempt"
    # the fast node is released after its 15 s grace, the normal one after 120 s
    ready_fast = ready_slow = None
    for v in ctl.views:
        t = v.now - setup.start_unix
        if ready_fast is None and _node(v, fast).serving_ready and t > t_re:
            ready_fast = t
        if ready_slow is None and _node(v, slow).serving_ready and t > t_re:
            ready_slow = t
    assert ready_fast is not None and ready_slow is not None
    assert t_re + FAST_GRACE + COLD <= ready_fast < t_re + GRACE + COLD <= ready_slow
    assert len(eng.fast_reclaim_delays) == 1 and FAST_GRACE + COLD <= eng.fast_reclaim_delays[0] <= ready_fast - t_re
    assert len(eng.reclaim_delays) == 1 and GRACE + COLD <= eng.reclaim_delays[0] <= ready_slow - t_re
    assert _node(ctl.at(ready_fast), fast).tier is Tier.NORMAL  # serving again: no tier


def test_without_a_fast_partition_the_tier_of_a_lend_is_ignored() -> None:
    setup = Setup(cfg(tiered=False), flat_workload(1.0, 40), nodes=2, mix=MIX)
    n = setup.node_names()[0]
    ctl = Scripted({0.0: [(ActionKind.LEND, n, Tier.FAST)]}, setup.start_unix)
    simulate(setup, ctl)
    v = ctl.at(1200.0)
    assert _node(v, n).tier is Tier.NORMAL and _node(v, n).jobs
    assert v.pending_fast_nodes == 0 and v.pending_research_nodes > 0


def test_each_tier_keeps_its_share_of_the_backlog() -> None:
    r = Research.create(JobMix(TIERED_MIX, queue_depth=20), 4, seed=3, tiered=True)
    fast_share = sum(c.weight for c in TIERED_MIX if c.fast) / sum(c.weight for c in TIERED_MIX)
    assert sum(1 for j in r.pending if j.cls.fast) == round(20 * fast_share)
    # normal nodes only: normal jobs start, the fast backlog stays whole
    before = r.pending_nodes(fast=True)
    started = r.schedule(0.0, [f"n{i}" for i in range(30)], fast=False)
    assert started and not any(j.cls.fast for j in started)
    assert r.pending_nodes(fast=True) == before
    assert [j.seq for j in r.pending] == sorted(j.seq for j in r.pending)


def _lent(name: str, tier: Tier, jobs: tuple[str, ...] = ()) -> NodeState:
    return NodeState(name, "default", Phase.LENT, 0.0, slurm_state="allocated" if jobs else "idle", jobs=jobs, tier=tier)


def test_victims_take_fast_tier_nodes_first_on_a_surprise() -> None:
    now = 100_000.0
    jobs = {
        # the normal node's job checkpointed a minute ago (cheap), the fast one's an hour ago
        "a": SlurmJob("a", "x", "u", "preempt", "running", ("n-a",), now - 7200, checkpoint_time=now - 60),
        "b": SlurmJob("b", "x", "u", "preempt-fast", "running", ("n-b",), now - 7200, checkpoint_time=now - 3600),
    }
    cands = [_lent("n-a", Tier.NORMAL, ("a",)), _lent("n-b", Tier.FAST, ("b",)), _lent("n-c", Tier.NORMAL)]
    plain = choose_victims(cands, 2, jobs, now, allow_young=True)
    assert plain.nodes == ("n-c", "n-a")  # idle first, then the least lost work
    fast = choose_victims(cands, 2, jobs, now, allow_young=True, fast_first=True)
    assert fast.nodes == ("n-c", "n-b")  # idle first, then the fast tier despite its loss
    assert choose_victims(cands, 3, jobs, now, allow_young=True, fast_first=True).nodes == ("n-c", "n-b", "n-a")
