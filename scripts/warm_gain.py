"""What warm lending is worth: bridge with ``pools[].warm_lending`` off and on, on the same
traces and seeds, against the same oracle (cold delays: grace + cold start).

With warm lending on, a reclaimed node's replica is woken (``wake_s``) instead of cold-started
(``cold_start_s``), and the policy plans that pool with the shorter horizon (grace + wake).
``wake_fail_rate`` (default 0: every wake succeeds) makes that share of the wakes fail: the
replica is then cold-started after the wake's wait (``Setup.wake_fail_rate``), and the
measured delays raise the horizon as the daemon's do. Reported per trace and seed: lent GPU-hours
and % of the cold oracle, violations against its bound (the oracle's + 0.1 % of minutes),
useful and lost research GPU-hours, and the warm oracle's GPU-hours (the same oracle with the
wake as its delay: what the shorter reclaim could give at best). Used by
``scripts/bench_harvest.py --warm``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bridge.config import Config
from bridge.simulate.baselines import make_controller
from bridge.simulate.engine import DEFAULT_START_UNIX, Setup, simulate
from bridge.simulate.workload import build_workload, split_history
from bridge.trace import load_trace

BOUND_SHARE = 0.001


@dataclass(frozen=True, slots=True)
class WarmRun:
    trace: str
    seed: int
    days: float
    oracle_gpu_h: float  # cold delays
    oracle_viol: int
    warm_oracle_gpu_h: float  # the wake as the delay
    allowed: float
    cold_gpu_h: float
    cold_viol: int
    cold_useful: float
    cold_lost: float
    warm_gpu_h: float
    warm_viol: int
    warm_useful: float
    warm_lost: float

    @property
    def bound(self) -> float:
        return self.oracle_viol + self.allowed


# the memory hold a warm lend needs (pools[].warm_hold_mb): the simulated 70B replica's ~130 GiB of
# weights plus a margin; the simulator's research jobs do not ask for memory, so it changes nothing here
SIM_HOLD_MB = 140_000


def with_warm(cfg: Config, wake_s: float | None = None) -> Config:
    """The config with every pool lending warm (and its wake time, if given)."""
    pools = tuple(dataclasses.replace(p, warm_lending=True, wake_s=p.wake_s if wake_s is None else wake_s,
                                      warm_hold_mb=p.warm_hold_mb or SIM_HOLD_MB) for p in cfg.pools)
    return dataclasses.replace(cfg, pools=pools)


def run_one(cfg: Config, path: str, seed: int, *, nodes: int = 24, peak_replicas: float = 20.0, days: float | None = None,
            history_days: float = 0.0, cold_start_cv: float = 0.25, wake_s: float | None = None,
            wake_fail_rate: float = 0.0) -> WarmRun:
    """Oracle (cold and warm), bridge cold, bridge warm: one trace, one seed."""
    w = build_workload(load_trace(path), peak_replicas=peak_replicas, days=days, seed=seed)
    hist, rest = split_history(w, history_days)

    def setup(c: Config, fail: float = 0.0) -> Setup:
        return Setup(c, rest, nodes, 4, seed=seed, history=hist, cold_start_cv=cold_start_cv,
                     start_unix=DEFAULT_START_UNIX + (hist.duration_s if hist is not None else 0.0), wake_fail_rate=fail)

    s_cold, s_warm = setup(cfg), setup(with_warm(cfg, wake_s), wake_fail_rate)
    o = simulate(s_cold, make_controller("oracle", s_cold)).metrics
    ow = simulate(s_warm, make_controller("oracle", s_warm)).metrics
    cold = simulate(s_cold, make_controller("bridge", s_cold)).metrics
    warm = simulate(s_warm, make_controller("bridge", s_warm)).metrics
    return WarmRun(
        trace=Path(path).name.removesuffix(".csv"), seed=seed, days=cold.trace_minutes / 1440.0,
        oracle_gpu_h=o.lent_gpu_hours, oracle_viol=o.slo_violation_minutes, warm_oracle_gpu_h=ow.lent_gpu_hours,
        allowed=BOUND_SHARE * cold.trace_minutes,
        cold_gpu_h=cold.lent_gpu_hours, cold_viol=cold.slo_violation_minutes, cold_useful=cold.useful_gpu_hours,
        cold_lost=cold.lost_gpu_hours,
        warm_gpu_h=warm.lent_gpu_hours, warm_viol=warm.slo_violation_minutes, warm_useful=warm.useful_gpu_hours,
        warm_lost=warm.lost_gpu_hours,
    )


def header() -> str:
    return (f"{'trace':<20} {'seed':>4} {'%oracle cold':>12} {'warm':>6} {'gain GPU-h/d':>12} {'viol cold':>9} {'warm':>4} "
            f"{'bound':>6} {'useful cold':>11} {'warm':>6} {'lost cold':>9} {'warm':>5} {'warm oracle %':>13}")


def row(r: WarmRun) -> str:
    o = max(r.oracle_gpu_h, 1e-9)
    return (f"{r.trace:<20} {r.seed:4d} {r.cold_gpu_h / o:12.1%} {r.warm_gpu_h / o:6.1%} {(r.warm_gpu_h - r.cold_gpu_h) / r.days:12.1f} "
            f"{r.cold_viol:9d} {r.warm_viol:4d} {r.bound:6.1f} {r.cold_useful:11.0f} {r.warm_useful:6.0f} {r.cold_lost:9.0f} "
            f"{r.warm_lost:5.0f} {r.warm_oracle_gpu_h / o:13.1%}"
            + ("" if r.warm_viol <= r.bound + 1e-9 else "  OVER (warm)") + ("" if r.cold_viol <= r.bound + 1e-9 else "  OVER (cold)"))


def run_all(cfg: Config, paths: Sequence[str], seeds: Sequence[int], *, on_run: Callable[[WarmRun], None] | None = None,
            **kw: object) -> list[WarmRun]:
    out: list[WarmRun] = []
    for seed in seeds:
        for p in paths:
            r = run_one(cfg, p, seed, **kw)  # type: ignore[arg-type]  # the keywords of run_one
            out.append(r)
            if on_run is not None:
                on_run(r)
    return out


def summary(runs: Sequence[WarmRun]) -> str:
    lines = []
    for trace in dict.fromkeys(r.trace for r in runs):
        rs = [r for r in runs if r.trace == trace]
        gain = float(np.mean([(r.warm_gpu_h - r.cold_gpu_h) / max(r.oracle_gpu_h, 1e-9) for r in rs]))
        lines.append(
            f"{trace}: warm - cold = {gain:+.1%} of the cold oracle (mean over {len(rs)} seeds), "
            f"{float(np.mean([(r.warm_gpu_h - r.cold_gpu_h) / r.days for r in rs])):+.1f} GPU-h/day; violations warm "
            f"{[r.warm_viol for r in rs]} vs cold {[r.cold_viol for r in rs]}, bound {[round(r.bound, 1) for r in rs]}"
        )
    return "\n".join(lines)
