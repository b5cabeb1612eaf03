"""The cluster behind the API: Deployment -> ReplicaSet -> Pods, a scheduler, a kubelet,
the PDB controller, graceful deletion and garbage collection, so that what clients read
is what a cluster would do (a drained pod really goes, its replacement really lands).

One thread. The store calls ``_on_event`` for every write (under its lock); the thread
collects what became dirty and reconciles only that, plus timers (pod start delay = the
vLLM cold start, the end of a deletion grace period)."""

from __future__ import annotations

import calendar
import hashlib
import heapq
import json
import math
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from bridge import logs
from gpu_bridge_lab.sandbox.kube import defaults, resources as res_mod, selectors
from gpu_bridge_lab.sandbox.kube.api import bind_pod, delete_object, set_condition
from gpu_bridge_lab.sandbox.kube.quantity import parse as parse_quantity
from gpu_bridge_lab.sandbox.kube.ranking import is_ready, victim_order
from gpu_bridge_lab.sandbox.kube.scheduling import fit_problem, pod_requests, tolerates
from gpu_bridge_lab.sandbox.kube.workloads import DAEMONSETS, STATEFULSETS, sync_daemonset, sync_statefulset
from gpu_bridge_lab.sandbox.kube.store import ApiError, Store, WatchEvent, deepcopy_json, now_rfc3339

log = logs.get(__name__)

PODS = res_mod.core("pods")
NODES = res_mod.core("nodes")
EVENTS = res_mod.core("events")
DEPLOYMENTS = res_mod.get("apps", "deployments")
REPLICASETS = res_mod.get("apps", "replicasets")
PDBS = res_mod.get("policy", "poddisruptionbudgets")

