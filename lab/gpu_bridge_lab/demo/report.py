"""The demo's summary (pure arithmetic over samples and events), its table and its PNG.

SLO-violation minutes follow docs/simulator.md: trace minutes in which the offered load,
in replicas at the per-replica target, exceeds the Ready serving replicas (the least Ready
in the interval). The offered load is the simulator's applied rate (the trace window's mean,
after scaling), so a minute is not counted for a burst inside a window.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_bridge_lab.demo.shape import DayShape, clock
from gpu_bridge_lab.demo.timeline import Event
from gpu_bridge_lab.demo.watch import JobTracker, Sample

GPUS_PER_NODE = 4


def summarize(samples: Sequence[Sample], events: Sequence[Event], tracker: JobTracker, *, shape: DayShape,
              min_serving: int, nodes: int) -> dict[str, Any]:
    """Everything the table and the test need, as plain JSON-able values."""
    lent_node_s = 0.0
    slo_trace_s = 0.0
    for a, b in zip(samples, samples[1:], strict=False):
        dt = b.t - a.t
        lent_node_s += a.lent * dt
        if a.rate / shape.replica_rps > min(a.ready, b.ready) + 1e-9:
            slo_trace_s += dt * shape.speed
    duration = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    reclaims = [e for e in events if e.kind == "serving"]
    lat: dict[str, list[float]] = {k: [] for k in ("detection_s", "slurm_release_s", "kubernetes_ready_s", "total_s")}
    for e in reclaims:
        for k in lat:
            v = e.data.get(k)
            if isinstance(v, (int, float)):
                lat[k].append(max(0.0, float(v)))
    jobs = list(tracker.jobs.values())
    requeued = [j for j in jobs if j.requeued]
    return {
        "demo_s": round(duration, 1),
        "trace_hours": round(duration * shape.speed / 3600, 2),
        "trace_start": clock(shape.trace_start_s),
        "speed": shape.speed,
        "nodes": nodes,
        "lent_gpu_hours_demo": round(lent_node_s * GPUS_PER_NODE / 3600, 3),
        "lent_gpu_hours_trace": round(lent_node_s * GPUS_PER_NODE * shape.speed / 3600, 1),
        "lends": sum(1 for e in events if e.kind == "lent"),
        "reclaims": len(reclaims),
        "reclaims_started": sum(1 for e in events if e.kind == "reclaim"),
        "reclaims_with_jobs": sum(1 for e in events if e.kind == "reclaim" and e.data.get("jobs")),
        "jobs_submitted": len(jobs),
        "jobs_started": sum(1 for j in jobs if j.first_start_t is not None),
        "jobs_finished": sum(1 for j in jobs if j.finished_t is not None and j.state == "completed"),
        "jobs_failed": sum(1 for j in jobs if j.finished_t is not None and j.state != "completed"),
        "jobs_requeued": len(requeued),
        "jobs_requeued_resumed": sum(1 for j in requeued if j.resumed or (j.finished_t is not None and j.runs > 1)),
        "jobs_requeued_finished": sum(1 for j in requeued if j.finished_t is not None and j.state == "completed"),
        "jobs_still_running": sum(1 for j in jobs if j.finished_t is None and j.state in ("running", "completing")),
        "jobs_still_pending": sum(1 for j in jobs if j.finished_t is None and j.state not in ("running", "completing")),
        "failed_jobs": [e.text for e in events if e.kind == "job-failed"],
        "latency_s": {k: _stats(v) for k, v in lat.items()},
        "slo_violation_minutes": round(slo_trace_s / 60, 1),
        "trace_minutes": round(duration * shape.speed / 60, 1),
        "min_ready": min((s.ready for s in samples), default=0),
        "min_serving": min_serving,
        "max_lent": max((s.lent for s in samples), default=0),
    }


def _stats(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"n": len(xs), "min": round(min(xs), 2), "median": round(statistics.median(xs), 2), "max": round(max(xs), 2)}


def table(s: dict[str, Any]) -> str:
    """The summary as an aligned two-column table."""
    def lat(key: str) -> str:
        v = s["latency_s"].get(key)
        return "-" if v is None else f"median {v['median']:.1f} s (min {v['min']:.1f}, max {v['max']:.1f}, n={v['n']})"

    rows = [
        ("replayed", f"{s['trace_hours']:.1f} trace hours from {s['trace_start']} in {s['demo_s']:.0f} s "
                     f"(x{s['speed']:.0f}), {s['nodes']} nodes x {GPUS_PER_NODE} GPUs"),
        ("GPU-hours lent to Slurm", f"{s['lent_gpu_hours_demo']:.2f} in demo time = {s['lent_gpu_hours_trace']:.1f} "
                                    f"at trace speed (max {s['max_lent']} nodes lent at once)"),
        ("nodes lent / reclaimed", f"{s['lends']} lends, {s['reclaims']} reclaims completed "
                                   f"({s['reclaims_with_jobs']} had to preempt jobs)"),
        ("jobs submitted", str(s["jobs_submitted"])),
        ("jobs started / finished", f"{s['jobs_started']} / {s['jobs_finished']}"
                                    + (f" ({s['jobs_failed']} failed)" if s["jobs_failed"] else "")),
        ("jobs requeued", f"{s['jobs_requeued']}; resumed after requeue {s['jobs_requeued_resumed']}, "
                          f"of which finished {s['jobs_requeued_finished']}"),
        ("jobs left at the end", f"{s['jobs_still_running']} running, {s['jobs_still_pending']} pending"),
        ("reclaim: detection", lat("detection_s")),
        ("reclaim: Slurm release", lat("slurm_release_s")),
        ("reclaim: Kubernetes ready", lat("kubernetes_ready_s")),
        ("reclaim: total", lat("total_s")),
        ("SLO-violation minutes", f"{s['slo_violation_minutes']:.1f} of {s['trace_minutes']:.0f} trace minutes"),
        ("min Ready serving", f"{s['min_ready']} (min_serving {s['min_serving']})"),
    ]
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 2 + max(len(v) for _, v in rows))
    return "\n".join([line, *(f"{k:<{w}}  {v}" for k, v in rows), line])


def dump(path: Path, samples: Sequence[Sample], events: Sequence[Event]) -> Path:
    """Samples and events as JSON, to re-plot or inspect a run afterwards."""
    doc = {
        "samples": [{**{k: getattr(x, k) for k in Sample.__slots__}, "phases": dict(x.phases)} for x in samples],
        "events": [{"t": e.t, "trace_s": e.trace_s, "node": e.node, "kind": e.kind, "text": e.text, "data": e.data}
                   for e in events],
    }
    path.write_text(json.dumps(doc))
    return path


def plot(path: Path, samples: Sequence[Sample], events: Sequence[Event], *, shape: DayShape, nodes: int,
         min_serving: int) -> Path:
    """Load vs Ready capacity (top), lent nodes and research jobs (bottom), over trace time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def hours(trace_s: float) -> float:
        return (trace_s - shape.trace_start_s) / 3600.0

    x = [hours(s.trace_s) for s in samples]
    load = [s.rate / shape.replica_rps for s in samples]
    ready = [s.ready for s in samples]
    lent = [s.lent for s in samples]
    busy = [s.busy_nodes for s in samples]
    fig, (top, bot) = plt.subplots(2, 1, figsize=(12, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top.step(x, ready, where="post", color="tab:green", lw=2, label="Ready serving replicas (capacity)")
    top.plot(x, load, color="tab:blue", lw=1.2, label=f"offered load, replicas at target ({shape.replica_rps:.1f} req/s each)")
    over = [lo > r for lo, r in zip(load, ready, strict=False)]
    top.fill_between(x, load, ready, where=over, step=None, color="tab:red", alpha=0.3, label="load above Ready capacity")
    top.axhline(min_serving, color="grey", ls=":", lw=1, label=f"min_serving = {min_serving}")
    ymax = max([nodes + 0.5, *load]) * 1.05
    for e in events:
        if e.kind == "reclaim":
            top.axvline(hours(e.trace_s), color="tab:orange", lw=0.8, alpha=0.7)
        elif e.kind == "lent":
            top.axvline(hours(e.trace_s), color="tab:purple", lw=0.8, alpha=0.4, ls="--")
    top.plot([], [], color="tab:orange", lw=0.8, label="reclaim started")
    top.plot([], [], color="tab:purple", lw=0.8, ls="--", label="node lent")
    top.set_ylim(0, ymax)
    top.set_ylabel("replicas")
    top.set_title(f"gpu-bridge demo: {clock(shape.trace_start_s)} + 24 h of the ServeGen trace on {nodes} nodes")
    top.legend(loc="upper right", fontsize=8, ncol=2)
    top.grid(alpha=0.3)

    bot.fill_between(x, lent, step="post", color="tab:purple", alpha=0.25, label="nodes lent to Slurm")
    bot.step(x, busy, where="post", color="black", lw=1.2, label="nodes running research jobs")
    for e in events:
        if e.kind == "reclaim":
            bot.axvline(hours(e.trace_s), color="tab:orange", lw=0.8, alpha=0.7)
    marks = {"job-started": ("^", "tab:green", "job started"), "job-requeued": ("x", "tab:red", "job requeued"),
             "job-resumed": ("v", "tab:blue", "job resumed"), "job-finished": ("o", "tab:grey", "job finished")}
    for kind, (m, c, label) in marks.items():
        pts = [hours(e.trace_s) for e in events if e.kind == kind]
        y = {"job-started": nodes + 0.35, "job-requeued": nodes + 0.7, "job-resumed": nodes + 0.35,
             "job-finished": nodes + 1.05}[kind]
        bot.scatter(pts, [y] * len(pts), marker=m, color=c, s=28, label=label, zorder=3)
    bot.set_ylim(0, nodes + 1.5)
    bot.set_ylabel("nodes / jobs")
    ticks = list(range(0, 25, 3))
    bot.set_xticks(ticks)
    bot.set_xticklabels([clock(shape.trace_start_s + h * 3600).split(" ", 2)[2] for h in ticks])
    bot.set_xlabel(f"trace time (24 h replayed in {samples[-1].t - samples[0].t:.0f} s)" if samples else "trace time")
    bot.legend(loc="upper left", bbox_to_anchor=(0.0, 0.76), fontsize=8, ncol=3)
    bot.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
