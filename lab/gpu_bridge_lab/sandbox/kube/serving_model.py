"""The sandbox's serving side: GPU nodes named like the Slurm nodes, one lending pool, a
namespace ``serving`` with a vLLM Deployment (one 4-GPU replica per node) and its
PodDisruptionBudget. Seeding goes through the same store and controllers as API writes,
so the pods are really scheduled and become Ready after the kubelet's start delay."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from bridge import wellknown
from gpu_bridge_lab.sandbox.kube import resources as res_mod
from gpu_bridge_lab.sandbox.kube.controllers import node_info
from gpu_bridge_lab.sandbox.kube.defaults import on_create
from gpu_bridge_lab.sandbox.kube.store import Store

MODEL_LABEL = "gpu-bridge.io/model"  # the vLLM simulator reads the model from this pod label
DEFAULT_MODEL = "meta-llama/Llama-3.1-70B-Instruct"  # the vLLM simulator's default too
NAMESPACE = "serving"
DEPLOYMENT = "vllm"
PDB = "vllm"
APP_LABEL = "vllm"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class ServingModel:
    """What to seed. ``spare`` nodes get no replica (room for a drained pod's replacement)."""

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

    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}{i:02d}" for i in range(1, self.nodes + 1)]


def cli_args(m: ServingModel, *, spare_nodes: int = 0) -> list[str]:
    """The ``gpu-bridge sandbox kube`` arguments that seed ``m`` (for the sandbox orchestrator,
    which starts the server as a subprocess: ``Sandbox(kube=True, kube_args=cli_args(m))``)."""
    argv = ["--seed-serving", "--nodes", str(m.nodes), "--pool", m.pool, "--model", m.model,
            "--grace-s", str(m.termination_grace_s)]
    if spare_nodes:
        argv += ["--spare-nodes", str(spare_nodes)]
    if m.replicas is not None:
        argv += ["--replicas", str(m.replicas)]
    return argv


def node_object(name: str, pool: str, gpus: int, index: int = 1) -> dict[str, Any]:
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", wellknown.GPU_RESOURCE: str(gpus),
           "ephemeral-storage": "1Ti"}
    return {
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(gpus), wellknown.LABEL_POOL: pool}},
        "spec": {},
        "status": {
            "capacity": dict(res), "allocatable": dict(res),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status", "lastHeartbeatTime": ts,
                            "lastTransitionTime": ts}],
            "addresses": [{"type": "InternalIP", "address": f"10.0.0.{index}"}, {"type": "Hostname", "address": name}],
            "nodeInfo": node_info(name),
        },
    }


def deployment_object(m: ServingModel) -> dict[str, Any]:
    labels = {"app": APP_LABEL}
    if _LABEL_VALUE.match(m.model):  # "org/name" is no label value: the simulator then uses its default
        labels[MODEL_LABEL] = m.model
    replicas = m.nodes if m.replicas is None else m.replicas
    return {
        "metadata": {"name": m.deployment, "namespace": m.namespace, "labels": {"app": APP_LABEL}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": APP_LABEL}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {"gpu-bridge.io/served-model": m.model}},
                "spec": {
                    "terminationGracePeriodSeconds": m.termination_grace_s,
                    "nodeSelector": {wellknown.LABEL_POOL: m.pool},
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


def seed_serving(store: Store, m: ServingModel, *, spare_nodes: int = 0) -> list[str]:
    """Create the nodes (``m.nodes`` serving + ``spare_nodes`` more), the namespace, the
    Deployment and the PDB. Returns the node names. Idempotent objects are not re-created."""
    nodes_r = res_mod.core("nodes")
    names = [f"{m.node_prefix}{i:02d}" for i in range(1, m.nodes + spare_nodes + 1)]
    with store.lock:
        for i, n in enumerate(names, start=1):
            if store.get_entry(nodes_r, "", n) is None:
                store.create(nodes_r, node_object(n, m.pool, m.gpus_per_node, i), keep_status=True)
        ns_r = res_mod.core("namespaces")
        if store.get_entry(ns_r, "", m.namespace) is None:
            store.create(ns_r, {"metadata": {"name": m.namespace}})
        dep_r = res_mod.get("apps", "deployments")
        if store.get_entry(dep_r, m.namespace, m.deployment) is None:
            d = deployment_object(m)
            on_create(dep_r, d)
            store.create(dep_r, d)
        pdb_r = res_mod.get("policy", "poddisruptionbudgets")
        if store.get_entry(pdb_r, m.namespace, PDB) is None:
            store.create(pdb_r, pdb_object(m))
    return names


def wait_serving_ready(store: Store, m: ServingModel, timeout_s: float = 30.0) -> bool:
    """Until the Deployment reports all replicas available."""
    dep_r = res_mod.get("apps", "deployments")
    want = m.nodes if m.replicas is None else m.replicas
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        e = store.get_entry(dep_r, m.namespace, m.deployment)
        if e is not None:
            st = e.obj.get("status") or {}
            if st.get("availableReplicas", 0) >= want and st.get("observedGeneration") == e.obj["metadata"].get(
                    "generation"):
                return True
        time.sleep(0.02)
    return False
