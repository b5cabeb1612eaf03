"""`gpu-bridge sandbox kube` as a process: ready line, kubeconfig, seeded serving side, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kube_contract import KUBECTL


@pytest.mark.integration
def test_cli_serves_the_seeded_serving_side_and_stops_on_sigterm(tmp_path: Path) -> None:
    if os.environ.get("GPU_BRIDGE_CONTRACT_KUBECONFIG"):
        pytest.skip("starts the sandbox server itself")
    kc = tmp_path / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "sandbox", "kube", "--port", "0", "--kubeconfig", str(kc),
                             "--token", "t0ken", "--seed-serving", "--nodes", "2", "--spare-nodes", "1",
                             "--pool", "research", "--pod-start-delay-s", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("gpu-bridge sandbox kube: listening on https://127.0.0.1:"), line
        env = {"HOME": str(tmp_path), "KUBECONFIG": str(kc), "PATH": os.environ.get("PATH", "")}
        out = subprocess.run([KUBECTL, "get", "nodes", "-l", "gpu-bridge.io/pool=research", "-o", "name"], env=env,
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.split() == ["node/gpu-node-01", "node/gpu-node-02", "node/gpu-node-03"], out.stderr
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            r = subprocess.run([KUBECTL, "get", "deploy", "vllm", "-n", "serving", "-o",
                                "jsonpath={.status.availableReplicas}"], env=env, capture_output=True, text=True,
                               timeout=30)
            if r.stdout.strip() == "2":
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the seeded vLLM Deployment never became available")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()
