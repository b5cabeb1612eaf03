"""In-memory fakes of the Kubernetes and Prometheus adapters and of the leader elector, for
the daemon's tests and the simulator.

Honest on purpose: ``FakeKube`` keeps objects in the API's JSON shape, reads them through
the same parsers and writes them through the same patch builders as ``KubeAdapter``, bumps
resourceVersions, rejects stale writes (409, retried a bounded number of times like the real
one), blocks evictions a PodDisruptionBudget forbids (BLOCKED), and runs a tiny
ReplicaSet/scheduler/kubelet in ``step(now)``: pods are deleted in the ReplicaSet
controller's order (unscheduled, pending, not Ready, then lowest deletion cost),
placed only on schedulable untainted pool nodes (one replica per node), Ready after a start
delay, gone after their termination grace.
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar, cast

from bridge import wellknown as wk
from bridge.adapters.kube import patches
from bridge.adapters.kube.calls import KubeApiError, KubeConflictError
from bridge.adapters.kube.informer import InformerStatus
from bridge.adapters.kube.objects import (
    DeploymentInfo,
    EvictOutcome,
    NodeInfo,
    PodInfo,
    ScaleInfo,
    parse_deployment,
    parse_node,
    parse_pod,
)
from bridge.adapters.protocols import CacheStatus, KubeAdapterProtocol, Leader, PoolTarget, PromReader
from bridge.adapters.prom.types import DelayCount, PromPool, SignalsReading
from bridge.model import LoadSignals, Phase, Pin, WarmRecord


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """Strategic-merge for the shapes our patches use: maps merge, None deletes, lists replace."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        elif isinstance(value, Mapping):
            target[key] = {}
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    node: str
    reason: str
    message: str
    event_type: str
    t: float


T = TypeVar("T")


@dataclass
class _Pool:
    target: PoolTarget
    replicas: int
    min_available: int | None  # PDB; None = no PDB
    start_delay_s: float
    grace_s: float
    readiness_gate: bool = False  # the pod template declares gpu-bridge.io/awake (warm lending)


