"""What the Slurm adapter returns: plain frozen values (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from bridge import wellknown
from bridge.model import JOB_STATES_HOLDING_NODES, JOB_STATES_WAITING, SlurmJob

# Base node states as Slurm prints them (lowercase); anything else is a flag.
BASE_STATES = frozenset(
    {"idle", "mixed", "allocated", "down", "error", "future", "unknown", "planned"}
)
ACTIVE_JOB_STATES = JOB_STATES_HOLDING_NODES | JOB_STATES_WAITING  # the states known not to have ended


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as slurmctld reports it.

    ``state`` is the base state (lowercase: idle, mixed, allocated, down, ...); ``flags`` the
    uppercase state flags (DRAIN, NOT_RESPONDING, COMPLETING, MAINT, ...). ``reason_ours``:
    the reason starts with the bridge's prefix (``gpu-bridge:``), so the bridge set the drain.
    """

    name: str
    state: str
    flags: frozenset[str]
    reason: str
    gpus: int
    gpus_used: int = 0
    partitions: tuple[str, ...] = ()
    reason_user: str = ""
    reason_time: float | None = None

    @property
    def reason_ours(self) -> bool:
        return self.reason.startswith(wellknown.SLURM_REASON_PREFIX)

    @property
    def drained(self) -> bool:
        """DRAIN set: no new job starts (running ones continue: "draining")."""
        return "DRAIN" in self.flags

    @property
    def drained_by_us(self) -> bool:
        return self.drained and self.reason_ours

    @property
    def drained_by_other(self) -> bool:
        return self.drained and not self.reason_ours

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def down(self) -> bool:
        """DOWN, FAIL or not responding: jobs cannot run there now."""
        return self.state == "down" or not self.responding or "FAIL" in self.flags

    @property
    def allocated(self) -> bool:
        """Some job (ours or research) holds resources, or is still completing, on the node."""
        return self.state in ("allocated", "mixed") or "COMPLETING" in self.flags


@dataclass(frozen=True, slots=True)
class SlurmJobInfo(SlurmJob):
    """A SlurmJob plus what the reclaim path needs: preemption and (grace) end times."""

    preempt_time: float | None = None  # when Slurm decided to preempt it (GraceTime started)
    end_time: float | None = None  # for a preempted job: preempt_time + GraceTime
    state_reason: str = ""
    batch_host: str = ""
    state_description: str = ""  # Slurm's free text (state_desc), e.g. "launch failed requeued held"

    def held_for(self, reason: str) -> bool:
        """Pending for ``reason``, as squeue's %r shows it (state_desc with spaces as "_", else
        the reason code): Slurm 22.05 puts "launch failed requeued held" in state_desc."""
        want = _norm(reason)
        return self.state == "pending" and want in (_norm(self.state_reason), _norm(self.state_description))

    def grace_over(self, now: float) -> bool:
        """A preempted job's EndTime (PreemptTime + GraceTime, or its time limit if sooner) has
        certainly passed by ``now``: Slurm's times are whole seconds (truncated), so one second
        is added. For tools and tests; the daemon's own rule is ``bridge.lifecycle.past_grace``
        (the partition's GraceTime from PreemptTime, by slurmctld's clock)."""
        return self.preempt_time is not None and self.end_time is not None and now >= self.end_time + 1.0

    @property
    def is_hold(self) -> bool:
        return self.partition == wellknown.SLURM_HOLD_PARTITION and self.name.startswith(
            wellknown.SLURM_HOLD_JOB_PREFIX
        )

    @property
    def hold_node(self) -> str | None:
        """The node a hold job is for, from its name ``gpu-bridge-hold:<node>``."""
        return self.name[len(wellknown.SLURM_HOLD_JOB_PREFIX) :] if self.is_hold else None


def _norm(text: str) -> str:
    return "_".join(text.lower().split())
