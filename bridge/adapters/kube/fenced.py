"""Writes only while leader: the fencing check made structural.

``FencedKube(kube, leader)`` passes reads through and checks ``leader.is_leader`` right
before every write, so a daemon whose Lease lapsed in the middle of a step (renewals failing
past the renew deadline) cannot write even if its loop has not noticed yet.
"""

from __future__ import annotations

from typing import Protocol

from bridge.errors import AdapterError
from bridge.model import Phase

from .objects import EvictOutcome
from .protocol import KubeAdapterProtocol, ReadThrough


class LeaderLike(Protocol):
    @property
    def is_leader(self) -> bool: ...


class NotLeaderError(AdapterError):
    """A write was refused because this instance does not hold the Lease (any more)."""

    def __init__(self, write: str) -> None:
        super().__init__("kubernetes", f"{write} refused: not the leader (Lease lost or not renewed in time)")


class FencedKube(ReadThrough):
    """Implements KubeReader + KubeWriter; every write raises NotLeaderError unless leader."""

    def __init__(self, inner: KubeAdapterProtocol, leader: LeaderLike) -> None:
        super().__init__(inner)
        self._leader = leader

    def _check(self, write: str) -> None:
        if not self._leader.is_leader:
            raise NotLeaderError(write)

    # writes
    def set_request(self, node: str, request: str | None) -> bool:
        self._check("set_request")
        return self._inner.set_request(node, request)  # type: ignore[attr-defined,no-any-return]

    def set_phase(self, node: str, phase: Phase, reason: str, since: float) -> bool:
        self._check("set_phase")
        return self._inner.set_phase(node, phase, reason, since)

    def fence(self, node: str) -> bool:
        self._check("fence")
        return self._inner.fence(node)

    def unfence(self, node: str) -> bool:
        self._check("unfence")
        return self._inner.unfence(node)

    def set_pod_deletion_cost(self, namespace: str, pod: str, cost: int) -> bool:
        self._check("set_pod_deletion_cost")
        return self._inner.set_pod_deletion_cost(namespace, pod, cost)

    def scale(self, namespace: str, deployment: str, replicas: int) -> bool:
        self._check("scale")
        return self._inner.scale(namespace, deployment, replicas)

    def evict(self, namespace: str, pod: str) -> EvictOutcome:
        self._check("evict")
        return self._inner.evict(namespace, pod)

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None:
        self._check("emit_event")
        self._inner.emit_event(node, reason, message, event_type)
