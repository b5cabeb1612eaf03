"""The Kubernetes client's own retries: a hung API server costs one timeout a call, not four
(urllib3 retried a GET or PUT three times after a read timeout), while a connection the server
closed without answering (a stale pooled one) is still retried."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from bridge.adapters.kube.client import api_client_from_config


@contextlib.contextmanager
def _server(answer: Callable[[int, socket.socket], None]) -> Iterator[tuple[int, list[int]]]:
    """A loopback TCP server calling ``answer(i, conn)`` for its i-th connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    seen: list[int] = []
    held: list[socket.socket] = []

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            seen.append(len(seen))
            held.append(conn)
            answer(len(seen) - 1, conn)

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield srv.getsockname()[1], seen
    finally:
        srv.close()
        for c in held:
            c.close()


def _core(port: int, tmp_path: Path) -> k8s.CoreV1Api:
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: not-a-secret}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    return k8s.CoreV1Api(api_client_from_config(kubeconfig=str(kc)))


@pytest.fixture
def hung() -> Iterator[tuple[int, list[int]]]:
    with _server(lambda i, conn: None) as server:  # accepts, reads nothing, never answers
        yield server


@pytest.mark.parametrize("verb", ["get", "put", "patch"])
def test_a_hung_api_server_costs_one_timeout_a_call(hung: tuple[int, list[int]], tmp_path: Path, verb: str) -> None:
    port, seen = hung
    core = _core(port, tmp_path)
    call = {
        "get": lambda: core.read_node("gpu-node-01", _request_timeout=0.4),
        "put": lambda: core.replace_namespaced_config_map("c", "default", {}, _request_timeout=0.4),
        "patch": lambda: core.patch_node("gpu-node-01", {"metadata": {}}, _request_timeout=0.4),
    }[verb]
    t = time.monotonic()
    with pytest.raises(Exception, match="timed out"):
        call()
    assert time.monotonic() - t < 1.2  # four timeouts (the old behaviour) would be 1.6 s
    assert seen == [0]  # one request, no retry


def test_a_connection_closed_without_an_answer_is_still_retried(tmp_path: Path) -> None:
    body = b'{"kind": "Node", "apiVersion": "v1", "metadata": {"name": "gpu-node-01"}}'

    def answer(i: int, conn: socket.socket) -> None:
        conn.recv(65536)
        if i == 0:
            conn.close()  # a stale keep-alive connection: closed with the request unanswered
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)

    with _server(answer) as (port, seen):
        resp = _core(port, tmp_path).read_node("gpu-node-01", _preload_content=False, _request_timeout=2.0)
        assert resp.status == 200 and b"gpu-node-01" in resp.data
        assert seen == [0, 1]
