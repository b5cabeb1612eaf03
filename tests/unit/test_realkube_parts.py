"""The pure parts of the real control plane's set-up: pinned versions (one source for the
build script and the sandbox), kube_args, kwok's stages, rbac.yaml's objects as applied."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from bridge.errors import SandboxError
from gpu_bridge_lab.sandbox.realkube import binaries, component, serving_model

ROOT = Path(__file__).resolve().parents[2]


def test_versions_are_the_ones_the_build_script_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("KUBE_VERSION", "ETCD_VERSION", "KWOK_VERSION", "GPU_BRIDGE_CACHE"):
        monkeypatch.delenv(k, raising=False)
    out = subprocess.run(
        ["bash", "-c", '. "$1"; echo "$KUBE_VERSION $ETCD_VERSION $KWOK_VERSION $KUBE_BIN_DIR"', "x",
         str(ROOT / "scripts" / "kube_versions.sh")], capture_output=True, text=True, check=True).stdout.split()
    v = binaries.versions()
    assert [v["KUBE_VERSION"], v["ETCD_VERSION"], v["KWOK_VERSION"]] == out[:3]
    assert out[3] == f"/var/cache/gpu-bridge/kubernetes/v{v['KUBE_VERSION']}"
    monkeypatch.setenv("KUBE_VERSION", "1.99.0")
    assert binaries.versions()["KUBE_VERSION"] == "1.99.0"


def test_missing_binaries_name_the_build_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPU_BRIDGE_CACHE", str(tmp_path))
    with pytest.raises(SandboxError, match=r"scripts/build_kube.sh.*") as e:
        binaries.find_binaries()
    assert str(tmp_path / "etcd") in str(e.value)


def test_kube_args_are_the_emulators_flags() -> None:
    a = component.parse_kube_args(["--seed-serving", "--nodes", "3", "--pool", "p", "--model", "m",
                                   "--pod-start-delay-s", "1.5", "--grace-s", "7", "--spare-nodes", "1"])
    assert (a.seed_serving, a.nodes, a.pool, a.model, a.pod_start_delay_s, a.grace_s, a.spare_nodes) == (
        True, 3, "p", "m", 1.5, 7, 1)
    assert a.readiness_gates == ()
    gated = component.parse_kube_args(["--readiness-gate", "gpu-bridge.io/awake"])
    assert gated.readiness_gates == ("gpu-bridge.io/awake",)
    dep = serving_model.deployment_object(serving_model.ServingModel(readiness_gates=gated.readiness_gates))
    assert dep["spec"]["template"]["spec"]["readinessGates"] == [{"conditionType": "gpu-bridge.io/awake"}]
    assert "readinessGates" not in serving_model.deployment_object(serving_model.ServingModel())["spec"]["template"]["spec"]
    with pytest.raises(SandboxError, match="--grace-s: must be >= 0"):
        component.parse_kube_args(["--grace-s", "-1"])
    with pytest.raises(SandboxError, match="--node-heartbeat-s: must be > 0"):
        component.parse_kube_args(["--node-heartbeat-s", "0"])
    with pytest.raises(SandboxError, match="cannot parse"):
        component.parse_kube_args(["--no-such-flag"])


def test_kwok_stages_carry_the_cold_start_and_the_grace() -> None:
    docs = list(yaml.safe_load_all(component.stages_yaml(2500, node_heartbeat_s=60)))
    assert docs[0]["kind"] == "KwokConfiguration" and docs[0]["options"]["nodeLeaseDurationSeconds"] == 240
    assert yaml.safe_load_all(component.stages_yaml(0)).__next__()["options"]["nodeLeaseDurationSeconds"] == 40
    stages = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Stage"}
    assert set(stages) == {"node-initialize", "pod-create", "pod-ready", "pod-running-gated", "pod-gate-closed",
                           "pod-gate-open", "pod-delete"}
    assert stages["pod-ready"]["delay"]["durationMilliseconds"] == 2500
    # readiness gates: Ready only once every gate is True (kwok's jq counts the gates not True)
    gates = {name: next(e for e in spec["selector"]["matchExpressions"] if e["key"] == component.GATES_CLOSED)
             for name, spec in stages.items() if name.startswith("pod-") and name not in ("pod-create", "pod-delete")}
    assert {n: (e["operator"], e["values"]) for n, e in gates.items()} == {
        "pod-ready": ("In", ["0"]), "pod-running-gated": ("NotIn", ["0"]),
        "pod-gate-closed": ("NotIn", ["0"]), "pod-gate-open": ("In", ["0"])}
    assert stages["pod-running-gated"]["delay"]["durationMilliseconds"] == 2500  # the same cold start
    for name, ready in (("pod-running-gated", "False"), ("pod-gate-closed", "False"), ("pod-gate-open", "True")):
        status = yaml.safe_load(stages[name]["next"]["statusTemplate"].replace("{{ $now := Now }}", "")
                                .replace("{{ $now | Quote }}", "x").replace("{{ Now | Quote }}", "x")
                                .replace("{{ range .spec.containers }}", "").replace("{{ end }}", "")
                                .replace("{{ .image | Quote }}", "i").replace("{{ .name | Quote }}", "n"))
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == ready, name
    assert "jitterDurationMilliseconds" not in stages["pod-ready"]["delay"]
    # a deleted pod leaves when its deletionTimestamp (now + grace) is reached, not before
    assert stages["pod-delete"]["delay"]["durationFrom"]["expressionFrom"] == ".metadata.deletionTimestamp"
    assert stages["pod-delete"]["next"]["delete"] is True


def test_rbac_documents_are_the_manifest_with_its_rolebinding_per_serving_namespace() -> None:
    manifest = ROOT / "deploy" / "kubernetes" / "rbac.yaml"
    raw = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    docs = component.rbac_documents(manifest, ["serving", "other"])
    assert len(docs) == len(raw) + 1
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "gpu-bridge-serving"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["other", "serving"]
    # nothing else changed: every other object is in the manifest as written
    rest = [d for d in docs if d not in bindings]
    assert all(d in raw for d in rest)


def test_sandbox_starts_and_reattaches_the_real_control_plane(tmp_path: Path) -> None:
    from gpu_bridge_lab.sandbox.cluster import Sandbox
    from gpu_bridge_lab.sandbox.realkube import RealKubeComponent

    d = Path(tempfile.mkdtemp(prefix="gbrt-", dir="/tmp"))
    try:
        sb = Sandbox(d, kube=True, vllm=False, prometheus=False, kube_args=("--seed-serving", "--nodes", "2"))
        comps = sb._components()
        assert [type(c).__name__ for c in comps] == ["MungeComponent", "RealKubeComponent", "SlurmComponent"]
        assert comps[1].args.nodes == 2 and comps[1].args.seed_serving
        sb.components = comps
        sb.ports = {"slurmctld": 7000, "kube": 6443, "etcd": 2379, "etcd-peer": 2380}
        sb.node_ports = {n: 7001 + i for i, n in enumerate(sb.node_names)}
        sb._save_state("running")
        back = Sandbox.attach(d)
        assert any(isinstance(c, RealKubeComponent) for c in back.components)
        assert back.ports["etcd"] == 2379
        # no daemon kubeconfig written yet: the admin one; with it, the ServiceAccount's
        assert back.daemon_kubeconfig == back.kubeconfig
        (d / "kube").mkdir()
        (d / "kube" / "kubeconfig-daemon").write_text("x")
        assert back.daemon_kubeconfig == d / "kube" / "kubeconfig-daemon"
    finally:
        shutil.rmtree(d, ignore_errors=True)
