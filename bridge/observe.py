"""Joins what the adapters read into the two views the daemon decides on.

Pure: no I/O. The daemon passes in the Kubernetes watch-cache snapshots, the Slurm node and
job lists, and the Prometheus readings; this module returns the policy's ``ClusterView``
and, per node, the lifecycle's ``NodeFacts``. Anything that does not add up (an invalid label
of ours, an administrator's drain, a Slurm lookup that failed, a node Slurm does not know)
becomes a ``problem`` on the node, which holds it where it is: fail closed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Protocol

from bridge import wellknown as wk
from bridge.errors import AdapterError
from bridge.config import Config, PoolConfig
from bridge.lifecycle import HoldFacts, NodeFacts, PodFacts, PreemptedJob
from bridge.names import validate_node_name
from bridge.model import (ClusterView, LoadSignals, NodeState, Phase, Pin, PoolState, SlurmJob, Tier, holds_nodes,
                          WarmRecord)


class KubeNode(Protocol):
    """What observe needs of a Kubernetes node (bridge.adapters.kube.objects.NodeInfo); read-only."""

    @property
    def name(self) -> str: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def pool(self) -> str | None: ...
    @property
    def phase(self) -> Phase | None: ...
    @property
    def phase_since(self) -> float | None: ...
    @property
    def pin(self) -> Pin | None: ...
    @property
    def fenced(self) -> bool: ...
    @property
    def warm(self) -> WarmRecord | None: ...
    @property
    def problem(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...


class KubePod(Protocol):
    """What observe needs of a serving pod (bridge.adapters.kube.objects.PodInfo); read-only."""

    @property
    def name(self) -> str: ...
    @property
    def node(self) -> str | None: ...
    @property
    def ready(self) -> bool: ...
    @property
    def deletion_cost(self) -> int | None: ...
    @property
    def terminating(self) -> bool: ...
    @property
    def awake(self) -> bool | None: ...
    @property
    def ip(self) -> str | None: ...


class SlurmNodeLike(Protocol):
    """What observe needs of a Slurm node (bridge.adapters.slurm.types.SlurmNode); read-only."""

    @property
    def name(self) -> str: ...
    @property
    def drained(self) -> bool:
        """DRAIN flag set (draining or drained)."""
        ...
    @property
    def reason_ours(self) -> bool:
        """The reason starts with gpu-bridge's prefix."""
        ...
    @property
    def down(self) -> bool:
        """DOWN or not responding."""
        ...


@dataclass(frozen=True, slots=True)
class Readings:
    """One pool's Prometheus readings: the newest sample (None: missing); the history is the memory's."""

    current: LoadSignals | None
    problem: str | None = None  # why ``current`` is None, for logs
    inflight_by_pod: Mapping[str, float] = field(default_factory=dict)  # pod -> running + waiting
    # the samples of the gap before ``current`` that Prometheus kept (``Observer.read``'s
    # ``since``), oldest first: the memory takes them first, so the governor recounts the gap
    recovered: tuple[LoadSignals, ...] = ()


@dataclass(frozen=True, slots=True)
class Observation:
    view: ClusterView
    facts: Mapping[str, NodeFacts]
    pool_of: Mapping[str, str]
    problems: Mapping[str, str] = field(default_factory=dict)  # node -> why it is held
    requests: Mapping[str, str] = field(default_factory=dict)  # node -> an operator's lend/reclaim
    # preempt-partition jobs Slurm itself held after a failed launch, whose run is gone
    # (pending, no longer completing): released when slurm.release_launch_failed
    slurm_held: Mapping[str, str] = field(default_factory=dict)  # job id -> the node it last ran on ("" unknown)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one read saw; ``readings`` carry no history (the policy memory adds it)."""

    now: float
    kube_nodes: Sequence[KubeNode]
    pods: Mapping[str, Sequence[KubePod]]
    desired: Mapping[str, int]  # pool -> its Deployment's replicas
    pool_problems: Mapping[str, str]  # pool -> why its Deployment cannot be trusted
    slurm_nodes: Sequence[SlurmNodeLike] | None  # None: Slurm could not be read
    slurm_jobs: Sequence[SlurmJob] | None
    slurm_now: float | None  # slurmctld's clock, after both reads
    readings: Mapping[str, Readings]
    errors: tuple[str, ...] = ()  # the systems a read failed on
    gpu_free: Mapping[str, float | None] = field(default_factory=dict)  # node -> lowest free GPU MiB (NodeFacts.gpu_free_mib)


