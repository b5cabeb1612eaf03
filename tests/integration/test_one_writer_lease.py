"""One writer, on the real control plane's Lease (``kube_plane``; a Lease namespace per test):
``gpu-bridge run --dry-run`` runs its loop without ever creating or taking the Lease, so it
cannot park the real daemon; ``run --once`` is refused (exit 1, the holder named) while another
instance holds the Lease, and when the Lease is free takes it for its one iteration and gives
it back. Slurm (but for the start-up read of GraceTime) and Prometheus are unreachable here: what matters is the Lease, which each
iteration settles before it reads anything (the daemon observes Slurm as unavailable). The same with fakes: tests/unit/test_one_writer.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from bridge.adapters.kube import api_client_from_config
from bridge.config import default_config, to_dict
from bridge.adapters.kube.lease import LeaderElector
from gpu_bridge_lab.sandbox.daemon_config import write_config
from test_kube_adapter_support import Corner, corner, ensure_namespace, seed_deployment  # noqa: F401 (corner: fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _config(c: Corner, tmp_path: Path, lease_ns: str) -> Path:
    doc = to_dict(default_config())
    doc["kubernetes"]["kubeconfig"] = str(c.kubeconfig)
    serving = c.name("serving")
    seed_deployment(c.api, serving, "vllm", c.name("pool"), replicas=0, corner=c)  # the pool's (empty) Deployment
    doc["pools"][0].update({"namespace": serving, "deployment": "vllm"})
    doc["daemon"].update({"lease_namespace": lease_ns, "metrics_host": "127.0.0.1", "metrics_port": 0})
    # Slurm answers only the start-up read of the preempt partition's GraceTime (the daemon will
    # not run without it); every other Slurm call fails
    slurm = tmp_path / "slurm-partition-only"
    slurm.write_text(
        "#!/bin/sh\n"
        'if [ "$*" = "scontrol --oneliner show partition preempt" ]; then\n'
        '  echo "PartitionName=preempt PriorityTier=1 PreemptMode=REQUEUE GraceTime=120 State=UP"; exit 0\n'
        "fi\n"
        "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1\n"
    )
    slurm.chmod(0o755)
    doc["slurm"].update({"command_prefix": [str(slurm)], "command_timeout_s": 1})
    doc["prometheus"]["url"] = "http://127.0.0.1:9"  # discard port: nothing answers
    return write_config(tmp_path / "gpu-bridge.yaml", doc)


def _gpu_bridge(*args: str) -> list[str]:
    return [sys.executable, "-m", "bridge", *args]


def _lease(c: Corner, ns: str) -> dict[str, Any] | None:
    try:
        resp = k8s.CoordinationV1Api(c.api).read_namespaced_lease("gpu-bridge", ns, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return dict(json.loads(resp.data)["spec"])


@pytest.fixture
def lease_ns(corner: Corner) -> str:
    ns = corner.name("lease")
    ensure_namespace(corner.api, ns, corner)
    return ns


def test_a_dry_run_never_takes_the_lease(corner: Corner, lease_ns: str, tmp_path: Path) -> None:
    cfg = _config(corner, tmp_path, lease_ns)
    log = (tmp_path / "dry-run.log").open("w")
    proc = subprocess.Popen(_gpu_bridge("run", "--dry-run", "--config", str(cfg), "--log-format", "json"),
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline and text.count('"slurm_unavailable"') < 3:  # its loop ran, several times
            assert proc.poll() is None, (tmp_path / "dry-run.log").read_text()
            time.sleep(0.3)
            text = (tmp_path / "dry-run.log").read_text()
        assert text.count('"slurm_unavailable"') >= 3, text
        assert _lease(corner, lease_ns) is None  # never created, never taken
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()
    assert _lease(corner, lease_ns) is None


def test_once_is_refused_while_another_instance_holds_the_lease(corner: Corner, lease_ns: str, tmp_path: Path) -> None:
    other = LeaderElector(api_client_from_config(kubeconfig=str(corner.kubeconfig)), namespace=lease_ns,
                          identity="the-real-daemon", lease_duration_s=30)
    assert other.try_acquire_or_renew()
    r = subprocess.run(_gpu_bridge("run", "--once", "--config", str(_config(corner, tmp_path, lease_ns))),
                       capture_output=True, text=True, timeout=90, check=False)
    assert r.returncode == 1, r.stderr
    assert "run --once refused: the Lease is held by the-real-daemon; nothing was written" in r.stderr
    lease = _lease(corner, lease_ns)
    assert lease is not None and lease["holderIdentity"] == "the-real-daemon"
    assert other.release()


def test_once_takes_a_free_lease_for_its_iteration_and_gives_it_back(corner: Corner, lease_ns: str, tmp_path: Path) -> None:
    r = subprocess.run(_gpu_bridge("run", "--once", "--config", str(_config(corner, tmp_path, lease_ns)),
                                   "--log-format", "json"),
                       capture_output=True, text=True, timeout=90, check=False)
    assert '"lease_acquired"' in r.stderr and '"lease_released"' in r.stderr, r.stderr
    lease = _lease(corner, lease_ns)
    assert lease is not None and lease["holderIdentity"] == ""  # taken, then given back
