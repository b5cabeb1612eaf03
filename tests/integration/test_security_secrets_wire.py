"""Secrets never appear in logs or errors: the Kubernetes adapter and the leader election run
against the real control plane (``kube_plane``, TLS, bearer tokens) through errors (401 from
the apiserver for a wrong token; 500s from the lab's fault proxy, which terminates TLS with the
apiserver's certificate and echoes the request's headers, Authorization included, as a
debugging proxy might; a connection refused), and the token is in no log line (structlog and
stdlib logging, every level) and no AdapterError message."""

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
from bridge.adapters.kube.lease import LeaderElector
from bridge.model import Phase
from gpu_bridge_lab.sandbox.faultproxy import FaultProxy, proxied_kubeconfig

from test_kube_adapter_support import Corner, corner, serving_side  # noqa: F401 (corner: fixture)

pytestmark = pytest.mark.integration

WRONG = "gb-wrong.Aa1Bb2Cc3Dd4Ee5Ff6_other-secret"


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


def kubeconfig_with(source: Path, path: Path, token: str) -> Path:
    doc = yaml.safe_load(source.read_text())
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


def test_token_never_logged_or_raised(corner: Corner, tmp_path: Path, captured: tuple[io.StringIO, list[str]]) -> None:
    stream, records = captured
    errors: list[str] = []
    model = serving_side(corner, nodes=2, grace_s=1)
    plane = corner.plane
    token = yaml.safe_load(corner.kubeconfig.read_text())["users"][0]["user"]["token"]
    assert plane.kube_tls is not None
    proxy = FaultProxy(corner.port, tls=plane.kube_tls, echo_headers=True)
    via = proxied_kubeconfig(kubeconfig_with(corner.kubeconfig, tmp_path / "good", token), proxy.port, tmp_path / "good-via-proxy")
    good = api_client_from_config(kubeconfig=str(via))
    bad = api_client_from_config(kubeconfig=str(kubeconfig_with(corner.kubeconfig, tmp_path / "bad", WRONG)))
    target = [PoolTarget(model.pool, model.namespace, model.deployment)]
    n1, n2 = model.node_names()
    lease_ns = corner.name("gpu-bridge")
    corner.namespaces.append(lease_ns)
    from kubernetes import client as k8s

    k8s.CoreV1Api(corner.api).create_namespace({"metadata": {"name": lease_ns}}, _preload_content=False)
    kube = KubeAdapter(good, pools=target, identity="secrets-test", watch_timeout_s=2, request_timeout_s=2)
    wrong = KubeAdapter(bad, pools=target, identity="secrets-test-2", watch_timeout_s=2, request_timeout_s=2)
    try:
        # 401 from the apiserver: a wrong token, on reads, writes and the Lease
        collect(errors, wrong.start)
        collect(errors, lambda: wrong.fence(n1))
        collect(errors, lambda: wrong.read_scale(model.namespace, model.deployment))
        lease = LeaderElector(bad, namespace=lease_ns, identity="x", lease_duration_s=3, retry_period_s=0.01)
        assert lease.try_acquire_or_renew() is False
        errors.append(str(lease.last_error))

        # 500s echoing the Authorization header: watches, writes, the Lease
        kube.start()
        assert kube.wait_synced(10)
        pod = kube.pods(model.pool)[0].name
        proxy.set_mode("500")  # cuts the open watches too: they reconnect into 500s
        collect(errors, lambda: kube.set_phase(n1, Phase.LENDING, "t", time.time()))
        collect(errors, lambda: kube.fence(n2))
        collect(errors, lambda: kube.scale(model.namespace, model.deployment, 1))
        collect(errors, lambda: kube.evict(model.namespace, pod))
        collect(errors, lambda: kube.emit_event(n1, "GpuBridgeLending", "t"))
        lease2 = LeaderElector(good, namespace=lease_ns, identity="y", lease_duration_s=3, retry_period_s=0.01)
        assert lease2.try_acquire_or_renew() is False
        errors.append(str(lease2.last_error))
        # the informers' watches fail and are retried (each failure logged)
        time.sleep(1.0)
        status = kube.cache_status()
        errors += [str(s.last_error) for s in status.informers]
    finally:
        kube.stop()
        wrong.stop()
    # connection refused, after the server is gone
    proxy.close()
    collect(errors, lambda: kube.fence(n1))
    good.close()
    bad.close()

    text = stream.getvalue() + "\n".join(records) + "\n".join(errors)
    assert errors and any("HTTP 401" in e for e in errors) and any("HTTP 500" in e for e in errors)
    assert "watch_failed" in stream.getvalue() or any("500" in e for e in errors)
    assert proxy.counts["500"] > 0
    for secret in (token, WRONG, WRONG.split(".")[1]):
        leaks = [line for line in text.splitlines() if secret in line]
        assert not leaks, f"secret leaked in {len(leaks)} line(s), e.g. {leaks[0][:300]}"
    assert "<redacted>" in text  # the echoed header was seen, and redacted
