"""``--dry-run`` for Kubernetes: reads pass through, writes are logged and never sent.

Each write reports what it *would* do from the cached object, with the same patch builders as
the real writes, so a dry run logs exactly the changes a real run would make.
"""

from __future__ import annotations

from bridge import logs
from bridge.model import Phase, Pin

from . import patches
from .objects import EvictOutcome
from .protocol import KubeAdapterProtocol, ReadThrough

log = logs.get(__name__)


class DryRunKube(ReadThrough):
    """Wraps a KubeAdapter (or FakeKube): implements KubeReader + KubeWriter, writes nothing."""

    def __init__(self, inner: KubeAdapterProtocol, *, identity: str = "dry-run") -> None:
        super().__init__(inner)
        self._identity = identity

    # writes
    def _would(self, what: str, changed: bool, **kw: object) -> bool:
        log.info("dry_run_write", write=what, would_change=changed, **kw)
        return changed

    def set_phase(self, node: str, phase: Phase, reason: str, since: float) -> bool:
        n = self._inner.node(node)
        changed = n is None or patches.phase_patch(n, Phase(phase), reason, since, self._identity) is not None
        return self._would("set_phase", changed, node=node, phase=str(phase), reason=patches.clean_reason(reason))

    def set_request(self, node: str, request: str | None) -> bool:
        n = self._inner.node(node)
        return self._would("set_request", n is None or patches.request_patch(n, request) is not None, node=node, request=request)

    def set_pin(self, node: str, pin: Pin | None) -> bool:
        n = self._inner.node(node)
        changed = n is None or patches.pin_patch(n, Pin(pin) if pin is not None else None) is not None
        return self._would("set_pin", changed, node=node, pin=str(pin) if pin else None)

    def fence(self, node: str) -> bool:
        n = self._inner.node(node)
        return self._would("fence", n is None or patches.fence_patch(n) is not None, node=node)

    def unfence(self, node: str) -> bool:
        n = self._inner.node(node)
        return self._would("unfence", n is None or patches.unfence_patch(n) is not None, node=node)

    def set_pod_deletion_cost(self, namespace: str, pod: str, cost: int) -> bool:
        return self._would("set_pod_deletion_cost", True, namespace=namespace, pod=pod, cost=cost)

    def scale(self, namespace: str, deployment: str, replicas: int) -> bool:
        return self._would("scale", True, namespace=namespace, deployment=deployment, replicas=replicas)

    def evict(self, namespace: str, pod: str) -> EvictOutcome:
        self._would("evict", True, namespace=namespace, pod=pod)
        return EvictOutcome.BLOCKED  # nothing was evicted: callers must not proceed as if it were

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None:
        self._would("emit_event", True, node=node, reason=reason, message=patches.clean_reason(message), event_type=event_type)
