"""StatefulSet and DaemonSet controllers (simplified but honest): a StatefulSet keeps pods
``<name>-0..N-1``, created in order, each once the previous one is Ready (OrderedReady) or
all at once (Parallel), removed from the highest ordinal; a DaemonSet keeps one pod on each
node it fits (with the tolerations the real controller adds, so cordoned nodes keep theirs
and ``kubectl drain --ignore-daemonsets`` has something to ignore)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpu_bridge_lab.sandbox.kube import defaults, resources as res_mod
from gpu_bridge_lab.sandbox.kube.api import delete_object
from gpu_bridge_lab.sandbox.kube.ranking import is_ready
from gpu_bridge_lab.sandbox.kube.scheduling import fit_problem
from gpu_bridge_lab.sandbox.kube.store import Store, deepcopy_json

PODS = res_mod.core("pods")
NODES = res_mod.core("nodes")
STATEFULSETS = res_mod.get("apps", "statefulsets")
DAEMONSETS = res_mod.get("apps", "daemonsets")

Record = Callable[[Mapping[str, Any], str, str], None]  # (object, reason, message)

DAEMON_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]


def owned_pods(store: Store, ns: str, uid: str) -> list[dict[str, Any]]:
    return [p for p in store.objs(PODS, ns)
            if any(r.get("uid") == uid and r.get("controller") for r in p["metadata"].get("ownerReferences") or [])]


def _pod_from_template(owner: Mapping[str, Any], kind: str, name: str | None) -> dict[str, Any]:
    meta = owner["metadata"]
    tmpl = (owner.get("spec") or {}).get("template") or {}
    body: dict[str, Any] = {
        "metadata": {"namespace": meta["namespace"],
                     "labels": dict((tmpl.get("metadata") or {}).get("labels") or {}),
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": meta["name"],
                                          "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": deepcopy_json(tmpl.get("spec") or {}),
    }
    ann = (tmpl.get("metadata") or {}).get("annotations")
    if ann:
        body["metadata"]["annotations"] = dict(ann)
    if name:
        body["metadata"]["name"] = name
    else:
        body["metadata"]["generateName"] = f"{meta['name']}-"
    return body


def _write_status(store: Store, r: res_mod.Resource, ns: str, name: str, status: dict[str, Any]) -> None:
    cur = store.get(r, ns, name)
    if (cur.get("status") or {}) == status:
        return
    new = deepcopy_json(cur)
    new["status"] = status
    store.update(r, new, subresource="status", namespace=ns, name=name)


def sync_statefulset(store: Store, ns: str, name: str, record: Record) -> None:
    e = store.get_entry(STATEFULSETS, ns, name)
    if e is None or e.obj["metadata"].get("deletionTimestamp"):
        return
    sts = e.obj
    spec = sts.get("spec") or {}
    want = int(spec.get("replicas", 1))
    parallel = spec.get("podManagementPolicy") == "Parallel"
    pods = {p["metadata"]["name"]: p for p in owned_pods(store, ns, sts["metadata"]["uid"])}
    for i in range(want):
        pname = f"{name}-{i}"
        p = pods.get(pname)
        if p is None:
            body = _pod_from_template(sts, "StatefulSet", pname)
            body["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] = pname
            body["metadata"]["labels"]["apps.kubernetes.io/pod-index"] = str(i)
            body["spec"].setdefault("hostname", pname)
            defaults.on_create(PODS, body)
            pods[pname] = store.create(PODS, body, keep_status=True)
            record(sts, "SuccessfulCreate", f"create Pod {pname} in StatefulSet {name} successful")
            if not parallel:
                break
        elif not parallel and (not is_ready(p) or p["metadata"].get("deletionTimestamp")):
            break  # OrderedReady: the next ordinal waits for this one
    extra = sorted((p for n, p in pods.items() if _ordinal(n, name) >= want and not p["metadata"].get(
        "deletionTimestamp")), key=lambda p: -_ordinal(p["metadata"]["name"], name))
    for p in extra[: (len(extra) if parallel else 1)]:
        delete_object(store, PODS, ns, p["metadata"]["name"], {})
        record(sts, "SuccessfulDelete", f"delete Pod {p['metadata']['name']} in StatefulSet {name} successful")
    active = [p for p in owned_pods(store, ns, sts["metadata"]["uid"]) if not p["metadata"].get("deletionTimestamp")]
    ready = sum(1 for p in active if is_ready(p))
    rev = f"{name}-{sts['metadata'].get('generation', 1)}"
    status: dict[str, Any] = {"observedGeneration": sts["metadata"].get("generation", 1), "replicas": len(active),
                              "readyReplicas": ready, "currentReplicas": len(active), "updatedReplicas": len(active),
                              "availableReplicas": ready, "currentRevision": rev, "updateRevision": rev,
                              "collisionCount": 0}
    _write_status(store, STATEFULSETS, ns, name, {k: v for k, v in status.items() if v or k in (
        "replicas", "observedGeneration", "availableReplicas")})


def _ordinal(pod_name: str, sts_name: str) -> int:
    tail = pod_name[len(sts_name) + 1:]
    return int(tail) if tail.isdigit() else -1


def sync_daemonset(store: Store, ns: str, name: str, record: Record) -> None:
    e = store.get_entry(DAEMONSETS, ns, name)
    if e is None or e.obj["metadata"].get("deletionTimestamp"):
        return
    ds = e.obj
    uid = ds["metadata"]["uid"]
    pods = owned_pods(store, ns, uid)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for p in pods:
        if p["metadata"].get("deletionTimestamp"):
            continue
        target = _target_node(p)
        by_node.setdefault(target, []).append(p)
    probe = _pod_from_template(ds, "DaemonSet", "probe")
    probe["spec"]["tolerations"] = list(probe["spec"].get("tolerations") or []) + DAEMON_TOLERATIONS
    desired = 0
    for node in store.objs(NODES):
        nn = node["metadata"]["name"]
        why = fit_problem(probe, node, {}, 0)  # taints, selector, affinity; resources are the scheduler's
        fits = not why or why.startswith("Insufficient") or why == "Too many pods"
        have = by_node.pop(nn, [])
        if fits:
            desired += 1
            if not have:
                body = _pod_from_template(ds, "DaemonSet", None)
                body["spec"]["tolerations"] = list(body["spec"].get("tolerations") or []) + DAEMON_TOLERATIONS
                body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                            "values": [nn]}]}]}}}
                defaults.on_create(PODS, body)
                pod = store.create(PODS, body, keep_status=True)
                record(ds, "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}")
            for extra in have[1:]:
                delete_object(store, PODS, ns, extra["metadata"]["name"], {})
        else:
            for p in have:
                delete_object(store, PODS, ns, p["metadata"]["name"], {})
                record(ds, "SuccessfulDelete", f"Deleted pod: {p['metadata']['name']}")
    for leftover in by_node.values():  # pods for nodes that are gone
        for p in leftover:
            delete_object(store, PODS, ns, p["metadata"]["name"], {})
    active = [p for p in owned_pods(store, ns, uid) if not p["metadata"].get("deletionTimestamp")]
    scheduled = [p for p in active if (p.get("spec") or {}).get("nodeName")]
    ready = sum(1 for p in scheduled if is_ready(p))
    _write_status(store, DAEMONSETS, ns, name, {
        "observedGeneration": ds["metadata"].get("generation", 1), "desiredNumberScheduled": desired,
        "currentNumberScheduled": len(scheduled), "numberMisscheduled": 0, "numberReady": ready,
        "numberAvailable": ready, "updatedNumberScheduled": len(scheduled),
        **({"numberUnavailable": desired - ready} if desired > ready else {})})


def _target_node(pod: Mapping[str, Any]) -> str:
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        return str(node)
    aff = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in aff.get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return ""
