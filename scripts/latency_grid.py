"""The latency frontier: the harvest over a grid of Slurm grace x vLLM cold start.

Every surprise costs about one reclaim latency (grace + cold start) of missing capacity, so
a causal policy must keep headroom for every jump that can happen within it. This grid runs
bridge and the oracle *with the same delays* on each cell and reports bridge's share of that
oracle, its violations against the governor's bound (``docs/policy.md`` section 8: in every
window of ``policy.governor.window_s``, avoidable violation minutes <= the budget ``B``, i.e.
violations <= the minutes above every node + ``B``) and, apart from it, against the issue-11
target the calibration aims at (the oracle's violations + 0.1 % of the trace's minutes: a
forecast's aim, not a promise; for a 7-day trace it is smaller than ``B`` and can be missed
while the bound holds), then what one minute of reclaim latency costs in lent GPU-hours per
day (a least-squares slope over the cells). Used by ``scripts/bench_harvest.py --latency-grid``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bridge.config import Config
from bridge.simulate.baselines import make_controller
from bridge.cli.simulate import apply_overrides
from bridge.simulate.engine import DEFAULT_START_UNIX, Setup, simulate
from bridge.simulate.workload import build_workload, split_history
from bridge.trace import load_trace

GRACES_S = (0.0, 30.0, 120.0)
COLD_STARTS_S = (10.0, 60.0, 300.0)
TARGET_SHARE = 0.001  # the issue-11 target: the oracle's violation minutes + 0.1 % of the trace's


@dataclass(frozen=True, slots=True)
class Cell:
    """One (trace, seed, grace, cold start) run of bridge and the oracle."""

    trace: str
    seed: int
    grace_s: float
    cold_start_s: float
    days: float
    bridge_gpu_h: float
    oracle_gpu_h: float
    viol: int
    oracle_viol: int
    allowed: float  # the target's share of the trace's minutes (TARGET_SHARE)
    # the governor's bound (None in grids saved before it was recorded: not judged)
    unavoidable: int | None = None  # minutes with load above every node
    worst_window: int | None = None  # most avoidable violation minutes in one governor window
    budget: float | None = None  # the governor's budget B per window

    @property
    def latency_min(self) -> float:
        return (self.grace_s + self.cold_start_s) / 60.0

    @property
    def frac(self) -> float:
        return self.bridge_gpu_h / max(self.oracle_gpu_h, 1e-9)

    @property
    def bound(self) -> float | None:
        """The governor's bound on the run's violations: unavoidable + B (per window)."""
        if self.unavoidable is None or self.budget is None:
            return None
        return self.unavoidable + self.budget

    @property
    def ok(self) -> bool | None:
        """The governor's promise: every window's avoidable violations <= B (None: not recorded)."""
        if self.worst_window is None or self.budget is None:
            return None
        return self.worst_window <= self.budget + 1e-9

    @property
    def target(self) -> float:
        """The issue-11 target the calibration aims at: the oracle's violations + 0.1 % of the run."""
        return self.oracle_viol + self.allowed

    @property
    def on_target(self) -> bool:
        return self.viol <= self.target + 1e-9


def governor_bound(setup: Setup, violation_minutes: np.ndarray) -> tuple[int, int, float]:
    """(unavoidable minutes, the worst governor window's avoidable violation minutes, the budget
    per window) of one run: the quantities of the bound in ``docs/policy.md`` section 8. A run
    no longer than the window is one window (as the governor counts it in the simulator)."""
    w = setup.workload
    cap = setup.nodes * setup.replicas_per_node + 1e-9
    avoid = np.zeros(w.minutes, dtype=np.int64)
    avoid[violation_minutes[w.load[violation_minutes] <= cap]] = 1
    win = max(1, int(round(setup.config.policy.governor.window_s / w.minute_s)))
    c = np.concatenate(([0], np.cumsum(avoid)))
    worst = int(c[-1]) if w.minutes <= win else int((c[win:] - c[:-win]).max())
    return int((w.load > cap).sum()), worst, setup.pool.slo_budget * win


