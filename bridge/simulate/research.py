"""The research side of the simulator: a Slurm preemptible partition on the lent nodes.

A backlog of jobs (a configurable mix of 1-4 node jobs, hours to a day long, with or
without periodic checkpoints) is kept at ``queue_depth`` pending jobs, so research demand
never runs out. Jobs start on free lent nodes in priority order (submit order; a requeued
job keeps its place) with EASY backfill: the first job that does not fit reserves the
earliest time enough nodes free up (from the running jobs' ends), and later jobs may jump
ahead only if they end before it or use nodes the reservation does not need.

Preemption (a reclaim of any node of a job) preempts the whole job: it is signalled at once,
its nodes stay occupied for the Slurm grace period, then it is requeued and can restart
anywhere from its last checkpoint. Work since that checkpoint (or since the run's start) is
*lost*; work up to it is *useful*. A job that checkpoints on the signal (``signal_save_s``
within the grace, as ``slurm_conf/examples/train-checkpointing.sbatch`` does) loses nothing. A job publishes its last checkpoint to the policy as
``SlurmJob.checkpoint_time`` (the ``gpu-bridge:checkpoint=<t>`` comment) when ``publishes``.

With a fast partition (``tiered``), jobs of ``fast`` classes run only on nodes lent to the
fast tier and the others only on normal-tier nodes, each tier with its own backlog; a
fast-tier preemption has the fast partition's grace.

Time here is simulation seconds; the engine adds the unix epoch when it builds views.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from bridge.errors import ConfigError


@dataclass(frozen=True, slots=True)
class JobClass:
    """One kind of research job in the mix."""

    name: str
    weight: float
    nodes: int  # 1..4 whole nodes
    min_hours: float
    max_hours: float
    checkpoint_s: float | None  # None: never checkpoints (a preemption loses the whole run)
    publishes: bool = True  # tells Slurm (the policy) its checkpoint time
    # seconds it needs to checkpoint when Slurm signals it at the start of GraceTime (the
    # slurm_conf/examples template); if that fits in the grace, a preemption loses nothing
    signal_save_s: float | None = None
    # submitted to the fast-grace partition (slurm.fast_partition): short or checkpointing
    # continuously; with no fast partition configured it runs in the normal one
    fast: bool = False


DEFAULT_MIX: tuple[JobClass, ...] = (
    JobClass("small-ckpt", 0.35, 1, 2.0, 8.0, 1800.0),
    JobClass("small-nockpt", 0.15, 1, 1.0, 4.0, None),
    JobClass("medium", 0.25, 2, 4.0, 12.0, 3600.0),
    JobClass("large", 0.15, 4, 8.0, 24.0, 7200.0),
    JobClass("large-silent", 0.10, 2, 6.0, 24.0, 3600.0, publishes=False),
)

# Both tiers: the default mix at 70 % of its weight, plus 30 % fast-tier jobs, half short
# (15 min to 1 h, no checkpoint) and half checkpointing continuously (every 10 min, and on the
# preemption signal within 10 s, inside the fast partition's grace).
TIERED_MIX: tuple[JobClass, ...] = tuple(
    JobClass(c.name, round(c.weight * 0.7, 6), c.nodes, c.min_hours, c.max_hours, c.checkpoint_s, c.publishes, c.signal_save_s)
    for c in DEFAULT_MIX
) + (
    JobClass("short-fast", 0.15, 1, 0.25, 1.0, None, fast=True),
    JobClass("ckpt-fast", 0.15, 1, 2.0, 8.0, 600.0, signal_save_s=10.0, fast=True),
)


@dataclass(frozen=True, slots=True)
class JobMix:
    classes: tuple[JobClass, ...] = DEFAULT_MIX
    queue_depth: int = 32  # pending jobs kept in the backlog (research demand never runs out)


def parse_job_mix(data: object, source: str = "job mix") -> JobMix:
    """A mix from parsed YAML/JSON: ``{queue_depth: 32, classes: [{name, weight, nodes,
    min_hours, max_hours, checkpoint_s, publishes}, ...]}``; every problem is reported."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: expected a mapping with 'classes', got {type(data).__name__}"])
    depth = data.get("queue_depth", 32)
    if not isinstance(depth, int) or depth < 1:
        problems.append(f"{source}: queue_depth: must be an integer >= 1, got {depth!r}")
    raw = data.get("classes")
    if not isinstance(raw, list) or not raw:
        problems.append(f"{source}: classes: must be a non-empty list, got {raw!r}")
        raise ConfigError(problems)
    known = {"name", "weight", "nodes", "min_hours", "max_hours", "checkpoint_s", "publishes", "signal_save_s", "fast"}
    classes: list[JobClass] = []
    for i, c in enumerate(raw):
        where = f"{source}: classes[{i}]"
        if not isinstance(c, dict):
            problems.append(f"{where}: expected a mapping, got {c!r}")
            continue
        for k in sorted(set(c) - known):
            problems.append(f"{where}.{k}: unknown key; expected one of {', '.join(sorted(known))}")
        name = str(c.get("name", f"class-{i}"))
        w, n, lo, hi = c.get("weight", 1.0), c.get("nodes"), c.get("min_hours"), c.get("max_hours")
        ck, pub, sig = c.get("checkpoint_s"), c.get("publishes", True), c.get("signal_save_s")
        fast = c.get("fast", False)
        valid = len(problems)  # the problems found before this class's own values
        if not isinstance(fast, bool):
            problems.append(f"{where}.fast: must be true or false, got {fast!r}")
        if sig is not None and (not isinstance(sig, (int, float)) or isinstance(sig, bool) or not sig >= 0):
            problems.append(f"{where}.signal_save_s: must be >= 0 or null, got {sig!r}")
        if not isinstance(w, (int, float)) or not w > 0:
            problems.append(f"{where}.weight: must be > 0, got {w!r}")
        if not isinstance(n, int) or not 1 <= n <= 64:
            problems.append(f"{where}.nodes: must be an integer 1..64, got {n!r}")
        for key, v in (("min_hours", lo), ("max_hours", hi)):
            if not isinstance(v, (int, float)) or not v > 0:
                problems.append(f"{where}.{key}: must be > 0, got {v!r}")
        if len(problems) == valid and hi < lo:  # type: ignore[operator]
            problems.append(f"{where}.max_hours: must be >= min_hours ({lo!r}), got {hi!r}")
        if ck is not None and (not isinstance(ck, (int, float)) or not ck > 0):
            problems.append(f"{where}.checkpoint_s: must be > 0 or null, got {ck!r}")
        if not isinstance(pub, bool):
            problems.append(f"{where}.publishes: must be true or false, got {pub!r}")
        if len(problems) == valid:
            classes.append(JobClass(
                name, float(w), int(n), float(lo), float(hi), None if ck is None else float(ck), pub,  # type: ignore[arg-type]
                None if sig is None else float(sig), fast,
            ))
    if problems:
        raise ConfigError(problems)
    return JobMix(tuple(classes), int(depth))


