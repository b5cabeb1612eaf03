"""Secrets never appear in logs or errors: the Kubernetes adapter and the leader election run
against a bearer-token sandbox API server (TLS) through errors (401 for a wrong token, 500s
whose bodies echo the request's Authorization header, as a debugging proxy might, a
connection refused), and the token is in no log line (structlog and stdlib logging, every
level) and no AdapterError message."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge import logs
from bridge.adapters.kube import KubeAdapter, PoolTarget, api_client_from_config
from bridge.errors import AdapterError
from bridge.leader import LeaderElector
from bridge.model import Phase
from gpu_bridge_lab.sandbox.kube import KubeServer, ServingModel, seed_serving, wait_serving_ready
from gpu_bridge_lab.sandbox.kube import resources as R
from gpu_bridge_lab.sandbox.kube.api import Response
from gpu_bridge_lab.sandbox.kube.store import ApiError

TOKEN = "gb-tok.Zx9Qm2LrT7vK4pW8sN1c_secret-value"
WRONG = "gb-wrong.Aa1Bb2Cc3Dd4Ee5Ff6_other-secret"


class Faults:
    """Wraps the server's router: requests matching a rule get an error reply whose body
    echoes their Authorization header (the worst case a proxy can do)."""

    def __init__(self, server: KubeServer) -> None:
        self.rules: list[tuple[Callable[[Any], bool], int]] = []
        self._route = server.route
        server.route = self.route  # type: ignore[method-assign]

    def route(self, req: Any) -> Any:
        for match, code in self.rules:
            if match(req):
                auth = req.headers.get("authorization", "")
                msg = f"upstream failed for request with headers Authorization: {auth}; token={auth.split()[-1] if auth else ''}"
                return Response.of(code, ApiError(code, "InternalError", msg).status())
        return self._route(req)


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, list[str]]]:
    stream = io.StringIO()
    logs.configure(json=True, level="debug", stream=stream)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Keep(level=logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield stream, records
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        logs.configure(json=True, level="info")


def kubeconfig_with(server: KubeServer, path: Path, token: str) -> Path:
    server.write_kubeconfig(path)
    doc = yaml.safe_load(path.read_text())
    doc["users"][0]["user"]["token"] = token
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def collect(errors: list[str], fn: Callable[[], Any]) -> None:
    try:
        fn()
    except AdapterError as exc:
        errors.append(str(exc))
        errors.append(repr(exc))


def test_token_never_logged_or_raised(tmp_path: Path, captured: tuple[io.StringIO, list[str]]) -> None:
    stream, records = captured
    errors: list[str] = []
    model = ServingModel(nodes=2, termination_grace_s=1)
    server = KubeServer(port=0, token=TOKEN, pod_start_delay_s=0.05, pod_stop_s=0.1)
    with server:
        assert server.tls
        seed_serving(server.store, model)
        server.store.create(R.core("namespaces"), {"metadata": {"name": "gpu-bridge"}})
        assert wait_serving_ready(server.store, model, 30)
        faults = Faults(server)
        good = api_client_from_config(kubeconfig=str(kubeconfig_with(server, tmp_path / "good", TOKEN)))
        bad = api_client_from_config(kubeconfig=str(kubeconfig_with(server, tmp_path / "bad", WRONG)))
        target = [PoolTarget("default", model.namespace, model.deployment)]
        kube = KubeAdapter(good, pools=target, identity="secrets-test", watch_timeout_s=2, request_timeout_s=2)
        wrong = KubeAdapter(bad, pools=target, identity="secrets-test-2", watch_timeout_s=2, request_timeout_s=2)
        try:
            # 401: a wrong token, on reads, writes and the Lease
            collect(errors, wrong.start)
            collect(errors, lambda: wrong.fence("gpu-node-01"))
            collect(errors, lambda: wrong.read_scale(model.namespace, model.deployment))
            lease = LeaderElector(bad, namespace="gpu-bridge", identity="x", lease_duration_s=3, retry_period_s=0.01)
            assert lease.try_acquire_or_renew() is False
            errors.append(str(lease.last_error))

            # 500s echoing the Authorization header: watches, writes, the Lease
            kube.start()
            assert kube.wait_synced(10)
            faults.rules = [(lambda r: r.method in ("PATCH", "PUT", "POST"), 500),
                            (lambda r: r.method == "GET" and "watch" in r.query, 500),
                            (lambda r: r.method == "GET" and "/scale" in r.path, 500)]
            collect(errors, lambda: kube.set_phase("gpu-node-01", Phase.LENDING, "t", time.time()))
            collect(errors, lambda: kube.fence("gpu-node-02"))
            collect(errors, lambda: kube.scale(model.namespace, model.deployment, 1))
            collect(errors, lambda: kube.evict(model.namespace, kube.pods("default")[0].name))
            collect(errors, lambda: kube.emit_event("gpu-node-01", "GpuBridgeLending", "t"))
            lease2 = LeaderElector(good, namespace="gpu-bridge", identity="y", lease_duration_s=3, retry_period_s=0.01)
            assert lease2.try_acquire_or_renew() is False
            errors.append(str(lease2.last_error))
            # the informers' watches fail and are retried (each failure logged)
            for inf in kube._all_informers():
                inf.stop()
            kube._started = False
            kube._pods.clear()
            kube.start()
            time.sleep(1.0)
            status = kube.cache_status()
            errors += [str(s.last_error) for s in status.informers]
        finally:
            kube.stop()
            wrong.stop()
    # connection refused, after the server is gone
    collect(errors, lambda: kube.fence("gpu-node-01"))
    good.close()
    bad.close()

    text = stream.getvalue() + "\n".join(records) + "\n".join(errors)
    assert errors and any("HTTP 401" in e for e in errors) and any("HTTP 500" in e for e in errors)
    assert "watch_failed" in stream.getvalue() or any("500" in e for e in errors)
    for secret in (TOKEN, WRONG, TOKEN.split(".")[1], WRONG.split(".")[1]):
        leaks = [line for line in text.splitlines() if secret in line]
        assert not leaks, f"secret leaked in {len(leaks)} line(s), e.g. {leaks[0][:300]}"
    assert "<redacted>" in text  # the echoed header was seen, and redacted
