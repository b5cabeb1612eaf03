"""The control API and /metrics over real HTTP, with the server in-process on port 0."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_bridge_lab.sandbox.vllm.server import SimServer
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from bridge.trace import Trace

FLAT = Trace((0.0, 600.0), (5.0, 5.0), (1.0, 1.0), 600.0, "flat")


@pytest.fixture
def server() -> Iterator[SimServer]:
    sim = Simulation(FLAT, ["m"], seed=4)
    srv = SimServer(sim, "127.0.0.1", 0, tick_s=0.05).start()
    yield srv
    srv.stop()


def call(srv: SimServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(srv.url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            raw = resp.read()
            status = resp.status
            ctype = resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    return status, (json.loads(raw) if "json" in ctype else raw.decode())


def test_replica_lifecycle_over_http(server: SimServer) -> None:
    assert call(server, "GET", "/healthz")[0] == 200
    status, rep = call(server, "POST", "/replicas", {"name": "r1", "model": "m", "node": "gpu-node-02"})
    assert status == 201 and rep["state"] == "serving" and rep["node"] == "gpu-node-02"
    status, body = call(server, "GET", "/replicas")
    assert status == 200 and [r["name"] for r in body["replicas"]] == ["r1"]
    assert call(server, "GET", "/replicas/r1")[1]["node"] == "gpu-node-02"
    assert call(server, "GET", "/replicas/nope")[0] == 404
    assert call(server, "GET", "/health")[0] == 200
    status, text = call(server, "GET", "/metrics")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {s.labels["pod"] for s in fams["vllm:num_requests_running"].samples} == {"r1"}
    status, rep = call(server, "DELETE", "/replicas/r1?shutdown_timeout_s=0")
    assert status == 202
    assert call(server, "GET", "/replicas")[1]["replicas"] == []
    fams = {f.name: f for f in text_string_to_metric_families(call(server, "GET", "/metrics")[1])}
    assert fams["vllm:num_requests_running"].samples == []


def test_load_override_over_http(server: SimServer) -> None:
    status, body = call(server, "GET", "/load")
    assert status == 200 and body["models"]["m"]["rate"] == 5.0 and "trace_clock" in body
    status, body = call(server, "PUT", "/load", {"rate": 50, "cv": 1.0})
    assert status == 200 and body["models"]["m"]["rate"] == 50.0
    status, body = call(server, "PUT", "/load", {"multiplier": 2})
    assert body["models"]["m"]["rate"] == 100.0
    status, body = call(server, "PUT", "/load", {"reset": True})
    assert body["models"]["m"]["rate"] == 5.0


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "match"),
    [
        ("POST", "/replicas", {"model": "m"}, 400, "replica.name"),
        ("POST", "/replicas", {"name": "x", "model": "zzz"}, 400, "unknown model"),
        ("POST", "/replicas", {"name": "x", "colour": "red"}, 400, "unknown key"),
        ("POST", "/replicas", {"name": "x", "warmup_s": "soon"}, 400, "warmup_s"),
        ("DELETE", "/replicas/ghost", None, 404, "not found"),
        ("PUT", "/load", {"rate": -3}, 400, "load.rate"),
        ("GET", "/nowhere", None, 404, "no such path"),
        ("DELETE", "/load", None, 405, "not allowed"),
    ],
)
def test_bad_requests_get_clear_errors(server: SimServer, method: str, path: str, body: Any, status: int, match: str) -> None:
    got, answer = call(server, method, path, body)
    assert got == status
    assert match in answer["error"]


def test_duplicate_replica_conflicts(server: SimServer) -> None:
    assert call(server, "POST", "/replicas", {"name": "a"})[0] == 201
    status, answer = call(server, "POST", "/replicas", {"name": "a"})
    assert status == 409 and "already exists" in answer["error"]


def test_invalid_json_body(server: SimServer) -> None:
    req = urllib.request.Request(server.url + "/load", data=b"{nope", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=5)
    assert exc.value.code == 400 and "invalid JSON" in json.loads(exc.value.read())["error"]
