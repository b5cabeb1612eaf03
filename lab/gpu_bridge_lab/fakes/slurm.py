"""An in-memory Slurm implementing SlurmReader + SlurmWriter with the real one's rules, for
the daemon's tests (no MagicMock of our own code): drains carry reasons and only ours are
lifted; a hold job cannot start on a drained node or while research jobs run there; a hold
preempts research jobs with GraceTime, after which they are requeued (pending, restart+1);
lookups can be made to fail. Time is driven by the caller (``now``/``advance``).

Memory as a consumable resource (CR_Core_Memory), for warm lending's memory hold
(``gpu-bridge-warm:<node>``, 1 CPU, no GPU): a research job runs beside it only if its ``--mem``
fits in what the hold leaves; a pending memory hold preempts research jobs that leave it too
little; and, as slurmctld does (tests/integration/test_warm_memory_hold.py), the whole-node
serving hold neither starts nor preempts anything while a memory hold runs on its node.

Behaviour mirrored from the sandbox (Slurm 22.05): preemption is decided at once; the victim is
requeued when the grace is over and slurmctld notices (``requeue_lag_s``, up to 30 s there;
0 by default), or at once by ``requeue``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from bridge import wellknown
from bridge.errors import AdapterError
from bridge.names import validate_job_id, validate_node_name

from bridge.adapters.slurm.cli import NotOursError, admins_down, drain_reason, hold_job_name, mem_hold_job_name, validate_mem_mb
from bridge.adapters.protocols import RequeueOutcome, SlurmAdapterProtocol, SlurmReader
from bridge.adapters.slurm.types import SlurmJobInfo, SlurmNode


def holds_of(slurm: SlurmReader) -> dict[str, SlurmJobInfo]:
    """node -> the oldest active hold job for it (the hold partition, the hold job's name), from
    ``slurm.jobs``, real or fake: what the tests and the fake ask. The daemon tells holds from
    research jobs in ``bridge.observe`` (with ``slurm.hold_user``)."""
    out: dict[str, SlurmJobInfo] = {}
    for j in sorted(slurm.jobs(partition=wellknown.SLURM_HOLD_PARTITION), key=lambda j: int(j.job_id.split("_")[0])):
        if j.hold_node:
            out.setdefault(j.hold_node, j)
    return out


@dataclass
class _Node:
    name: str
    gpus: int = 4
    drained: bool = False
    down: bool = False
    responding: bool = True
    reason: str = ""
    reason_user: str = ""
    tiers: tuple[str, ...] | None = None  # its preempt partitions when set by set_tier; None: slurm.conf's (all)
    memory_mb: int = 16000  # RealMemory


@dataclass
class _Job:
    job_id: str
    name: str
    user: str
    partition: str
    state: str  # pending | running
    node: str | None  # pinned node (-w) or None
    nodes: tuple[str, ...] = ()
    start_time: float | None = None
    preempt_time: float | None = None
    end_time: float | None = None
    restart_count: int = 0
    requeueable: bool = True
    comment: str = ""
    gpus: int = 4
    held_reason: str = ""  # Slurm's own hold (priority 0), e.g. launch_failed_requeued_held
    mem_mb: int = 0  # --mem (0: DefMemPerCPU's small share)


@dataclass
class FakeSlurm:
    grace_s: float = 10.0
    now: float = 1_000_000.0
    requeue_lag_s: float = 0.0
    bridge_user: str = "root"
    fast_partition: str | None = None  # a second preempt partition (the fast-grace tier) over the same nodes
    fast_grace_s: float = 4.0
    _nodes: dict[str, _Node] = field(default_factory=dict)
    _jobs: dict[str, _Job] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    fail: dict[str, AdapterError] = field(default_factory=dict)  # method name -> error raised (until removed)
    writes: list[tuple[str, str]] = field(default_factory=list)  # (intent, node or job) actually written
    # calls of requeue_jobs (each one re-read of its jobs and one requeue, as CliSlurm makes them),
    # of drain_nodes (one read of its nodes) and of drain (one read of its node)
    calls: Counter[str] = field(default_factory=Counter)

    # ---- set-up helpers (the test's "outside world") -----------------------------------
    def add_node(self, name: str, gpus: int = 4, memory_mb: int = 16000) -> None:
        self._nodes[validate_node_name(name)] = _Node(name, gpus, memory_mb=memory_mb)

    def add_job(self, node: str | None = None, *, name: str = "research", user: str = "alice",
                requeueable: bool = True, comment: str = "", partition: str = wellknown.SLURM_PREEMPT_PARTITION,
                mem_mb: int = 0) -> str:
        """A research job in the preempt partition (or ``partition``), started at once on ``node`` if given and free."""
        jid = str(next(self._ids))
        self._jobs[jid] = _Job(jid, name, user, partition, "pending", node,
                               requeueable=requeueable, comment=comment, mem_mb=mem_mb)
        self._schedule()
        return jid

    def admin_drain(self, node: str, reason: str, user: str = "admin") -> None:
        n = self._nodes[node]
        n.drained, n.reason, n.reason_user = True, reason, user

    def duplicate_start(self, job_id: str) -> None:
        """What slurmctld does after a SIGKILL lost a job's start and it starts the job again on
        the node where the first run goes on: the node drained "Duplicate jobid", the first run
        killed, the job requeued held (launch_failed_requeued_held)."""
        j = self._jobs[job_id]
        node = j.nodes[0]
        self._requeue(j)
        j.held_reason = "launch failed requeued held"  # state_desc, as 22.05 has it
        n = self._nodes[node]
        n.drained, n.reason, n.reason_user = True, "Duplicate jobid", "slurm"
        self._schedule()

    def admin_down(self, node: str, reason: str, user: str = "admin") -> None:
        """An administrator's ``scontrol update State=DOWN Reason=...``."""
        n = self._nodes[node]
        n.down, n.reason, n.reason_user = True, reason, user

    def set_responding(self, node: str, responding: bool) -> None:
        """A dead slurmd: its running jobs are requeued, as slurmctld does for a DOWN node
        (which keeps a reason already set: a drain's, an administrator's DOWN)."""
        n = self._nodes[node]
        n.responding = responding
        if not responding:
            n.reason = n.reason if (n.drained or n.reason) else "Not responding"
            for j in self._running_on(node):
                self._requeue(j)
        elif not n.drained and not n.down:
            n.reason = ""
        self._schedule()

    def finish(self, job_id: str) -> None:
        self._jobs.pop(job_id)
        self._schedule()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self._tick()

    # ---- internals ---------------------------------------------------------------------
    def _check(self, method: str) -> None:
        if method in self.fail:
            raise self.fail[method]

    def _running_on(self, node: str) -> list[_Job]:
        return [j for j in self._jobs.values() if j.state == "running" and node in j.nodes]

    def _is_hold(self, j: _Job) -> bool:
        return j.partition == wellknown.SLURM_HOLD_PARTITION and j.name.startswith(wellknown.SLURM_HOLD_JOB_PREFIX)

    def _is_mem_hold(self, j: _Job) -> bool:
        return j.partition == wellknown.SLURM_WARM_PARTITION and j.name.startswith(wellknown.SLURM_WARM_HOLD_JOB_PREFIX)

    def _mem_free(self, node: str) -> int:
        return self._nodes[node].memory_mb - sum(j.mem_mb for j in self._running_on(node))

    def _requeue(self, j: _Job) -> None:
        j.state, j.nodes, j.start_time, j.preempt_time, j.end_time = "pending", (), None, None, None
        j.restart_count += 1

    def _tick(self) -> None:
        for j in list(self._jobs.values()):
            if j.state == "running" and j.end_time is not None and self.now >= j.end_time + self.requeue_lag_s:
                self._requeue(j)
        self._schedule()

    def _usable(self, n: _Node) -> bool:
        return not n.drained and not n.down and n.responding

    def _schedule(self) -> None:
        # holds first (higher PriorityTier): preempt research jobs on their node
        for h in [j for j in self._jobs.values() if self._is_hold(j) and j.state == "pending"]:
            n = self._nodes[h.node or ""]
            if not self._usable(n):
                continue  # ReqNodeNotAvail
            busy = self._running_on(n.name)
            if any(self._is_mem_hold(j) for j in busy):
                continue  # the whole node can never be its while a memory hold runs: no preemption either
            if busy:
                for v in busy:
                    if v.preempt_time is None:
                        grace = self.fast_grace_s if v.partition == self.fast_partition else self.grace_s
                        v.preempt_time, v.end_time = self.now, self.now + grace
                continue
            h.state, h.nodes, h.start_time = "running", (n.name,), self.now
        # memory holds (top tier, never preempted): beside research jobs while the memory fits,
        # else they preempt them; never beside a serving hold (it takes the whole node)
        for h in [j for j in self._jobs.values() if self._is_mem_hold(j) and j.state == "pending"]:
            n = self._nodes[h.node or ""]
            busy = self._running_on(n.name)
            if not self._usable(n) or any(self._is_hold(j) for j in busy):
                continue
            if h.mem_mb > self._mem_free(n.name):
                for v in busy:
                    if v.preempt_time is None:
                        v.preempt_time, v.end_time = self.now, self.now + self.grace_s
                continue
            h.state, h.nodes, h.start_time = "running", (n.name,), self.now
        for j in sorted((j for j in self._jobs.values()
                         if not self._is_hold(j) and not self._is_mem_hold(j) and j.state == "pending" and not j.held_reason),
                        key=lambda j: int(j.job_id)):
            cands = [j.node] if j.node else sorted(self._nodes)
            for c in cands:
                n = self._nodes[c]
                held = any((self._is_hold(h) or (self._is_mem_hold(h) and h.state == "pending")) and h.node == c
                           for h in self._jobs.values())
                others = [r for r in self._running_on(c) if not self._is_mem_hold(r)]
                if (self._usable(n) and not others and not held and j.partition in self._tiers(n)
                        and j.mem_mb <= self._mem_free(c)):
                    j.state, j.nodes, j.start_time = "running", (c,), self.now
                    break

    def _tiers(self, n: _Node) -> tuple[str, ...]:
        every = (wellknown.SLURM_PREEMPT_PARTITION,) + ((self.fast_partition,) if self.fast_partition else ())
        return every if n.tiers is None else n.tiers

    def _info(self, j: _Job) -> SlurmJobInfo:
        from bridge.adapters.slurm.parse import checkpoint_time, signal_save_s

        return SlurmJobInfo(
            job_id=j.job_id, name=j.name, user=j.user, partition=j.partition, state=j.state, nodes=j.nodes,
            start_time=j.start_time, checkpoint_time=checkpoint_time(j.comment), signal_save_s=signal_save_s(j.comment),
            requeueable=j.requeueable,
            gpus_per_node=j.gpus, restart_count=j.restart_count, preempt_time=j.preempt_time, end_time=j.end_time,
            batch_host=j.nodes[0] if j.nodes else "", state_reason="JobHeldAdmin" if j.held_reason else "",
            state_description=j.held_reason,
        )

    def _node_info(self, n: _Node) -> SlurmNode:
        busy = self._running_on(n.name)
        gpu_jobs = [j for j in busy if not self._is_mem_hold(j)]
        state = "down" if (n.down or not n.responding) else ("allocated" if gpu_jobs else "mixed" if busy else "idle")
        flags = set()
        if n.drained:
            flags.add("DRAIN")
        if not n.responding:
            flags.add("NOT_RESPONDING")
        return SlurmNode(name=n.name, state=state, flags=frozenset(flags), reason=n.reason, gpus=n.gpus,
                         gpus_used=n.gpus if gpu_jobs else 0,
                         partitions=tuple(sorted((*self._tiers(n), wellknown.SLURM_HOLD_PARTITION))),
                         reason_user=n.reason_user)

    # ---- SlurmReader -------------------------------------------------------------------
    def ping(self) -> None:
        self._check("ping")

    def nodes(self, names: Iterable[str] | None = None) -> tuple[SlurmNode, ...]:
        self._check("nodes")
        wanted = sorted(self._nodes) if names is None else sorted({validate_node_name(n) for n in names})
        missing = [n for n in wanted if n not in self._nodes]
        if missing:
            raise AdapterError("slurm", f"sinfo --json: unknown node(s) {', '.join(missing)}")
        return tuple(self._node_info(self._nodes[n]) for n in wanted)

    def node(self, name: str) -> SlurmNode:
        return self.nodes([name])[0]

    def clock(self) -> float:
        self._check("clock")
        return self.now

    def grace_time_s(self, partition: str) -> float:
        self._check("grace_time_s")
        if partition not in (wellknown.SLURM_PREEMPT_PARTITION, wellknown.SLURM_HOLD_PARTITION, self.fast_partition):
            raise AdapterError("slurm", f"scontrol show partition {partition}: Partition {partition} not found")
        if partition == self.fast_partition:
            return self.fast_grace_s
        return self.grace_s if partition == wellknown.SLURM_PREEMPT_PARTITION else 0.0

    def jobs(self, *, partition: str | None = None, node: str | None = None,
             states: Iterable[str] | None = None) -> tuple[SlurmJobInfo, ...]:
        self._check("jobs")
        if node is not None:
            validate_node_name(node)
        want = None if states is None else {s.lower() for s in states}
        out = [self._info(j) for j in sorted(self._jobs.values(), key=lambda j: int(j.job_id))]
        return tuple(j for j in out if (partition is None or j.partition == partition)
                     and (node is None or node in j.nodes) and (want is None or j.state in want))

    # ---- SlurmWriter -------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> bool:
        self._check("drain")
        self.calls["drain"] += 1
        return self._drain(node, reason)

    def drain_nodes(self, reasons: Mapping[str, str]) -> dict[str, bool | AdapterError]:
        """Each node through ``drain``'s rules after one read of them all (an unknown node fails
        it, as ``scontrol show node`` does: nothing written)."""
        self._check("drain_nodes")
        self.calls["drain_nodes"] += 1
        self.nodes(reasons)
        return {n: self._drain(n, r) for n, r in reasons.items()}

    def _drain(self, node: str, reason: str) -> bool:
        cur = self.node(node)
        text = drain_reason(reason)
        if cur.drained and (cur.reason == text or not cur.reason_ours):
            return False
        if admins_down(cur):
            return False
        n = self._nodes[node]
        n.drained, n.reason, n.reason_user = True, text, self.bridge_user
        self.writes.append(("drain", node))
        return True

    def resume(self, node: str) -> bool:
        self._check("resume")
        cur = self.node(node)
        if not cur.drained:
            return False
        if not cur.reason_ours:
            raise NotOursError("slurm", f"resume {node}: drained by someone else ({cur.reason!r}): refusing")
        n = self._nodes[node]
        n.drained, n.reason, n.reason_user = False, "", ""
        self.writes.append(("resume", node))
        self._schedule()
        return True

    def submit_hold(self, node: str) -> str:
        self._check("submit_hold")
        name = hold_job_name(node)
        if node not in self._nodes:
            raise AdapterError("slurm", f"sbatch failed (rc 1): invalid node name specified {node}")
        existing = holds_of(self).get(node)
        if existing is not None:
            return existing.job_id
        jid = str(next(self._ids))
        self._jobs[jid] = _Job(jid, name, self.bridge_user, wellknown.SLURM_HOLD_PARTITION, "pending", node, gpus=0)
        self.writes.append(("submit_hold", node))
        self._schedule()
        return jid

    def submit_holds(self, nodes: Collection[str]) -> dict[str, str | AdapterError]:
        """Each node through ``submit_hold`` (its failure, injected or Slurm's, is its outcome)."""
        self._check("submit_holds")
        self.calls["submit_holds"] += 1
        out: dict[str, str | AdapterError] = {}
        for node in nodes:
            try:
                out[node] = self.submit_hold(node)
            except AdapterError as exc:
                out[node] = exc
        return out

    def cancel_hold(self, node: str) -> tuple[str, ...]:
        return self._cancel_ours(node, mem=False)

    def _cancel_ours(self, node: str, *, mem: bool) -> tuple[str, ...]:
        write = "cancel_mem_hold" if mem else "cancel_hold"
        self._check(write)
        name, ours = (mem_hold_job_name(node), self._is_mem_hold) if mem else (hold_job_name(node), self._is_hold)
        ids = tuple(j.job_id for j in self._jobs.values() if ours(j) and j.name == name)
        for jid in ids:
            del self._jobs[jid]
        if ids:
            self.writes.append((write, node))
        self._schedule()
        return ids

    def submit_mem_hold(self, node: str, mem_mb: int) -> str:
        self._check("submit_mem_hold")
        name, mb = mem_hold_job_name(node), validate_mem_mb(mem_mb)
        if node not in self._nodes:
            raise AdapterError("slurm", f"sbatch failed (rc 1): invalid node name specified {node}")
        existing = next((j for j in self._jobs.values() if self._is_mem_hold(j) and j.name == name), None)
        if existing is not None:
            return existing.job_id
        jid = str(next(self._ids))
        self._jobs[jid] = _Job(jid, name, self.bridge_user, wellknown.SLURM_WARM_PARTITION, "pending", node, gpus=0, mem_mb=mb)
        self.writes.append(("submit_mem_hold", node))
        self._schedule()
        return jid

    def cancel_mem_hold(self, node: str) -> tuple[str, ...]:
        return self._cancel_ours(node, mem=True)

    def requeue(self, job_id: str, *, restart_count: int | None = None) -> bool:
        self._check("requeue")
        jid = validate_job_id(job_id)
        j = self._jobs.get(jid)
        if j is not None and (self._is_hold(j) or self._is_mem_hold(j)):
            raise NotOursError("slurm", f"requeue {jid}: it is a hold job, not a research job")
        if j is None or j.state != "running" or j.partition not in (wellknown.SLURM_PREEMPT_PARTITION, self.fast_partition):
            return False
        if j.preempt_time is None or (restart_count is not None and j.restart_count != restart_count):
            return False  # not preempted by Slurm, or another run than the one preempted
        if not j.requeueable:
            raise AdapterError("slurm", "scontrol requeue failed (rc 1): Requested operation is presently disabled")
        self._requeue(j)
        self.writes.append(("requeue", jid))
        self._schedule()
        return True

    def requeue_jobs(self, jobs: Mapping[str, int | None]) -> dict[str, RequeueOutcome]:
        """Each job through ``requeue``'s rules (the re-read and requeue being one call each)."""
        self._check("requeue_jobs")
        self.calls["requeue_jobs"] += 1
        out = {}
        for jid, restart_count in jobs.items():
            try:
                done = self.requeue(jid, restart_count=restart_count)
            except AdapterError as exc:
                out[jid] = RequeueOutcome(jid, False, error=exc)
            else:
                out[jid] = RequeueOutcome(jid, done, skipped="" if done else "not running preempted in that run")
        return out

    def set_tier(self, node: str, partition: str) -> bool:
        self._check("set_tier")
        n = self._nodes[validate_node_name(node)]
        if self.fast_partition is None or partition not in (wellknown.SLURM_PREEMPT_PARTITION, self.fast_partition):
            raise AdapterError("slurm", f"set_tier {node}: {partition!r} is not a tier partition")
        if self._tiers(n) == (partition,):
            return False
        n.tiers = (partition,)
        self.writes.append(("set_tier", node))
        self._schedule()
        return True

    def release(self, job_id: str, reason: str) -> bool:
        self._check("release")
        j = self._jobs.get(validate_job_id(job_id))
        if j is not None and (self._is_hold(j) or self._is_mem_hold(j)):
            raise NotOursError("slurm", f"release {job_id}: it is a hold job, not a research job")
        if j is None or not self._info(j).held_for(reason):
            return False
        j.held_reason = ""
        self.writes.append(("release", j.job_id))
        self._schedule()
        return True

    def _own_drain(self, node: str, slurm_reason: str, *, empty: bool = True) -> bool:
        cur = self.node(node)
        held = any(self._is_hold(h) and h.state == "running" and node in h.nodes for h in self._jobs.values())
        return (cur.drained and not cur.reason_ours and wellknown.is_slurm_reason(cur.reason, slurm_reason)
                and not cur.down and not (empty and (cur.allocated or held)))

    def clear_own_drain(self, node: str, slurm_reason: str) -> bool:
        self._check("clear_own_drain")
        if not self._own_drain(node, slurm_reason):
            return False
        n = self._nodes[node]
        n.drained, n.reason, n.reason_user = False, "", ""
        self.writes.append(("clear_own_drain", node))
        self._schedule()
        return True

    def take_over_drain(self, node: str, slurm_reason: str, reason: str) -> bool:
        self._check("take_over_drain")
        if not self._own_drain(node, slurm_reason, empty=False):
            return False
        n = self._nodes[node]
        n.reason, n.reason_user = drain_reason(reason), self.bridge_user
        self.writes.append(("take_over_drain", node))
        return True

    def snapshot(self) -> dict[str, SlurmJobInfo]:
        """Every job by id (tests)."""
        return {j.job_id: replace(self._info(j)) for j in self._jobs.values()}


def _conforms(fake: FakeSlurm) -> SlurmAdapterProtocol:
    """Never called: ``mypy --strict`` checks here that the fake implements the contract it
    stands in for (tests/unit/test_static_checks.py)."""
    return fake