START_DELAY_ANNOTATION = "sandbox.gpu-bridge.io/start-delay-s"  # per-pod override of the cold start
POD_TEMPLATE_HASH = "pod-template-hash"


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def is_active(pod: Mapping[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _int_or_percent(v: Any, total: int, round_up: bool) -> int:
    if isinstance(v, str) and v.endswith("%"):
        x = float(v[:-1]) * total / 100.0
        return int(math.ceil(x)) if round_up else int(math.floor(x))
    return int(v)


def template_hash(template: Mapping[str, Any]) -> str:
    t = deepcopy_json(template)
    (t.get("metadata") or {}).get("labels", {}).pop(POD_TEMPLATE_HASH, None)
    h = hashlib.sha256(json.dumps(t, sort_keys=True).encode()).hexdigest()
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    n = int(h[:16], 16)
    out = ""
    for _ in range(10):
        out += alphabet[n % len(alphabet)]
        n //= len(alphabet)
    return out


def node_info(name: str) -> dict[str, str]:
    """A complete NodeSystemInfo (the official client rejects one with a field missing)."""
    ident = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
    return {"architecture": "amd64", "bootID": ident, "containerRuntimeVersion": "containerd://1.7.22",
            "kernelVersion": "6.1.0-sandbox", "kubeProxyVersion": "", "kubeletVersion": "v1.32.0",
            "machineID": ident.replace("-", ""), "operatingSystem": "linux",
            "osImage": "Debian GNU/Linux 12 (bookworm)", "systemUUID": ident}


class Controllers:
    """All controllers in one reconcile thread."""

    def __init__(self, store: Store, *, pod_start_delay_s: float = 0.5, pod_stop_s: float | None = None,
                 record_events: bool = True) -> None:
        self.store = store
        self.pod_start_delay_s = pod_start_delay_s
        self.pod_stop_s = pod_stop_s
        self.record_events = record_events
        self._pending: list[WatchEvent] = []
        self._cond = threading.Condition()
        self._timers: list[tuple[float, int, str, str, str, str]] = []  # (due, seq, what, ns, name, uid)
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._started_uids: set[str] = set()
        self._ready_timer_uids: set[str] = set()
        store.listeners.append(self._on_event)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        with self.store.lock:  # reconcile what was loaded before start
            for key in (DEPLOYMENTS, REPLICASETS, STATEFULSETS, DAEMONSETS, PODS, NODES, PDBS):
                for e in self.store.entries(key):
                    self._pending.append(WatchEvent(self.store.rv, "ADDED", key.key,
                                                    e.obj["metadata"].get("namespace", ""), e, None))
        self._thread = threading.Thread(target=self._run, name="kube-controllers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._on_event in self.store.listeners:
            self.store.listeners.remove(self._on_event)

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Until every pending write is reconciled (timers may still be due later)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._cond:
                if not self._pending and self._idle.is_set():
                    return True
            time.sleep(0.005)
        return False

    def _on_event(self, ev: WatchEvent) -> None:
        with self._cond:
            self._pending.append(ev)
            self._idle.clear()
            self._cond.notify()

    def _timer(self, due: float, what: str, ns: str, name: str, uid: str) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._timers, (due, self._seq, what, ns, name, uid))
            self._cond.notify()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                if not self._pending:
                    self._idle.set()
                    wait = 0.5
                    if self._timers:
                        wait = max(0.0, min(wait, self._timers[0][0] - time.monotonic()))
                    self._cond.wait(wait)
                batch, self._pending = self._pending, []
                due = []
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    due.append(heapq.heappop(self._timers))
            try:
                with self.store.lock:
                    for t in due:
                        self._fire(t[2], t[3], t[4], t[5])
                    if batch:
                        self._reconcile(batch)
            except Exception as exc:  # keep the cluster alive; the next event retries
                log.exception("kube_controller_error", reason=str(exc))
                time.sleep(0.05)

    # --- dispatch --------------------------------------------------------------------------
    def _reconcile(self, batch: list[WatchEvent]) -> None:
        deployments: set[tuple[str, str]] = set()
        replicasets: set[tuple[str, str]] = set()
        pdb_namespaces: set[str] = set()
        statefulsets: set[tuple[str, str]] = set()
        daemonsets: set[tuple[str, str]] = set()
        all_daemonsets = False
        schedule = False
        nodes_noexec: set[str] = set()
        for ev in batch:
            obj = ev.entry.obj
            meta = obj["metadata"]
            ns, name = meta.get("namespace", ""), meta["name"]
            ref = controller_ref(obj)
            if ev.key == PODS.key:
                pdb_namespaces.add(ns)
                if ref and ref.get("kind") == "ReplicaSet":
                    replicasets.add((ns, ref["name"]))
                elif ref and ref.get("kind") == "StatefulSet":
                    statefulsets.add((ns, ref["name"]))
                elif ref and ref.get("kind") == "DaemonSet":
                    daemonsets.add((ns, ref["name"]))
                if ev.type == "DELETED":
                    schedule = True
                    self._started_uids.discard(meta.get("uid", ""))
                    self._ready_timer_uids.discard(meta.get("uid", ""))
                    self.store.deadlines.pop((ns, name), None)
                    continue
                if not (obj.get("spec") or {}).get("nodeName"):
                    if not meta.get("deletionTimestamp"):
                        schedule = True
                    else:
                        self.store.remove(PODS, ns, name, uid=meta.get("uid"))
                    continue
                self._kubelet(obj)
            elif ev.key == REPLICASETS.key:
                replicasets.add((ns, name))
                if ref and ref.get("kind") == "Deployment":
                    deployments.add((ns, ref["name"]))
                if ev.type == "DELETED":
                    self._gc(PODS, ns, meta.get("uid", ""))
            elif ev.key == DEPLOYMENTS.key:
                deployments.add((ns, name))
                if ev.type == "DELETED":
                    self._gc(REPLICASETS, ns, meta.get("uid", ""))
            elif ev.key == STATEFULSETS.key:
                statefulsets.add((ns, name))
                if ev.type == "DELETED":
                    self._gc(PODS, ns, meta.get("uid", ""))
            elif ev.key == DAEMONSETS.key:
                daemonsets.add((ns, name))
                if ev.type == "DELETED":
                    self._gc(PODS, ns, meta.get("uid", ""))
            elif ev.key == NODES.key:
                schedule = True
                all_daemonsets = all_daemonsets or ev.type != "MODIFIED" or ev.prev is None or (
                    (ev.prev.obj.get("spec") or {}) != (obj.get("spec") or {}) or
                    (ev.prev.obj["metadata"].get("labels") != meta.get("labels")))
                if ev.type == "DELETED":
                    self._orphaned_pods(name)
                else:
                    self._node_kubelet(obj)
                    if any(t.get("effect") == "NoExecute" for t in (obj.get("spec") or {}).get("taints") or []):
                        nodes_noexec.add(name)
            elif ev.key == PDBS.key:
                pdb_namespaces.add(ns)
        for ns, name in sorted(deployments):
            self._sync_deployment(ns, name)
        for ns, name in sorted(replicasets):
            self._sync_replicaset(ns, name)
        for ns, name in sorted(statefulsets):
            sync_statefulset(self.store, ns, name, self._record)
        if all_daemonsets:
            daemonsets |= {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in self.store.objs(DAEMONSETS)}
        for ns, name in sorted(daemonsets):
            sync_daemonset(self.store, ns, name, self._record)
        for node in sorted(nodes_noexec):
            self._taint_eviction(node)
        if schedule:
            self._schedule()
        for ns in sorted(pdb_namespaces):
            self._sync_pdbs(ns)

    def _fire(self, what: str, ns: str, name: str, uid: str) -> None:
        e = self.store.get_entry(PODS, ns, name)
        if e is None or e.obj["metadata"].get("uid") != uid:
            return
        if what == "ready":
            self._ready_timer_uids.discard(uid)
            if not e.obj["metadata"].get("deletionTimestamp"):
                self._set_pod_ready(ns, name)
        elif what == "gone":
            d = self.store.deadlines.get((ns, name))
            if d is not None and d[0] == uid and d[1] > time.monotonic() + 0.001:
                self._timer(d[1], "gone", ns, name, uid)  # an earlier timer of a longer grace
                return
            self.store.deadlines.pop((ns, name), None)
            self.store.remove(PODS, ns, name, uid=uid)

    # --- events ----------------------------------------------------------------------------
    def _record(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.event(obj, reason, message, component=f"{str(obj.get('kind', '')).lower()}-controller")

    def event(self, obj: Mapping[str, Any], reason: str, message: str, typ: str = "Normal",
              component: str = "") -> None:
        """Record a core/v1 Event about ``obj`` (as the real controllers do)."""
        if not self.record_events:
            return
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        ts = now_rfc3339()
        body = {"metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns},
                "involvedObject": {"kind": obj.get("kind"), "namespace": meta.get("namespace", ""),
                                   "name": meta["name"], "uid": meta.get("uid"), "apiVersion": obj.get("apiVersion"),
                                   "resourceVersion": meta.get("resourceVersion")},
                "reason": reason, "message": message, "type": typ, "count": 1,
                "source": {"component": component or "sandbox-controller-manager"},
                "firstTimestamp": ts, "lastTimestamp": ts, "eventTime": None,
                "reportingComponent": component or "sandbox-controller-manager", "reportingInstance": ""}
        try:
            self.store.create(EVENTS, body)
        except ApiError:
            pass

    # --- kubelet ---------------------------------------------------------------------------
    def _node_kubelet(self, node: Mapping[str, Any]) -> None:
        """A node without status gets the Ready condition a live kubelet would report."""
        st = node.get("status") or {}
        if st.get("conditions"):
            return
        name = node["metadata"]["name"]

        def edit(n: dict[str, Any]) -> None:
            s = n.setdefault("status", {})
            ts = now_rfc3339()
            s["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kubelet is posting ready status", "lastHeartbeatTime": ts,
                                "lastTransitionTime": ts}]
            s.setdefault("nodeInfo", node_info(name))
            if "allocatable" not in s and "capacity" in s:
                s["allocatable"] = dict(s["capacity"])
        self.store.mutate(NODES, "", name, edit, subresource="status")

    def _start_delay(self, pod: Mapping[str, Any]) -> float:
        ann = (pod["metadata"].get("annotations") or {}).get(START_DELAY_ANNOTATION)
        if ann is not None:
            try:
                return max(0.0, float(ann))
            except ValueError:
                pass
        return self.pod_start_delay_s

    def _kubelet(self, pod: Mapping[str, Any]) -> None:
        """A bound pod: start its containers (Running, not Ready), Ready after the start delay;
        a deleted one: gone when its grace period (or ``pod_stop_s``) ends."""
        meta = pod["metadata"]
        ns, name, uid = meta.get("namespace", ""), meta["name"], meta.get("uid", "")
        if meta.get("deletionTimestamp"):
            d = self.store.deadlines.get((ns, name))
            if d is None or d[0] != uid:
                self.store.remove(PODS, ns, name, uid=uid)  # no tracked grace: loaded terminating
                return
            due = d[1]
            if self.pod_stop_s is not None:
                started = d[1] - float(meta.get("deletionGracePeriodSeconds") or 0)
                due = min(due, started + self.pod_stop_s)
                self.store.deadlines[(ns, name)] = (uid, due)
            self._timer(due, "gone", ns, name, uid)
            return
        st = pod.get("status") or {}
        if st.get("phase") in ("Succeeded", "Failed"):
            return
        if st.get("containerStatuses") and st.get("phase") == "Running":
            if not is_ready(pod) and uid not in self._ready_timer_uids and uid not in self._started_uids:
                self._started_uids.add(uid)
                self._ready_timer_uids.add(uid)
                self._timer(time.monotonic() + self._start_delay(pod), "ready", ns, name, uid)
            return
        if uid in self._started_uids:
            return
        self._started_uids.add(uid)
        node = self.store.get_entry(NODES, "", pod["spec"]["nodeName"])
        host_ip = "10.0.0.1"
        if node is not None:
            for a in (node.obj.get("status") or {}).get("addresses") or []:
                if a.get("type") == "InternalIP":
                    host_ip = a.get("address", host_ip)
        pod_ip = "10.244.%d.%d" % ((hash(uid) >> 8) % 250 + 1, hash(uid) % 250 + 2)

        def edit(p: dict[str, Any]) -> None:
            s = p.setdefault("status", {})
            ts = now_rfc3339()
            s["phase"] = "Running"
            s["hostIP"] = host_ip
            s["hostIPs"] = [{"ip": host_ip}]
            s["podIP"] = pod_ip
            s["podIPs"] = [{"ip": pod_ip}]
            s["startTime"] = ts
            set_condition(p, "PodReadyToStartContainers", "True", now=ts)
            set_condition(p, "Initialized", "True", now=ts)
            set_condition(p, "Ready", "False", "ContainersNotReady", "containers with unready status", now=ts)
            set_condition(p, "ContainersReady", "False", "ContainersNotReady", "containers with unready status",
                          now=ts)
            set_condition(p, "PodScheduled", "True", now=ts)
            s["containerStatuses"] = [
                {"name": c.get("name", ""), "image": c.get("image", ""), "imageID": "", "ready": False,
                 "started": True, "restartCount": 0, "containerID": f"sandbox://{uid[:8]}-{i}",
                 "state": {"running": {"startedAt": ts}}, "lastState": {}}
                for i, c in enumerate((p.get("spec") or {}).get("containers") or [])]
        self.store.mutate(PODS, ns, name, edit, subresource="status")
        self._ready_timer_uids.add(uid)
        self._timer(time.monotonic() + self._start_delay(pod), "ready", ns, name, uid)

    def _set_pod_ready(self, ns: str, name: str) -> None:
        def edit(p: dict[str, Any]) -> None:
            ts = now_rfc3339()
            set_condition(p, "Ready", "True", now=ts)
            set_condition(p, "ContainersReady", "True", now=ts)
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                cs["ready"] = True
        self.store.mutate(PODS, ns, name, edit, subresource="status")

    # --- garbage collection, taint eviction ------------------------------------------------
    def _gc(self, r: res_mod.Resource, ns: str, owner_uid: str) -> None:
        for o in self.store.objs(r, ns):
            if any(ref.get("uid") == owner_uid for ref in o["metadata"].get("ownerReferences") or []):
                try:
                    delete_object(self.store, r, ns, o["metadata"]["name"], {})
                except ApiError:
                    pass

    def _orphaned_pods(self, node_name: str) -> None:
        """Pods bound to a node that no longer exists are deleted at once (the pod GC)."""
        for key in list(self.store.pods_by_node.get(node_name, ())):
            e = self.store.get_entry(PODS, *key)
            if e is not None:
                self.event(e.obj, "NodeLost", f"node {node_name} was deleted", "Warning", "pod-garbage-collector")
                self.store.remove(PODS, key[0], key[1])

    def _taint_eviction(self, node_name: str) -> None:
        node = self.store.get_entry(NODES, "", node_name)
        if node is None:
            return
        taints = [t for t in (node.obj.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
        for p in self.store.objs(PODS):
            if (p.get("spec") or {}).get("nodeName") != node_name or p["metadata"].get("deletionTimestamp"):
                continue
            tol = (p.get("spec") or {}).get("tolerations") or []
            if all(tolerates(tol, t) for t in taints):
                continue
            self.event(p, "TaintManagerEviction", "Marking for deletion Pod " + p["metadata"]["name"],
                       component="taint-eviction-controller")
            delete_object(self.store, PODS, p["metadata"]["namespace"], p["metadata"]["name"], {})

    # --- scheduler -------------------------------------------------------------------------
    def _schedule(self) -> None:
        unbound = [e.obj for e in self.store.entries(PODS, keys=list(self.store.pods_by_node.get("", ())))]
        pending = [p for p in unbound
                   if not (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")
                   and (p.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"]
        if not pending:
            return
        nodes = self.store.objs(NODES)
        used: dict[str, dict[str, float]] = {n["metadata"]["name"]: {} for n in nodes}
        count: dict[str, int] = {n["metadata"]["name"]: 0 for n in nodes}
        for p in self.store.objs(PODS):
            n = (p.get("spec") or {}).get("nodeName")
            if n in used and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                count[n] += 1
                for k, v in pod_requests(p).items():
                    used[n][k] = used[n].get(k, 0.0) + v
        pending.sort(key=lambda p: p["metadata"].get("creationTimestamp", ""))
        for pod in pending:
            reasons: dict[str, int] = {}
            best: tuple[float, str] | None = None
            reqs = pod_requests(pod)
            for node in nodes:
                nn = node["metadata"]["name"]
                why = fit_problem(pod, node, used[nn], count[nn])
                if why:
                    reasons[why] = reasons.get(why, 0) + 1
                    continue
                alloc = (node.get("status") or {}).get("allocatable") or {}
                free = 0.0
                for k in ("nvidia.com/gpu", "cpu", "memory"):
                    if k in alloc and parse_quantity(alloc[k]) > 0:
                        free += 1.0 - used[nn].get(k, 0.0) / parse_quantity(alloc[k])
                score = (-free, nn)  # least allocated first, then by name
                if best is None or score < best:
                    best = score
            meta = pod["metadata"]
            if best is None:
                msg = f"0/{len(nodes)} nodes are available: " + ", ".join(
                    f"{n} {r}" for r, n in sorted(reasons.items())) + "." if nodes else "no nodes available"
                cur = deepcopy_json(pod)
                if set_condition(cur, "PodScheduled", "False", "Unschedulable", msg):
                    self.store.update(PODS, cur, subresource="status", namespace=meta["namespace"], name=meta["name"])
                    self.event(pod, "FailedScheduling", msg, "Warning", "default-scheduler")
                continue
            node_name = best[1]
            bind_pod(self.store, meta["namespace"], meta["name"], node_name)
            count[node_name] += 1
            for k, v in reqs.items():
                used[node_name][k] = used[node_name].get(k, 0.0) + v
            self.event(pod, "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {node_name}",
                       component="default-scheduler")

    # --- replicasets -----------------------------------------------------------------------
    def _owned_pods(self, ns: str, uid: str) -> list[dict[str, Any]]:
        return [p for p in self.store.objs(PODS, ns)
                if any(r.get("uid") == uid and r.get("controller") for r in p["metadata"].get("ownerReferences") or [])]

    def _sync_replicaset(self, ns: str, name: str) -> None:
        e = self.store.get_entry(REPLICASETS, ns, name)
        if e is None or e.obj["metadata"].get("deletionTimestamp"):
            return
        rs = e.obj
        uid = rs["metadata"]["uid"]
        pods = self._owned_pods(ns, uid)
        active = [p for p in pods if is_active(p)]
        want = int((rs.get("spec") or {}).get("replicas", 1))
        diff = len(active) - want
        if diff < 0:
            tmpl = (rs.get("spec") or {}).get("template") or {}
            for _ in range(-diff):
                body = {"metadata": {"generateName": f"{name}-", "namespace": ns,
                                     "labels": dict((tmpl.get("metadata") or {}).get("labels") or {}),
                                     "annotations": dict((tmpl.get("metadata") or {}).get("annotations") or {}),
                                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                          "name": name, "uid": uid, "controller": True,
                                                          "blockOwnerDeletion": True}]},
                        "spec": deepcopy_json(tmpl.get("spec") or {})}
                if not body["metadata"]["annotations"]:
                    del body["metadata"]["annotations"]
                defaults.on_create(PODS, body)
                pod = self.store.create(PODS, body, keep_status=True)
                active.append(pod)
                self.event(rs, "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}",
                           component="replicaset-controller")
        elif diff > 0:
            for victim in victim_order(active, self.store.objs(PODS, ns))[:diff]:
                vm = victim["metadata"]
                delete_object(self.store, PODS, ns, vm["name"], {})
                active = [p for p in active if p["metadata"]["uid"] != vm["uid"]]
                self.event(rs, "SuccessfulDelete", f"Deleted pod: {vm['name']}", component="replicaset-controller")
        # status from what exists now
        cur_active = [p for p in self._owned_pods(ns, uid) if is_active(p)]
        ready = sum(1 for p in cur_active if is_ready(p))
        sel = selectors.from_label_selector_object((rs.get("spec") or {}).get("selector")) or ()
        status = {"replicas": len(cur_active),
                  "fullyLabeledReplicas": sum(1 for p in cur_active
                                              if selectors.labels_match(sel, p["metadata"].get("labels"))),
                  "readyReplicas": ready, "availableReplicas": ready,
                  "observedGeneration": rs["metadata"].get("generation", 1)}
        for k in ("readyReplicas", "availableReplicas"):
            if not status[k]:
                del status[k]

        def edit(o: dict[str, Any]) -> None:
            o["status"] = status
        self.store.mutate(REPLICASETS, ns, name, edit, subresource="status")

    # --- deployments -----------------------------------------------------------------------
    def _sync_deployment(self, ns: str, name: str) -> None:
        e = self.store.get_entry(DEPLOYMENTS, ns, name)
        if e is None or e.obj["metadata"].get("deletionTimestamp"):
            return
        d = e.obj
        spec = d.get("spec") or {}
        uid = d["metadata"]["uid"]
        desired = int(spec.get("replicas", 1))
        tmpl = spec.get("template") or {}
        h = template_hash(tmpl)
        rss = [rs for rs in self.store.objs(REPLICASETS, ns)
               if any(r.get("uid") == uid and r.get("controller") for r in rs["metadata"].get("ownerReferences") or [])]
        new_rs = next((rs for rs in rss if (rs["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH) == h), None)
        old = [rs for rs in rss if rs is not new_rs]
        strategy = spec.get("strategy") or {}
        ru = strategy.get("rollingUpdate") or {}
        surge = _int_or_percent(ru.get("maxSurge", "25%"), desired, True)
        unavail = _int_or_percent(ru.get("maxUnavailable", "25%"), desired, False)
        if surge == 0 and unavail == 0:
            unavail = 1
        recreate = strategy.get("type") == "Recreate"
        old_running = sum(int((rs.get("spec") or {}).get("replicas", 0)) for rs in old)
        old_pods = sum(int((rs.get("status") or {}).get("replicas", 0)) for rs in old)
        if new_rs is None:
            revision = 1 + max([int((rs["metadata"].get("annotations") or {}).get(
                "deployment.kubernetes.io/revision", 0)) for rs in rss] or [0])
            labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
            labels[POD_TEMPLATE_HASH] = h
            t = deepcopy_json(tmpl)
            t.setdefault("metadata", {})["labels"] = labels
            sel = deepcopy_json(spec.get("selector") or {})
            sel.setdefault("matchLabels", {})[POD_TEMPLATE_HASH] = h
            start = desired if old_running == 0 and (old_pods == 0 or not recreate) else 0
            if not recreate and old_running:
                start = max(0, min(desired, desired + surge - old_pods))
            body = {"metadata": {"name": f"{name}-{h}", "namespace": ns, "labels": labels,
                                 "annotations": {"deployment.kubernetes.io/revision": str(revision),
                                                 "deployment.kubernetes.io/desired-replicas": str(desired),
                                                 "deployment.kubernetes.io/max-replicas": str(desired + surge)},
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                                      "uid": uid, "controller": True, "blockOwnerDeletion": True}]},
                    "spec": {"replicas": start, "selector": sel, "template": t,
                             "minReadySeconds": spec.get("minReadySeconds", 0)}}
            defaults.on_create(REPLICASETS, body)
            new_rs = self.store.create(REPLICASETS, body, keep_status=True)
            if start:
                self.event(d, "ScalingReplicaSet",
                           f"Scaled up replica set {new_rs['metadata']['name']} from 0 to {start}",
                           component="deployment-controller")
        else:
            cur = int((new_rs.get("spec") or {}).get("replicas", 0))
            if recreate:
                target = desired if old_running == 0 and old_pods == 0 else cur
            elif not old_running:
                target = desired
            else:
                total_pods = old_pods + int((new_rs.get("status") or {}).get("replicas", 0))
                up = max(0, desired + surge - total_pods)
                target = min(desired, cur + up)
            if target != cur:
                self._scale_rs(d, new_rs, target)
        # scale old replicasets down
        if old_running:
            if recreate:
                for rs in old:
                    if int((rs.get("spec") or {}).get("replicas", 0)):
                        self._scale_rs(d, rs, 0)
            else:
                new_e = self.store.get_entry(REPLICASETS, ns, new_rs["metadata"]["name"])
                nst = (new_e.obj.get("status") or {}) if new_e else {}
                new_spec = int(((new_e.obj if new_e else new_rs).get("spec") or {}).get("replicas", 0))
                new_avail = int(nst.get("availableReplicas", 0))
                all_spec = old_running + new_spec
                min_avail = desired - unavail
                budget = all_spec - min_avail - (new_spec - new_avail)
                for rs in sorted(old, key=lambda x: x["metadata"].get("creationTimestamp", "")):
                    n = int((rs.get("spec") or {}).get("replicas", 0))
                    if n == 0 or budget <= 0:
                        continue
                    down = min(n, budget)
                    self._scale_rs(d, rs, n - down)
                    budget -= down
        # status
        rss = [rs for rs in self.store.objs(REPLICASETS, ns)
               if any(r.get("uid") == uid and r.get("controller") for r in rs["metadata"].get("ownerReferences") or [])]
        newest = next((rs for rs in rss if (rs["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH) == h), None)
        total = sum(int((rs.get("status") or {}).get("replicas", 0)) for rs in rss)
        ready = sum(int((rs.get("status") or {}).get("readyReplicas", 0)) for rs in rss)
        avail = sum(int((rs.get("status") or {}).get("availableReplicas", 0)) for rs in rss)
        updated = int((newest.get("status") or {}).get("replicas", 0)) if newest else 0
        complete = updated == desired and total == desired and avail >= desired
        st: dict[str, Any] = {"observedGeneration": d["metadata"].get("generation", 1), "replicas": total,
                              "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": avail,
                              "unavailableReplicas": max(0, desired - avail)}
        for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas", "unavailableReplicas"):
            if not st[k]:
                del st[k]
        new = deepcopy_json(d)
        new["status"] = dict(d.get("status") or {})
        new["status"].update({k: 0 for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas",
                                             "unavailableReplicas")})
        for k in list(new["status"]):
            if new["status"][k] == 0:
                del new["status"][k]
        new["status"].update(st)
        set_condition(new, "Available", "True" if avail >= desired - unavail else "False",
                      "MinimumReplicasAvailable" if avail >= desired - unavail else "MinimumReplicasUnavailable",
                      "Deployment has minimum availability." if avail >= desired - unavail else
                      "Deployment does not have minimum availability.")
        rs_name = newest["metadata"]["name"] if newest else name
        set_condition(new, "Progressing", "True", "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                      f'ReplicaSet "{rs_name}" has successfully progressed.' if complete else
                      f'ReplicaSet "{rs_name}" is progressing.')
        for c in new["status"].get("conditions") or []:
            c.pop("lastProbeTime", None)
            c.setdefault("lastUpdateTime", c.get("lastTransitionTime"))
        if new["status"] != (d.get("status") or {}):
            self.store.update(DEPLOYMENTS, new, subresource="status", namespace=ns, name=name)

    def _scale_rs(self, d: Mapping[str, Any], rs: Mapping[str, Any], n: int) -> None:
        meta = rs["metadata"]
        cur = int((self.store.get(REPLICASETS, meta["namespace"], meta["name"]).get("spec") or {}).get("replicas", 0))
        if cur == n:
            return

        def edit(o: dict[str, Any]) -> None:
            o["spec"]["replicas"] = n
            o["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/desired-replicas"] = \
                str((d.get("spec") or {}).get("replicas", 1))
        self.store.mutate(REPLICASETS, meta["namespace"], meta["name"], edit)
        verb = "up" if n > cur else "down"
        self.event(d, "ScalingReplicaSet", f"Scaled {verb} replica set {meta['name']} from {cur} to {n}",
                   component="deployment-controller")

    # --- pod disruption budgets ------------------------------------------------------------
    def _expected(self, pods: list[Mapping[str, Any]], ns: str) -> int | None:
        """Sum of the scale of the controllers of ``pods`` (None: an unmanaged pod)."""
        seen: dict[str, int] = {}
        for p in pods:
            ref = controller_ref(p)
            if ref is None:
                return None
            if ref["uid"] in seen:
                continue
            if ref.get("kind") == "ReplicaSet":
                rs = self.store.get_entry(REPLICASETS, ns, ref["name"])
                if rs is None:
                    return None
                dref = controller_ref(rs.obj)
                if dref and dref.get("kind") == "Deployment":
                    d = self.store.get_entry(DEPLOYMENTS, ns, dref["name"])
                    if d is None:
                        return None
                    if dref["uid"] not in seen:
                        seen[dref["uid"]] = int((d.obj.get("spec") or {}).get("replicas", 1))
                    seen[ref["uid"]] = 0
                else:
                    seen[ref["uid"]] = int((rs.obj.get("spec") or {}).get("replicas", 1))
            elif ref.get("kind") == "StatefulSet":
                sts = self.store.get_entry(res_mod.get("apps", "statefulsets"), ns, ref["name"])
                if sts is None:
                    return None
                seen[ref["uid"]] = int((sts.obj.get("spec") or {}).get("replicas", 1))
            else:
                return None
        return sum(seen.values())

    def _sync_pdbs(self, ns: str) -> None:
        pdbs = self.store.objs(PDBS, ns)
        if not pdbs:
            return
        all_pods = self.store.objs(PODS, ns)
        now = time.time()
        for pdb in pdbs:
            spec = pdb.get("spec") or {}
            try:
                reqs = selectors.from_label_selector_object(spec.get("selector"))
            except selectors.SelectorError:
                reqs = None
            pods = [p for p in all_pods if reqs and selectors.labels_match(reqs, p["metadata"].get("labels"))]
            disrupted = dict((pdb.get("status") or {}).get("disruptedPods") or {})
            alive = {p["metadata"]["name"]: p for p in pods}
            for pname, ts in list(disrupted.items()):
                p = alive.get(pname)
                try:
                    age = now - calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ"))
                except (ValueError, TypeError):
                    age = 1e9
                if p is None or p["metadata"].get("deletionTimestamp") or age > 120:
                    del disrupted[pname]
            healthy = sum(1 for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp")
                          and p["metadata"]["name"] not in disrupted)
            if "minAvailable" in spec and not str(spec["minAvailable"]).endswith("%"):
                expected = len(pods)
                desired_h = int(spec["minAvailable"])
            else:
                exp = self._expected(pods, ns)
                expected = len(pods) if exp is None else exp
                if "maxUnavailable" in spec:
                    desired_h = max(0, expected - _int_or_percent(spec["maxUnavailable"], expected, True))
                elif "minAvailable" in spec:
                    desired_h = _int_or_percent(spec["minAvailable"], expected, True)
                else:
                    desired_h = expected
            allowed = max(0, healthy - desired_h) if expected > 0 else 0
            status: dict[str, Any] = {"observedGeneration": pdb["metadata"].get("generation", 1),
                                      "currentHealthy": healthy, "desiredHealthy": desired_h,
                                      "expectedPods": expected, "disruptionsAllowed": allowed}
            if disrupted:
                status["disruptedPods"] = disrupted
            new = deepcopy_json(pdb)
            old_conds = (pdb.get("status") or {}).get("conditions")
            new["status"] = status
            if old_conds:
                new["status"]["conditions"] = old_conds
            set_condition(new, "DisruptionAllowed", "True" if allowed > 0 else "False",
                          "SufficientPods" if allowed > 0 else "InsufficientPods")
            for c in new["status"]["conditions"]:
                c.pop("lastProbeTime", None)
                c.setdefault("message", "")
                c["observedGeneration"] = status["observedGeneration"]
            if new["status"] != (pdb.get("status") or {}):
                self.store.update(PDBS, new, subresource="status", namespace=ns, name=pdb["metadata"]["name"])

