"""The simulator's engine: delays, research accounting, baselines (short synthetic loads)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from bridge.config import default_config
from bridge.model import Action, ActionKind, ClusterView, Phase
from bridge.simulate.baselines import FixedWindowController, OracleController, ReactiveController, make_controller
from bridge.simulate.engine import Setup, simulate
from bridge.simulate.research import JobClass, JobMix
from bridge.simulate.workload import MINUTE_S, Workload, build_workload
from bridge.trace import Trace

GRACE, COLD, DRAIN, TICK = 120.0, 300.0, 60.0, 30.0


def flat_workload(replicas: float, minutes: int) -> Workload:
    load = np.full(minutes, float(replicas))
    return Workload(load, load[::10].copy(), MINUTE_S, 600.0, 1.0, 4.0, replicas * 4.0, replicas, "synthetic")


def cfg(**pool: float):
    c = default_config(cold_start_s=COLD, drain_s=DRAIN, **pool)
    import dataclasses

    return dataclasses.replace(c, slurm=dataclasses.replace(c.slurm, grace_s=GRACE))


class Scripted:
    """Takes the given actions at the given simulation times; records every view."""

    name = "scripted"

    def __init__(self, script: dict[float, list[tuple[ActionKind, str]]], start: float) -> None:
        self.script = script
        self.start = start
        self.views: list[ClusterView] = []

    def decide(self, view: ClusterView) -> Sequence[Action]:
        self.views.append(view)
        t = view.now - self.start
        return [Action(k, n, "default", "test", "scripted") for k, n in self.script.get(t, [])]

    def node_at(self, t: float, name: str):
        v = next(v for v in self.views if math.isclose(v.now - self.start, t))
        return next(n for n in v.nodes if n.name == name), v


def one_class(**kw: object) -> JobMix:
    base = dict(name="job", weight=1.0, nodes=1, min_hours=10.0, max_hours=10.0, checkpoint_s=1800.0)
    base.update(kw)
    return JobMix((JobClass(**base),), queue_depth=4)  # type: ignore[arg-type]


def test_reclaimed_node_with_a_job_is_not_ready_before_grace_plus_cold_start() -> None:
    setup = Setup(cfg(), flat_workload(1.0, 120), nodes=3, mix=one_class())
    n = setup.node_names()[0]
    t_reclaim = 1200.0
    ctl = Scripted({0.0: [(ActionKind.LEND, n)], t_reclaim: [(ActionKind.RECLAIM, n)]}, setup.start_unix)
    r = simulate(setup, ctl)
    lent, view = ctl.node_at(t_reclaim - TICK, n)
    assert lent.phase is Phase.LENT and lent.jobs, "a job runs on the lent node"
    ready_t = t_reclaim + GRACE + COLD
    t = t_reclaim
    while t < ready_t:
        st, _ = ctl.node_at(t, n)
        assert not st.serving_ready, f"Ready at {t} s, before grace + cold start"
        t += TICK
    st, _ = ctl.node_at(ready_t, n)
    assert st.phase is Phase.SERVING and st.serving_ready
    mid, _ = ctl.node_at(t_reclaim + GRACE + TICK, n)
    assert mid.phase is Phase.RETURNING
    assert r.metrics.reclaims == 1 and r.metrics.lends == 1 and r.metrics.preemptions == 1


def test_idle_node_skips_the_grace_but_not_the_cold_start() -> None:
    # a 2-node-only mix cannot start on one lent node, so the node stays idle in Slurm
    setup = Setup(cfg(), flat_workload(1.0, 60), nodes=3, mix=one_class(nodes=2))
    n = setup.node_names()[0]
    ctl = Scripted({0.0: [(ActionKind.LEND, n)], 600.0: [(ActionKind.RECLAIM, n)]}, setup.start_unix)
    r = simulate(setup, ctl)
    assert not ctl.node_at(570.0, n)[0].jobs
    assert not ctl.node_at(600.0 + COLD - TICK, n)[0].serving_ready
    assert ctl.node_at(600.0 + COLD, n)[0].serving_ready
    assert r.metrics.preemptions == 0 and r.metrics.lost_gpu_hours == 0


def test_lending_removes_capacity_at_once_and_lends_after_the_drain() -> None:
    setup = Setup(cfg(), flat_workload(1.0, 30), nodes=2, mix=one_class())
    n = setup.node_names()[0]
    ctl = Scripted({0.0: [(ActionKind.LEND, n)]}, setup.start_unix)
    r = simulate(setup, ctl)
    assert r.tick_ready[0] == 1
    assert ctl.node_at(DRAIN - TICK, n)[0].phase is Phase.LENDING
    assert ctl.node_at(DRAIN, n)[0].phase is Phase.LENT
    # lent from the end of the drain to the end of the run
    assert r.metrics.lent_gpu_hours == pytest.approx((30 * 60 - DRAIN) * 4 / 3600)


def test_lost_work_counts_only_since_the_last_checkpoint() -> None:
    setup = Setup(cfg(), flat_workload(1.0, 120), nodes=2, mix=one_class(checkpoint_s=1800.0))
    n = setup.node_names()[0]
    # job starts at DRAIN; checkpoints at DRAIN + 1800, + 3600; reclaim at DRAIN + 4000 (rounded to a tick)
    t_r = 4080.0  # job ran 4020 s, last checkpoint at 3600 s of run
    ctl = Scripted({0.0: [(ActionKind.LEND, n)], t_r: [(ActionKind.RECLAIM, n)]}, setup.start_unix)
    r = simulate(setup, ctl)
    run = t_r - DRAIN
    assert r.metrics.lost_gpu_hours == pytest.approx((run - 3600.0) * 4 / 3600)
    assert r.metrics.useful_gpu_hours == pytest.approx(3600.0 * 4 / 3600)
    # the policy saw the checkpoint: published as unix time
    _, v = ctl.node_at(t_r - TICK, n)
    (job,) = v.jobs.values()
    assert job.checkpoint_time == pytest.approx(setup.start_unix + DRAIN + 3600.0)
    assert job.start_time == pytest.approx(setup.start_unix + DRAIN)


def test_a_job_that_checkpoints_on_the_signal_loses_nothing_if_the_grace_suffices() -> None:
    for save_s, lost in ((60.0, 0.0), (600.0, (4080.0 - DRAIN - 3600.0) * 4 / 3600)):
        setup = Setup(cfg(), flat_workload(1.0, 120), nodes=2, mix=one_class(signal_save_s=save_s))
        n = setup.node_names()[0]
        r = simulate(setup, Scripted({0.0: [(ActionKind.LEND, n)], 4080.0: [(ActionKind.RECLAIM, n)]}, setup.start_unix))
        assert r.metrics.lost_gpu_hours == pytest.approx(lost)
        assert r.metrics.preemptions == 1


def test_a_job_without_checkpoints_loses_its_whole_run_and_restarts_after_requeue() -> None:
    setup = Setup(cfg(), flat_workload(1.0, 240), nodes=3, mix=one_class(checkpoint_s=None, min_hours=1.0, max_hours=1.0))
    a, b = setup.node_names()[:2]
    ctl = Scripted(
        {0.0: [(ActionKind.LEND, a)], 1860.0: [(ActionKind.RECLAIM, a)], 1980.0: [(ActionKind.LEND, b)]},
        setup.start_unix,
    )
    r = simulate(setup, ctl)
    assert r.metrics.lost_gpu_hours == pytest.approx((1860.0 - DRAIN) * 4 / 3600)
    # requeued after the grace (1980 s); restarts (from scratch) on b, ahead of newer jobs
    _, v = ctl.node_at(1980.0 + DRAIN + TICK, b)
    (job,) = v.jobs.values()
    assert job.job_id == "r1" and job.restart_count == 1 and job.nodes == (b,)
    assert r.completed_jobs >= 1


def test_a_multi_node_job_is_preempted_whole_and_frees_its_other_node_after_the_grace() -> None:
    setup = Setup(cfg(), flat_workload(1.0, 120), nodes=4, mix=one_class(nodes=2, checkpoint_s=None))
    a, b = setup.node_names()[:2]
    t_r = 1800.0
    ctl = Scripted({0.0: [(ActionKind.LEND, a), (ActionKind.LEND, b)], t_r: [(ActionKind.RECLAIM, a)]}, setup.start_unix)
    r = simulate(setup, ctl)
    _, v = ctl.node_at(t_r - TICK, a)
    (job,) = v.jobs.values()
    assert set(job.nodes) == {a, b}
    assert r.metrics.preemptions == 1
    # both nodes' GPUs lost the run
    assert r.metrics.lost_gpu_hours == pytest.approx((t_r - DRAIN) * 8 / 3600)
    during, v2 = ctl.node_at(t_r + TICK, b)
    assert during.phase is Phase.LENT and during.jobs == (job.job_id,) and v2.jobs[job.job_id].state == "completing"
    after, _ = ctl.node_at(t_r + GRACE + TICK, b)
    assert after.jobs == ()  # freed; a lone node cannot run a 2-node job
    assert r.metrics.useful_gpu_hours + r.metrics.lost_gpu_hours <= r.metrics.lent_gpu_hours + 1e-9


def test_oracle_never_violates_and_lends() -> None:
    starts = tuple(float(i * 600) for i in range(144))
    rates = tuple(100.0 + 80.0 * math.sin(i / 144 * 2 * math.pi) + (120.0 if i % 37 == 0 else 0.0) for i in range(144))
    trace = Trace(starts, rates, tuple(3.0 for _ in starts), 600.0, "synthetic")
    for seed in (1, 2, 3):
        w = build_workload(trace, peak_replicas=10, seed=seed)
        assert w.load.max() < 16
        setup = Setup(cfg(), w, nodes=16, seed=seed)
        r = simulate(setup, OracleController(setup))
        assert r.metrics.slo_violation_minutes == 0
        assert r.metrics.lent_gpu_hours > 0
        react = simulate(setup, ReactiveController(setup))
        assert react.metrics.slo_violation_minutes > 0  # no cold-start awareness


def test_fixed_window_lends_only_between_20_and_08() -> None:
    setup = Setup(cfg(), flat_workload(3.0, 2 * 1440), nodes=8, mix=one_class())
    ctl = FixedWindowController(setup)
    r = simulate(setup, ctl)
    tod = r.tick_t % 86400
    inside = (tod >= 20 * 3600) | (tod < 8 * 3600)
    assert r.tick_lent[~inside].max() == 0
    assert r.tick_lent[inside].max() > 0
    assert r.metrics.slo_violation_minutes == 0  # flat load above nothing


def test_bridge_runs_the_real_policy_and_is_deterministic() -> None:
    starts = tuple(float(i * 600) for i in range(72))
    rates = tuple(100.0 + 50.0 * math.sin(i / 30) for i in range(72))
    trace = Trace(starts, rates, tuple(2.0 for _ in starts), 600.0, "synthetic")
    runs = []
    for seed in (5, 5, 6):
        w = build_workload(trace, peak_replicas=8, seed=seed)
        setup = Setup(cfg(), w, nodes=12, seed=seed)
        runs.append(simulate(setup, make_controller("bridge", setup)).metrics.as_dict())
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert runs[0]["lends"] > 0 and runs[0]["lent_gpu_hours"] > 0


# --- properties ---------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=12, deadline=None)
@given(
    rates=st.lists(st.floats(1.0, 100.0), min_size=12, max_size=12),
    cv=st.floats(0.5, 6.0),
    cold=st.sampled_from([60.0, 300.0, 420.0]),
    grace=st.sampled_from([0.0, 120.0]),
    seed=st.integers(0, 1000),
)
def test_oracle_never_violates_within_the_pool(rates: list[float], cv: float, cold: float, grace: float, seed: int) -> None:
    import dataclasses

    trace = Trace(tuple(i * 600.0 for i in range(12)), tuple(rates), tuple(cv for _ in rates), 600.0, "hyp")
    w = build_workload(trace, peak_replicas=6, seed=seed)
    c = default_config(cold_start_s=cold, drain_s=DRAIN)
    c = dataclasses.replace(c, slurm=dataclasses.replace(c.slurm, grace_s=grace))
    nodes = int(math.ceil(w.load.max())) + 1
    setup = Setup(c, w, nodes=nodes, seed=seed)
    r = simulate(setup, OracleController(setup))
    assert r.metrics.slo_violation_minutes == 0


@settings(max_examples=15, deadline=None)
@given(
    script=st.lists(
        st.tuples(st.integers(0, 119), st.sampled_from([ActionKind.LEND, ActionKind.RECLAIM]), st.integers(0, 5)),
        max_size=40,
    ),
    seed=st.integers(0, 50),
)
def test_research_accounting_never_exceeds_the_lent_time(script: list[tuple[int, ActionKind, int]], seed: int) -> None:
    mix = JobMix(
        (
            JobClass("a", 1.0, 1, 0.2, 1.0, 600.0),
            JobClass("b", 1.0, 2, 0.2, 2.0, None),
            JobClass("c", 1.0, 3, 0.5, 1.0, 900.0, publishes=False),
        ),
        queue_depth=6,
    )
    setup = Setup(cfg(), flat_workload(1.0, 60), nodes=6, mix=mix, seed=seed)
    names = setup.node_names()
    plan: dict[float, list[tuple[ActionKind, str]]] = {}
    for k, kind, i in script:
        plan.setdefault(k * TICK, []).append((kind, names[i]))
    r = simulate(setup, Scripted(plan, setup.start_unix))
    m = r.metrics
    assert m.useful_gpu_hours >= 0 and m.lost_gpu_hours >= 0
    assert m.useful_gpu_hours + m.lost_gpu_hours <= m.lent_gpu_hours + 1e-6
    assert m.lends - m.reclaims == int(r.tick_lent[-1]) + int(setup.nodes - r.tick_committed[-1] - r.tick_lent[-1])