@dataclass(frozen=True, slots=True)
class GridSpec:
    """What every cell shares: the pool's size and scale, the trace length and history, the
    spread of the drawn cold starts."""

    nodes: int = 24
    peak_replicas: float = 20.0
    days: float | None = None
    history_days: float = 0.0
    cold_start_cv: float = 0.25
    max_cv: float | None = None


def run_cell(cfg: Config, path: str, spec: GridSpec, seed: int, grace_s: float, cold_start_s: float) -> Cell:
    """bridge and the oracle on one trace with these delays (the oracle plans with them too)."""
    c = apply_overrides(cfg, grace_s=grace_s, cold_start_s=cold_start_s)
    w = build_workload(load_trace(path), peak_replicas=spec.peak_replicas, days=spec.days, seed=seed, max_cv=spec.max_cv)
    hist, rest = split_history(w, spec.history_days)
    setup = Setup(
        c, rest, spec.nodes, 4, seed=seed, history=hist, cold_start_cv=spec.cold_start_cv,
        start_unix=DEFAULT_START_UNIX + (hist.duration_s if hist is not None else 0.0),
    )
    rb = simulate(setup, make_controller("bridge", setup))
    b, o = rb.metrics, simulate(setup, make_controller("oracle", setup)).metrics
    unavoidable, worst, budget = governor_bound(setup, rb.violation_minutes)
    return Cell(
        trace=Path(path).name.removesuffix(".csv"), seed=seed, grace_s=grace_s, cold_start_s=cold_start_s,
        days=b.trace_minutes / 1440.0, bridge_gpu_h=b.lent_gpu_hours, oracle_gpu_h=o.lent_gpu_hours,
        viol=b.slo_violation_minutes, oracle_viol=o.slo_violation_minutes, allowed=TARGET_SHARE * b.trace_minutes,
        unavoidable=unavoidable, worst_window=worst, budget=budget,
    )


def run_grid(
    cfg: Config,
    paths: Sequence[str],
    spec: GridSpec,
    seeds: Sequence[int],
    *,
    graces_s: Sequence[float] = GRACES_S,
    cold_starts_s: Sequence[float] = COLD_STARTS_S,
    on_cell: Callable[[Cell], None] | None = None,
) -> list[Cell]:
    """Every cell of the grid on every trace and seed (seed-major, so a seed ends whole)."""
    cells: list[Cell] = []
    for seed in seeds:
        for path in paths:
            for g in graces_s:
                for cs in cold_starts_s:
                    cell = run_cell(cfg, path, spec, seed, g, cs)
                    cells.append(cell)
                    if on_cell is not None:
                        on_cell(cell)
    return cells


def save(cells: Iterable[Cell], path: str, meta: dict[str, object]) -> None:
    """The cells as JSON (rewritten whole, so a killed run leaves the cells done so far)."""
    data = {"meta": meta, "cells": [asdict(c) for c in cells]}
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def load(paths: Iterable[str]) -> list[Cell]:
    """Cells of one or more saved grids (e.g. one file per seed)."""
    out: list[Cell] = []
    for p in paths:
        data = json.loads(Path(p).read_text(encoding="utf-8"))
        out.extend(Cell(**c) for c in data["cells"])
    return out


def _mean_by_cell(cells: Sequence[Cell], trace: str) -> list[tuple[float, float, list[Cell]]]:
    """(grace, cold start, the seeds' cells) of one trace, in grid order."""
    keys = sorted({(c.grace_s, c.cold_start_s) for c in cells if c.trace == trace})
    return [(g, cs, [c for c in cells if c.trace == trace and (c.grace_s, c.cold_start_s) == (g, cs)]) for g, cs in keys]


