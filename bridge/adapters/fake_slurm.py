"""An honest in-memory Slurm for tests and the daemon's fast loop tests.

It keeps Slurm's rules that gpu-bridge depends on: a DRAINed node starts no job (the hold
job included); a hold job in the high-tier partition preempts the research jobs on its
node, which are requeued (never cancelled) after GraceTime, and then runs; a resumed node
runs pending research jobs; only drains with gpu-bridge's reason are resumed. Time moves
only through ``step(now)``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from bridge import wellknown as wk
from bridge.adapters.slurm.types import SlurmJobInfo, SlurmNode
from bridge.errors import AdapterError


@dataclass
class _Node:
    name: str
    drain: bool = False
    reason: str = ""
    down: bool = False


@dataclass
class _Job:
    job_id: str
    name: str
    partition: str
    nodes_wanted: int = 1
    pin: str | None = None  # -w NODE
    state: str = "pending"
    nodes: tuple[str, ...] = ()
    start_time: float | None = None
    preempted_at: float | None = None
    restarts: int = 0
    duration_s: float = 3600.0
    finished_at: float | None = None


@dataclass
class FakeSlurm:
    """SlurmReader + SlurmWriter in memory (the subset the daemon uses)."""

    node_names: tuple[str, ...]
    grace_s: float = 10.0
    now: float = 0.0
    fail: bool = False  # every call raises: slurmctld down
    _nodes: dict[str, _Node] = field(default_factory=dict)
    _jobs: dict[str, _Job] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    requeued: list[str] = field(default_factory=list)
    cancelled_research: list[str] = field(default_factory=list)  # must stay empty

    def __post_init__(self) -> None:
        self._nodes = {n: _Node(n) for n in self.node_names}

    # --- outside actions (researchers, admins) ------------------------------------------
    def sbatch(self, name: str, *, nodes: int = 1, duration_s: float = 3600.0) -> str:
        jid = str(next(self._ids))
        self._jobs[jid] = _Job(jid, name, wk.SLURM_PREEMPT_PARTITION, nodes_wanted=nodes, duration_s=duration_s)
        self._schedule()
        return jid

    def admin_drain(self, node: str, reason: str) -> None:
        self._nodes[node].drain, self._nodes[node].reason = True, reason

    def job(self, job_id: str) -> _Job:
        return self._jobs[job_id]

    def step(self, now: float) -> None:
        self.now = now
        for j in self._jobs.values():
            if j.state == "running" and j.partition == wk.SLURM_PREEMPT_PARTITION:
                if j.preempted_at is not None and now >= j.preempted_at + self.grace_s:
                    self._requeue(j)
                elif j.start_time is not None and now >= j.start_time + j.duration_s:
                    j.state, j.finished_at = "completed", now
        self._schedule()

    # --- scheduling ---------------------------------------------------------------------
    def _busy(self) -> dict[str, _Job]:
        return {n: j for j in self._jobs.values() if j.state == "running" for n in j.nodes}

    def _schedule(self) -> None:
        # holds first (higher PriorityTier), then research in submission order
        pending = sorted(
            (j for j in self._jobs.values() if j.state == "pending"),
            key=lambda j: (j.partition != wk.SLURM_HOLD_PARTITION, int(j.job_id)),
        )
        for j in pending:
            busy = self._busy()
            if j.partition == wk.SLURM_HOLD_PARTITION:
                node = self._nodes[j.pin or ""]
                if node.drain or node.down:
                    continue
                victim = busy.get(node.name)
                if victim is None:
                    j.state, j.nodes, j.start_time = "running", (node.name,), self.now
                elif victim.partition == wk.SLURM_PREEMPT_PARTITION and victim.preempted_at is None:
                    victim.preempted_at = self.now  # GraceTime starts
                continue
            free = [n for n in self.node_names if n not in busy and not self._nodes[n].drain and not self._nodes[n].down
                    and not any(h.state == "pending" and h.pin == n for h in self._jobs.values())]
            if len(free) >= j.nodes_wanted:
                j.state, j.nodes, j.start_time = "running", tuple(free[: j.nodes_wanted]), self.now

    def _requeue(self, j: _Job) -> None:
        j.state, j.nodes, j.start_time, j.preempted_at = "pending", (), None, None
        j.restarts += 1
        self.requeued.append(j.job_id)

    def _check(self) -> None:
        if self.fail:
            raise AdapterError("slurm", "squeue: Unable to contact slurm controller (connect failure)")

    # --- SlurmReader --------------------------------------------------------------------
    def nodes(self) -> tuple[SlurmNode, ...]:
        self._check()
        busy = self._busy()
        out = []
        for n in self._nodes.values():
            state = "down" if n.down else ("allocated" if n.name in busy else "idle")
            flags = frozenset({"DRAIN"} if n.drain else set())
            out.append(SlurmNode(n.name, state, flags, n.reason, gpus=4, gpus_used=4 if n.name in busy else 0))
        return tuple(out)

    def jobs(self) -> tuple[SlurmJobInfo, ...]:
        self._check()
        return tuple(
            SlurmJobInfo(
                job_id=j.job_id, name=j.name, user="root", partition=j.partition, state=j.state, nodes=j.nodes,
                start_time=j.start_time, restart_count=j.restarts,
            )
            for j in self._jobs.values()
            if j.state in ("pending", "running")
        )

    # --- SlurmWriter --------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> bool:
        self._check()
        n = self._nodes[node]
        text = f"{wk.SLURM_REASON_PREFIX} {reason}"
        if n.drain and n.reason == text:
            return False
        n.drain, n.reason = True, text
        return True

    def resume(self, node: str) -> bool:
        self._check()
        n = self._nodes[node]
        if not n.drain:
            return False
        if not n.reason.startswith(wk.SLURM_REASON_PREFIX):
            raise AdapterError("slurm", f"{node}: drained by someone else ({n.reason!r}); not resuming it")
        n.drain, n.reason = False, ""
        self._schedule()
        return True

    def submit_hold(self, node: str) -> str:
        self._check()
        jid = str(next(self._ids))
        self._jobs[jid] = _Job(jid, f"{wk.SLURM_HOLD_JOB_PREFIX}{node}", wk.SLURM_HOLD_PARTITION, pin=node)
        self._schedule()
        return jid

    def cancel_hold(self, node: str) -> tuple[str, ...]:
        self._check()
        gone = []
        for j in self._jobs.values():
            if j.partition == wk.SLURM_HOLD_PARTITION and j.pin == node and j.state in ("pending", "running"):
                j.state = "cancelled"
                gone.append(j.job_id)
        self._schedule()
        return tuple(gone)

    def requeue(self, job_id: str) -> bool:
        self._check()
        j = self._jobs[job_id]
        if j.state != "running":
            return False
        self._requeue(j)
        self._schedule()
        return True

    def research_on(self, node: str) -> list[str]:
        return [j.job_id for j in self._jobs.values() if j.state == "running"
                and j.partition == wk.SLURM_PREEMPT_PARTITION and node in j.nodes]

    def snapshot_jobs(self) -> dict[str, _Job]:
        return {k: replace(v) for k, v in self._jobs.items()}
