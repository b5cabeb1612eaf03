"""End to end with two pools sharing the sandbox's nodes: real Slurm, the sandbox's Kubernetes,
real Prometheus, the vLLM simulator serving two models, the daemon as a subprocess.

Pool ``default`` (Deployment ``vllm``) has gpu-node-01 and -02, pool ``pool-b`` (``vllm-b``)
has -03 and -04. Two things only a multi-pool daemon run shows:

- a problem node in pool B (a phase label no lifecycle has, which the daemon holds and never
  guesses) does not stop pool A's lend: the Deployment scale guard is per pool;
- pool A's lend takes the node whose replica has the least in-flight work (vLLM's
  ``num_requests_running + num_requests_waiting`` per pod, as Prometheus has them), not the
  first by name: the simulator keeps gpu-node-01's replica several times busier.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_api_client import PrometheusConnect

from bridge import wellknown as wk
from gpu_bridge_lab.sandbox import serving
from gpu_bridge_lab.sandbox.daemon_config import daemon_identity, sandbox_config, write_config
from gpu_bridge_lab.sandbox.e2e import World, put_load, read_events, wait_until
from gpu_bridge_lab.sandbox.serving import serving_sandbox, split_pool
from sandbox_fixtures import QUIET_START_RPS, daemon_run

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

NODES = 4
GRACE_S = 5
POD_START_S = 3.0
A_NODES = ("gpu-node-01", "gpu-node-02")
BUSY, IDLE = A_NODES  # BUSY's replica is kept at BUSY_WEIGHT times IDLE's in-flight requests
BUSY_WEIGHT = 6.0
PROBLEM = "gpu-node-04"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, World, Path]]:
    d = Path(tempfile.mkdtemp(prefix="gb-2p-", dir="/tmp"))
    sb = serving_sandbox(d, nodes=NODES, grace_s=GRACE_S, pod_start_delay_s=POD_START_S, pod_grace_s=3,
                         shutdown_timeout_s=2, vllm_extra=("--max-cv", "1.5"), pool_b_nodes=2,
                         peak_rps=QUIET_START_RPS)
    try:
        sb.up()
        assert split_pool(sb, 2) == ["gpu-node-03", "gpu-node-04"]
        w = World(sb)
        try:
            yield sb, w, d
        finally:
            w.close()
    finally:
        sb.down()
        shutil.rmtree(d, ignore_errors=True)


def inflight_by_node(sb: Any, w: World, model: str) -> dict[str, float]:
    """running + waiting per node's replica of ``model``, from Prometheus (what the daemon reads)."""
    pc = PrometheusConnect(url=sb.prometheus_url, disable_ssl=True)
    q = (f'sum by (pod) (vllm:num_requests_running{{model_name="{model}"}}'
         f' + vllm:num_requests_waiting{{model_name="{model}"}})')
    by_pod = {r["metric"]["pod"]: float(r["value"][1]) for r in pc.custom_query(q)}
    return {node: sum(by_pod.get(p, 0.0) for p in pods) for node, pods in w.pods_by_node().items() if node in A_NODES}


def test_pool_a_lends_its_least_busy_node_while_pool_b_has_a_problem_node(world: tuple[Any, World, Path]) -> None:
    sb, w, d = world
    vllm = sb.vllm_url
    assert vllm
    assert sorted(w.ready_pods_by_node()) == [f"gpu-node-0{i}" for i in range(1, NODES + 1)]
    # Pool A: little load (one replica is plenty), unevenly routed; pool B: both replicas needed.
    put_load(vllm, {"model": serving.MODEL, "rate": 4.0, "cv": 1.0, "node_weights": {BUSY: BUSY_WEIGHT}})
    put_load(vllm, {"model": serving.MODEL_B, "rate": 35.0, "cv": 1.0})
    # Pool B's problem: a phase label of ours that no lifecycle has (the daemon holds such a node).
    w.core.patch_node(PROBLEM, {"metadata": {"labels": {wk.LABEL_PHASE: "bogus"}}})

    def settled_and_uneven() -> dict[str, float] | None:
        """The start-up backlog (the trace's load before ours) served, the routing uneven."""
        got = inflight_by_node(sb, w, serving.MODEL)
        busy, idle = got.get(BUSY, 0.0), got.get(IDLE, 0.0)
        return got if busy + idle < 40 and busy > 2 * idle + 1 else None

    before = wait_until(settled_and_uneven, 60,
                        f"{BUSY}'s replica to carry clearly more in-flight requests than {IDLE}'s, in steady state")

    doc = sandbox_config(prometheus_url=sb.prometheus_url, **daemon_identity(sb), slurm_conf=sb.slurm.slurm_conf,
                         grace_s=GRACE_S, cold_start_s=POD_START_S, min_serving=1, scale_down_window_s=6,
                         min_lend_s=5, pool_b=True)
    cfg = write_config(d / "gpu-bridge.yaml", doc)
    log_path = d / "daemon.log"

    def explain() -> None:
        print("\n".join(f"{e.get('event')} node={e.get('node')} step={e.get('step')} action={e.get('action')} "
                        f"reason={e.get('reason')}" for e in read_events(log_path)
                        if e.get("event") in ("decision", "node_step", "step_failed", "pool_scaled", "node_problem"))[-6000:])

    samples: list[dict[str, float]] = []
    with daemon_run(cfg, log_path, sb.env, explain=explain):
        t0 = time.monotonic()

        def a_lent() -> str | None:
            samples.append(inflight_by_node(sb, w, serving.MODEL))
            phases = w.phases()
            return next((n for n in A_NODES if phases.get(n) == "lent"), None)

        lent = wait_until(a_lent, 120, "a node of pool A to be lent (pool B has a problem node)", poll_s=0.5)
        lend_s = time.monotonic() - t0
        phases = w.phases()
        time.sleep(1.0)
        decisions = [e for e in read_events(log_path, "decision") if e.get("action") == "lend"]
    print(f"\nin-flight before the daemon: {before}; pool A lent {lent} after {lend_s:.1f} s; "
          f"in-flight while it decided (last samples): {samples[-3:]}")
    # The per-pool scale guard: pool A's lend went through although pool B has a problem node.
    assert phases[PROBLEM] == "bogus"  # held, never guessed
    assert phases["gpu-node-03"] == "serving"
    assert w.apps.read_namespaced_deployment(serving.DEPLOYMENT_B, serving.NAMESPACE).spec.replicas == 2
    assert w.replicas() == 1  # pool A scaled down by the one node it lent
    # The in-flight order, from the vLLM series: the idle replica's node went, not the first by name.
    assert lent == IDLE, f"lent {lent}; in-flight per node {samples[-3:]}"
    assert phases[BUSY] == "serving"
    assert [e["node"] for e in decisions if e["node"] in A_NODES][:1] == [IDLE]
