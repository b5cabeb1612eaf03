"""The Kubernetes adapter's contract: a read side (watch-cache snapshots) and a write side
(intent-level, idempotent writes with optimistic concurrency). The daemon sees only these."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bridge.model import Phase

from .informer import InformerStatus
from .objects import DeploymentInfo, EvictOutcome, NodeInfo, PodInfo, ScaleInfo


@dataclass(frozen=True, slots=True)
class PoolTarget:
    """Where one pool's nodes and serving replicas are. ``pod_selector`` None = the
    Deployment's own ``spec.selector.matchLabels``, read once at start; ``node_selector``
    None (or ``{gpu-bridge.io/pool: <name>}``) = nodes labelled with the pool's name."""

    name: str
    namespace: str
    deployment: str
    pod_selector: str | None = None
    node_selector: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class CacheStatus:
    """Is the watch cache fit to decide on? ``synced`` is all informers synced;
    ``last_event_age_s`` is the stalest informer's age (None = never heard from)."""

    synced: bool
    last_event_age_s: float | None
    informers: tuple[InformerStatus, ...] = ()


@runtime_checkable
class KubeReader(Protocol):
    def cache_status(self) -> CacheStatus: ...

    def nodes(self) -> tuple[NodeInfo, ...]:
        """The pool nodes (label gpu-bridge.io/pool in the configured pools), sorted by name."""
        ...

    def node(self, name: str) -> NodeInfo | None: ...

    def pods(self, pool: str) -> tuple[PodInfo, ...]:
        """The serving pods of a pool's Deployment (terminating ones included)."""
        ...

    def deployment(self, pool: str) -> DeploymentInfo | None: ...

    def read_scale(self, namespace: str, deployment: str) -> ScaleInfo:
        """The Deployment's scale subresource, read now (one GET)."""
        ...


@runtime_checkable
class KubeWriter(Protocol):
    """Each write is idempotent: True = a change was written, False = it already was so."""

    def set_phase(self, node: str, phase: Phase, reason: str, since: float) -> bool: ...

    def fence(self, node: str) -> bool: ...

    def unfence(self, node: str) -> bool: ...

    def set_pod_deletion_cost(self, namespace: str, pod: str, cost: int) -> bool: ...

    def scale(self, namespace: str, deployment: str, replicas: int) -> bool: ...

    def evict(self, namespace: str, pod: str) -> EvictOutcome: ...

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None: ...


class KubeAdapterProtocol(KubeReader, KubeWriter, Protocol):
    """Both sides, as the daemon holds them."""


class ReadThrough:
    """The read side of a wrapper around a KubeAdapter (dry run, write fence): every read is
    the wrapped adapter's, so only the writes differ between wrappers."""

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

    def read_scale(self, namespace: str, deployment: str) -> ScaleInfo:
        return self._inner.read_scale(namespace, deployment)
