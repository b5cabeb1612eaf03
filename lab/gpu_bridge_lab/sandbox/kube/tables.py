"""Server-side printing: the ``meta.k8s.io`` Table kubectl asks for (``Accept: ...;as=Table``)
so that ``kubectl get nodes/pods/deployments/...`` shows the familiar columns."""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpu_bridge_lab.sandbox.kube.resources import Resource


def wants_table(accept: str) -> str:
    """The Table version asked for in an Accept header ("v1", "v1beta1") or ""."""
    for part in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip() for p in part.split(";")[1:] if "=" in p}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return params.get("v", "v1")
    return ""


def _age(obj: Mapping[str, Any]) -> str:
    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    try:
        t = calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return "<unknown>"
    return human_duration(max(0.0, time.time() - t))


def human_duration(s: float) -> str:
    s = int(s)
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 48:
        return f"{h}h{m % 60}m" if h < 8 and m % 60 else f"{h}h"
    return f"{h // 24}d"


def _cond(obj: Mapping[str, Any], typ: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == typ:
            return c.get("status")
    return None


def _node_row(o: Mapping[str, Any]) -> list[Any]:
    st = "Ready" if _cond(o, "Ready") == "True" else ("NotReady" if _cond(o, "Ready") else "Unknown")
    if (o.get("spec") or {}).get("unschedulable"):
        st += ",SchedulingDisabled"
    labels = (o.get("metadata") or {}).get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    info = (o.get("status") or {}).get("nodeInfo") or {}
    addr = {a.get("type"): a.get("address") for a in (o.get("status") or {}).get("addresses") or []}
    return [o["metadata"]["name"], st, ",".join(roles) or "<none>", _age(o), info.get("kubeletVersion", ""),
            addr.get("InternalIP", "<none>"), addr.get("ExternalIP", "<none>"), info.get("osImage", "<unknown>"),
            info.get("kernelVersion", "<unknown>"), info.get("containerRuntimeVersion", "<unknown>")]


def pod_status_text(o: Mapping[str, Any]) -> str:
    st = o.get("status") or {}
    if (o.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    for cs in st.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            return str(waiting["reason"])
    return str(st.get("reason") or st.get("phase") or "Pending")


def _pod_row(o: Mapping[str, Any]) -> list[Any]:
    spec, st = o.get("spec") or {}, o.get("status") or {}
    total = len(spec.get("containers") or [])
    ready = sum(1 for c in st.get("containerStatuses") or [] if c.get("ready"))
    restarts = sum(int(c.get("restartCount", 0)) for c in st.get("containerStatuses") or [])
    return [o["metadata"]["name"], f"{ready}/{total}", pod_status_text(o), restarts, _age(o),
            st.get("podIP") or "<none>", spec.get("nodeName") or "<none>", st.get("nominatedNodeName") or "<none>",
            "<none>"]


def _deploy_row(o: Mapping[str, Any]) -> list[Any]:
    spec, st = o.get("spec") or {}, o.get("status") or {}
    cs = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    sel = (spec.get("selector") or {}).get("matchLabels") or {}
    return [o["metadata"]["name"], f"{st.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
            st.get("updatedReplicas", 0), st.get("availableReplicas", 0), _age(o),
            ",".join(c.get("name", "") for c in cs), ",".join(c.get("image", "") for c in cs),
            ",".join(f"{k}={v}" for k, v in sorted(sel.items()))]


def _rs_row(o: Mapping[str, Any]) -> list[Any]:
    spec, st = o.get("spec") or {}, o.get("status") or {}
    return [o["metadata"]["name"], spec.get("replicas", 0), st.get("replicas", 0), st.get("readyReplicas", 0), _age(o)]


def _pdb_row(o: Mapping[str, Any]) -> list[Any]:
    spec, st = o.get("spec") or {}, o.get("status") or {}
    return [o["metadata"]["name"], str(spec.get("minAvailable", "N/A")), str(spec.get("maxUnavailable", "N/A")),
            st.get("disruptionsAllowed", 0), _age(o)]


def _lease_row(o: Mapping[str, Any]) -> list[Any]:
    return [o["metadata"]["name"], (o.get("spec") or {}).get("holderIdentity") or "", _age(o)]


def _event_row(o: Mapping[str, Any]) -> list[Any]:
    inv = o.get("involvedObject") or o.get("regarding") or {}
    return [_age(o), o.get("type", ""), o.get("reason", ""), f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}",
            o.get("message") or o.get("note") or ""]


def _col(name: str, typ: str = "string", priority: int = 0, fmt: str = "") -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "type": typ, "format": fmt, "description": name, "priority": priority}
    return d


_PRINTERS: dict[str, tuple[list[dict[str, Any]], Callable[[Mapping[str, Any]], list[Any]]]] = {
    "Node": ([_col("Name", fmt="name"), _col("Status"), _col("Roles"), _col("Age"), _col("Version"),
              _col("Internal-IP", priority=1), _col("External-IP", priority=1), _col("OS-Image", priority=1),
              _col("Kernel-Version", priority=1), _col("Container-Runtime", priority=1)], _node_row),
    "Pod": ([_col("Name", fmt="name"), _col("Ready"), _col("Status"), _col("Restarts", "string"), _col("Age"),
             _col("IP", priority=1), _col("Node", priority=1), _col("Nominated Node", priority=1),
             _col("Readiness Gates", priority=1)], _pod_row),
    "Deployment": ([_col("Name", fmt="name"), _col("Ready"), _col("Up-to-date", "integer"),
                    _col("Available", "integer"), _col("Age"), _col("Containers", priority=1),
                    _col("Images", priority=1), _col("Selector", priority=1)], _deploy_row),
    "ReplicaSet": ([_col("Name", fmt="name"), _col("Desired", "integer"), _col("Current", "integer"),
                    _col("Ready", "integer"), _col("Age")], _rs_row),
    "PodDisruptionBudget": ([_col("Name", fmt="name"), _col("Min Available"), _col("Max Unavailable"),
                             _col("Allowed Disruptions", "integer"), _col("Age")], _pdb_row),
    "Lease": ([_col("Name", fmt="name"), _col("Holder"), _col("Age")], _lease_row),
    "Event": ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")], _event_row),
}


def _generic(o: Mapping[str, Any]) -> list[Any]:
    return [o["metadata"]["name"], _age(o)]


def table(r: Resource, objs: list[Mapping[str, Any]], rv: str, version: str, include: str) -> dict[str, Any]:
    cols, row = _PRINTERS.get(r.kind, ([_col("Name", fmt="name"), _col("Age")], _generic))
    rows = []
    for o in objs:
        item: dict[str, Any] = {"cells": row(o)}
        if include == "Object":
            item["object"] = o
        elif include != "None":
            item["object"] = {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{version}",
                              "metadata": o.get("metadata", {})}
        rows.append(item)
    return {"kind": "Table", "apiVersion": f"meta.k8s.io/{version}", "metadata": {"resourceVersion": rv},
            "columnDefinitions": cols, "rows": rows}