# The reason Slurm (22.05 .. 24.11) gives a job it requeued held after its launch failed
# (e.g. a second start of a job whose first run still goes on: "Duplicate jobid").
LAUNCH_FAILED_HELD = "launch_failed_requeued_held"


def own_drain_reason(reason: str, config: Config) -> str | None:
    """The entry of ``slurm.own_drain_reasons`` a node's drain reason is, if any: the whole
    reason, or the entry followed by Slurm's details after a space, colon or parenthesis
    (case-insensitive). Never a bare prefix: "Kill" would take an administrator's "Killed
    GPU 3" for Slurm's own."""
    return next((r for r in config.slurm.own_drain_reasons if r and wk.is_slurm_reason(reason, r)), None)


def is_hold_job(job: SlurmJob, config: Config, *, mem: bool = False) -> bool:
    """Our placeholder job (``mem``: warm lending's memory hold, ``gpu-bridge-warm:<node>``): its
    partition and name, and its user when ``slurm.hold_user`` is set (anyone else's job of that
    name is a research job: never cancelled as a hold; a hold is never requeued or counted as research)."""
    part, prefix = (config.slurm.warm_partition, wk.SLURM_WARM_HOLD_JOB_PREFIX) if mem else (config.slurm.hold_partition, wk.SLURM_HOLD_JOB_PREFIX)
    return job.partition == part and job.name.startswith(prefix) and config.slurm.hold_user in (None, job.user)


def hold_job_node(job: SlurmJob) -> str:
    """The node a hold job is meant for (its name), whether or not it runs yet."""
    return job.name[len(wk.SLURM_HOLD_JOB_PREFIX) :]


def ready_timeout_s(pool: PoolConfig) -> float:
    """How long a returning node may go without a Ready replica before it is reported and
    no longer counted as capacity (so the policy reclaims another): twice the cold start
    plus two minutes."""
    return 2 * pool.cold_start_s + 120.0


def node_tier(partitions: Sequence[str], running: Sequence[str], config: Config) -> Tier:
    """The tier a node serves, as Slurm has it (the daemon keeps no copy): fast only while it
    is in the fast partition and not in the normal one, and runs no normal-tier job (``running``:
    its research jobs' partitions). Anything else, e.g. both partitions after a reconfigure
    reset slurm.conf's lists, is the normal tier: its jobs may have the normal grace."""
    fast, normal = config.slurm.fast_partition, config.slurm.preempt_partition
    if fast is None or fast not in partitions or normal in partitions or normal in running:
        return Tier.NORMAL
    return Tier.FAST


