"""Helpers of the Kubernetes API contract tests (kubectl runner, cluster set-up via the API)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the kubectl under test: $GPU_BRIDGE_KUBECTL (e.g. Debian 12's kubernetes-client 1.20, unpacked
# somewhere: scripts/test_kubectl_debian12.sh), else the one built with the control plane, of
# the same release (scripts/build_kube.sh)
def _kubectl() -> str:
    if os.environ.get("GPU_BRIDGE_KUBECTL"):
        return os.environ["GPU_BRIDGE_KUBECTL"]
    from gpu_bridge_lab.sandbox.realkube import find_binaries

    return str(find_binaries().kubectl)


KUBECTL = _kubectl()


@dataclass
class Kube:
    """One cluster under test, as its kubeconfig plus handy runners."""

    kubeconfig: Path
    home: Path
    plane: Any = None  # the sandbox running the control plane, None against another cluster
    prefix: str = field(default_factory=lambda: "c" + uuid.uuid4().hex[:6])
    _clients: list[Any] = field(default_factory=list)

    @property
    def sandbox(self) -> bool:
        return self.plane is not None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        env.update({"HOME": str(self.home), "KUBECONFIG": str(self.kubeconfig)})
        return env

    def kubectl(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([KUBECTL, *args], env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r

    def kubectl_bg(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([KUBECTL, *args], env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def client(self) -> Any:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self._clients.append(api)
        return client, api

    def close(self) -> None:
        for c in self._clients:
            c.close()

    def name(self, base: str) -> str:
        return f"{self.prefix}-{base}"


def wait_for(cond: Callable[[], Any], timeout_s: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


GPU = "nvidia.com/gpu"


def make_node(core: Any, client: Any, name: str, labels: dict[str, str] | None = None, gpus: int = 4) -> Any:
    """A Node via the API with allocatable GPUs and Ready (status written through /status)."""
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}}
    core.create_node(body)
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(gpus)}
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready",
         "lastHeartbeatTime": ts, "lastTransitionTime": ts}]}})
    return core.read_node(name)


def settled(core: Any, name: str) -> Any:
    """The node once the node lifecycle controller has lifted the not-ready taint it gives a
    new node: a write of its own, not to be mistaken for a test's (a real cluster only)."""
    wait_for(lambda: not any(t.key.startswith("node.kubernetes.io/") for t in core.read_node(name).spec.taints or []),
             20, f"node {name}: the not-ready taint lifted")
    return core.read_node(name)


def serving_objects(ns: str, pool: str, replicas: int, grace: int = 5, max_unavailable: int = 1) -> tuple[dict, dict]:
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm", "namespace": ns},
           "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "vllm"}},
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                    "template": {"metadata": {"labels": {"app": "vllm"}},
                                 "spec": {"terminationGracePeriodSeconds": grace,
                                          "nodeSelector": {"gpu-bridge.io/pool": pool},
                                          "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
                                                          "resources": {"requests": {GPU: "4"},
                                                                        "limits": {GPU: "4"}}}]}}}}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "vllm", "namespace": ns},
           "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": "vllm"}}}}
    return dep, pdb


@dataclass
class Serving:
    ns: str
    pool: str
    nodes: list[str]
    core: Any
    apps: Any
    policy: Any
    client: Any

    def pods(self) -> list[Any]:
        return self.core.list_namespaced_pod(self.ns, label_selector="app=vllm").items

    def node_of(self) -> dict[str, str]:
        return {p.metadata.name: p.spec.node_name for p in self.pods()}

    def ready_pods(self) -> list[Any]:
        out = []
        for p in self.pods():
            conds = {c.type: c.status for c in (p.status.conditions or [])}
            if conds.get("Ready") == "True" and p.metadata.deletion_timestamp is None:
                out.append(p)
        return out


class BookmarkWatch:
    """A watch with bookmarks, opened with the first contract test and read in a thread: the
    apiserver sends its first BOOKMARK about a minute later (none earlier, whatever the
    timeout), so the other contract tests run meanwhile instead of the suite waiting."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.ns = "c" + uuid.uuid4().hex[:6] + "-bookmarks"
        self.core.create_namespace({"metadata": {"name": self.ns}})
        self.rv = json.loads(self.core.list_namespaced_config_map(self.ns, _preload_content=False).data)["metadata"]["resourceVersion"]
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            resp = self.core.list_namespaced_config_map(self.ns, watch=True, resource_version=self.rv,
                                                        allow_watch_bookmarks=True, timeout_seconds=75,
                                                        _preload_content=False)
            for line in resp:
                self.events += [json.loads(part) for part in line.split(b"\n") if part.strip()]
                if any(ev["type"] == "BOOKMARK" for ev in self.events):
                    break
            resp.close()
            resp.release_conn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def close(self) -> None:
        try:
            self.core.delete_namespace(self.ns)
        finally:
            self.api.close()
