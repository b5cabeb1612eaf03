"""KubeFollower with the official client against a minimal fake pod API (list + watch,
410 on compacted versions, a failing list): the adapter's list/watch/relist/reconnect."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpu_bridge_lab.sandbox.vllm.follow_kube import KubeFollower, PodTracker
from gpu_bridge_lab.sandbox.vllm.model import DRAINING, SERVING
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from bridge.trace import Trace

FLAT = Trace((0.0, 600.0), (5.0, 5.0), (1.0, 1.0), 600.0, "flat")
NS = "serving"


def pod(name: str, *, ready: bool = True, node: str = "gpu-node-01", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": {"app": "vllm"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class FakePodApi:
    """Just enough of the pods API: list with resourceVersion, watch from a version."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.pods: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[int, str, dict[str, Any]]] = []
        self.floor = 0  # watches from below this get 410
        self.kick = 0  # bumping it ends open watches
        self.fail_lists = 0
        self.lists = 0
        self.selectors: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=lambda: self.httpd.serve_forever(poll_interval=0.05), daemon=True)

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return obj

    def put(self, obj: dict[str, Any]) -> None:
        with self.cond:
            name = obj["metadata"]["name"]
            kind = "MODIFIED" if name in self.pods else "ADDED"
            obj = self._stamp(obj)
            self.pods[name] = obj
            self.log.append((self.rv, kind, obj))
            self.cond.notify_all()

    def delete(self, name: str) -> None:
        with self.cond:
            obj = self._stamp(self.pods.pop(name))
            self.log.append((self.rv, "DELETED", obj))
            self.cond.notify_all()

    def compact_and_kick(self) -> None:
        with self.cond:
            self.floor = self.rv  # a list now (at rv) can still be watched from
            self.kick += 1
            self.cond.notify_all()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return None

            def _json(self, status: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                url = urlsplit(self.path)
                if url.path != f"/api/v1/namespaces/{NS}/pods":
                    self._json(404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": url.path})
                    return
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                api.selectors.append(q.get("labelSelector", ""))
                if q.get("watch") in ("true", "1", "True"):
                    self._watch(int(q.get("resourceVersion") or 0), float(q.get("timeoutSeconds") or 30))
                    return
                with api.cond:
                    api.lists += 1
                    if api.fail_lists:
                        api.fail_lists -= 1
                        self._json(500, {"kind": "Status", "code": 500, "reason": "InternalError", "message": "boom"})
                        return
                    body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(api.rv)},
                            "items": list(api.pods.values())}
                self._json(200, body)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _watch(self, since: int, timeout: float) -> None:
                # chunked, like a real API server, so each event reaches the client at once
                self.protocol_version = "HTTP/1.1"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    self._watch_events(since, timeout)
                finally:
                    self.wfile.write(b"0\r\n\r\n")
                    self.close_connection = True

            def _watch_events(self, since: int, timeout: float) -> None:
                deadline = time.monotonic() + timeout
                with api.cond:
                    if since < api.floor:
                        ev = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "code": 410,
                                                          "reason": "Expired", "message": "too old resource version"}}
                        self._chunk(json.dumps(ev).encode() + b"\n")
                        return
                    kick = api.kick
                    while time.monotonic() < deadline and api.kick == kick:
                        for rv, kind, obj in api.log:
                            if rv > since:
                                self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                                since = rv
                        api.cond.wait(0.1)

        return H


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakePodApi]:
    fake = FakePodApi()
    fake.thread.start()
    yield fake
    with fake.cond:
        fake.kick += 1
        fake.cond.notify_all()
    fake.httpd.shutdown()
    fake.httpd.server_close()


def kubeconfig(tmp_path: Path, port: int) -> str:
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": NS}}],
    }
    p = tmp_path / "kubeconfig"
    p.write_text(json.dumps(cfg))
    return str(p)


def wait_for(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_follower_lists_watches_relists_on_410_and_survives_errors(api: FakePodApi, tmp_path: Path) -> None:
    api.put(pod("vllm-a"))
    api.put(pod("vllm-b", ready=False, node="gpu-node-02"))
    api.fail_lists = 1  # the first list fails: the follower must retry
    sim = Simulation(FLAT, ["m"], seed=1)
    tracker = PodTracker(sim, "m")
    follower = KubeFollower(tracker, kubeconfig(tmp_path, api.httpd.server_address[1]), NS, "app=vllm",
                            watch_timeout_s=2, backoff_s=0.2).start()
    try:
        wait_for(lambda: set(sim.replicas) == {"vllm-a"}, "vllm-a after a failed first list")
        assert api.lists >= 2 and "app=vllm" in api.selectors
        assert sim.replicas["vllm-a"].node == "gpu-node-01"

        api.put(pod("vllm-b", node="gpu-node-02"))  # becomes Ready: seen through the watch
        wait_for(lambda: "vllm-b" in sim.replicas, "vllm-b Ready")
        assert sim.replicas["vllm-b"].state == SERVING and sim.replicas["vllm-b"].node == "gpu-node-02"
        lists_before = api.lists
        sim.advance(10)  # requests in flight, so a drain takes time

        api.put(pod("vllm-a", deleting=True))  # deletion started: drain
        wait_for(lambda: sim.replicas.get("vllm-a") is not None and sim.replicas["vllm-a"].state == DRAINING,
                 "vllm-a draining")

        # history compacted while disconnected, and vllm-b went away meanwhile
        api.compact_and_kick()
        api.delete("vllm-b")
        api.compact_and_kick()
        wait_for(lambda: api.lists > lists_before, "a re-list after 410")
        wait_for(lambda: "vllm-b" not in sim.replicas, "vllm-b removed after the re-list")

        api.put(pod("vllm-c", node="gpu-node-03"))  # the watch resumed from the re-list's version
        wait_for(lambda: "vllm-c" in sim.replicas, "vllm-c after the re-list")
        api.delete("vllm-a")
        wait_for(lambda: "vllm-a" not in sim.replicas, "vllm-a gone when its pod is deleted")
    finally:
        t0 = time.monotonic()
        follower.stop()
        assert time.monotonic() - t0 < 1.5  # stop wakes the blocked watch read
