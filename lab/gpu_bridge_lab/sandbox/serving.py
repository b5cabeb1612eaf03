"""The whole sandbox as gpu-bridge sees a real site: Slurm nodes that are also Kubernetes GPU
nodes serving one vLLM Deployment (or two: ``pool_b_nodes``), the vLLM simulator following
the Deployments' Ready pods, and Prometheus scraping the simulator (and, given its address,
the daemon)."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bridge import wellknown
from bridge.config import DEFAULT_POOL, PoolConfig
from gpu_bridge_lab.sandbox.cluster.prometheus import ScrapeTarget
from gpu_bridge_lab.sandbox.cluster.sandbox import DEFAULT_DIR, Sandbox
from gpu_bridge_lab.sandbox.cluster.slurm import node_names
from gpu_bridge_lab.sandbox.dcgm import FakeDcgm

# the pool and Deployment names the daemon assumes when a config does not name them
POOL = DEFAULT_POOL
DEPLOYMENT = PoolConfig(name=POOL).deployment
NAMESPACE = "serving"
MODEL = "llama-70b"
# The second pool (``pool_b_nodes``): its own Deployment, model, PDB and nodes.
POOL_B = "pool-b"
DEPLOYMENT_B = "vllm-b"
MODEL_B = "qwen-32b"
APP_LABEL = "app"
MODEL_LABEL = "gpu-bridge.io/model"  # the vLLM simulator reads a pod's model from this label
# Both Deployments' pods: the simulator follows them all, each replica serving its pod's model.
POD_SELECTOR = f"{APP_LABEL} in ({DEPLOYMENT},{DEPLOYMENT_B})"


def serving_sandbox(
    dir: Path | str = DEFAULT_DIR,
    *,
    nodes: int = 4,
    grace_s: int = 10,
    fast_grace_s: int | None = None,
    pod_start_delay_s: float = 3.0,
    pod_grace_s: int = 5,
    shutdown_timeout_s: float = 3.0,
    speed: float = 1.0,
    trace_start_s: float | None = None,
    peak_rps: float | None = None,
    vllm_extra: Sequence[str] = (),
    scrape_targets: Sequence[ScrapeTarget | str] = (),
    extra_slurm_conf: str = "",
    job_submit_lua: Path | str | None = None,
    timeout_s: float = 60.0,
    pool_b_nodes: int = 0,
    warm_port: int | None = None,
    dcgm: FakeDcgm | None = None,
) -> Sandbox:
    """A Sandbox (not started) with the serving side: ``nodes`` GPU nodes in pool ``default``,
    Deployment ``serving/vllm`` with one 4-GPU replica per node, its PDB, and the simulator's
    replicas following the Deployment's Ready pods. ``pod_start_delay_s`` models the vLLM
    cold start; ``pod_grace_s`` is the pods' terminationGracePeriodSeconds.

    ``pool_b_nodes`` > 0: the simulator also serves ``MODEL_B``; after ``up()``, call
    ``split_pool(sb, pool_b_nodes)`` to give that many of the nodes to pool ``pool-b``.

    ``warm_port``: the serving side warm lending needs (docs/warm-lending.md): the simulator in
    sleep mode (``--enable-sleep-mode``, dev endpoints on), each pod's engine reachable at
    ``http://<pod IP>:warm_port`` (the daemon's ``pools[].vllm_port``; pod IPs are loopback
    addresses), and the pods declaring the readiness gate ``gpu-bridge.io/awake``: they start
    not Ready, and serve once the daemon opens their gates (``up()`` waits for them started only).

    ``dcgm``: a started fake dcgm-exporter (``gpu_bridge_lab.sandbox.dcgm``) that Prometheus
    scrapes too (job ``dcgm``), for the free-GPU check before a warm wake."""
    node_names(nodes)  # the node count's own check first: "nodes: must be between 1 and 999"
    if not 0 <= pool_b_nodes < nodes:
        raise ValueError(f"pool_b_nodes: must be between 0 and nodes - 1 ({nodes - 1}), got {pool_b_nodes}")
    d = Path(dir).absolute()
    kubeconfig = d / "kube" / "kubeconfig"
    kube_args = [
        "--seed-serving",
        "--nodes", str(nodes),
        "--pool", POOL,
        "--model", MODEL,
        "--pod-start-delay-s", str(pod_start_delay_s),
        "--grace-s", str(pod_grace_s),
    ]
    vllm_args = [
        "--kubeconfig", str(kubeconfig),
        "--namespace", NAMESPACE,
        "--selector", POD_SELECTOR,
        "--model", MODEL,
        *(("--model", MODEL_B) if pool_b_nodes else ()),
        "--shutdown-timeout", str(shutdown_timeout_s),
        "--speed", str(speed),
    ]
    if warm_port is not None:
        kube_args += ["--readiness-gate", wellknown.CONDITION_AWAKE]
        vllm_args += ["--enable-sleep-mode", "--dev-mode", "--pod-port", str(warm_port)]
    if trace_start_s is not None:
        vllm_args += ["--trace-start-s", str(trace_start_s)]
    if peak_rps is not None:
        vllm_args += ["--peak-rps", str(peak_rps)]
    vllm_args += list(vllm_extra)
    return Sandbox(
        d,
        nodes=nodes,
        grace_s=grace_s,
        fast_grace_s=fast_grace_s,
        kube=True,
        kube_args=kube_args,
        vllm=True,
        vllm_args=vllm_args,
        scrape_targets=(*scrape_targets, *((dcgm.scrape_target(),) if dcgm is not None else ())),
        extra_slurm_conf=extra_slurm_conf,
        job_submit_lua=job_submit_lua,
        timeout_s=timeout_s,
    )


def split_pool(sb: Sandbox, count: int, timeout_s: float = 60.0) -> list[str]:
    """Give the last ``count`` nodes to a second pool, through the Kubernetes API only (so it
    works on any implementation): the ``default`` Deployment gives up its pods there (lowest
    pod-deletion-cost, scaled down by ``count``), the nodes get the pool label ``pool-b``, and
    Deployment ``vllm-b`` (a copy of ``vllm`` serving ``MODEL_B`` on those nodes) and its PDB
    are created. Returns pool B's nodes once its replicas are available."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    names = list(sb.node_names)
    if not 0 < count < len(names):
        raise ValueError(f"count: must be between 1 and {len(names) - 1}, got {count}")
    moved = names[-count:]
    api = k8s_config.new_client_from_config(config_file=str(sb.kubeconfig))
    try:
        core, apps, policy = k8s.CoreV1Api(api), k8s.AppsV1Api(api), k8s.PolicyV1Api(api)
        dep = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE)
        selector = ",".join(f"{k}={v}" for k, v in dep.spec.selector.match_labels.items())
        for pod in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items:
            if pod.spec.node_name in moved:
                core.patch_namespaced_pod(pod.metadata.name, NAMESPACE, {"metadata": {"annotations": {
                    "controller.kubernetes.io/pod-deletion-cost": "-1000"}}})
        keep = len(names) - count
        apps.patch_namespaced_deployment_scale(DEPLOYMENT, NAMESPACE, {"spec": {"replicas": keep}})
        _wait(lambda: not any(p.spec.node_name in moved for p in
                              core.list_namespaced_pod(NAMESPACE, label_selector=selector).items),
              timeout_s, f"pool {POOL}'s pods to leave {', '.join(moved)}")
        for node in moved:
            core.patch_node(node, {"metadata": {"labels": {wellknown.LABEL_POOL: POOL_B}}})
        apps.create_namespaced_deployment(NAMESPACE, _deployment_b(api.sanitize_for_serialization(dep), count))
        policy.create_namespaced_pod_disruption_budget(NAMESPACE, {
            "metadata": {"name": DEPLOYMENT_B},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {APP_LABEL: DEPLOYMENT_B}}}})

        def available() -> bool:
            a = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE).status.available_replicas or 0
            b = apps.read_namespaced_deployment(DEPLOYMENT_B, NAMESPACE).status.available_replicas or 0
            return a == keep and b == count

        _wait(available, timeout_s, f"{keep} replicas of {DEPLOYMENT} and {count} of {DEPLOYMENT_B} available")
    finally:
        api.close()
    return moved


def _deployment_b(dep: dict[str, Any], replicas: int) -> dict[str, Any]:
    """Deployment ``vllm-b``: ``vllm``'s spec with its own name, labels, model and pool."""
    spec = copy.deepcopy(dep["spec"])
    spec["replicas"] = replicas
    spec["selector"] = {"matchLabels": {APP_LABEL: DEPLOYMENT_B}}
    tmpl = spec["template"]
    tmpl["metadata"]["labels"] = {APP_LABEL: DEPLOYMENT_B, MODEL_LABEL: MODEL_B}
    tmpl["metadata"].setdefault("annotations", {})["gpu-bridge.io/served-model"] = MODEL_B
    tmpl["spec"]["nodeSelector"] = {wellknown.LABEL_POOL: POOL_B}
    for c in tmpl["spec"]["containers"]:
        args = list(c.get("args") or [])
        if "--model" in args[:-1]:
            args[args.index("--model") + 1] = MODEL_B
        c["args"] = args
    return {"metadata": {"name": DEPLOYMENT_B, "namespace": NAMESPACE, "labels": {APP_LABEL: DEPLOYMENT_B}},
            "spec": spec}


def _wait(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.3)
