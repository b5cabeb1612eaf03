"""The sandbox on the real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok; gpu_bridge_lab.sandbox.realkube): the serving side as a site has it, pods Ready a
cold start after they are placed and gone a grace period after deletion, the vLLM simulator
following them, nothing left after down; and RBAC enforced on the daemon: with one rule of
deploy/kubernetes/rbac.yaml removed, the step that needs it fails with a logged 403 and serving
keeps its capacity."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpu_bridge_lab.sandbox.cluster import procs
from gpu_bridge_lab.sandbox.daemon_config import daemon_identity, sandbox_config, write_config
from gpu_bridge_lab.sandbox.e2e import put_load, read_events, wait_until
from gpu_bridge_lab.sandbox.realkube import find_binaries
from gpu_bridge_lab.sandbox.serving import serving_sandbox
from sandbox_fixtures import QUIET_START_RPS, daemon_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = 3
COLD_START_S = 2.0
POD_GRACE_S = 4


def _ts(t: Any) -> float:
    return t.timestamp() if isinstance(t, datetime) else datetime.fromisoformat(str(t).replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def real() -> Iterator[tuple[Any, Path]]:
    d = Path(tempfile.mkdtemp(prefix="gbrk-", dir="/tmp"))
    sb = serving_sandbox(d, nodes=NODES, grace_s=5, pod_start_delay_s=COLD_START_S, pod_grace_s=POD_GRACE_S,
                         shutdown_timeout_s=2, peak_rps=QUIET_START_RPS)
    sb.up()
    try:
        yield sb, d
    finally:
        sb.down()
        left = procs.find_leftovers(str(d), str(d))
        shutil.rmtree(d, ignore_errors=True)
        assert not left, f"processes left after down: {left}"


def _api(kubeconfig: Path) -> Any:
    return k8s_config.new_client_from_config(config_file=str(kubeconfig))


def _ready_pods(core: Any) -> dict[str, Any]:
    out = {}
    for p in core.list_namespaced_pod("serving", label_selector="app=vllm").items:
        conds = {c.type: c for c in p.status.conditions or []}
        if "Ready" in conds and conds["Ready"].status == "True" and p.metadata.deletion_timestamp is None:
            out[p.metadata.name] = p
    return out


def test_serving_side_on_the_real_control_plane(real: tuple[Any, Path]) -> None:
    sb, _d = real
    assert sb.startup_s is not None and sb.startup_s < 60
    api = _api(sb.kubeconfig)
    core = k8s.CoreV1Api(api)
    try:
        nodes = {n.metadata.name: n for n in core.list_node().items}
        assert sorted(nodes) == list(sb.node_names)
        for n in nodes.values():
            assert n.status.allocatable["nvidia.com/gpu"] == "4"
            assert n.metadata.labels["gpu-bridge.io/pool"] == "default"
            assert n.status.node_info.kubelet_version.startswith("kwok-")  # a kwok kubelet, not ours
        ready = _ready_pods(core)
        assert len(ready) == NODES and {p.spec.node_name for p in ready.values()} == set(sb.node_names)
        for p in ready.values():  # Ready a cold start after kwok started it (timestamps in whole seconds)
            conds = {c.type: c for c in p.status.conditions}
            assert _ts(conds["Ready"].last_transition_time) - _ts(p.metadata.creation_timestamp) >= COLD_START_S - 1

        # the vLLM simulator serves exactly the Ready pods
        def sim_pods() -> set[str]:
            with urllib.request.urlopen(sb.vllm_url + "/metrics", timeout=5) as r:  # noqa: S310 - loopback
                text = r.read().decode()
            return {line.split('pod="')[1].split('"')[0] for line in text.splitlines()
                    if line.startswith("vllm:num_requests_running{") and 'pod="' in line}

        wait_until(lambda: sim_pods() == set(ready), 15, "the simulator to follow the Ready pods")

        # a deleted pod stays (Terminating) for its grace period, then goes; the simulator drops it
        victim = sorted(ready)[0]
        t0 = time.monotonic()
        core.delete_namespaced_pod(victim, "serving")
        time.sleep(1.0)
        p = core.read_namespaced_pod(victim, "serving")
        assert p.metadata.deletion_timestamp is not None
        names = lambda: {q.metadata.name for q in core.list_namespaced_pod("serving").items}  # noqa: E731
        wait_until(lambda: victim not in names(), POD_GRACE_S + 10, "the deleted pod to go")
        gone_after = time.monotonic() - t0
        assert gone_after >= POD_GRACE_S - 1, f"gone after {gone_after:.1f} s, grace {POD_GRACE_S} s"
        wait_until(lambda: victim not in sim_pods(), 10, "the simulator to drop the deleted pod")
        # its replacement is placed once the GPUs are free, and Ready a cold start later
        wait_until(lambda: len(_ready_pods(core)) == NODES, 30, "the replacement replica Ready")
    finally:
        api.close()


def _kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(find_binaries().kubectl), f"--kubeconfig={kubeconfig}", *args],
                          capture_output=True, text=True, timeout=30, check=False)


def test_daemon_identity_is_its_service_account_with_exactly_the_manifest(real: tuple[Any, Path]) -> None:
    sb, _d = real
    kc = sb.daemon_kubeconfig
    assert kc != sb.kubeconfig
    who = _kubectl(kc, "auth", "whoami", "-o", "json")
    assert who.returncode == 0, who.stderr
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == "system:serviceaccount:gpu-bridge:gpu-bridge"
    for verb, what, ns, allowed in (("patch", "nodes", None, "yes"), ("delete", "nodes", None, "no"),
                                     ("create", "pods/eviction", "serving", "yes"), ("delete", "pods", "serving", "no"),
                                     ("list", "secrets", "serving", "no"), ("patch", "deployments/scale", "serving", "yes"),
                                     ("create", "leases", "gpu-bridge", "yes"), ("create", "leases", "serving", "no")):
        res, _, sub = what.partition("/")
        args = ["auth", "can-i", verb, res] + ([f"--subresource={sub}"] if sub else []) + (["-n", ns] if ns else [])
        got = _kubectl(kc, *args).stdout.strip()
        assert got == allowed, f"can-i {verb} {what} in {ns}: {got}, expected {allowed}"
    # the operator CLI works with the same account
    cfg = write_config(_d / "cli.yaml", sandbox_config(prometheus_url=sb.prometheus_url, **daemon_identity(sb),
                                                       slurm_conf=sb.slurm.slurm_conf, grace_s=5, cold_start_s=2))
    env = {**os.environ, **sb.env}
    for argv in (["status", "--json"], ["plan"], ["pin", sb.node_names[-1], "serving"], ["unpin", sb.node_names[-1]]):
        r = subprocess.run([sys.executable, "-m", "bridge", *argv, "--config", str(cfg)], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, f"gpu-bridge {' '.join(argv)} as the ServiceAccount: {r.stdout}{r.stderr}"


def test_a_rule_removed_from_the_manifest_fails_that_step_with_a_logged_403_and_no_damage(
        real: tuple[Any, Path]) -> None:
    """Last in the module: it edits the ClusterRole. Without `patch pods` the lend step that
    marks the node's replica (pod-deletion-cost) is refused; the daemon logs the 403 and never
    scales the Deployment down nor hands the node to Slurm."""
    sb, d = real
    api = _api(sb.kubeconfig)
    core, apps, rbac = k8s.CoreV1Api(api), k8s.AppsV1Api(api), k8s.RbacAuthorizationV1Api(api)
    try:
        role = rbac.read_cluster_role("gpu-bridge-serving")
        for rule in role.rules:
            if rule.resources == ["pods"]:
                rule.verbs = [v for v in rule.verbs if v != "patch"]
        rbac.replace_cluster_role("gpu-bridge-serving", role)
        put_load(sb.vllm_url, {"rate": 1.0, "cv": 1.0})  # low: the daemon wants to lend
        cfg = write_config(d / "rbac-test.yaml", sandbox_config(
            prometheus_url=sb.prometheus_url, **daemon_identity(sb), slurm_conf=sb.slurm.slurm_conf, grace_s=5,
            cold_start_s=COLD_START_S, min_serving=1, scale_down_window_s=4, min_lend_s=5))
        log_path = d / "rbac-daemon.log"
        with daemon_run(cfg, log_path, sb.env):
            def refused() -> list[dict[str, Any]]:
                return [e for e in read_events(log_path, "step_failed") if "HTTP 403" in str(e.get("error"))]

            events = wait_until(refused, 150, "a step refused with 403 in the daemon's log")
            time.sleep(5)  # a few more ticks: it must keep not going further
        err = str(events[0]["error"])
        assert "patch pods" in err and "forbidden" in err.lower() and "system:serviceaccount:gpu-bridge:gpu-bridge" in err
        assert events[0]["node"] in sb.node_names
        # no damage: every replica still there and Ready, no node handed to Slurm
        dep = apps.read_namespaced_deployment("vllm", "serving")
        assert dep.spec.replicas == NODES
        assert len(_ready_pods(core)) == NODES
        assert not read_events(log_path, "deployment_scaled")
        phases = {n.metadata.name: (n.metadata.labels or {}).get("gpu-bridge.io/phase") for n in core.list_node().items}
        assert "lent" not in phases.values(), phases
        # the node was never released to Slurm: its hold job kept, its drain not lifted
        assert not read_events(log_path, "slurm_hold_cancelled") and not read_events(log_path, "slurm_resumed")
    finally:
        api.close()
