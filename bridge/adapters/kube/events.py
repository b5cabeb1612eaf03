"""Reading node Events back: what ``gpu-bridge web`` shows of the daemon's records (the
``GpuBridgeJobPreempted`` Events). Read-only, one LIST per call; the daemon never calls it, so
its RBAC (deploy/kubernetes/rbac.yaml) does not grant it; web-rbac.yaml does."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kubernetes import client as k8s

from .calls import ApiCalls, read_json
from .objects import NodeEvent


def parse_node_event(obj: Mapping[str, Any]) -> NodeEvent | None:
    """One core/v1 Event about a node (None: about something else, or without a time)."""
    inv = obj.get("involvedObject") or {}
    if inv.get("kind") != "Node" or not isinstance(inv.get("name"), str):
        return None
    stamp = obj.get("lastTimestamp") or obj.get("eventTime") or obj.get("firstTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        t = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return NodeEvent(node=inv["name"], reason=str(obj.get("reason") or ""), message=str(obj.get("message") or ""), t=t)


class NodeEventReader:
    """Lists the Events on nodes in ``namespace`` (where the daemon writes them: ``default``)."""

    def __init__(self, api_client: k8s.ApiClient, *, namespace: str = "default", request_timeout_s: float = 10.0) -> None:
        self.calls = ApiCalls()
        self._core = k8s.CoreV1Api(api_client)
        self._ns = namespace
        self._timeout = request_timeout_s

    def node_events(self, reason: str) -> tuple[NodeEvent, ...]:
        """The Events with ``reason`` on nodes, oldest first. Kubernetes keeps Events for the
        API server's ``--event-ttl`` (1 h by default)."""
        if not reason.isalnum():
            raise ValueError(f"reason: expected a CamelCase Event reason, got {reason!r}")
        doc = read_json(self.calls.run("list", "events", "", self._core.list_namespaced_event, self._ns,
                                       field_selector=f"involvedObject.kind=Node,reason={reason}",
                                       _preload_content=False, _request_timeout=self._timeout))
        found = (parse_node_event(item) for item in doc.get("items") or ())
        return tuple(sorted((e for e in found if e is not None), key=lambda e: (e.t, e.node)))
