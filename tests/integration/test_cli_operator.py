"""The operator CLI against the real control plane (``kube_plane``, a serving side of its own): `gpu-bridge lend|reclaim|pin|
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

from test_kube_adapter_support import Corner, corner, serving_side  # noqa: F401 (corner: fixture)

pytestmark = pytest.mark.integration


@pytest.fixture()
def site(corner: Corner, tmp_path: Path) -> Iterator[tuple[Path, Path, list[str]]]:
    m = serving_side(corner, nodes=2)
    kubeconfig = corner.kubeconfig  # the admin's, mode 0600
    cfg = tmp_path / "gpu-bridge.yaml"
    cfg.write_text(yaml.safe_dump({
        "pools": [{"name": m.pool, "namespace": m.namespace, "deployment": m.deployment}],
        "kubernetes": {"kubeconfig": str(kubeconfig)},
    }))
    os.chmod(cfg, 0o600)
    yield kubeconfig, cfg, m.node_names()


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


def test_lend_and_reclaim_write_requests_for_the_leader(site: tuple[Path, Path, list[str]]) -> None:
    kubeconfig, cfg, (n1, n2) = site
    out = cli("lend", n1, "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert f"lend of {n1} requested" in out.stdout
    assert node_meta(kubeconfig, n1)["annotations"].get(wk.ANNOTATION_REQUEST) == "lend"
    out = cli("reclaim", n2, "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert node_meta(kubeconfig, n2)["annotations"].get(wk.ANNOTATION_REQUEST) == "reclaim"


def test_pin_to_slurm_also_asks_to_lend_and_unpin_removes_the_pin(site: tuple[Path, Path, list[str]]) -> None:
    kubeconfig, cfg, (n1, _) = site
    out = cli("pin", n1, "slurm", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    meta = node_meta(kubeconfig, n1)
    assert meta["labels"].get(wk.LABEL_PIN) == "slurm"
    assert meta["annotations"].get(wk.ANNOTATION_REQUEST) == "lend"  # not yet adopted: serving -> lend it first
    out = cli("unpin", n1, "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert wk.LABEL_PIN not in node_meta(kubeconfig, n1)["labels"]


@pytest.mark.parametrize("name", ["gpu;reboot", "a/../b", "$(id)", "x" * 300])
def test_bad_node_names_are_refused_before_any_write(site: tuple[Path, Path, list[str]], name: str) -> None:
    _, cfg, _ = site
    out = cli("lend", name, "--config", str(cfg))
    assert out.returncode == 1
    assert "invalid" in out.stderr and "Traceback" not in out.stderr


def test_a_node_outside_the_pool_is_refused(site: tuple[Path, Path, list[str]]) -> None:
    _, cfg, _ = site
    out = cli("lend", "no-such-node", "--config", str(cfg))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "no-such-node" in out.stderr
