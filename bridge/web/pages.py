"""The documents behind each page (and its JSON endpoint), from what the adapters read. Pure:
no I/O, ``now`` passed in; the numbers come from the daemon's own functions
(``cli.daemon.status_rows``, ``policy.victims.job_loss_gpu_hours``, ``policy.outlook``)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set as AbstractSet
from datetime import UTC, datetime
from typing import Any

from bridge.adapters.prom.types import DaemonHistory
from bridge.adapters.slurm.types import SlurmJobInfo
from bridge.policy.outlook import HourOutlook, first_free_window
from bridge.policy.victims import job_loss_gpu_hours
from bridge.preemption import Preemption
from bridge.wellknown import is_date

JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?")
# "job 12" / "jobs 12, 13_4" in a node's reason or problem (actuate's sentences name the jobs on it)
_JOBS_NAMED = re.compile(rf"\b(jobs? )({JOB_ID.pattern}(?:, {JOB_ID.pattern})*)\b")
OTHER_JOB = "(another user's)"
USER_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")


class BadInput(ValueError):
    """A request the view cannot answer: ``status`` 400 (malformed) or 404 (unknown)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def iso(t: float | None) -> str | None:
    if t is None or not is_date(t):  # Slurm's numbers: no date beyond 9999
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def check_job_id(raw: str) -> str:
    """A Slurm job id as squeue prints it (``123`` or an array task ``123_4``), else 400."""
    if not JOB_ID.fullmatch(raw):
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise BadInput(400, f"job id: expected digits such as 1234 (or 1234_5 for an array task), got {shown!r}")
    return raw


def check_user(raw: str | None, header: str) -> str:
    """The user the reverse proxy authenticated (``web.user_header``), else 401."""
    if raw is None or not raw.strip():
        raise BadInput(401, f"no {header} header: this view answers only behind the reverse proxy that authenticates users")
    user = raw.strip()
    if not USER_NAME.fullmatch(user):
        raise BadInput(400, f"{header}: not a user name: {user[:40]!r}")
    return user


def pool_doc(rows: Sequence[Mapping[str, Any]], *, now: float, user: str | None, user_jobs: Iterable[str]) -> dict[str, Any]:
    """The pool page: ``gpu-bridge status``'s rows; with a user filter, other users' jobs are
    counted, not named (the user's own ``squeue --me`` view)."""
    mine = set(user_jobs)
    nodes = []
    for r in rows:
        row = dict(r)
        if user is not None:
            jobs = [j for j in row["slurm_jobs"] if j in mine]
            row["other_jobs"] = len(row["slurm_jobs"]) - len(jobs)
            row["slurm_jobs"] = jobs
            row["reason"], row["problem"] = (hide_other_jobs(row[k], mine) for k in ("reason", "problem"))
        else:
            row["other_jobs"] = 0
        nodes.append(row)
    counts = dict(Counter(r["phase"] for r in nodes))
    return {"now": now, "now_text": iso(now), "user": user, "phases": counts, "nodes": nodes}


def hide_other_jobs(text: str | None, mine: AbstractSet[str]) -> str | None:
    """``text`` with the ids it names after "job"/"jobs" that are not ``mine`` replaced by
    ``OTHER_JOB``: a node's reason names the jobs on it, other users' included."""
    if not text:
        return text
    return _JOBS_NAMED.sub(
        lambda m: m.group(1) + ", ".join(j if j in mine else OTHER_JOB for j in m.group(2).split(", ")), text)


def outlook_chart_rows(hours: Sequence[HourOutlook]) -> list[dict[str, Any]]:
    """One row per hour ahead for the chart and its table."""
    return [
        {
            "start": h.start,
            "label": datetime.fromtimestamp(h.start, UTC).strftime("%a %H:%M"),
            "demand": None if h.demand is None else round(h.demand, 2),
            "serving": h.serving_nodes,
            "lendable": h.lendable_nodes,
            "basis": h.basis or None,
            "held": h.held or None,
        }
        for h in hours
    ]


