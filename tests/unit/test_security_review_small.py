"""Smaller findings of the safety review (issue 21 point 8), each a failing test first:

- the metrics endpoint binds loopback unless the operator opens it (``daemon.metrics_host``);
- node names and job ids are matched whole (``re.fullmatch``): ``$`` also matched before a
  trailing newline, so ``"gpu-node-01\\n"`` passed ``validate_node_name``;
- a kubeconfig with ``insecure-skip-tls-verify`` is refused unless
  ``kubernetes.allow_insecure_tls`` says so.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
import yaml

from bridge.adapters.kube.client import api_client_from_config
from bridge.config import default_config, parse_config
from bridge.errors import AdapterError, ConfigError
from bridge.metrics import BridgeMetrics, serve
from bridge.names import validate_job_id, validate_node_name
from bridge.wiring import build_adapters


def _other_local_address() -> str | None:
    """An address of this host that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, only a route is chosen
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_metrics_bind_loopback_by_default() -> None:
    host = default_config().daemon.metrics_host
    assert host == "127.0.0.1"
    server = serve(BridgeMetrics().registry, port=0, addr=host)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:  # noqa: S310
            assert r.status == 200
        other = _other_local_address()
        if other is not None:  # not reachable from the network
            with pytest.raises(OSError), socket.create_connection((other, server.port), timeout=2):
                pass
    finally:
        server.close()


@pytest.mark.parametrize("name", ["gpu-node-01\n", "gpu-node-01\r\n"])
def test_a_node_name_with_a_trailing_newline_is_refused(name: str) -> None:
    with pytest.raises(AdapterError, match="invalid"):
        validate_node_name(name)


@pytest.mark.parametrize("job_id", ["123\n", "123_4\n"])
def test_a_job_id_with_a_trailing_newline_is_refused(job_id: str) -> None:
    with pytest.raises(AdapterError, match="invalid"):
        validate_job_id(job_id)


def _kubeconfig(tmp: Path, *, insecure: bool) -> Path:
    cluster: dict[str, object] = {"server": "https://127.0.0.1:1"}
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t0ken-for-a-test-only"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path = tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def test_a_kubeconfig_skipping_tls_verification_is_refused(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, insecure=True)
    with pytest.raises(AdapterError) as ei:
        api_client_from_config(kubeconfig=str(path))
    assert "insecure-skip-tls-verify" in str(ei.value) and "kubernetes.allow_insecure_tls" in str(ei.value)
    assert api_client_from_config(kubeconfig=str(path), allow_insecure_tls=True).configuration.verify_ssl is False
    assert api_client_from_config(kubeconfig=str(_kubeconfig(tmp_path, insecure=False))).configuration.verify_ssl is True


def test_the_daemon_refuses_it_unless_the_config_allows_it(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, insecure=True)
    doc = {"pools": [{"name": "llama"}], "kubernetes": {"kubeconfig": str(path)}}
    with pytest.raises(AdapterError, match="insecure-skip-tls-verify"):
        build_adapters(parse_config(doc), leader=False, start_watches=False)
    doc["kubernetes"]["allow_insecure_tls"] = True  # type: ignore[index]
    adapters = build_adapters(parse_config(doc), leader=False, start_watches=False)
    adapters.close()


def test_allow_insecure_tls_is_a_strict_bool() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"pools": [{"name": "llama"}], "kubernetes": {"allow_insecure_tls": "yes"}})
    assert ei.value.problems == ['bridge.yaml: kubernetes.allow_insecure_tls: expected true or false, got "yes"']
