"""The whole sandbox as gpu-bridge sees a real site: Slurm nodes that are also Kubernetes GPU
nodes serving one vLLM Deployment, the vLLM simulator following that Deployment's Ready pods,
and Prometheus scraping the simulator (and, given its address, the daemon)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpu_bridge_lab.sandbox.cluster.sandbox import DEFAULT_DIR, Sandbox
from gpu_bridge_lab.sandbox.cluster.prometheus import ScrapeTarget

POOL = "default"
NAMESPACE = "serving"
DEPLOYMENT = "vllm"
MODEL = "llama-70b"
POD_SELECTOR = "app=vllm"


def serving_sandbox(
    dir: Path | str = DEFAULT_DIR,
    *,
    nodes: int = 4,
    grace_s: int = 10,
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
) -> Sandbox:
    """A Sandbox (not started) with the serving side: ``nodes`` GPU nodes in pool ``default``,
    Deployment ``serving/vllm`` with one 4-GPU replica per node, its PDB, and the simulator's
    replicas following the Deployment's Ready pods. ``pod_start_delay_s`` models the vLLM
    cold start; ``pod_grace_s`` is the pods' terminationGracePeriodSeconds."""
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
        "--shutdown-timeout", str(shutdown_timeout_s),
        "--speed", str(speed),
    ]
    if trace_start_s is not None:
        vllm_args += ["--trace-start-s", str(trace_start_s)]
    if peak_rps is not None:
        vllm_args += ["--peak-rps", str(peak_rps)]
    vllm_args += list(vllm_extra)
    return Sandbox(
        d,
        nodes=nodes,
        grace_s=grace_s,
        kube=True,
        kube_args=kube_args,
        vllm=True,
        vllm_args=vllm_args,
        scrape_targets=scrape_targets,
        extra_slurm_conf=extra_slurm_conf,
        job_submit_lua=job_submit_lua,
        timeout_s=timeout_s,
    )