def cost_per_minute(cells: Sequence[Cell], trace: str, which: str = "bridge") -> float | None:
    """Lent GPU-hours per day lost per extra minute of reclaim latency: minus the least-squares
    slope of GPU-hours/day over latency (grace + cold start), every cell and seed a point.
    None with fewer than two distinct latencies."""
    pts = [(c.latency_min, (c.bridge_gpu_h if which == "bridge" else c.oracle_gpu_h) / max(c.days, 1e-9))
           for c in cells if c.trace == trace]
    xs = np.asarray([p[0] for p in pts], dtype=float)
    if len(set(xs.tolist())) < 2:
        return None
    ys = np.asarray([p[1] for p in pts], dtype=float)
    slope = float(np.polyfit(xs, ys, 1)[0])
    return -slope


def traces_of(cells: Sequence[Cell]) -> list[str]:
    seen: dict[str, None] = {}
    for c in cells:
        seen.setdefault(c.trace, None)
    return list(seen)


def _verdict(cc: Sequence[Cell]) -> str:
    """The governor's bound over a cell's seeds: ok, BROKEN (seeds), or ? (not recorded)."""
    if any(c.ok is None for c in cc):
        return "?"
    broken = [c.seed for c in cc if not c.ok]
    return "ok" if not broken else "BROKEN (seed " + ", ".join(map(str, broken)) + ")"


def render(cells: Sequence[Cell]) -> str:
    """The table: per trace and cell, bridge's share of the same-delay oracle (mean and lowest
    over seeds), its GPU-hours/day, its worst seed's violations against the governor's bound
    (the worst window's avoidable minutes against the budget) and against the issue-11 target;
    then per trace the cost of one minute of reclaim latency."""
    seeds = sorted({c.seed for c in cells})
    head = (f"{'trace':<20} {'grace s':>7} {'cold s':>6} {'lat min':>7} {'%oracle':>8} {'min':>6} {'GPU-h/d':>8} "
            f"{'oracle/d':>8} {'viol max':>8} {'unavoid':>7} {'worst win':>9} {'budget':>6} {'bound':>6} "
            f"{'target':>6}  0.1%run")
    lines = [f"latency grid: seeds {', '.join(map(str, seeds))}; %oracle = bridge / the oracle with the same delays "
             f"(mean over seeds, and lowest); bound = the governor's (docs/policy.md section 8): every window's "
             f"avoidable violation minutes (worst win, worst seed) <= budget; target = the calibration's aim, not a "
             f"promise: the oracle's violations + {TARGET_SHARE:.1%} of the run's minutes (viol max, worst seed)",
             head, "-" * len(head)]

    def num(x: float | None, fmt: str, width: int) -> str:
        return f"{'-':>{width}}" if x is None else f"{x:{width}{fmt}}"

    for trace in traces_of(cells):
        for g, cs, cc in _mean_by_cell(cells, trace):
            worst = max(cc, key=lambda c: c.viol - c.target)
            judged = [c for c in cc if c.worst_window is not None and c.budget is not None]
            wb = max(judged, key=lambda c: (c.worst_window or 0) - (c.budget or 0.0)) if judged else None
            missed = [c.seed for c in cc if not c.on_target]
            lines.append(
                f"{trace:<20} {g:7g} {cs:6g} {(g + cs) / 60:7.1f} {float(np.mean([c.frac for c in cc])):8.1%} "
                f"{min(c.frac for c in cc):6.1%} {float(np.mean([c.bridge_gpu_h / c.days for c in cc])):8.0f} "
                f"{float(np.mean([c.oracle_gpu_h / c.days for c in cc])):8.0f} {worst.viol:8d} "
                f"{num(None if wb is None else wb.unavoidable, 'd', 7)} {num(None if wb is None else wb.worst_window, 'd', 9)} "
                f"{num(None if wb is None else wb.budget, '.1f', 6)} {_verdict(cc):>6} {worst.target:6.1f}  "
                + ("ok" if not missed else "over (seed " + ", ".join(map(str, missed)) + ")")
            )
    lines.append("-" * len(head))
    for trace in traces_of(cells):
        b, o = cost_per_minute(cells, trace), cost_per_minute(cells, trace, "oracle")
        cc = [c for c in cells if c.trace == trace]
        fast = [c for c in cc if c.latency_min == min(x.latency_min for x in cc)]
        slow = [c for c in cc if c.latency_min == max(x.latency_min for x in cc)]
        lines.append(
            f"one minute of reclaim latency on {trace}: "
            + ("-" if b is None else f"{b:.1f} GPU-h/day for bridge")
            + ("" if o is None else f", {o:.1f} for the oracle")
            + f" (bridge {float(np.mean([c.bridge_gpu_h / c.days for c in fast])):.0f} GPU-h/day at "
            f"{fast[0].latency_min:.1f} min vs {float(np.mean([c.bridge_gpu_h / c.days for c in slow])):.0f} at "
            f"{slow[0].latency_min:.1f} min)"
        )
    n_broken = sum(c.ok is False for c in cells)
    n_unjudged = sum(c.ok is None for c in cells)
    lines.append("governor bound: " + ("holds in every cell and seed" if not n_broken else f"BROKEN in {n_broken} of {len(cells)} runs")
                 + (f" ({n_unjudged} runs saved before it was recorded: not judged)" if n_unjudged else ""))
    n_missed = sum(not c.on_target for c in cells)
    lines.append(f"0.1%run target (the calibration's aim): {'met in every run' if not n_missed else f'missed in {n_missed} of {len(cells)} runs'}")
    return "\n".join(lines)