def join(*, now: float, config: Config, kube_nodes: Sequence[KubeNode], pods: Mapping[str, Sequence[KubePod]],
         desired_replicas: Mapping[str, int], slurm_nodes: Sequence[SlurmNodeLike] | None,
         slurm_jobs: Sequence[SlurmJob] | None, readings: Mapping[str, Readings],
         pool_problems: Mapping[str, str] | None = None, slurm_now: float | None = None,
         gpu_free: Mapping[str, float | None] | None = None) -> Observation:
    """Build the policy view and the lifecycle facts. ``slurm_nodes``/``slurm_jobs`` None:
    the Slurm lookup failed, so every node is held (its Slurm side is unknown).
    ``pool_problems``: pool -> why its Deployment cannot be trusted (its nodes are held).
    ``slurm_now``: slurmctld's clock when Slurm was read (its times are compared with it).
    ``gpu_free``: node -> the lowest free MiB over its GPUs, for the nodes it was read for.
    Each input is indexed by node once (``_Tick``), then each node of ours joined once (``_Tick.node``)."""
    jobs = _JobsByNode.of(slurm_jobs or (), config)
    tick = _Tick(now=now, config=config, slurm={n.name: n for n in slurm_nodes} if slurm_nodes is not None else None,
                 jobs=jobs, pods_on=_pods_by_node(pods), pool_problems=pool_problems or {}, slurm_now=slurm_now,
                 inflight_by_pod={pod: n for r in readings.values() for pod, n in r.inflight_by_pod.items()}, gpu_free=gpu_free or {})
    ours = _our_nodes(kube_nodes, config)
    joined = [tick.node(kn, pool) for kn, pool in ours]
    states = tuple(state for state, _ in joined)
    ready = Counter(s.pool for s in states if s.serving_ready)
    pools = {pool.name: PoolState(name=pool.name, signals=readings.get(pool.name, Readings(None)).current,
                                  ready_replicas=ready[pool.name], desired_replicas=desired_replicas.get(pool.name, 0))
             for pool in config.pools}
    view = ClusterView(now=now, nodes=states, pools=pools, jobs=jobs.research, pending_research_nodes=jobs.pending_nodes,
                       pending_fast_nodes=jobs.pending_fast)
    return Observation(
        view=view, facts={s.name: f for s, f in joined if f is not None}, pool_of={s.name: s.pool for s in states},
        problems={s.name: s.problem for s in states if s.problem}, slurm_held=jobs.slurm_held,
        requests={kn.name: r for kn, _ in ours if (r := kn.annotations.get(wk.ANNOTATION_REQUEST)) is not None},
    )


_BY_NAME = attrgetter("name")
FUTURE_SINCE_S = 3600.0  # a phase-since this far ahead of the clock is no clock skew between two daemons


def _our_nodes(kube_nodes: Sequence[KubeNode], config: Config) -> list[tuple[KubeNode, PoolConfig]]:
    """The nodes of our pools by name, each with its pool: any other node is never touched."""
    pools: dict[str | None, PoolConfig] = {p.name: p for p in reversed(config.pools)}  # a name twice: its first
    return [(kn, pool) for kn in sorted(kube_nodes, key=_BY_NAME) if (pool := pools.get(kn.pool)) is not None]


def _pods_by_node(pods: Mapping[str, Sequence[KubePod]]) -> dict[str, list[KubePod]]:
    """Every pool's scheduled serving pods, by node: looked up once per node, not searched."""
    on: dict[str, list[KubePod]] = {}
    for pool_pods in pods.values():
        for pod in pool_pods:
            if pod.node:
                on.setdefault(pod.node, []).append(pod)
    return on


