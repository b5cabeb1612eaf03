"""The sandbox's serving side, created through the Kubernetes API: GPU nodes named like the
Slurm nodes, one lending pool, a namespace with a vLLM Deployment (one 4-GPU replica per
node) and its PodDisruptionBudget. The real scheduler places the replicas, kwok makes them
Ready after the configured cold start; a test can put a whole serving side of its own in a
shared control plane (its own namespace, pool and node prefix)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from bridge import wellknown
from bridge.errors import SandboxError

MODEL_LABEL = "gpu-bridge.io/model"  # the vLLM simulator reads the model from this pod label
DEFAULT_MODEL = "meta-llama/Llama-3.1-70B-Instruct"  # the vLLM simulator's default too
NAMESPACE = "serving"
DEPLOYMENT = "vllm"
PDB = "vllm"
APP_LABEL = "vllm"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class ServingModel:
    """What to create. ``spare`` nodes get no replica (room for a drained pod's replacement)."""

    nodes: int = 4
    pool: str = "default"
    model: str = DEFAULT_MODEL
    namespace: str = NAMESPACE
    deployment: str = DEPLOYMENT
    replicas: int | None = None  # default: one per node
    gpus_per_node: int = 4
    termination_grace_s: int = 30
    max_unavailable: int = 1
    node_prefix: str = "gpu-node-"
    image: str = "vllm/vllm-openai:v0.6.3"
    readiness_gates: tuple[str, ...] = ()  # condition types the pods declare (spec.readinessGates)

    def node_names(self, spare_nodes: int = 0) -> list[str]:
        return [f"{self.node_prefix}{i:02d}" for i in range(1, self.nodes + spare_nodes + 1)]

    @property
    def want_replicas(self) -> int:
        return self.nodes if self.replicas is None else self.replicas


def node_object(name: str, pool: str, gpus: int, index: int = 1) -> dict[str, Any]:
    """A GPU node as a kubelet would register it; kwok (``--manage-all-nodes``) then keeps its
    conditions, heartbeats and nodeInfo, and keeps the capacity given here."""
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", wellknown.GPU_RESOURCE: str(gpus),
           "ephemeral-storage": "1Ti"}
    return {
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(gpus), wellknown.LABEL_POOL: pool}},
        "spec": {},
        "status": {
            "capacity": dict(res), "allocatable": dict(res),
            "addresses": [{"type": "InternalIP", "address": f"10.0.{index // 250}.{index % 250 + 1}"},
                          {"type": "Hostname", "address": name}],
        },
    }


def deployment_object(m: ServingModel) -> dict[str, Any]:
    labels = {"app": APP_LABEL}
    if _LABEL_VALUE.match(m.model):  # "org/name" is no label value: the simulator then uses its default
        labels[MODEL_LABEL] = m.model
    return {
        "metadata": {"name": m.deployment, "namespace": m.namespace, "labels": {"app": APP_LABEL}},
        "spec": {
            "replicas": m.want_replicas,
            "selector": {"matchLabels": {"app": APP_LABEL}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {"gpu-bridge.io/served-model": m.model}},
                "spec": {
                    "terminationGracePeriodSeconds": m.termination_grace_s,
                    "nodeSelector": {wellknown.LABEL_POOL: m.pool},
                    **({"readinessGates": [{"conditionType": g} for g in m.readiness_gates]} if m.readiness_gates else {}),
                    "containers": [{
                        "name": "vllm", "image": m.image,
                        "args": ["--model", m.model, "--tensor-parallel-size", str(m.gpus_per_node)],
                        "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                        "resources": {"requests": {wellknown.GPU_RESOURCE: str(m.gpus_per_node), "cpu": "8",
                                                   "memory": "64Gi"},
                                      "limits": {wellknown.GPU_RESOURCE: str(m.gpus_per_node)}},
                        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
                    }],
                },
            },
        },
    }


def pdb_object(m: ServingModel) -> dict[str, Any]:
    return {"metadata": {"name": PDB, "namespace": m.namespace},
            "spec": {"maxUnavailable": m.max_unavailable, "selector": {"matchLabels": {"app": APP_LABEL}}}}


def create(fn: Any) -> Any:
    """Create, treating 409 AlreadyExists as done (idempotent seeding)."""
    from kubernetes.client.exceptions import ApiException

    try:
        return fn()
    except ApiException as e:
        if e.status == 409:
            return None
        raise SandboxError(f"kube seeding: {e.status} {e.reason}: {(e.body or '')[:300]}") from None


def seed_serving(api: Any, m: ServingModel, *, spare_nodes: int = 0) -> list[str]:
    """Create, through ``api`` (a kubernetes ApiClient with the rights to), the nodes (``m.nodes``
    serving + ``spare_nodes`` more), the namespace with its ``default`` ServiceAccount, the
    Deployment and the PDB. Returns the node names. Objects that exist are left alone."""
    from kubernetes import client as k8s

    core, apps, policy = k8s.CoreV1Api(api), k8s.AppsV1Api(api), k8s.PolicyV1Api(api)
    names = m.node_names(spare_nodes)
    for i, name in enumerate(names, start=1):
        create(lambda name=name, i=i: core.create_node(node_object(name, m.pool, m.gpus_per_node, i),
                                                       _preload_content=False))
    create(lambda: core.create_namespace({"metadata": {"name": m.namespace}}, _preload_content=False))
    # The ServiceAccount admission plugin refuses pods until "default" exists; do not wait for
    # the controller to make it (the ReplicaSet controller would back off for seconds).
    create(lambda: core.create_namespaced_service_account(m.namespace, {"metadata": {"name": "default"}},
                                                          _preload_content=False))
    create(lambda: apps.create_namespaced_deployment(m.namespace, deployment_object(m), _preload_content=False))
    create(lambda: policy.create_namespaced_pod_disruption_budget(m.namespace, pdb_object(m), _preload_content=False))
    return names


def available_replicas(api: Any, m: ServingModel) -> int:
    """The Deployment's available replicas once its status is current, else -1."""
    from kubernetes import client as k8s

    try:
        d = k8s.AppsV1Api(api).read_namespaced_deployment(m.deployment, m.namespace, _request_timeout=5)
    except Exception:  # noqa: BLE001 - not there yet / apiserver busy: poll again
        return -1
    return int(d.status.available_replicas or 0) if d.status.observed_generation == d.metadata.generation else -1


def started_replicas(api: Any, m: ServingModel) -> int:
    """The Deployment's pods Running with their containers ready (Ready or not: a pod with a
    readiness gate is Ready only once its gate's condition is True), else -1 on an error."""
    import json

    from kubernetes import client as k8s

    try:
        resp: Any = k8s.CoreV1Api(api).list_namespaced_pod(m.namespace, label_selector=f"app={APP_LABEL}",
                                                      _request_timeout=5, _preload_content=False)
        pods = json.loads(resp.data).get("items") or []
    except Exception:  # noqa: BLE001 - apiserver busy: poll again
        return -1
    n = 0
    for p in pods:
        status = p.get("status") or {}
        conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        if status.get("phase") == "Running" and not (p.get("metadata") or {}).get("deletionTimestamp") \
                and conds.get("ContainersReady") == "True":
            n += 1
    return n


def wait_serving_ready(api: Any, m: ServingModel, timeout_s: float = 60.0) -> bool:
    """Until the Deployment reports all its replicas available."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if available_replicas(api, m) >= m.want_replicas:
            return True
        time.sleep(0.1)
    return False
