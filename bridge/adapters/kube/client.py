"""The real Kubernetes adapter over the official ``kubernetes`` client.

Reads come from informers (list + watch), so a tick costs no API call; writes cost one
request when the cache is current (the patch carries the cached resourceVersion), plus one
GET and a retry per 409. Every response body is read as raw JSON (``_preload_content=False``),
the same shape the parsers in ``objects`` take.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from types import TracebackType
from typing import Any, Self

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from urllib3 import BaseHTTPResponse
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util.retry import Retry

from bridge import logs
from bridge import wellknown as wk
from bridge.errors import AdapterError
from bridge.model import Phase, Pin, WarmRecord

from . import patches
from .calls import ApiCalls, KubeApiError, KubeConflictError, read_json, register_secret
from .informer import Informer
from .objects import (
    DeploymentInfo,
    EvictOutcome,
    NodeInfo,
    PodInfo,
    ScaleInfo,
    parse_deployment,
    parse_node,
    parse_pod,
    parse_scale,
    selector_from_match_labels,
)
from ..protocols import CacheStatus, PoolTarget

log = logs.get(__name__)

SMP = "application/strategic-merge-patch+json"
EVENT_COMPONENT = "gpu-bridge"


class NoRetryAfterTimeout(Retry):
    """urllib3's default retries a GET or PUT three times after a timeout, so an API server
    that hangs held a tick (or a Lease renewal, or a list) for four timeouts: 40 s a call at
    the default 10 s. A timeout is the daemon's to handle (the next tick, the informer's
    backoff); a connection refused or closed under us (a stale pooled one) is still retried."""

    def increment(
        self, method: str | None = None, url: str | None = None, response: BaseHTTPResponse | None = None,
        error: Exception | None = None, _pool: ConnectionPool | None = None, _stacktrace: TracebackType | None = None,
    ) -> Self:
        if isinstance(error, Urllib3Timeout):
            raise error
        return super().increment(method, url, response, error, _pool, _stacktrace)


def api_client_from_config(
    *, kubeconfig: str | None = None, context: str | None = None, in_cluster: bool | None = None, allow_insecure_tls: bool = False
) -> k8s.ApiClient:
    """An ApiClient from ``load_incluster_config`` (in a pod, or ``in_cluster=True``) or
    ``load_kube_config`` (``kubeconfig`` path, else $KUBECONFIG / ~/.kube/config). A
    kubeconfig that skips TLS verification is refused unless ``allow_insecure_tls``
    (config ``kubernetes.allow_insecure_tls``): the daemon's token would go to whoever answers."""
    import os

    cfg = k8s.Configuration()
    if in_cluster is None:
        in_cluster = kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (k8s_config.ConfigException, OSError, ValueError) as e:
        raise AdapterError("kubernetes", f"cannot load {'in-cluster' if in_cluster else 'kubeconfig'} configuration: {e}") from None
    if not cfg.verify_ssl:
        if not allow_insecure_tls:
            raise AdapterError(
                "kubernetes",
                f"{'in-cluster configuration' if in_cluster else 'kubeconfig ' + (kubeconfig or '(default)')}: "
                "insecure-skip-tls-verify is set, so the API server's certificate would not be checked; refusing "
                "(give the cluster's certificate-authority, or set kubernetes.allow_insecure_tls: true)",
            )
        log.warning("kube_tls_unverified", detail="insecure-skip-tls-verify accepted by kubernetes.allow_insecure_tls")
    for value in (cfg.api_key or {}).values():  # "Bearer <token>": never echoed into errors or logs
        register_secret(str(value).split()[-1] if value else None)
    register_secret(cfg.password or None)
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 32)  # one per watch + writes
    cfg.retries = NoRetryAfterTimeout(3)  # urllib3's default count, less the timeouts
    return k8s.ApiClient(cfg)


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeAdapter:
    """Implements ``KubeReader`` and ``KubeWriter``. ``start()`` begins the watches; the daemon
    should wait for ``cache_status().synced`` before deciding anything."""

    def __init__(self, api_client: k8s.ApiClient, *, pools: Sequence[PoolTarget], identity: str,
                 event_namespace: str = "default", request_timeout_s: float = 10.0, watch_timeout_s: int = 60,
                 max_conflict_retries: int = 5, clock: Callable[[], float] = time.time,
                 on_change: Callable[[], None] | None = None) -> None:
        if not pools:
            raise ValueError("pools: at least one pool is needed")
        self.calls = ApiCalls()
        self.identity = identity
        self._api = api_client
        self._core = k8s.CoreV1Api(api_client)
        self._apps = k8s.AppsV1Api(api_client)
        self._pools = {p.name: p for p in pools}
        self._event_ns = event_namespace
        self._timeout = request_timeout_s
        self._watch_timeout_s = watch_timeout_s
        self._retries = max_conflict_retries
        self._clock = clock
        self._on_change = on_change
        self._started = False
        # Nodes: one watch on the pool label for every pool that uses it (the default), one
        # watch per pool with its own node selector otherwise.
        default = sorted(p.name for p in pools if not p.node_selector or dict(p.node_selector) == {wk.LABEL_POOL: p.name})
        self._node_infs: list[Informer[NodeInfo]] = []
        if default:
            selector = f"{wk.LABEL_POOL} in ({','.join(default)})"
            self._node_infs.append(self._informer("nodes", "nodes", partial(self._core.list_node, label_selector=selector), parse_node))
        for p in pools:
            if p.name not in default and p.node_selector:
                list_fn = partial(self._core.list_node, label_selector=selector_from_match_labels(p.node_selector))
                parse = partial(_parse_pool_node, pool=p.name)
                self._node_infs.append(self._informer(f"nodes/{p.name}", "nodes", list_fn, parse))
        self._pods: dict[str, Informer[PodInfo]] = {}
        self._deployments: dict[str, Informer[DeploymentInfo]] = {}
        for p in pools:
            by_name = partial(self._apps.list_namespaced_deployment, p.namespace,
                              field_selector=f"metadata.name={p.deployment}")
            self._deployments[p.name] = self._informer(f"deployment/{p.name}", "deployments", by_name, parse_deployment)

    def _informer(self, name: str, resource: str, fn: Callable[..., Any], parse: Callable[[Mapping[str, Any]], Any]) -> Informer[Any]:
        return Informer(name, resource, fn, parse, calls=self.calls, watch_timeout_s=self._watch_timeout_s,
                        request_timeout_s=self._timeout, on_change=self._on_change)

    def _json(self, verb: str, resource: str, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call (counted; its failure a KubeApiError), its raw answer read as JSON."""
        return read_json(self.calls.run(verb, resource, name, fn, *args, **kwargs, _preload_content=False,
                                        _request_timeout=self._timeout))

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Resolve each pool's pod selector (from its Deployment if not configured) and start
        the watches. Raises AdapterError if a Deployment without a configured selector
        cannot be read."""
        if self._started:
            return
        for p in self._pools.values():
            selector = p.pod_selector or self._deployment_selector(p)
            self._pods[p.name] = self._informer(f"pods/{p.name}", "pods", partial(
                self._core.list_namespaced_pod, p.namespace, label_selector=selector), partial(parse_pod, pool=p.name))
        for inf in self._all_informers():
            inf.start()
        self._started = True
        log.info("kube_adapter_started", pools=sorted(self._pools), identity=self.identity)

    def stop(self, timeout_s: float = 5.0) -> None:
        """End every watch: all are signalled first, then joined within ``timeout_s`` overall."""
        infs = self._all_informers()
        for inf in infs:
            inf.signal_stop()
        deadline = time.monotonic() + timeout_s
        for inf in infs:
            inf.join(max(0.0, deadline - time.monotonic()))
        self._started = False

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for inf in self._all_informers():
            inf.wait_synced(max(0.0, deadline - time.monotonic()))
        return self.cache_status().synced

    def _all_informers(self) -> list[Informer[Any]]:
        return [*self._node_infs, *self._deployments.values(), *self._pods.values()]

    def _deployment_selector(self, p: PoolTarget) -> str:
        labels = parse_deployment(self._json("get", "deployments", p.deployment, self._apps.read_namespaced_deployment,
                                             p.deployment, p.namespace)).match_labels
        if not labels:
            raise AdapterError("kubernetes", f"deployment {p.namespace}/{p.deployment}: spec.selector.matchLabels is empty; configure pod_selector")
        return selector_from_match_labels(labels)

    # --- read side ----------------------------------------------------------------------
    def cache_status(self) -> CacheStatus:
        infos = tuple(inf.status() for inf in self._all_informers())
        ages = [s.last_event_age_s for s in infos]
        age = None if not ages or any(a is None for a in ages) else max(a for a in ages if a is not None)
        return CacheStatus(synced=self._started and all(s.synced for s in infos), last_event_age_s=age, informers=infos)

    def nodes(self) -> tuple[NodeInfo, ...]:
        if len(self._node_infs) == 1:
            return self._node_infs[0].items()
        seen: dict[str, list[NodeInfo]] = {}
        for inf in self._node_infs:
            for n in inf.items():
                seen.setdefault(n.name, []).append(n)
        return tuple(_one_pool(seen[name]) for name in sorted(seen))

    def node(self, name: str) -> NodeInfo | None:
        found = [n for inf in self._node_infs if (n := inf.get(name)) is not None]
        return _one_pool(found) if found else None

    def _node_write_through(self, obj: Mapping[str, Any]) -> None:
        name = str(obj["metadata"]["name"])
        for inf in self._node_infs:
            if inf.get(name) is not None:
                inf.write_through(obj)

    def pods(self, pool: str) -> tuple[PodInfo, ...]:
        inf = self._pods.get(self._pool(pool).name)
        return inf.items() if inf is not None else ()

    def deployment(self, pool: str) -> DeploymentInfo | None:
        p = self._pool(pool)
        return self._deployments[p.name].get(p.deployment)

    def read_scale(self, namespace: str, deployment: str) -> ScaleInfo:
        read = self._apps.read_namespaced_deployment_scale
        return parse_scale(self._json("get", "deployments/scale", deployment, read, deployment, namespace))

    def _pool(self, pool: str) -> PoolTarget:
        try:
            return self._pools[pool]
        except KeyError:
            raise ValueError(f"pool {pool!r}: not configured (known: {', '.join(sorted(self._pools))})") from None

    # --- write side ---------------------------------------------------------------------
    def set_phase(self, node: str, phase: Phase, reason: str, since: float) -> bool:
        return self._patch_node(node, lambda n: patches.phase_patch(n, Phase(phase), reason, since, self.identity),
                                "node_phase_set", phase=str(phase), reason=patches.clean_reason(reason))

    def set_request(self, node: str, request: str | None) -> bool:
        """An operator's lend/reclaim request (None removes it)."""
        if request is not None and request not in wk.REQUESTS:
            raise ValueError(f"request: expected one of {', '.join(wk.REQUESTS)}, got {request!r}")
        return self._patch_node(node, lambda n: patches.request_patch(n, request), "node_request_set", request=request)

    def set_pin(self, node: str, pin: Pin | None) -> bool:
        """An operator's pin (None removes it): the policy never moves a pinned node."""
        return self._patch_node(node, lambda n: patches.pin_patch(n, Pin(pin) if pin is not None else None),
                                "node_pin_set", pin=str(pin) if pin else None)

    def set_warm(self, node: str, record: WarmRecord | None) -> bool:
        """Warm lending's record on the node (None removes it)."""
        return self._patch_node(node, lambda n: patches.warm_patch(n, record), "node_warm_set",
                                reason=str(record) if record else None)

    def fence(self, node: str) -> bool:
        return self._patch_node(node, patches.fence_patch, "node_fenced")

    def unfence(self, node: str) -> bool:
        return self._patch_node(node, patches.unfence_patch, "node_unfenced")

    def read_node(self, name: str) -> NodeInfo:
        """The node as the API server has it now (one GET), not as the cache last saw it."""
        obj = self._json("get", "nodes", name, self._core.read_node, name)
        self._node_write_through(obj)
        return parse_node(obj)

    def _patch_node(self, name: str, build: Callable[[NodeInfo], dict[str, Any] | None], event: str,
                    **fields: Any) -> bool:
        """Patch the node with ``build``'s body (None: nothing to write), retried on a conflict
        against the node read again; ``event`` logged with ``fields`` once written."""
        current = self.node(name) or self.read_node(name)
        for _attempt in range(self._retries + 1):
            body = build(current)
            if body is None:
                return False
            try:
                obj = self._json("patch", "nodes", name, self._core.patch_node, name, body, _content_type=SMP)
            except KubeApiError as e:
                if e.status != 409:
                    raise
                log.info("write_conflict_retry", node=name, resource="nodes")
                current = self.read_node(name)
                continue
            self._node_write_through(obj)
            log.info(event, node=name, **fields)
            return True
        raise KubeConflictError("patch", "nodes", name, 409, f"still conflicting after {self._retries} retries")

    def set_pod_deletion_cost(self, namespace: str, pod: str, cost: int) -> bool:
        return self._patch_pod(namespace, pod, lambda p: patches.deletion_cost_patch(p, cost), "pod_deletion_cost_set",
                               cost=cost)

    def set_pod_awake(self, namespace: str, pod: str, awake: bool) -> bool:
        """Warm lending's readiness-gate condition on the pod (pods/status)."""
        stamp = _rfc3339(self._clock())
        return self._patch_pod(namespace, pod, lambda p: patches.awake_patch(p, awake, stamp), "pod_awake_set",
                               status=True, reason="awake" if awake else "asleep")

    def _patch_pod(self, namespace: str, pod: str, build: Callable[[PodInfo], dict[str, Any] | None], event: str, *,
                   status: bool = False, **fields: Any) -> bool:
        """``_patch_node`` for a pod (``status``: its status subresource)."""
        current = self._cached_pod(namespace, pod) or self._get_pod(namespace, pod)
        send = self._send_pod_status if status else self._send_pod
        for _attempt in range(self._retries + 1):
            body = build(current)
            if body is None:
                return False
            try:
                obj = send(namespace, pod, body)
            except KubeApiError as e:
                if e.status != 409:
                    raise
                current = self._get_pod(namespace, pod)
                continue
            self._write_through_pod(current.pool, obj)
            log.info(event, pod=pod, namespace=namespace, **fields)
            return True
        raise KubeConflictError("patch", "pods", f"{namespace}/{pod}", 409, f"still conflicting after {self._retries} retries")

    def _send_pod(self, namespace: str, pod: str, body: dict[str, Any]) -> Any:
        return self._json("patch", "pods", f"{namespace}/{pod}", self._core.patch_namespaced_pod, pod, namespace, body,
                          _content_type=SMP)

    def _send_pod_status(self, namespace: str, pod: str, body: dict[str, Any]) -> Any:
        """The status subresource: the readiness gate's condition lives there."""
        return self._json("patch", "pods/status", f"{namespace}/{pod}", self._core.patch_namespaced_pod_status, pod,
                          namespace, body, _content_type=SMP)

    def _cached_pod(self, namespace: str, pod: str) -> PodInfo | None:
        for inf in self._pods.values():
            found = inf.get(pod)
            if found is not None and found.namespace == namespace:
                return found
        return None

    def _get_pod(self, namespace: str, pod: str) -> PodInfo:
        obj = self._json("get", "pods", f"{namespace}/{pod}", self._core.read_namespaced_pod, pod, namespace)
        pool = next((p.name for p in self._pools.values() if p.namespace == namespace), "")
        cached = self._cached_pod(namespace, pod)
        return parse_pod(obj, cached.pool if cached else pool)

    def _write_through_pod(self, pool: str, obj: Mapping[str, Any]) -> None:
        inf = self._pods.get(pool)
        if inf is not None and inf.get(str(obj["metadata"]["name"])) is not None:
            inf.write_through(obj)

    def scale(self, namespace: str, deployment: str, replicas: int) -> bool:
        if replicas < 0:
            raise ValueError(f"replicas: expected >= 0, got {replicas}")
        for _attempt in range(self._retries + 1):
            current = self.read_scale(namespace, deployment)
            if current.replicas == replicas:
                return False
            meta = {"name": deployment, "namespace": namespace, "resourceVersion": current.resource_version}
            body = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": meta,
                    "spec": {"replicas": int(replicas)}}
            try:
                self._json("update", "deployments/scale", f"{namespace}/{deployment}",
                           self._apps.replace_namespaced_deployment_scale, deployment, namespace, body)
            except KubeApiError as e:
                if e.status != 409:
                    raise
                continue
            log.info("deployment_scaled", namespace=namespace, deployment=deployment, replicas=replicas, was=current.replicas)
            return True
        raise KubeConflictError("update", "deployments/scale", f"{namespace}/{deployment}", 409, f"still conflicting after {self._retries} retries")

    def evict(self, namespace: str, pod: str) -> EvictOutcome:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
        try:
            self._json("create", "pods/eviction", f"{namespace}/{pod}", self._core.create_namespaced_pod_eviction,
                       pod, namespace, body)
        except KubeApiError as e:
            if e.status == 429:
                log.info("pod_eviction_blocked", pod=pod, namespace=namespace, reason="disruption_budget")
                return EvictOutcome.BLOCKED
            if e.status == 404:
                return EvictOutcome.GONE
            raise
        log.info("pod_evicted", pod=pod, namespace=namespace)
        return EvictOutcome.EVICTED

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None:
        """A core/v1 Event on the node (namespace ``event_namespace``), as kubelet and
        controllers write them, so ``kubectl describe node`` lists it."""
        if event_type not in ("Normal", "Warning"):
            raise ValueError(f"event_type: expected Normal or Warning, got {event_type!r}")
        now = self._clock()
        stamp = _rfc3339(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{node}.{int(now * 1e9):x}", "namespace": self._event_ns},
            # uid = the node's name, as kubelet writes node events: kubectl describe node finds
            # those in every version (1.20, Debian 12's, searches only that; later ones both)
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": patches.clean_reason(reason)[:128],
            "message": patches.clean_reason(message),
            "type": event_type,
            "source": {"component": EVENT_COMPONENT},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": self.identity[:128],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._json("create", "events", node, self._core.create_namespaced_event, self._event_ns, body)


def _parse_pool_node(obj: Mapping[str, Any], *, pool: str) -> NodeInfo:
    """A node found by a pool's own node selector belongs to that pool, label or not."""
    return dataclasses.replace(parse_node(obj), pool=pool)


def _one_pool(found: list[NodeInfo]) -> NodeInfo:
    """A node seen by several pools' selectors is a configuration problem: hold it."""
    if len(found) == 1:
        return found[0]
    pools = ", ".join(sorted(n.pool or "?" for n in found))
    first = found[0]
    problem = f"node matches the node selectors of several pools: {pools}"
    return dataclasses.replace(first, problem=f"{first.problem}; {problem}" if first.problem else problem)
