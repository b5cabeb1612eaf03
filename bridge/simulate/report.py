"""Metrics of simulation runs as a table, JSON and a PNG plot (matplotlib, Agg backend)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import numpy as np

from bridge.simulate.engine import Metrics, Result
from bridge.simulate.workload import Workload

# The JSON objects carry exactly these keys, in this order: the fields of ``Metrics``.
KEYS: tuple[str, ...] = tuple(f.name for f in fields(Metrics))


def to_json(results: Sequence[Result]) -> str:
    """A JSON list: one object per run with exactly ``KEYS`` (``Metrics.as_dict``)."""
    return json.dumps([r.metrics.as_dict() for r in results], indent=2)


def table(results: Sequence[Result], *, wall: bool = True) -> str:
    """A fixed-width text table, one row per run (plus the wall time of each run)."""
    head = ["policy", "lent GPU-h", "useful GPU-h", "lost GPU-h", "preempt", "early", "lends", "reclaims", "SLO-viol min", "of min", "viol %"]
    if wall:
        head.append("wall s")
    rows = [head]
    for r in results:
        m = r.metrics
        row = [
            m.policy, f"{m.lent_gpu_hours:.1f}", f"{m.useful_gpu_hours:.1f}", f"{m.lost_gpu_hours:.1f}",
            *map(str, (m.preemptions, m.early_preemptions, m.lends, m.reclaims)),
            str(m.slo_violation_minutes), str(m.trace_minutes),
            f"{100.0 * m.slo_violation_minutes / max(1, m.trace_minutes):.3f}",
        ]
        if wall:
            row.append(f"{r.wall_s:.1f}")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for j, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(results: Sequence[Result], workload: Workload, path: str | Path, *, nodes: int, replicas_per_node: int = 1) -> None:
    """Offered load vs each run's Ready capacity, and lent nodes over time, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(14, 7), sharex=True, constrained_layout=True)
    days = np.arange(workload.minutes) * workload.minute_s / 86400.0
    ax1.plot(days, workload.load, color="0.4", lw=0.4, zorder=1, label="offered load (replicas, per minute)")
    colors = {"bridge": "tab:blue", "oracle": "tab:green", "fixed-window": "tab:orange", "reactive": "tab:red"}
    for r in results:
        x = r.tick_t / 86400.0
        name = r.metrics.policy
        c = colors.get(name.split(" ")[0])
        z = 3 if name.startswith("bridge") else 2
        ax1.step(x, r.tick_ready * replicas_per_node, where="post", lw=0.7, color=c, zorder=z, label=f"{name}: Ready capacity")
        ax2.step(x, r.tick_lent, where="post", lw=0.7, color=c, zorder=z, label=f"{name} ({r.metrics.lent_gpu_hours:.0f} GPU-h)")
        v = r.violation_minutes
        if v.size:
            ax1.plot(days[v], workload.load[v], ".", ms=3, color=c, zorder=4, label=f"{name}: SLO-violation minutes ({v.size})")
    ax1.axhline(nodes * replicas_per_node, color="grey", ls=":", lw=0.8, label="all nodes")
    ax1.set_ylabel("replicas")
    ax1.legend(loc="upper right", fontsize=7, ncol=2)
    ax2.set_ylabel("nodes lent to Slurm")
    ax2.set_xlabel("day of the trace")
    ax2.set_ylim(0, nodes)
    ax2.legend(loc="upper right", fontsize=7, ncol=2)
    name = workload.source if workload.source.startswith("prometheus ") else (Path(workload.source).name or "trace")
    fig.suptitle(f"gpu-bridge simulate: {name}, {nodes} nodes")
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
