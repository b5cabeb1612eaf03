"""The operator CLI against the sandbox's Kubernetes API server: `gpu-bridge lend|reclaim|pin|
unpin NODE` write requests and pins on the node (the leader carries them out through the
lifecycle: tests/unit/test_daemon_loop.py), refuse nodes outside the pool and bad names."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bridge import wellknown as wk
from gpu_bridge_lab.sandbox.kube import KubeServer, ServingModel, seed_serving

pytestmark = pytest.mark.integration


@pytest.fixture()
def site(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    with KubeServer(port=0, pod_start_delay_s=0.1) as server:
        seed_serving(server.store, ServingModel(nodes=2))
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        os.chmod(kubeconfig, 0o600)
        cfg = tmp_path / "gpu-bridge.yaml"
        cfg.write_text(yaml.safe_dump({
            "pools": [{"name": "default", "namespace": "serving", "deployment": "vllm"}],
            "kubernetes": {"kubeconfig": str(kubeconfig)},
        }))
        os.chmod(cfg, 0o600)
        yield kubeconfig, cfg


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": os.environ.get("HOME", "/root")})


def node_meta(kubeconfig: Path, name: str) -> dict[str, dict[str, str]]:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        meta = client.CoreV1Api(api).read_node(name).metadata
        return {"labels": dict(meta.labels or {}), "annotations": dict(meta.annotations or {})}
    finally:
        api.close()


def test_lend_and_reclaim_write_requests_for_the_leader(site: tuple[Path, Path]) -> None:
    kubeconfig, cfg = site
    out = cli("lend", "gpu-node-01", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "lend of gpu-node-01 requested" in out.stdout
    assert node_meta(kubeconfig, "gpu-node-01")["annotations"].get(wk.ANNOTATION_REQUEST) == "lend"
    out = cli("reclaim", "gpu-node-02", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert node_meta(kubeconfig, "gpu-node-02")["annotations"].get(wk.ANNOTATION_REQUEST) == "reclaim"


def test_pin_to_slurm_also_asks_to_lend_and_unpin_removes_the_pin(site: tuple[Path, Path]) -> None:
    kubeconfig, cfg = site
    out = cli("pin", "gpu-node-01", "slurm", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    meta = node_meta(kubeconfig, "gpu-node-01")
    assert meta["labels"].get(wk.LABEL_PIN) == "slurm"
    assert meta["annotations"].get(wk.ANNOTATION_REQUEST) == "lend"  # not yet adopted: serving -> lend it first
    out = cli("unpin", "gpu-node-01", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert wk.LABEL_PIN not in node_meta(kubeconfig, "gpu-node-01")["labels"]


@pytest.mark.parametrize("name", ["gpu;reboot", "a/../b", "$(id)", "x" * 300])
def test_bad_node_names_are_refused_before_any_write(site: tuple[Path, Path], name: str) -> None:
    _server, cfg = site
    out = cli("lend", name, "--config", str(cfg))
    assert out.returncode == 1
    assert "invalid" in out.stderr and "Traceback" not in out.stderr


def test_a_node_outside_the_pool_is_refused(site: tuple[Path, Path]) -> None:
    _server, cfg = site
    out = cli("lend", "no-such-node", "--config", str(cfg))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "no-such-node" in out.stderr
