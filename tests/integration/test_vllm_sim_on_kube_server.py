"""Follow-kube end to end: the real control plane (the session's ``kube_plane``) runs the vLLM
Deployment; the simulator (a subprocess, `--kubeconfig`) follows its Ready pods. An eviction
drains that pod's replica, which disappears, and the Deployment's replacement pod becomes a
replica on another node."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from test_kube_adapter_support import Corner, corner, serving_side  # noqa: F401 (corner: fixture)

pytestmark = pytest.mark.integration

GRACE_S = 3  # the pods' termination grace: kwok deletes a pod when it ends


@pytest.fixture
def cluster(corner: Corner) -> Iterator[tuple[Any, Any, Path]]:
    m = serving_side(corner, nodes=3, spare_nodes=1, grace_s=GRACE_S)
    yield corner, m, corner.kubeconfig


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def replicas(base: str) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(base + "/replicas", timeout=5) as resp:
        return {r["name"]: r for r in json.loads(resp.read())["replicas"]}


def test_replicas_follow_ready_pods_through_an_eviction(cluster: tuple[Any, Any, Path]) -> None:
    from kubernetes import client, config

    _, m, kubeconfig = cluster
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    pods = {p.metadata.name: p.spec.node_name
            for p in api.list_namespaced_pod(m.namespace, label_selector="app=vllm").items}
    assert len(pods) == 3

    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "sandbox", "vllm", "--host", "127.0.0.1", "--port", "0",
         "--kubeconfig", str(kubeconfig), "--namespace", m.namespace, "--selector", "app=vllm",
         "--shutdown-timeout", "30", "--peak-rps", "60", "--speed", "60", "--trace-start-s", "18:00"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.match(r"vllm-sim listening on (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        base = match.group(1)
        wait_for(lambda: {n: r["node"] for n, r in replicas(base).items()} == pods, 15, "one replica per Ready pod")
        assert all(r["state"] == "serving" and r["model"] == m.model for r in replicas(base).values())
        time.sleep(1.0)  # some requests in flight

        victim, victim_node = sorted(pods.items())[0]
        api.create_namespaced_pod_eviction(victim, m.namespace, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=victim, namespace=m.namespace)))
        # the pod lingers GRACE_S terminating: its replica drains meanwhile
        wait_for(lambda: replicas(base).get(victim, {}).get("state") == "draining", 10, "the victim draining")
        wait_for(lambda: victim not in replicas(base), 15, "the victim's replica gone with its pod")

        def replacement() -> dict[str, Any] | None:
            new = {n: r for n, r in replicas(base).items() if n not in pods}
            return next(iter(new.values()), None)

        wait_for(lambda: replacement() is not None, 20, "the replacement pod's replica")
        rep = replacement()
        assert rep is not None and rep["node"] and rep["node"] != victim_node and rep["state"] == "serving"
        assert len(replicas(base)) == 3

        with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert f'pod="{victim}"' not in text
        assert f'pod="{rep["name"]}"' in text and f'node="{rep["node"]}"' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
