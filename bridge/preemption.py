"""The daemon's record of one research job preempted by a reclaim: an Event on the node
(reason ``GpuBridgeJobPreempted``) whose message people read in ``kubectl describe node`` and
``gpu-bridge web`` reads back. Pure: the text is written and parsed here, in one place.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from bridge.wellknown import is_date

EVENT_REASON = "GpuBridgeJobPreempted"


@dataclass(frozen=True, slots=True)
class Preemption:
    """One preemption of one job, as the daemon decided it."""

    job_id: str
    node: str
    t: float  # unix s: when the reclaim preempting it started (the Event's time)
    grace_s: float  # Slurm GraceTime the job was given before its requeue
    lost_gpu_hours: float  # work since its last checkpoint (or start) thrown away
    checkpoint_time: float | None  # its last published checkpoint then; None = none published


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def preemption_message(*, job_id: str, node: str, grace_s: float, lost_gpu_hours: float, checkpoint_time: float | None) -> str:
    """The Event's message: one sentence, its numbers in a fixed form (``parse_preemption``).
    A checkpoint time no date can show (a job's comment is the job owner's text) is none."""
    ckpt = ("no checkpoint published" if checkpoint_time is None or not is_date(checkpoint_time)
            else f"last checkpoint {_iso(checkpoint_time)}")
    return (
        f"job {job_id} preempted to reclaim {node} for serving: GraceTime {grace_s:g} s, then requeued; "
        f"{lost_gpu_hours:.3f} GPU-h of work lost ({ckpt})"
    )


_MESSAGE = re.compile(
    r"^job (?P<job>[0-9]+(?:_[0-9]+)?) preempted to reclaim (?P<node>\S+) for serving: "
    r"GraceTime (?P<grace>[0-9.e+]+) s, then requeued; (?P<lost>[0-9.]+) GPU-h of work lost "
    r"\((?:last checkpoint (?P<ckpt>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)|no checkpoint published)\)$"
)


def parse_preemption(message: str, t: float) -> Preemption | None:
    """The preemption a ``preemption_message`` text describes (None: not one of ours). An Event's
    text is whatever its writer put there (anyone allowed to create Events can write one with
    this reason): numbers or a date it cannot read make it not one of ours, never an exception
    (``GraceTime 1..2 s`` raised ValueError, and every job page of the web view with it)."""
    m = _MESSAGE.match(message)
    if m is None:
        return None
    ckpt = m.group("ckpt")
    try:
        grace_s, lost = float(m.group("grace")), float(m.group("lost"))
        checkpoint = datetime.strptime(ckpt, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp() if ckpt else None
    except ValueError:
        return None
    if not (math.isfinite(grace_s) and math.isfinite(lost)):
        return None
    return Preemption(job_id=m.group("job"), node=m.group("node"), t=t, grace_s=grace_s, lost_gpu_hours=lost,
                      checkpoint_time=checkpoint)