class FakeKube:
    """Implements KubeReader + KubeWriter in memory. Time only moves through ``step(now)``."""

    def __init__(self, *, identity: str = "fake-bridge", max_conflict_retries: int = 5, now: float = 0.0,
                 pod_network: str = "10.0") -> None:
        self.identity = identity
        self.now = now
        self.synced = True
        self.last_event_age_s: float | None = 0.0
        self.events: list[RecordedEvent] = []
        self.calls: Counter[tuple[str, str]] = Counter()
        self._retries = max_conflict_retries
        self._rv = itertools.count(1)
        self._nodes: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # name -> JSON (namespace in metadata)
        self._pod_pool: dict[str, str] = {}
        self._pod_times: dict[str, float] = {}  # pod -> when it was scheduled / deleted
        self._pools: dict[str, _Pool] = {}
        self._deploy_rv: dict[str, str] = {}
        self._cache: dict[int, tuple[str | None, object]] = {}  # id(object JSON) -> (its resourceVersion, parsed)
        self._conflicts: Counter[str] = Counter()  # object key -> concurrent writes to simulate
        self._failures: Counter[str] = Counter()  # verb -> failures to inject
        self._names = itertools.count(1)
        self._ips = 0
        self._pod_network = pod_network  # pods get <pod_network>.X.Y (127.0: reachable servers on loopback)

    # --- seeding and fault injection ----------------------------------------------------
    def add_node(self, name: str, pool: str, *, gpus: int = 4, labels: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None, unschedulable: bool = False,
                 taints: Sequence[Mapping[str, str]] = ()) -> None:
        self._nodes[name] = {
            "metadata": {
                "name": name, "uid": f"uid-{name}", "resourceVersion": self._next_rv(),
                "labels": {wk.LABEL_POOL: pool, **(labels or {})}, "annotations": dict(annotations or {}),
            },
            "spec": {"unschedulable": unschedulable, "taints": [dict(t) for t in taints]},
            "status": {"allocatable": {wk.GPU_RESOURCE: str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]},
        }

    def add_pool(self, target: PoolTarget, *, replicas: int, min_available: int | None = None,
                 start_delay_s: float = 0.0, grace_s: float = 0.0, ready: bool = True, readiness_gate: bool = False) -> None:
        """A Deployment with ``replicas`` pods placed at once (Ready at once if ``ready``). With
        ``readiness_gate`` a started pod is Ready only while its gpu-bridge.io/awake condition is True."""
        self._pools[target.name] = _Pool(target, replicas, min_available, start_delay_s, grace_s, readiness_gate)
        self._deploy_rv[target.name] = self._next_rv()
        for _ in range(replicas):
            node = self._free_node(target.name)
            if node is None:
                break
            self._create_pod(target.name, node, ready=ready)

    def set_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        """An outside change (an operator's kubectl label); bumps the rv like the server."""
        _merge(self._nodes[node]["metadata"].setdefault("labels", {}), labels)
        self._bump(self._nodes[node])

    def set_unschedulable(self, node: str, unschedulable: bool) -> None:
        """An outside change (an administrator's ``kubectl cordon``/``uncordon``)."""
        self._nodes[node]["spec"]["unschedulable"] = unschedulable
        self._bump(self._nodes[node])

    def inject_conflicts(self, key: str, n: int = 1) -> None:
        """The next ``n`` writes to node/pod/deployment ``key`` race with someone else (409)."""
        self._conflicts[key] += n

    def inject_failures(self, verb: str, n: int = 1) -> None:
        """The next ``n`` calls of ``verb`` (patch, evict, scale, event) fail with no answer."""
        self._failures[verb] += n

    # --- KubeReader ---------------------------------------------------------------------
    def cache_status(self) -> CacheStatus:
        return CacheStatus(self.synced, self.last_event_age_s, (InformerStatus("fake", self.synced, self.last_event_age_s, 1, 0, None),))

    def _listed(self, n: NodeInfo) -> bool:
        """As the real adapter's label-selected watch: only nodes of the configured pools
        (``add_pool``). A fake with no pool yet lists every node (tests of node writes alone)."""
        return not self._pools or n.pool in self._pools

    def nodes(self) -> tuple[NodeInfo, ...]:
        return tuple(n for n in (self._node(name) for name in sorted(self._nodes)) if self._listed(n))

    def node(self, name: str) -> NodeInfo | None:
        obj = self._nodes.get(name)
        n = self._node(name) if obj is not None else None
        return n if n is not None and self._listed(n) else None

    def pods(self, pool: str) -> tuple[PodInfo, ...]:
        self._pool(pool)
        return tuple(self._pod(p, pool) for p in sorted(self._pods) if self._pod_pool[p] == pool)

    def deployment(self, pool: str) -> DeploymentInfo | None:
        p = self._pool(pool)
        pods = self.pods(pool)
        ready = sum(1 for x in pods if x.ready and not x.terminating)
        return parse_deployment({
            "metadata": {"name": p.target.deployment, "namespace": p.target.namespace, "resourceVersion": self._deploy_rv[pool], "generation": 1},
            "spec": {"replicas": p.replicas},
            "status": {"observedGeneration": 1, "replicas": len(pods), "readyReplicas": ready, "availableReplicas": ready, "updatedReplicas": len(pods)},
        })

    def read_node(self, name: str) -> NodeInfo:
        self.calls[("get", "nodes")] += 1
        obj = self._nodes.get(name)
        if obj is None:
            raise KubeApiError("get", "nodes", name, 404, "NotFound")
        return parse_node(obj)

    def read_scale(self, namespace: str, deployment: str) -> ScaleInfo:
        self.calls[("get", "deployments/scale")] += 1
        p = self._by_deployment(namespace, deployment)
        return ScaleInfo(namespace, deployment, p.replicas, sum(1 for n in self._pod_pool.values() if n == p.target.name), "", self._deploy_rv[p.target.name])

    # --- KubeWriter ---------------------------------------------------------------------
    def set_phase(self, node: str, phase: Phase, reason: str, since: float) -> bool:
        return self._patch_node(node, lambda n: patches.phase_patch(n, Phase(phase), reason, since, self.identity))

    def set_request(self, node: str, request: str | None) -> bool:
        return self._patch_node(node, lambda n: patches.request_patch(n, request))

    def set_pin(self, node: str, pin: Pin | None) -> bool:
        return self._patch_node(node, lambda n: patches.pin_patch(n, Pin(pin) if pin is not None else None))

    def fence(self, node: str) -> bool:
        return self._patch_node(node, patches.fence_patch)

    def unfence(self, node: str) -> bool:
        return self._patch_node(node, patches.unfence_patch)

    def set_pod_deletion_cost(self, namespace: str, pod: str, cost: int) -> bool:
        obj = self._pods.get(pod)
        if obj is None or obj["metadata"]["namespace"] != namespace:
            raise KubeApiError("get", "pods", f"{namespace}/{pod}", 404, "NotFound")
        return self._patch(f"pod/{pod}", "pods", obj, lambda: patches.deletion_cost_patch(parse_pod(obj, self._pod_pool[pod]), cost))

    def set_warm(self, node: str, record: WarmRecord | None) -> bool:
        return self._patch_node(node, lambda n: patches.warm_patch(n, record))

    def set_pod_awake(self, namespace: str, pod: str, awake: bool) -> bool:
        """The condition merged by type, as the API server's strategic merge does; with the
        pool's readiness gate the pod's Ready follows at once (the kubelet's next sync)."""
        obj = self._pods.get(pod)
        if obj is None or obj["metadata"]["namespace"] != namespace:
            raise KubeApiError("get", "pods", f"{namespace}/{pod}", 404, "NotFound")
        pool = self._pools[self._pod_pool[pod]]

        def build() -> dict[str, Any] | None:
            body = patches.awake_patch(parse_pod(obj, self._pod_pool[pod]), awake, "1970-01-01T00:00:00Z")
            if body is None:
                return None
            kept = [dict(c) for c in obj.get("status", {}).get("conditions", []) if c.get("type") != wk.CONDITION_AWAKE]
            started = not obj["metadata"].get("deletionTimestamp") and self.now >= self._pod_times[pod] + pool.start_delay_s
            if pool.readiness_gate and started:
                for c in kept:
                    if c.get("type") == "Ready":
                        c["status"] = "True" if awake else "False"
            body["status"]["conditions"] = kept + body["status"]["conditions"]
            return body
        return self._patch(f"pod/{pod}", "pods/status", obj, build)

    def scale(self, namespace: str, deployment: str, replicas: int) -> bool:
        if replicas < 0:
            raise ValueError(f"replicas: expected >= 0, got {replicas}")
        p = self._by_deployment(namespace, deployment)
        key = f"deployment/{deployment}"
        for _ in range(self._retries + 1):
            self.calls[("get", "deployments/scale")] += 1
            if p.replicas == replicas:
                return False
            self._fail_maybe("scale", "deployments/scale", key)
            self.calls[("update", "deployments/scale")] += 1
            if self._conflicts[key] > 0:
                self._conflicts[key] -= 1
                self._deploy_rv[p.target.name] = self._next_rv()
                continue
            p.replicas = replicas
            self._deploy_rv[p.target.name] = self._next_rv()
            return True
        raise KubeConflictError("update", "deployments/scale", key, 409, f"still conflicting after {self._retries} retries")

    def evict(self, namespace: str, pod: str) -> EvictOutcome:
        self._fail_maybe("evict", "pods/eviction", pod)
        self.calls[("create", "pods/eviction")] += 1
        obj = self._pods.get(pod)
        if obj is None or obj["metadata"]["namespace"] != namespace:
            return EvictOutcome.GONE
        info = parse_pod(obj, self._pod_pool[pod])
        pool = self._pools[info.pool]
        if info.terminating:
            return EvictOutcome.EVICTED
        if pool.min_available is not None and info.ready:  # pending pods skip the PDB, as in the API server
            healthy = sum(1 for x in self.pods(info.pool) if x.ready and not x.terminating)
            if healthy - pool.min_available <= 0:
                return EvictOutcome.BLOCKED
        self._delete_pod(pod)
        return EvictOutcome.EVICTED

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None:
        if event_type not in ("Normal", "Warning"):
            raise ValueError(f"event_type: expected Normal or Warning, got {event_type!r}")
        self._fail_maybe("event", "events", node)
        self.calls[("create", "events")] += 1
        # as the API server: an Event names its node, it needs none to exist (a node deleted
        # meanwhile still gets its Event); the reason is capped as the real adapter caps it
        self.events.append(RecordedEvent(node, patches.clean_reason(reason)[:128], patches.clean_reason(message), event_type, self.now))

    # --- the controllers ------------------------------------------------------------------
    def step(self, now: float) -> None:
        """Advance time: finish graceful deletions, make started pods Ready, reconcile
        each Deployment's replicas (delete lowest deletion cost first, place new pods)."""
        self.now = now
        for obj in self._nodes.values():
            _node_lifecycle_taint(obj, self._bump)
        for name in list(self._pods):
            meta = self._pods[name]["metadata"]
            if meta.get("deletionTimestamp") and now >= self._pod_times[name]:
                self._cache.pop(id(self._pods[name]), None)  # its parse goes with it (the id may be reused)
                del self._pods[name], self._pod_pool[name], self._pod_times[name]
        for name, obj in self._pods.items():
            pool = self._pools[self._pod_pool[name]]
            if not obj["metadata"].get("deletionTimestamp") and now >= self._pod_times[name] + pool.start_delay_s:
                conds = obj["status"]["conditions"]
                gate_open = not pool.readiness_gate or any(
                    c.get("type") == wk.CONDITION_AWAKE and c.get("status") == "True" for c in conds)
                want = "True" if gate_open else "False"
                if obj["status"].get("phase") != "Running" or conds[0]["status"] != want:
                    obj["status"]["phase"] = "Running"
                    conds[0] = {"type": "Ready", "status": want}
                    self._bump(obj)
        for pool_name, pool in self._pools.items():
            live = [p for p in self.pods(pool_name) if not p.terminating]
            if len(live) > pool.replicas:
                victims = sorted(live, key=_deletion_rank)[: len(live) - pool.replicas]
                for v in victims:
                    self._delete_pod(v.name)
            for node in self._free_nodes(pool_name)[: max(0, pool.replicas - len(live))]:
                self._create_pod(pool_name, node, ready=False)

    # --- internals ----------------------------------------------------------------------
    def _next_rv(self) -> str:
        return str(next(self._rv))

    def _bump(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = self._next_rv()

    def _parsed(self, obj: dict[str, Any], parse: Callable[[], T]) -> T:
        """``parse()`` of ``obj`` once per resourceVersion, as the real adapter's informers parse
        an object once per watch event: a read costs the daemon what a read of their cache does
        (the scale benchmark measures the daemon, not this fake)."""
        rv = obj.get("metadata", {}).get("resourceVersion")
        hit = self._cache.get(id(obj))
        if hit is not None and hit[0] == rv and rv is not None:
            return cast(T, hit[1])
        got = parse()
        self._cache[id(obj)] = (rv, got)
        return got

    def _node(self, name: str) -> NodeInfo:
        return self._parsed(self._nodes[name], partial(parse_node, self._nodes[name]))

    def _pod(self, name: str, pool: str) -> PodInfo:
        return self._parsed(self._pods[name], partial(parse_pod, self._pods[name], pool))

    def _pool(self, pool: str) -> _Pool:
        try:
            return self._pools[pool]
        except KeyError:
            raise ValueError(f"pool {pool!r}: not configured (known: {', '.join(sorted(self._pools))})") from None

    def _by_deployment(self, namespace: str, deployment: str) -> _Pool:
        for p in self._pools.values():
            if (p.target.namespace, p.target.deployment) == (namespace, deployment):
                return p
        raise KubeApiError("get", "deployments/scale", f"{namespace}/{deployment}", 404, "NotFound")

    def _fail_maybe(self, verb: str, resource: str, name: str) -> None:
        if self._failures[verb] > 0:
            self._failures[verb] -= 1
            raise KubeApiError(verb, resource, name, None, "injected failure")

    def _patch_node(self, name: str, build: Any) -> bool:
        obj = self._nodes.get(name)
        if obj is None:
            raise KubeApiError("get", "nodes", name, 404, "NotFound")
        return self._patch(f"node/{name}", "nodes", obj, lambda: build(parse_node(obj)))

    def _patch(self, key: str, resource: str, obj: dict[str, Any], build: Any) -> bool:
        for _ in range(self._retries + 1):
            body = build()
            if body is None:
                return False
            self._fail_maybe("patch", resource, key)
            self.calls[("patch", resource)] += 1
            if self._conflicts[key] > 0:  # someone else wrote first: the rv moved on
                self._conflicts[key] -= 1
                self._bump(obj)
                self.calls[("get", resource)] += 1
                continue
            if body["metadata"].get("resourceVersion") != obj["metadata"]["resourceVersion"]:
                self.calls[("get", resource)] += 1
                continue
            body = copy.deepcopy(body)
            del body["metadata"]["resourceVersion"]
            _merge(obj, body)
            self._bump(obj)
            return True
        raise KubeConflictError("patch", resource, key, 409, f"still conflicting after {self._retries} retries")

    def _free_node(self, pool: str) -> str | None:
        free = self._free_nodes(pool)
        return free[0] if free else None

    def _free_nodes(self, pool: str) -> list[str]:
        """Schedulable untainted pool nodes with no replica, in name order (one pass: the
        10,000-node bench places a thousand replicas at once)."""
        used = {obj["spec"].get("nodeName") for p, obj in self._pods.items() if self._pod_pool[p] == pool}
        free = []
        for name in sorted(self._nodes):
            n = self._node(name)
            if n.pool != pool or n.unschedulable or name in used:
                continue
            if any(t.effect in ("NoSchedule", "NoExecute") for t in n.taints):
                continue
            free.append(name)
        return free

    def _create_pod(self, pool: str, node: str, *, ready: bool) -> None:
        t = self._pools[pool].target
        name = f"{t.deployment}-{next(self._names):05d}"
        self._pods[name] = {
            "metadata": {"name": name, "namespace": t.namespace, "uid": f"uid-{name}", "resourceVersion": self._next_rv(),
                         "labels": {"app": t.deployment}, "annotations": {}},
            "spec": {"nodeName": node},
            "status": {"phase": "Running" if ready else "Pending", "podIP": f"{self._pod_network}.{self._ips // 250}.{self._ips % 250 + 1}",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }
        self._ips += 1
        self._pod_pool[name] = pool
        self._pod_times[name] = self.now if not ready else self.now - self._pools[pool].start_delay_s

    def _delete_pod(self, name: str) -> None:
        obj = self._pods[name]
        obj["metadata"]["deletionTimestamp"] = f"t={self.now}"
        obj["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        self._bump(obj)
        self._pod_times[name] = self.now + self._pools[self._pod_pool[name]].grace_s


UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def _node_lifecycle_taint(obj: dict[str, Any], bump: Any) -> None:
    """The node lifecycle controller (TaintNodesByCondition): a cordoned node gets the
    ``node.kubernetes.io/unschedulable:NoSchedule`` taint, an uncordoned one loses it. Our
    patches must keep a taint they did not set, and may race with this write (409)."""
    spec = obj["spec"]
    taints = spec.get("taints") or []
    has = any(t.get("key") == UNSCHEDULABLE_TAINT["key"] for t in taints)
    if spec.get("unschedulable") and not has:
        spec["taints"] = [*taints, dict(UNSCHEDULABLE_TAINT)]
        bump(obj)
    elif not spec.get("unschedulable") and has:
        spec["taints"] = [t for t in taints if t.get("key") != UNSCHEDULABLE_TAINT["key"]]
        bump(obj)


_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def _deletion_rank(pod: PodInfo) -> tuple[bool, int, bool, int, str]:
    """The ReplicaSet controller's scale-down order (controller.ActivePodsWithRanks):
    unscheduled first, then Pending < Unknown < Running, then not Ready before Ready, and only
    then the lower pod-deletion-cost. A starting pod is removed before a cheap Ready one."""
    return (pod.node is not None, _PHASE_RANK.get(pod.phase, 2), pod.ready, pod.deletion_cost or 0, pod.name)


@dataclass
class FakeProm:
    """Implements PromReader: returns the readings set per pool; ``fail`` makes it raise."""

    readings: dict[str, SignalsReading] = field(default_factory=dict)
    histories: dict[str, tuple[LoadSignals, ...]] = field(default_factory=dict)
    delays: dict[str, tuple[DelayCount, ...]] = field(default_factory=dict)  # pool -> its histogram's buckets
    fail: bool = False
    live_pods: frozenset[str] | None = None  # what the last current() was told exists
    gpu: dict[str, float | None] = field(default_factory=dict)  # node -> lowest free GPU MiB, with auto beyond the need (absent: unknown)
    gpu_queries: list[tuple[str, ...]] = field(default_factory=list)  # the nodes of each gpu_free() call
    gpu_pods: list[dict[str, str] | None] = field(default_factory=list)  # the pods of each call (auto), else None

    def set(
        self,
        pool: str,
        signals: LoadSignals,
        problems: Mapping[str, str] | None = None,
        inflight_by_pod: Mapping[str, float] | None = None,
    ) -> None:
        self.readings[pool] = SignalsReading(
            pool=pool, signals=signals, problems=dict(problems or {}), inflight_by_pod=dict(inflight_by_pod or {})
        )

    def current(self, pool: PromPool, *, at: float | None = None, live_pods: Collection[str] | None = None) -> SignalsReading:
        from bridge.errors import AdapterError

        self.live_pods = None if live_pods is None else frozenset(live_pods)

        if self.fail:
            raise AdapterError("prometheus", f"pool {pool.name}: query failed: injected")
        if pool.name not in self.readings:
            t = at or 0.0
            empty = LoadSignals(t=t, running=None, waiting=None, kv_cache_usage_sum=None, tokens_per_s=None, replicas_reporting=0)
            return SignalsReading(pool=pool.name, signals=empty, problems={"running": "no series of vllm:num_requests_running"})
        return self.readings[pool.name]

    def history(self, pool: PromPool, *, start: float, end: float, step_s: float) -> tuple[LoadSignals, ...]:
        from bridge.errors import AdapterError

        if self.fail:
            raise AdapterError("prometheus", f"pool {pool.name}: query_range failed: injected")
        return tuple(s for s in self.histories.get(pool.name, ()) if start <= s.t <= end)

    def reclaim_delays(self, pool: PromPool, *, window_s: float) -> tuple[DelayCount, ...]:
        from bridge.errors import AdapterError

        if self.fail:
            raise AdapterError("prometheus", f"pool {pool.name}: query failed: injected")
        return self.delays.get(pool.name, ())

    def gpu_free(self, pool: PromPool, nodes: Collection[str], *, node_label: str, gpus: int,
                 pods: Mapping[str, str] | None = None) -> dict[str, float | None]:
        from bridge.errors import AdapterError

        self.gpu_queries.append(tuple(sorted(nodes)))
        self.gpu_pods.append(None if pods is None else dict(pods))
        if self.fail:
            raise AdapterError("prometheus", f"pool {pool.name}: query failed: injected")
        return {n: self.gpu.get(n) for n in nodes}


@dataclass
class FakeLeader:
    """Implements the elector's daemon-facing surface; flip ``leader`` to test fencing."""

    leader: bool = True
    identity: str = "fake-bridge"
    released: bool = False
    valid_s: float = float("inf")  # how long leadership lasts from now (hold_for)

    @property
    def is_leader(self) -> bool:
        return self.leader and not self.released

    def try_acquire_or_renew(self) -> bool:
        """As the real elector: a released Lease is free, so the next step takes it again
        (``leader`` False = another instance holds it)."""
        if self.leader:
            self.released = False
        return self.is_leader

    def hold_for(self, seconds: float) -> bool:
        return self.is_leader and self.valid_s >= seconds

    def release(self) -> bool:
        was = self.is_leader
        self.released = True
        return was


def _conforms(kube: FakeKube, prom: FakeProm, leader: FakeLeader) -> tuple[KubeAdapterProtocol, PromReader, Leader]:
    """Never called: ``mypy --strict`` checks here that each fake implements the contract it
    stands in for (tests/unit/test_static_checks.py)."""
    return kube, prom, leader