def plot(cells: Sequence[Cell], path: str) -> None:
    """One panel per trace: lent GPU-hours/day over reclaim latency, bridge (filled, one colour
    per grace) and the same-delay oracle (hollow), bridge's fitted line; a red cross marks a
    cell where a seed broke the governor's bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = traces_of(cells)
    cols = min(2, len(traces))
    rows = math.ceil(len(traces) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.6 * rows), squeeze=False)
    colours = {g: f"C{i}" for i, g in enumerate(sorted({c.grace_s for c in cells}))}
    for ax, trace in zip(axes.flat, traces, strict=False):
        for g, cs, cc in _mean_by_cell(cells, trace):
            x = (g + cs) / 60
            yb = float(np.mean([c.bridge_gpu_h / c.days for c in cc]))
            yo = float(np.mean([c.oracle_gpu_h / c.days for c in cc]))
            ax.plot([x], [yb], "o", color=colours[g], label=f"bridge, grace {g:g} s")
            ax.plot([x], [yo], "o", mfc="none", color=colours[g], label=f"oracle, grace {g:g} s")
            if any(c.ok is False for c in cc):
                ax.plot([x], [yb], "x", color="red", ms=12, label="governor bound broken")
        k = cost_per_minute(cells, trace)
        if k is not None:
            xs = np.asarray([c.latency_min for c in cells if c.trace == trace])
            ys = np.asarray([c.bridge_gpu_h / c.days for c in cells if c.trace == trace])
            fit = np.polyfit(xs, ys, 1)
            gx = np.linspace(xs.min(), xs.max(), 2)
            ax.plot(gx, np.polyval(fit, gx), "--", color="grey", label="bridge, least squares")
            ax.set_title(f"{trace}: {k:.1f} GPU-h/day per minute")
        else:
            ax.set_title(trace)
        ax.set_xlabel("reclaim latency: grace + cold start (min)")
        ax.set_ylabel("lent GPU-h / day")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles, strict=True))
        ax.legend(uniq.values(), uniq.keys(), fontsize=7)
    for ax in list(axes.flat)[len(traces):]:
        ax.set_visible(False)
    seeds = sorted({c.seed for c in cells})
    fig.suptitle(f"latency frontier (mean over seeds {', '.join(map(str, seeds))})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
