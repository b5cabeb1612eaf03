"""The issue's "done when", end to end on the real control plane (``kube_plane``): `kubectl drain` on a serving node
evicts its vLLM pod through the PDB, the vLLM simulator (following the Ready pods) stops
counting that replica, and the replacement pod lands on the spare node and serves."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_bridge_lab.sandbox.vllm.follow_kube import KubeFollower, PodTracker
from gpu_bridge_lab.sandbox.vllm.model import SERVING
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from bridge.trace import Trace

from test_kube_adapter_support import Corner, corner, kubectl, serving_side  # noqa: F401 (corner: fixture)

FLAT = Trace((0.0, 600.0), (20.0, 20.0), (1.0, 1.0), 600.0, "flat")


def _wait(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.integration
def test_drain_moves_a_replica_and_the_simulator_follows(corner: Corner, tmp_path: Path) -> None:
    model = serving_side(corner, nodes=3, spare_nodes=1, grace_s=2)
    kc = corner.kubeconfig
    sim = Simulation(FLAT, [model.model], seed=1)
    tracker = PodTracker(sim, model.model)
    follower = KubeFollower(tracker, str(kc), model.namespace, "app=vllm", watch_timeout_s=5).start()
    try:
        def serving() -> dict[str, str]:
            with sim.lock:
                return {n: r.node for n, r in sim.replicas.items() if r.state == SERVING}
        def n_serving(n: int, without: str = "") -> dict[str, str] | None:
            s = serving()
            return s if len(s) == n and without not in s else None
        before = _wait(lambda: n_serving(3), 10, "3 serving replicas")
        victim_pod, victim_node = sorted(before.items())[0]
        env = {"HOME": str(tmp_path), "KUBECONFIG": str(kc), "PATH": os.environ.get("PATH", "")}
        r = subprocess.run([kubectl(), "drain", victim_node, "--ignore-daemonsets", "--timeout=60s"],
                           env=env, capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        assert f"pod/{victim_pod} evicted" in r.stdout
        assert victim_pod not in serving()  # drained replica no longer counted
        after = _wait(lambda: n_serving(3, victim_pod), 15, "the replacement replica to serve")
        # the real scheduler leaves any one of the 4 nodes empty at first: the replacement lands there
        spare = set(model.node_names(1)) - set(before.values())
        assert len(spare) == 1
        assert set(after.values()) == (set(before.values()) - {victim_node}) | spare
    finally:
        follower.stop()
