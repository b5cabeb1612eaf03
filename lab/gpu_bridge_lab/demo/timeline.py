"""What the audience reads while the demo runs: a progress line and event lines.

On a terminal the progress line is redrawn in place every second and event lines scroll
above it; otherwise (a pipe, CI, a log file) the progress line is printed every few
seconds and events as they come. Events come from the daemon's JSON log (lending,
reclaims with their reason, requeues, reclaim latencies) and from Slurm (jobs started,
requeued, resumed, finished).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from gpu_bridge_lab.demo.shape import clock
from gpu_bridge_lab.demo.watch import JobEvent, Sample


@dataclass(frozen=True, slots=True)
class Event:
    t: float  # demo seconds since the replay started
    trace_s: float
    node: str
    kind: str  # lending | lent | reclaim | requeue | serving | job-* | warning
    text: str
    data: dict[str, Any] = field(default_factory=dict)


def progress_text(s: Sample, *, nodes: int, demand: float | None, replica_rps: float) -> str:
    d = "  -" if demand is None else f"{demand:4.1f}"
    return (f"{clock(s.trace_s)} | load {s.rate:5.1f} req/s ({s.rate / replica_rps:3.1f} repl) | demand {d} | "
            f"Ready {s.ready}/{nodes} | lent {s.lent} | jobs run {s.running} pend {s.pending} "
            f"(requeued {s.requeued_pending})")


def daemon_event(doc: dict[str, Any], t: float, trace_s: float) -> Event | None:
    """One line of the daemon's log as a timeline event, or None if not worth showing."""
    ev = doc.get("event")
    node = str(doc.get("node", ""))
    if ev == "node_transition_started":
        jobs = doc.get("jobs") or []
        if doc.get("phase") == "lending":
            return Event(t, trace_s, node, "lending", f"lending to Slurm ({doc.get('reason')}: {doc.get('detail')})")
        on_it = f"; preempting job(s) {', '.join(map(str, jobs))} with requeue" if jobs else "; no job on it"
        return Event(t, trace_s, node, "reclaim",
                     f"RECLAIM started ({doc.get('reason')}: {doc.get('detail')}){on_it}", {"jobs": list(jobs)})
    if ev == "node_step":
        step = doc.get("step")
        if step == "mark_lent" and doc.get("changed"):
            return Event(t, trace_s, node, "lent", "lent: Slurm may start research jobs on it")
        if step == "requeue_jobs" and doc.get("changed"):
            return Event(t, trace_s, node, "requeue", str(doc.get("detail") or "jobs requeued"))
        if step == "submit_hold":
            return Event(t, trace_s, node, "hold", f"hold job submitted ({doc.get('detail')}): Slurm preempts, GraceTime runs")
        return None
    if ev == "node_reclaimed":
        parts = []
        for key, label in (("detection_s", "detection"), ("slurm_release_s", "Slurm release"),
                           ("kubernetes_ready_s", "Kubernetes ready"), ("total_s", "total")):
            if isinstance(doc.get(key), (int, float)):
                parts.append(f"{label} {max(0.0, doc[key]):.1f} s")
        data = {k: doc[k] for k in ("detection_s", "slurm_release_s", "kubernetes_ready_s", "total_s") if k in doc}
        return Event(t, trace_s, node, "serving", "serving again, vLLM replica Ready (" + ", ".join(parts) + ")", data)
    if ev in ("step_failed", "tick_failed", "action_not_started", "scale_failed", "slurm_unavailable"):
        return Event(t, trace_s, node, "warning", f"daemon warning {ev}: {doc.get('error', '')}"[:200])
    return None


def job_event(e: JobEvent, t: float, trace_s: float) -> Event:
    where = f" on {','.join(e.nodes)}" if e.nodes else ""
    text = {"started": f"job {e.job_id} ({e.name}) started{where}",
            "requeued": f"job {e.job_id} ({e.name}) requeued (not lost): waits for a lent node",
            "resumed": f"job {e.job_id} ({e.name}) resumed{where} after its requeue",
            "finished": f"job {e.job_id} ({e.name}) finished",
            "failed": f"job {e.job_id} ({e.name}) ended without success ({e.detail})"}[e.kind]
    return Event(t, trace_s, "", "job-" + e.kind, text, {"job": e.job_id, "name": e.name})


class Display:
    """Writes events and the progress line; a TTY gets an in-place line."""

    def __init__(self, out: TextIO | None = None, *, every_s: float = 5.0) -> None:
        self.out = out or sys.stdout
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.every_s = every_s
        self._last_progress = -1e9
        self._line = ""

    def event(self, e: Event) -> None:
        node = f"{e.node:<12} " if e.node else ""
        self._clear()
        self.out.write(f"  {clock(e.trace_s)}  +{e.t:5.0f}s  {node}{e.text}\n")
        self._redraw()

    def info(self, text: str) -> None:
        self._clear()
        self.out.write(text + "\n")
        self._redraw()

    def progress(self, text: str, t: float) -> None:
        if self.tty:
            self._clear()
            self._line = text
            self._redraw()
        elif t - self._last_progress >= self.every_s:
            self._last_progress = t
            self.out.write(f"  [{t:5.0f}s] {text}\n")
            self.out.flush()

    def done(self) -> None:
        self._clear()
        self._line = ""

    def _clear(self) -> None:
        if self.tty and self._line:
            self.out.write("\r\033[K")

    def _redraw(self) -> None:
        if self.tty and self._line:
            self.out.write(self._line[:200])
        self.out.flush()
