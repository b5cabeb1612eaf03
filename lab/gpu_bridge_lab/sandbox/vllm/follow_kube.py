"""Follow-kube mode: the simulated replicas are the Ready pods of the vLLM Deployment.

Pure part (``pod_view``, ``plan``): pod JSON (as the API server sends it) -> what the
simulator should do. Adapter (``KubeFollower``): the official ``kubernetes`` client, list
then watch from the list's resourceVersion, re-list on 410 Gone, reconnect with back-off on
any other error.

- a pod Ready and not being deleted -> a serving replica (name = pod name, node =
  spec.nodeName, model = the pod's ``MODEL_LABEL`` label or the default model);
- a pod Running with its containers ready but not Ready (a readiness gate not True, e.g. warm
  lending's ``gpu-bridge.io/awake`` closed) -> its replica leaves the load balancing only: the
  engine goes on (in-flight requests finish, it can sleep and wake), as the pod's process does
  when the Service drops it; Ready again -> back in the load balancing;
- a pod no longer Ready otherwise, or with deletionTimestamp set -> drain (the replica stops taking
  requests and finishes in-flight ones within the shutdown timeout), then it disappears;
- a pod gone (DELETED, or absent from a re-list) -> removed at once: its process is gone,
  whatever was still running is aborted.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from bridge import logs
from gpu_bridge_lab.sandbox.vllm.model import DRAINING, SERVING, STARTING
from gpu_bridge_lab.sandbox.vllm.sim import SimError, Simulation

log = logs.get(__name__)

MODEL_LABEL = "gpu-bridge.io/model"  # optional pod label naming the served model


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    node: str
    model: str
    serving: bool  # Ready and not being deleted
    gated_out: bool = False  # Running, containers ready, not Ready, not being deleted: out of the Service only
    ip: str = ""  # status.podIP


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  # "add" | "drain" | "remove" | "unroute" | "route"
    name: str
    model: str = ""
    node: str = ""


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    return _condition(pod, "Ready")


def _condition(pod: Mapping[str, Any], kind: str) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status")) == "True"
    return False


def pod_view(pod: Mapping[str, Any], default_model: str, model_label: str = MODEL_LABEL) -> PodView:
    """What the simulator cares about in a pod object (camelCase JSON, as served)."""
    meta = pod.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise ValueError("pod.metadata.name: missing")
    labels = meta.get("labels") or {}
    model = labels.get(model_label) or default_model
    deleting = bool(meta.get("deletionTimestamp"))
    phase = (pod.get("status") or {}).get("phase")
    ready = pod_is_ready(pod)
    serving = ready and not deleting and phase in (None, "Running")
    gated_out = not ready and not deleting and phase == "Running" and _condition(pod, "ContainersReady")
    return PodView(str(name), str((pod.get("spec") or {}).get("nodeName") or ""), str(model), serving, gated_out,
                   str((pod.get("status") or {}).get("podIP") or ""))


def plan(pods: Mapping[str, PodView], replicas: Mapping[str, str], owned: set[str],
         unrouted: Collection[str] = ()) -> list[Action]:
    """Actions that make the simulator's replicas match the pods.

    ``replicas`` maps replica name -> state (starting/serving/draining) for every replica
    the simulator has, ``unrouted`` names those out of the load balancing; only names in
    ``owned`` (those this follower created) are drained, removed or unrouted, so replicas
    added by hand or by ``--replicas`` are left alone."""
    actions: list[Action] = []
    for name, pv in sorted(pods.items()):
        state = replicas.get(name)
        if pv.serving and (state is None or state == DRAINING):
            actions.append(Action("add", name, pv.model, pv.node))
        elif pv.serving and name in unrouted:
            actions.append(Action("route", name))
        elif pv.gated_out and state in (SERVING, STARTING) and name in owned:
            if name not in unrouted:
                actions.append(Action("unroute", name))
        elif not pv.serving and state in (SERVING, STARTING) and name in owned:
            actions.append(Action("drain", name))
    for name in sorted(owned):
        if name not in pods and name in replicas:
            actions.append(Action("remove", name))
    return actions


def apply_actions(sim: Simulation, actions: list[Action], owned: set[str]) -> None:
    """Carry out ``plan``'s actions on the simulation (a name conflict is logged, not fatal)."""
    for a in actions:
        try:
            if a.kind == "add":
                sim.add_replica(a.name, a.model, a.node, warmup_s=0.0)
                owned.add(a.name)
                log.info("replica_follows_pod", pod=a.name, node=a.node, model=a.model, phase=SERVING)
            elif a.kind in ("route", "unroute"):
                sim.set_routed(a.name, a.kind == "route")
                log.info("replica_follows_pod", pod=a.name, phase=SERVING,
                         reason="pod Ready: in the load balancing" if a.kind == "route"
                         else "pod running but not Ready (a readiness gate): out of the load balancing, engine kept")
            elif a.kind == "drain":
                sim.remove_replica(a.name)
                log.info("replica_draining", pod=a.name, phase=DRAINING, reason="pod not ready or deleting")
            elif a.kind == "remove":
                sim.remove_replica(a.name, shutdown_timeout_s=0.0)
                owned.discard(a.name)
                log.info("replica_removed", pod=a.name, reason="pod gone")
        except SimError as exc:
            log.warning("follow_kube_action_failed", pod=a.name, reason=str(exc))