@dataclass(frozen=True, slots=True)
class _Tick:
    """One tick's inputs, indexed by node name: what joining each node looks up."""

    now: float
    config: Config
    slurm: Mapping[str, SlurmNodeLike] | None  # None: Slurm could not be read
    jobs: _JobsByNode
    pods_on: Mapping[str, Sequence[KubePod]]
    inflight_by_pod: Mapping[str, float]
    pool_problems: Mapping[str, str]
    slurm_now: float | None
    gpu_free: Mapping[str, float | None]

    def node(self, kn: KubeNode, pool: PoolConfig) -> tuple[NodeState, NodeFacts | None]:
        """One node of ours: the policy's state of it, and the lifecycle's facts once Slurm knows it."""
        name, jobs = kn.name, self.jobs
        sn = self.slurm.get(name) if self.slurm is not None else None
        node_pods = self.pods_on.get(name, ())
        live = [p for p in node_pods if not p.terminating]
        ready = any(p.ready for p in live)
        # a node we never moved (no phase label) has served since before we knew it: epoch 0,
        # not now, or the relend dwell (policy.relend_dwell) would take it for a fresh return
        # at every tick and a new cluster would never lend; a label without its annotation
        # (a problem, flagged by _problem) stays now: the conservative reading
        since = kn.phase_since if kn.phase_since is not None else (self.now if kn.phase is not None else 0.0)
        on_node = tuple(sorted(jobs.research_on.get(name, ())))
        allocated, hold = name in jobs.allocated, jobs.holds.get(name)
        held = hold is not None and hold.running
        state = NodeState(
            name=name, pool=pool.name, phase=kn.phase or Phase.SERVING, phase_since=since, pin=kn.pin,
            serving_pods=len(live), serving_ready=ready, slurm_state=_slurm_state(sn, allocated, held=held), jobs=on_node,
            problem=self._problem(kn, sn, node_pods, ready, pool), reason=kn.reason or "",
            inflight=_inflight(live, self.inflight_by_pod),
            tier=node_tier(getattr(sn, "partitions", ()), jobs.partitions_on.get(name, ()), self.config),
        )
        if sn is None:
            return state, None
        drained, ours, busy = sn.drained, sn.reason_ours, bool(on_node) or (allocated and not held)
        return state, NodeFacts(
            name=name, phase=kn.phase, phase_since=since, fenced=kn.fenced,
            pods=tuple([PodFacts(p.name, ready=p.ready, terminating=p.terminating, deletion_cost=p.deletion_cost,
                                 awake=p.awake, ip=p.ip) for p in sorted(node_pods, key=_BY_NAME)]),
            slurm_drained_by_us=drained and ours, slurm_drained_by_other=drained and not ours, slurm_down=sn.down,
            slurm_allocated=allocated, hold=hold, mem_hold=jobs.mem_holds.get(name), research_jobs=on_node,
            slurm_drained_at=getattr(sn, "reason_time", None) if drained and ours else None,
            research_preempted=tuple(jobs.preempted_on.get(name, ())), slurm_now=self.slurm_now,
            slurm_own_drain=_own_drain(sn, self.config, busy=busy) if drained and not ours else None,
            warm=kn.warm, gpu_free_mib=self.gpu_free.get(name),
        )

    def _problem(self, kn: KubeNode, sn: SlurmNodeLike | None, node_pods: Sequence[KubePod], ready: bool,
                 pool: PoolConfig) -> str | None:
        """Why a node is held where it is: the first reason, in this order (the rest are not looked for), or
        None. ``ready``: a live serving pod of it is Ready."""
        if kn.problem:
            return kn.problem
        if kn.phase_since is not None and kn.phase_since - self.now > FUTURE_SINCE_S:
            # hand-edited (a wrong year): every timeout counts from it and would never expire
            return (f"annotation {wk.ANNOTATION_PHASE_SINCE}: {kn.phase_since:.0f} is {kn.phase_since - self.now:.0f} s "
                    "in the future; the phase's timeouts count from it")
        try:  # a name that cannot go into Slurm's argv: a transition could never finish
            validate_node_name(kn.name)
        except AdapterError as exc:
            return f"{exc}; never lent or reclaimed"
        if self.slurm is None:
            return "Slurm state unknown (lookup failed)"
        if sn is None:
            return "node unknown to Slurm"
        if sn.drained and not sn.reason_ours:
            if own_drain_reason(getattr(sn, "reason", ""), self.config) is not None:
                return (f"drained in Slurm by Slurm itself ({getattr(sn, 'reason', '')!r}): gpu-bridge "
                        "clears it (lent) or takes it over once nothing is allocated there")
            return "drained in Slurm by someone else (never undone by gpu-bridge)"
        for pod in node_pods:  # a serving pod we cannot read properly: never guess around it
            if bad := getattr(pod, "problem", None):
                return f"serving pod {pod.name}: {bad}"
        if pool_problem := self.pool_problems.get(pool.name):
            return pool_problem
        if kn.phase is Phase.RETURNING and kn.phase_since is not None and not ready:
            limit = ready_timeout_s(pool)
            if self.now - kn.phase_since > limit:
                return f"returning for {self.now - kn.phase_since:.0f} s without a Ready serving replica (timeout {limit:.0f} s)"
        return kn.problem  # None: nothing holds it


