"""Support (no tests here) for the Kubernetes adapter and leader integration tests: a sandbox
``KubeServer`` on a free port, a kubeconfig for it, and seeding through the official client
(the same requests would seed a real cluster)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from bridge import wellknown as wk
from gpu_bridge_lab.sandbox.faultproxy import pipe
from gpu_bridge_lab.sandbox.kube.server import KubeServer


def start_server(tmp: Path) -> Iterator[tuple[Any, Path]]:
    server = KubeServer(port=0, pod_start_delay_s=0.3)
    start = getattr(server, "start", None)
    if callable(start):
        start()
    kubeconfig = tmp / "kubeconfig"
    server.write_kubeconfig(str(kubeconfig))
    try:
        yield server, kubeconfig
    finally:
        server.stop()


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met within {timeout} s")
        time.sleep(0.05)


def raw(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a client method and return the JSON as a dict: the v37 client's pydantic models
    reject objects with optional fields missing (a Node without nodeInfo.bootID, ...)."""
    resp = fn(*args, _preload_content=False, **kwargs)
    try:
        return json.loads(resp.data)
    finally:
        resp.release_conn()


def ensure_namespace(api: k8s.ApiClient, name: str) -> None:
    try:
        raw(k8s.CoreV1Api(api).create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiException as e:
        if e.status != 409:
            raise


def seed_node(api: k8s.ApiClient, name: str, pool: str, *, gpus: int = 4, taints: list[dict[str, str]] | None = None, unschedulable: bool = False) -> None:
    core = k8s.CoreV1Api(api)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {wk.LABEL_POOL: pool, "kubernetes.io/hostname": name}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
    }
    raw(core.create_node, body)
    status = {
        "status": {
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", wk.GPU_RESOURCE: str(gpus)},
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", wk.GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "sandbox"}],
        }
    }
    raw(core.patch_node_status, name, status)


def seed_deployment(api: k8s.ApiClient, namespace: str, name: str, pool: str, replicas: int, *, grace_s: int = 1) -> None:
    ensure_namespace(api, namespace)
    labels = {"app": name, "pool": pool}
    raw(
        k8s.AppsV1Api(api).create_namespaced_deployment,
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {wk.LABEL_POOL: pool},
                        "terminationGracePeriodSeconds": grace_s,
                        "containers": [{"name": "vllm", "image": "vllm/vllm-openai", "resources": {"limits": {wk.GPU_RESOURCE: "4"}}}],
                    },
                },
            },
        },
    )


def seed_pdb(api: k8s.ApiClient, namespace: str, name: str, labels: dict[str, str], min_available: int) -> None:
    raw(
        k8s.PolicyV1Api(api).create_namespaced_pod_disruption_budget,
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}},
        },
    )


class TcpProxy:
    """A TCP forwarder in front of the API server. ``cut()`` closes every connection and stops
    listening: what clients see when the API server dies or the network goes away."""

    def __init__(self, target_port: int) -> None:

        self._target = ("127.0.0.1", target_port)
        self._socks: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False
        self.port = 0
        self._listen()

    def _listen(self) -> None:
        import socket

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: Any) -> None:
        import socket

        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        self._closed = True
        self._stop_listening()
        self.blip()

    def _stop_listening(self) -> None:
        import socket

        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        self._listener.close()

    def outage(self, seconds: float) -> None:
        """Drop every connection and refuse new ones for ``seconds``, then accept again."""
        self._stop_listening()
        self.blip()

        def back() -> None:
            time.sleep(seconds)
            if not self._closed:
                self._listen()

        threading.Thread(target=back, daemon=True).start()

    def blip(self) -> None:
        """Close every open connection; new ones are still accepted."""
        import socket

        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass
            self._socks.clear()


def proxied_kubeconfig(kubeconfig: Path, proxy_port: int, out: Path) -> Path:
    """The same kubeconfig, pointing at the proxy."""
    import re

    text = re.sub(r"(server:\s*https?://127\.0\.0\.1:)\d+", lambda m: m.group(1) + str(proxy_port), kubeconfig.read_text())
    out.write_text(text)
    return out