@dataclass(slots=True)
class Job:
    """A research job and its accounting (mutable: the simulator's own state)."""

    job_id: str
    seq: int  # priority: submit order
    cls: JobClass
    work_s: float  # run time it needs in total
    gpus_per_node: int
    done_s: float = 0.0  # progress saved (checkpointed) so far
    state: str = "pending"  # pending | running | completing | done
    nodes: tuple[str, ...] = ()
    run_start: float | None = None
    run_token: int = 0  # invalidates a scheduled completion after a preemption
    free_at: float = 0.0  # completing: when its nodes are free
    restarts: int = 0

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.cls.nodes

    def remaining_s(self) -> float:
        return max(0.0, self.work_s - self.done_s)

    def expected_end(self) -> float:
        assert self.run_start is not None
        return self.run_start + self.remaining_s()

    def last_checkpoint(self, now: float) -> float | None:
        """Time of this run's last checkpoint, None if none yet (or it never checkpoints)."""
        ck = self.cls.checkpoint_s
        if ck is None or self.run_start is None:
            return None
        k = math.floor((now - self.run_start) / ck + 1e-9)
        return self.run_start + k * ck if k >= 1 else None


# A preemption this soon after the job's (re)start counts as "early" (a requeued job that
# restarts on another lent node may be preempted again seconds later). Five minutes: a reporting
# threshold, the daemon's gpu_bridge_preempted_job_runtime_seconds has the whole distribution.
EARLY_PREEMPTION_S = 300.0