@dataclass
class _JobsByNode:
    """What Slurm's job list says about each node."""

    holds: dict[str, HoldFacts] = field(default_factory=dict)  # node -> our hold job for it
    mem_holds: dict[str, HoldFacts] = field(default_factory=dict)  # node -> our memory hold for it (warm lending)
    research_on: dict[str, list[str]] = field(default_factory=dict)  # node -> research jobs holding it
    preempted_on: dict[str, list[PreemptedJob]] = field(default_factory=dict)
    allocated: set[str] = field(default_factory=set)  # nodes any job holds
    research: dict[str, SlurmJob] = field(default_factory=dict)
    pending_nodes: int = 0  # nodes' worth of research waiting in the preempt partitions (both tiers)
    pending_fast: int = 0  # of those, jobs the fast partition may run
    partitions_on: dict[str, list[str]] = field(default_factory=dict)  # node -> its research jobs' partitions
    slurm_held: dict[str, str] = field(default_factory=dict)  # see Observation.slurm_held

    @classmethod
    def of(cls, jobs: Sequence[SlurmJob], config: Config) -> _JobsByNode:
        out = cls()
        fast = config.slurm.fast_partition
        tiers = {config.slurm.preempt_partition} | ({fast} if fast else set())
        for job in jobs:
            if is_hold_job(job, config, mem=True):
                # not in ``allocated`` (research or a serving hold there): beside it the node takes research jobs
                node = job.name[len(wk.SLURM_WARM_HOLD_JOB_PREFIX):]
                running = holds_nodes(job.state) and node in job.nodes
                if job.state != "completing" and (job.state == "pending" or running):  # completing: cancelled
                    out.mem_holds.setdefault(node, HoldFacts(job.job_id, running=running))
                continue
            if is_hold_job(job, config):
                target = hold_job_node(job)
                if job.state == "completing":  # cancelled, on its way out: not a hold any more
                    if target in job.nodes:
                        out.allocated.add(target)
                    continue
                running = holds_nodes(job.state) and target in job.nodes
                if job.state == "pending" or running:
                    out.holds[target] = HoldFacts(job.job_id, running=running)
                if running:
                    out.allocated.add(target)
            elif holds_nodes(job.state):
                out.research[job.job_id] = job
                preempt_time = getattr(job, "preempt_time", None)
                for n in job.nodes:
                    out.research_on.setdefault(n, []).append(job.job_id)
                    out.allocated.add(n)
                    out.partitions_on.setdefault(n, []).append(job.partition)
                    if preempt_time is not None and job.partition in tiers:  # each tier's own grace
                        grace = config.slurm.fast_grace_s if job.partition == fast else None
                        out.preempted_on.setdefault(n, []).append(PreemptedJob(job.job_id, preempt_time, job.restart_count, grace))
            elif job.state == "pending" and (parts := frozenset(job.partition.split(","))) & tiers:  # preempt,preempt-fast
                held_for = getattr(job, "held_for", None)
                if held_for is not None and held_for(LAUNCH_FAILED_HELD):
                    # held by Slurm (priority 0): it never starts on its own; pending means the
                    # failed run's kill has completed on its node (COMPLETING is over)
                    if config.slurm.release_launch_failed:
                        out.slurm_held[job.job_id] = getattr(job, "batch_host", "")
                    continue
                out.pending_nodes += max(1, len(job.nodes) or 1)
                out.pending_fast += max(1, len(job.nodes) or 1) if fast in parts else 0
        return out


def _own_drain(sn: SlurmNodeLike, config: Config, *, busy: bool) -> str | None:
    """Slurm's own drain reason (``slurm.own_drain_reasons``) on a node drained not by us, responding,
    where Slurm has no research job and nothing completing (our running hold job aside): only
    then may gpu-bridge handle it (a run Slurm knows of could still be on the node otherwise)."""
    if sn.down or busy or "COMPLETING" in getattr(sn, "flags", frozenset()):
        return None
    return own_drain_reason(getattr(sn, "reason", ""), config)


def _inflight(live: Sequence[KubePod], by_pod: Mapping[str, float]) -> float | None:
    """Requests running + waiting on a node's live (not terminating) serving pods; None when a
    pod has no reading (unknown is never read as "idle")."""
    try:
        return sum([by_pod[p.name] for p in live]) if live else None
    except KeyError:
        return None


def _slurm_state(sn: SlurmNodeLike | None, allocated: bool, *, held: bool = False) -> str:
    if sn is None:
        return "unknown"
    if sn.down:
        return "down"
    if held:
        return "held"  # our placeholder job runs on it (drained by us too, once serving)
    if sn.drained:
        return "draining" if allocated else "drained"
    return "allocated" if allocated else "idle"
