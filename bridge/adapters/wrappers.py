"""The wrappers the daemon puts around its adapters, both systems side by side.

``FencedKube`` / ``FencedSlurm``: reads pass through, every write first checks that this
instance still holds the Lease: a daemon whose Lease lapsed in the middle of a step (renewals
failing past the renew deadline) cannot write even if its loop has not noticed yet. (A dry run
needs no wrapper: the daemon never applies what it decides.)

Each implements the same Protocols (``bridge.adapters.protocols``) as what it wraps.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from bridge import logs
from bridge.errors import AdapterError
from bridge.model import Phase, Pin, WarmRecord

from .kube.objects import DeploymentInfo, EvictOutcome, NodeInfo, PodInfo, ScaleInfo
from .protocols import CacheStatus, DrainOutcomes, HoldOutcomes, KubeAdapterProtocol, LeaseHolder, RequeueOutcome, SlurmAdapterProtocol
from .slurm.types import SlurmJobInfo, SlurmNode

log = logs.get(__name__)


class NotLeaderError(AdapterError):
    """A write was refused because this instance does not hold the Lease (any more)."""

    def __init__(self, write: str, system: str = "kubernetes", why: str = "Lease lost or not renewed in time") -> None:
        super().__init__(system, f"{write} refused: not the leader ({why})")


def lease_fence(leader: LeaseHolder) -> Callable[[Sequence[str], float], None]:
    """The check a Slurm adapter runs right before each command that changes Slurm: the
    leadership must last the command's whole timeout (renewed first if it would not), so a
    write of several commands cannot land after a standby took over half-way."""

    def check(argv: Sequence[str], timeout_s: float) -> None:
        if not leader.hold_for(timeout_s):
            write = " ".join(argv[:2])
            raise NotLeaderError(write, system="slurm", why=f"the Lease does not hold for the {timeout_s:g} s it may take")

    return check


# --- read sides: every read is the wrapped adapter's, so only the writes differ ---------------


class KubeReadThrough:
    def __init__(self, inner: KubeAdapterProtocol) -> None:
        self._inner = inner

    def cache_status(self) -> CacheStatus:
        return self._inner.cache_status()

    def nodes(self) -> tuple[NodeInfo, ...]:
        return self._inner.nodes()

    def node(self, name: str) -> NodeInfo | None:
        return self._inner.node(name)

    def pods(self, pool: str) -> tuple[PodInfo, ...]:
        return self._inner.pods(pool)

    def deployment(self, pool: str) -> DeploymentInfo | None:
        return self._inner.deployment(pool)

    def read_node(self, name: str) -> NodeInfo:
        return self._inner.read_node(name)

    def read_scale(self, namespace: str, deployment: str) -> ScaleInfo:
        return self._inner.read_scale(namespace, deployment)


class SlurmReadThrough:
    def __init__(self, inner: SlurmAdapterProtocol) -> None:
        self._inner = inner

    def ping(self) -> None:
        self._inner.ping()

    def nodes(self, names: Iterable[str] | None = None) -> tuple[SlurmNode, ...]:
        return self._inner.nodes(names)

    def node(self, name: str) -> SlurmNode:
        return self._inner.node(name)

    def clock(self) -> float:
        return self._inner.clock()

    def grace_time_s(self, partition: str) -> float:
        return self._inner.grace_time_s(partition)

    def jobs(
        self, *, partition: str | None = None, node: str | None = None, states: Iterable[str] | None = None
    ) -> tuple[SlurmJobInfo, ...]:
        return self._inner.jobs(partition=partition, node=node, states=states)

    def holds(self) -> dict[str, SlurmJobInfo]:
        return self._inner.holds()


# --- the write fence ------------------------------------------------------------------------


class FencedKube(KubeReadThrough):
    """Every write raises NotLeaderError unless ``leader.is_leader`` right before it."""

    def __init__(self, inner: KubeAdapterProtocol, leader: LeaseHolder) -> None:
        super().__init__(inner)
        self._leader = leader

    def _check(self, write: str) -> None:
        if not self._leader.is_leader:
            raise NotLeaderError(write)

    def set_phase(self, node: str, phase: Phase, reason: str, since: float) -> bool:
        self._check("set_phase")
        return self._inner.set_phase(node, phase, reason, since)

    def set_request(self, node: str, request: str | None) -> bool:
        self._check("set_request")
        return self._inner.set_request(node, request)

    def set_pin(self, node: str, pin: Pin | None) -> bool:
        self._check("set_pin")
        return self._inner.set_pin(node, pin)

    def fence(self, node: str) -> bool:
        self._check("fence")
        return self._inner.fence(node)

    def unfence(self, node: str) -> bool:
        self._check("unfence")
        return self._inner.unfence(node)

    def set_pod_deletion_cost(self, namespace: str, pod: str, cost: int) -> bool:
        self._check("set_pod_deletion_cost")
        return self._inner.set_pod_deletion_cost(namespace, pod, cost)

    def set_warm(self, node: str, record: WarmRecord | None) -> bool:
        self._check("set_warm")
        return self._inner.set_warm(node, record)

    def set_pod_awake(self, namespace: str, pod: str, awake: bool) -> bool:
        self._check("set_pod_awake")
        return self._inner.set_pod_awake(namespace, pod, awake)

    def scale(self, namespace: str, deployment: str, replicas: int) -> bool:
        self._check("scale")
        return self._inner.scale(namespace, deployment, replicas)

    def evict(self, namespace: str, pod: str) -> EvictOutcome:
        self._check("evict")
        return self._inner.evict(namespace, pod)

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None:
        self._check("emit_event")
        self._inner.emit_event(node, reason, message, event_type)


class FencedSlurm(SlurmReadThrough):
    """Every write raises NotLeaderError unless ``leader.is_leader`` right before it."""

    def __init__(self, inner: SlurmAdapterProtocol, leader: LeaseHolder) -> None:
        super().__init__(inner)
        self._leader = leader

    def _check(self, write: str) -> None:
        if not self._leader.is_leader:
            raise NotLeaderError(write, system="slurm")

    def drain(self, node: str, reason: str) -> bool:
        self._check("drain")
        return self._inner.drain(node, reason)

    def drain_nodes(self, reasons: Mapping[str, str]) -> DrainOutcomes:
        self._check("drain_nodes")
        return self._inner.drain_nodes(reasons)

    def resume(self, node: str) -> bool:
        self._check("resume")
        return self._inner.resume(node)

    def submit_hold(self, node: str) -> str:
        self._check("submit_hold")
        return self._inner.submit_hold(node)

    def submit_holds(self, nodes: Collection[str]) -> HoldOutcomes:
        self._check("submit_holds")
        return self._inner.submit_holds(nodes)

    def cancel_hold(self, node: str) -> tuple[str, ...]:
        self._check("cancel_hold")
        return self._inner.cancel_hold(node)

    def submit_mem_hold(self, node: str, mem_mb: int) -> str:
        self._check("submit_mem_hold")
        return self._inner.submit_mem_hold(node, mem_mb)

    def cancel_mem_hold(self, node: str) -> tuple[str, ...]:
        self._check("cancel_mem_hold")
        return self._inner.cancel_mem_hold(node)

    def requeue_jobs(self, jobs: Mapping[str, int | None]) -> dict[str, RequeueOutcome]:
        self._check("requeue_jobs")
        return self._inner.requeue_jobs(jobs)

    def set_tier(self, node: str, partition: str) -> bool:
        self._check("set_tier")
        return self._inner.set_tier(node, partition)

    def release(self, job_id: str, reason: str) -> bool:
        self._check("release")
        return self._inner.release(job_id, reason)

    def clear_own_drain(self, node: str, slurm_reason: str) -> bool:
        self._check("clear_own_drain")
        return self._inner.clear_own_drain(node, slurm_reason)

    def take_over_drain(self, node: str, slurm_reason: str, reason: str) -> bool:
        self._check("take_over_drain")
        return self._inner.take_over_drain(node, slurm_reason, reason)
