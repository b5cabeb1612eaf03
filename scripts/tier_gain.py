"""What the fast-grace tier is worth: bridge with the tier off and on, on the same traces, the
same job mix with both tiers (``TIERED_MIX``) and the same oracle (normal delays).

With the tier off every job runs in the normal partition (grace ``slurm.grace_s``); with it
on, fast-tier jobs run on nodes lent to ``preempt-fast`` (grace ``slurm.fast_grace_s``), which
the policy plans with their shorter release time. Reported per trace and seed: lent GPU-hours
and % of the oracle, violations against the bound (the oracle's + 0.1 % of minutes), useful and
lost research GPU-hours, the share of lent node-time on the fast tier. Used by
``scripts/bench_harvest.py --fast-tier``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bridge.config import Config
from bridge.model import Action, ClusterView, Phase, Tier
from bridge.simulate.baselines import make_controller
from bridge.simulate.engine import DEFAULT_START_UNIX, Controller, Engine, Setup, simulate
from bridge.simulate.research import TIERED_MIX, JobMix
from bridge.simulate.workload import build_workload, split_history
from bridge.trace import load_trace

FAST_PARTITION = "preempt-fast"
BOUND_SHARE = 0.001


@dataclass(frozen=True, slots=True)
class TierRun:
    trace: str
    seed: int
    days: float
    oracle_gpu_h: float
    oracle_viol: int
    allowed: float
    off_gpu_h: float
    off_viol: int
    off_useful: float
    off_lost: float
    on_gpu_h: float
    on_viol: int
    on_useful: float
    on_lost: float
    on_fast_share: float  # of the lent node-ticks, on the fast tier

    @property
    def bound(self) -> float:
        return self.oracle_viol + self.allowed


def with_fast_tier(cfg: Config, fast_grace_s: float | None = None) -> Config:
    """The config with the fast partition named (and its grace, if given)."""
    slurm = dataclasses.replace(cfg.slurm, fast_partition=FAST_PARTITION,
                                fast_grace_s=cfg.slurm.fast_grace_s if fast_grace_s is None else fast_grace_s)
    return dataclasses.replace(cfg, slurm=slurm)


class _Counting:
    """Wraps a controller; counts the lent nodes of each tier on every tick."""

    def __init__(self, inner: Controller) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "bridge")
        self.fast = 0
        self.lent = 0

    def decide(self, view: ClusterView) -> Sequence[Action]:
        for n in view.nodes:
            if n.phase is Phase.LENT:
                self.lent += 1
                self.fast += n.tier is Tier.FAST
        return self.inner.decide(view)


def run_one(cfg: Config, path: str, seed: int, *, nodes: int = 24, peak_replicas: float = 20.0, days: float | None = None,
            history_days: float = 0.0, cold_start_cv: float = 0.25, mix: JobMix | None = None) -> TierRun:
    """Oracle, bridge tier off, bridge tier on: one trace, one seed."""
    mix = mix or JobMix(TIERED_MIX)
    w = build_workload(load_trace(path), peak_replicas=peak_replicas, days=days, seed=seed)
    hist, rest = split_history(w, history_days)

    def setup(c: Config) -> Setup:
        return Setup(c, rest, nodes, 4, seed=seed, history=hist, mix=mix, cold_start_cv=cold_start_cv,
                     start_unix=DEFAULT_START_UNIX + (hist.duration_s if hist is not None else 0.0))

    s_off, s_on = setup(cfg), setup(with_fast_tier(cfg))
    o = simulate(s_off, make_controller("oracle", s_off)).metrics
    off = simulate(s_off, make_controller("bridge", s_off)).metrics
    ctl = _Counting(make_controller("bridge", s_on))
    on = Engine(s_on, ctl).run().metrics
    return TierRun(
        trace=Path(path).name.removesuffix(".csv"), seed=seed, days=off.trace_minutes / 1440.0,
        oracle_gpu_h=o.lent_gpu_hours, oracle_viol=o.slo_violation_minutes, allowed=BOUND_SHARE * off.trace_minutes,
        off_gpu_h=off.lent_gpu_hours, off_viol=off.slo_violation_minutes, off_useful=off.useful_gpu_hours, off_lost=off.lost_gpu_hours,
        on_gpu_h=on.lent_gpu_hours, on_viol=on.slo_violation_minutes, on_useful=on.useful_gpu_hours, on_lost=on.lost_gpu_hours,
        on_fast_share=ctl.fast / max(ctl.lent, 1),
    )


def header() -> str:
    return (f"{'trace':<20} {'seed':>4} {'%oracle off':>11} {'on':>6} {'gain GPU-h/d':>12} {'viol off':>8} {'on':>4} "
            f"{'bound':>6} {'useful off':>10} {'on':>7} {'lost off':>8} {'on':>6} {'fast share':>10}")


def row(r: TierRun) -> str:
    o = max(r.oracle_gpu_h, 1e-9)
    return (f"{r.trace:<20} {r.seed:4d} {r.off_gpu_h / o:11.1%} {r.on_gpu_h / o:6.1%} {(r.on_gpu_h - r.off_gpu_h) / r.days:12.1f} "
            f"{r.off_viol:8d} {r.on_viol:4d} {r.bound:6.1f} {r.off_useful:10.0f} {r.on_useful:7.0f} {r.off_lost:8.0f} "
            f"{r.on_lost:6.0f} {r.on_fast_share:10.1%}"
            + ("" if r.on_viol <= r.bound + 1e-9 else "  OVER (tier on)") + ("" if r.off_viol <= r.bound + 1e-9 else "  OVER (tier off)"))


def run_all(cfg: Config, paths: Sequence[str], seeds: Sequence[int], *, on_run: Callable[[TierRun], None] | None = None,
            **kw: object) -> list[TierRun]:
    out: list[TierRun] = []
    for seed in seeds:
        for p in paths:
            r = run_one(cfg, p, seed, **kw)  # type: ignore[arg-type]  # the keywords of run_one
            out.append(r)
            if on_run is not None:
                on_run(r)
    return out


def summary(runs: Sequence[TierRun]) -> str:
    lines = []
    for trace in dict.fromkeys(r.trace for r in runs):
        rs = [r for r in runs if r.trace == trace]
        gain = float(np.mean([(r.on_gpu_h - r.off_gpu_h) / max(r.oracle_gpu_h, 1e-9) for r in rs]))
        lines.append(
            f"{trace}: tier on - off = {gain:+.1%} of the oracle (mean over {len(rs)} seeds), "
            f"{float(np.mean([(r.on_gpu_h - r.off_gpu_h) / r.days for r in rs])):+.1f} GPU-h/day; violations on "
            f"{[r.on_viol for r in rs]} vs off {[r.off_viol for r in rs]}, bound {[round(r.bound, 1) for r in rs]}"
        )
    return "\n".join(lines)