class PodTracker:
    """Pod state from list/watch events, reconciled into the simulation after each one."""

    def __init__(self, sim: Simulation, default_model: str, model_label: str = MODEL_LABEL,
                 on_pods: Callable[[Mapping[str, PodView]], None] | None = None) -> None:
        self.sim = sim
        self.default_model = default_model
        self.model_label = model_label
        self.pods: dict[str, PodView] = {}
        self.owned: set[str] = set()
        self.on_pods = on_pods  # called with the pods after each reconcile (the per-pod servers)

    def replace(self, pod_objs: list[Mapping[str, Any]]) -> None:
        """A full (re-)list."""
        self.pods = {}
        for obj in pod_objs:
            pv = pod_view(obj, self.default_model, self.model_label)
            self.pods[pv.name] = pv
        self.reconcile()

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED (BOOKMARK/ERROR are the caller's)."""
        pv = pod_view(obj, self.default_model, self.model_label)
        if kind == "DELETED":
            self.pods.pop(pv.name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.pods[pv.name] = pv
        self.reconcile()

    def reconcile(self) -> None:
        with self.sim.lock:
            self.owned &= set(self.sim.replicas)  # drained replicas the simulation reaped
            states = {n: r.state for n, r in self.sim.replicas.items()}
            unrouted = {n for n, r in self.sim.replicas.items() if not r.routed}
            apply_actions(self.sim, plan(self.pods, states, self.owned, unrouted), self.owned)
            self.owned &= set(self.sim.replicas)
        if self.on_pods is not None:
            self.on_pods(dict(self.pods))


class KubeFollower:
    """List+watch pods with the official client in a thread; feeds a ``PodTracker``."""

    def __init__(self, tracker: PodTracker, kubeconfig: str, namespace: str, selector: str = "", *,
                 watch_timeout_s: int = 60, backoff_s: float = 1.0,
                 on_synced: Callable[[], None] | None = None) -> None:
        from kubernetes import client, config  # late import: only follow mode needs it

        self.tracker = tracker
        self.namespace = namespace
        self.selector = selector
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.on_synced = on_synced
        api_client = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(api_client)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self.relists = 0

    def start(self) -> "KubeFollower":
        self._thread = threading.Thread(target=self._run, name="vllm-sim-follow-kube", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()
            resp = getattr(w, "_resp", None)  # unblock a read waiting for the next event
            if resp is not None:
                try:
                    shutdown = getattr(resp, "shutdown", None)  # urllib3 >= 2.3: wakes a blocked read
                    (shutdown or resp.close)()
                except Exception:  # already closed or released: the thread ends anyway
                    pass
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _list(self) -> str:
        resp = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector, _preload_content=False,
                                             _request_timeout=30)
        body = json.loads(resp.data)
        self.tracker.replace(body.get("items") or [])
        self.relists += 1
        if self.on_synced is not None:
            self.on_synced()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        rv = ""
        gone_streak = 0  # 410s in a row with no event between: back off instead of hammering
        while not self._stop.is_set():
            try:
                if not rv:
                    if gone_streak > 1:
                        self._stop.wait(self.backoff_s)
                    rv = self._list()
                    log.info("follow_kube_listed", reason="list", pods=len(self.tracker.pods), rv=rv)
                self._watch = watch.Watch()
                for ev in self._watch.stream(
                    self.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                    resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout_s,
                    _request_timeout=self.watch_timeout_s + 10,
                ):
                    if self._stop.is_set():
                        break
                    kind = ev.get("type")
                    raw = ev.get("raw_object") or {}
                    if kind == "ERROR":
                        if raw.get("code") == 410:
                            log.info("follow_kube_relist", reason="410 Gone")
                            gone_streak += 1
                            rv = ""
                            break
                        raise RuntimeError(f"watch error event: {raw}")
                    new_rv = (raw.get("metadata") or {}).get("resourceVersion")
                    gone_streak = 0
                    if kind != "BOOKMARK":
                        self.tracker.event(str(kind), raw)
                    if new_rv:
                        rv = str(new_rv)
                    # the client tracks resource_version itself too; keep ours in sync with it
            except ApiException as exc:
                if exc.status == 410:
                    log.info("follow_kube_relist", reason="410 Gone")
                    gone_streak += 1
                    rv = ""
                    continue
                log.warning("follow_kube_error", reason=f"{exc.status} {exc.reason}")
                self._stop.wait(self.backoff_s)
            except Exception as exc:  # connection refused, reset, timeouts: reconnect
                if self._stop.is_set():
                    break
                log.warning("follow_kube_error", reason=repr(exc)[:300])
                self._stop.wait(self.backoff_s)