def job_doc(
    job_id: str,
    job: SlurmJobInfo | None,
    preemptions: Sequence[Preemption],
    *,
    now: float,
    grace_s: float,
    outlook: Sequence[HourOutlook] | None,
) -> dict[str, Any]:
    """A job's page: its state now (squeue), where it runs, each preemption the daemon recorded
    (its Events), the work a preemption would cost now, and when it may start while pending."""
    mine = sorted((p for p in preemptions if p.job_id == job_id), key=lambda p: p.t)
    if job is None and not mine:
        raise BadInput(404, f"job {job_id}: not in squeue's preemptible partition and no preemption of it recorded")
    doc: dict[str, Any] = {"job_id": job_id, "now": now, "now_text": iso(now)}
    if job is None:
        doc.update(state="ended", active=False, note="no longer in squeue: it finished, was cancelled, or is older than squeue keeps")
    else:
        running = job.state == "running"
        doc.update(
            state=job.state,
            active=True,
            name=job.name,
            user=job.user,
            partition=job.partition,
            nodes=list(job.nodes),
            gpus=job.gpus_per_node * max(1, len(job.nodes)),
            requeues=job.restart_count,
            started=iso(job.start_time) if running else None,
            last_checkpoint=iso(job.checkpoint_time),
            state_reason=job.state_reason or None,
            requeueable=job.requeueable,
            at_risk_gpu_hours=round(job_loss_gpu_hours(job, now, grace_s), 3) if running else None,
            being_preempted=job.preempt_time is not None and job.state in ("running", "completing"),
            preempted_at=iso(job.preempt_time),
            grace_ends=iso(job.end_time) if job.preempt_time is not None else None,
        )
        if job.state == "pending":
            slurm_est = job.start_time if job.start_time is not None and job.start_time > now else None
            doc["slurm_expected_start"] = iso(slurm_est)
            need = max(1, len(job.nodes))
            w = first_free_window(outlook, need, 1.0) if outlook else None
            doc["forecast_nodes_needed"] = need
            doc["forecast_free_from"] = iso(max(w.start, now)) if w is not None else None
            doc["forecast_known"] = outlook is not None
    doc["preemptions"] = [
        {
            "time": iso(p.t),
            "t": p.t,
            "node": p.node,
            "grace_s": p.grace_s,
            "requeued": True,
            "lost_gpu_hours": round(p.lost_gpu_hours, 3),
            "checkpoint": iso(p.checkpoint_time),
        }
        for p in mine
    ]
    doc["lost_gpu_hours_total"] = round(sum(p.lost_gpu_hours for p in mine), 3)
    return doc


def jobs_doc(jobs: Sequence[SlurmJobInfo], preemptions: Sequence[Preemption], *, now: float, user: str | None) -> dict[str, Any]:
    """The job list: the preemptible partition as squeue shows it (one user's with a filter)."""
    count = Counter(p.job_id for p in preemptions)
    rows = [
        {
            "job_id": j.job_id,
            "name": j.name,
            "user": j.user,
            "state": j.state,
            "nodes": list(j.nodes),
            "requeues": j.restart_count,
            "preemptions_recorded": count.get(j.job_id, 0),
        }
        for j in sorted(jobs, key=lambda j: (j.state != "running", _job_key(j.job_id)))
        if user is None or j.user == user
    ]
    return {"now": now, "now_text": iso(now), "user": user, "jobs": rows}


def _job_key(job_id: str) -> tuple[int, int]:
    head, _, tail = job_id.partition("_")
    return int(head), int(tail or 0)


def history_doc(pool: str, hist: DaemonHistory, *, days: float, now: float) -> dict[str, Any]:
    """The history page: per step, lends, reclaims, nodes lent and the SLO budget spent, from
    Prometheus' record of the daemon's own metrics; totals per day."""
    s = hist.series
    steps: list[dict[str, float | None]] = []
    for i in range(len(s["lent"])):
        steps.append({k: None if math.isnan(s[k][i]) else round(s[k][i], 3) for k in s} | {"t": hist.t(i)})
    per_day: dict[str, dict[str, float]] = {}
    for row in steps:
        day = datetime.fromtimestamp(float(row["t"] or 0.0), UTC).strftime("%Y-%m-%d")
        d = per_day.setdefault(day, {"lends": 0.0, "reclaims": 0.0, "slo_spent": 0.0})
        d["lends"] += row["lends"] or 0.0
        d["reclaims"] += row["reclaims"] or 0.0
        d["slo_spent"] = max(d["slo_spent"], row["slo_spent"] or 0.0)
    known = [r for r in steps if r["lent"] is not None]
    return {
        "pool": pool,
        "now": now,
        "now_text": iso(now),
        "days": days,
        "step_s": hist.step_s,
        "known_steps": len(known),
        "days_table": [
            {"day": k, "lends": round(v["lends"]), "reclaims": round(v["reclaims"]), "slo_spent": round(v["slo_spent"], 3)}
            for k, v in sorted(per_day.items())
        ],
        "lends_total": round(sum(r["lends"] or 0.0 for r in steps)),
        "reclaims_total": round(sum(r["reclaims"] or 0.0 for r in steps)),
        "slo_spent_now": next((r["slo_spent"] for r in reversed(steps) if r["slo_spent"] is not None), None),
        "steps": steps,
    }