@dataclass(slots=True)
class Accounts:
    useful_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    preemptions: int = 0
    early_preemptions: int = 0  # preempted within EARLY_PREEMPTION_S of the run's start
    early_lost_gpu_s: float = 0.0  # the work those lost
    completed: int = 0
    started: int = 0


@dataclass(slots=True)
class Research:
    """Jobs on the lent nodes. The engine calls ``schedule`` whenever nodes may have freed,
    ``preempt`` on a reclaim and ``release`` when a completing job's grace ends."""

    mix: JobMix
    gpus_per_node: int
    rng: random.Random
    jobs: dict[str, Job] = field(default_factory=dict)
    pending: list[Job] = field(default_factory=list)  # kept sorted by seq
    running: dict[str, Job] = field(default_factory=dict)  # running + completing
    node_job: dict[str, str] = field(default_factory=dict)  # node -> job occupying it
    acct: Accounts = field(default_factory=Accounts)
    _seq: int = 0
    tiered: bool = False  # a fast partition exists: fast-class jobs run only on fast-tier nodes

    @classmethod
    def create(cls, mix: JobMix, gpus_per_node: int, seed: int, *, tiered: bool = False) -> "Research":
        r = cls(mix, gpus_per_node, random.Random(seed * 7919 + 17), tiered=tiered)
        r._refill()
        return r

    def is_fast(self, j: Job) -> bool:
        """The job runs in the fast partition (it asked for it, and there is one)."""
        return self.tiered and j.cls.fast

    # --- backlog -----------------------------------------------------------------------------

    def _new_job(self, fast: bool | None = None) -> Job:
        classes = self.mix.classes if fast is None else tuple(k for k in self.mix.classes if k.fast == fast)
        c = self.rng.choices(classes, weights=[k.weight for k in classes])[0]
        hours = self.rng.uniform(c.min_hours, c.max_hours)
        self._seq += 1
        j = Job(f"r{self._seq}", self._seq, c, hours * 3600.0, self.gpus_per_node)
        self.jobs[j.job_id] = j
        return j

    def _refill(self) -> None:
        if not self.tiered or all(c.fast == self.mix.classes[0].fast for c in self.mix.classes):
            while len(self.pending) < self.mix.queue_depth:
                self.pending.append(self._new_job())  # new jobs have the highest seq: append keeps order
            return
        # two partitions, two backlogs: each tier keeps its share of the queue depth (one
        # tier's jobs never crowd the other's out of the backlog)
        total = sum(c.weight for c in self.mix.classes)
        fast_depth = max(1, round(self.mix.queue_depth * sum(c.weight for c in self.mix.classes if c.fast) / total))
        for fast, depth in ((False, self.mix.queue_depth - fast_depth), (True, fast_depth)):
            have = sum(1 for j in self.pending if j.cls.fast == fast)
            for _ in range(depth - have):
                self.pending.append(self._new_job(fast))

    def pending_nodes(self, fast: bool | None = None) -> int:
        """Nodes' worth of pending jobs: all, or of one tier."""
        return sum(j.cls.nodes for j in self.pending if fast is None or self.is_fast(j) == fast)

    # --- scheduling --------------------------------------------------------------------------

    def schedule(self, now: float, free: Sequence[str], fast: bool = False) -> list[Job]:
        """Start what fits on ``free`` (lent nodes without a job, in a stable order), all of
        one tier: only that tier's jobs start there."""
        if not free or not self.pending:
            return []
        avail = list(free)
        started: list[Job] = []
        shadow: float | None = None  # reservation time of the first job that does not fit
        extra = 0  # nodes free at the reservation beyond what it needs
        keep: list[Job] = []
        for j in self.pending:
            n = j.cls.nodes
            if not avail or self.is_fast(j) != fast:
                keep.append(j)
                continue
            if shadow is None and n > len(avail):  # the first job that does not fit reserves
                shadow, extra = self._reservation(n, len(avail), fast)
                keep.append(j)
                continue
            if shadow is not None:  # backfill: ends before the reservation, or on nodes it does not need
                ends_first = now + j.remaining_s() <= shadow
                if n > len(avail) or not (ends_first or n <= extra):
                    keep.append(j)
                    continue
                if not ends_first:
                    extra -= n
            self._start(j, now, avail[:n])
            del avail[:n]
            started.append(j)
        self.pending = keep
        self._refill()
        return started

    def _reservation(self, need: int, free_now: int, fast: bool = False) -> tuple[float, int]:
        ends = sorted(
            (j.free_at if j.state == "completing" else j.expected_end(), len(j.nodes))
            for j in self.running.values()
            if self.is_fast(j) == fast
        )
        have = free_now
        for t, n in ends:
            have += n
            if have >= need:
                return t, have - need
        return math.inf, 0

    def _start(self, j: Job, now: float, nodes: Sequence[str]) -> None:
        j.state = "running"
        j.nodes = tuple(nodes)
        j.run_start = now
        j.run_token += 1
        self.running[j.job_id] = j
        for n in nodes:
            self.node_job[n] = j.job_id
        self.acct.started += 1

    # --- endings -----------------------------------------------------------------------------

    def complete(self, job_id: str, token: int, now: float) -> tuple[str, ...]:
        """A run reached its end (if ``token`` is still current). Returns the freed nodes."""
        j = self.jobs.get(job_id)
        if j is None or j.state != "running" or j.run_token != token:
            return ()
        assert j.run_start is not None
        self.acct.useful_gpu_s += (now - j.run_start) * j.gpus
        j.done_s = j.work_s
        j.state = "done"
        self.acct.completed += 1
        return self._vacate(j)

    def preempt(self, job_id: str, now: float, grace_s: float) -> bool:
        """Preempt a running job (requeue). Returns False if it was not running."""
        j = self.jobs.get(job_id)
        if j is None or j.state != "running":
            return False
        assert j.run_start is not None
        ck = j.last_checkpoint(now)
        kept_to = ck if ck is not None else j.run_start
        if j.cls.signal_save_s is not None and j.cls.signal_save_s <= grace_s:
            kept_to = now  # it checkpoints on the pre-preemption signal, within the grace
        self.acct.useful_gpu_s += (kept_to - j.run_start) * j.gpus
        self.acct.lost_gpu_s += (now - kept_to) * j.gpus
        self.acct.preemptions += 1
        if now - j.run_start < EARLY_PREEMPTION_S:
            self.acct.early_preemptions += 1
            self.acct.early_lost_gpu_s += (now - kept_to) * j.gpus
        j.done_s = min(j.work_s, j.done_s + (kept_to - j.run_start))
        j.state = "completing"
        j.free_at = now + grace_s
        j.run_token += 1
        return True

    def release(self, job_id: str) -> tuple[str, ...]:
        """The grace of a preempted job is over: requeue it and free its nodes."""
        j = self.jobs.get(job_id)
        if j is None or j.state != "completing":
            return ()
        freed = self._vacate(j)
        j.state = "pending"
        j.run_start = None
        j.restarts += 1
        bisect.insort_left(self.pending, j, key=lambda p: p.seq)  # requeued: back at its original priority
        return freed

    def _vacate(self, j: Job) -> tuple[str, ...]:
        nodes = j.nodes
        for n in nodes:
            if self.node_job.get(n) == j.job_id:
                del self.node_job[n]
        self.running.pop(j.job_id, None)
        j.nodes = ()
        return nodes

    def finish(self, now: float) -> None:
        """End of the simulation: work of runs still going counts as kept."""
        for j in self.running.values():
            if j.state == "running" and j.run_start is not None:
                self.acct.useful_gpu_s += (now - j.run_start) * j.gpus
