"""Real kubectl 1.32 against the API: what the daemon and an operator do by hand."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from kube_contract import Kube, Serving, make_node, settled, wait_for


def drained(node: str, out: str) -> bool:
    """kubectl's last line of a finished drain: "node/N drained" (1.21 and later); 1.20
    (Debian 12's kubernetes-client) says "node/N evicted" instead."""
    return f"node/{node} drained" in out or f"node/{node} evicted" in out


def _node(kube: Kube, name: str) -> dict:
    return json.loads(kube.kubectl("get", "node", name, "-o", "json").stdout)


def test_get_nodes_shows_the_gpu_nodes(kube: Kube, serving: Serving) -> None:
    out = kube.kubectl("get", "nodes", "-l", f"gpu-bridge.io/pool={serving.pool}").stdout
    lines = out.strip().splitlines()
    assert lines[0].split()[:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert [ln.split()[0] for ln in lines[1:]] == serving.nodes
    assert all(ln.split()[1] == "Ready" for ln in lines[1:])
    alloc = json.loads(kube.kubectl("get", "node", serving.nodes[0], "-o", "jsonpath={.status.allocatable}").stdout)
    assert alloc["nvidia.com/gpu"] == "4"


def test_get_pods_wide_shows_nodes_and_readiness(kube: Kube, serving: Serving) -> None:
    out = kube.kubectl("get", "pods", "-n", serving.ns, "-o", "wide").stdout.strip().splitlines()
    assert out[0].split()[:7] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    rows = [ln.split() for ln in out[1:]]
    assert len(rows) == 3 and all(r[1] == "1/1" and r[2] == "Running" for r in rows)
    assert {r[6] for r in rows} <= set(serving.nodes)


def test_cordon_and_uncordon(kube: Kube) -> None:
    client, api = kube.client()
    core = client.CoreV1Api(api)
    name = kube.name("node-cordon")
    make_node(core, client, name)
    try:
        assert "cordoned" in kube.kubectl("cordon", name).stdout
        assert _node(kube, name)["spec"]["unschedulable"] is True
        assert "SchedulingDisabled" in kube.kubectl("get", "node", name).stdout
        assert "already cordoned" in kube.kubectl("cordon", name).stdout  # idempotent, no write
        assert "uncordoned" in kube.kubectl("uncordon", name).stdout
        assert not _node(kube, name)["spec"].get("unschedulable")
    finally:
        core.delete_node(name)


def test_taint_is_replaced_whole_and_removed(kube: Kube) -> None:
    client, api = kube.client()
    core = client.CoreV1Api(api)
    name = kube.name("node-taint")
    make_node(core, client, name)
    settled(core, name)
    try:
        kube.kubectl("taint", "nodes", name, "gpu-bridge.io/lent=true:NoSchedule")
        kube.kubectl("taint", "nodes", name, "other=x:NoExecute")
        taints = _node(kube, name)["spec"]["taints"]
        assert {(t["key"], t.get("value"), t["effect"]) for t in taints} == {
            ("gpu-bridge.io/lent", "true", "NoSchedule"), ("other", "x", "NoExecute")}
        kube.kubectl("taint", "nodes", name, "other:NoExecute-")
        assert [t["key"] for t in _node(kube, name)["spec"]["taints"]] == ["gpu-bridge.io/lent"]
        r = kube.kubectl("taint", "nodes", name, "gpu-bridge.io/lent=false:NoSchedule", check=False)
        assert r.returncode != 0 and "already has" in r.stderr  # kubectl wants --overwrite
        kube.kubectl("taint", "nodes", name, "gpu-bridge.io/lent=false:NoSchedule", "--overwrite")
        assert _node(kube, name)["spec"]["taints"][0]["value"] == "false"
        kube.kubectl("taint", "nodes", name, "gpu-bridge.io/lent-")
        assert not _node(kube, name)["spec"].get("taints")
    finally:
        core.delete_node(name)


def test_label_and_annotate(kube: Kube) -> None:
    client, api = kube.client()
    core = client.CoreV1Api(api)
    name = kube.name("node-label")
    make_node(core, client, name)
    try:
        kube.kubectl("label", "node", name, "gpu-bridge.io/phase=lent")
        kube.kubectl("annotate", "node", name, "gpu-bridge.io/reason=idle for 15m")
        n = _node(kube, name)
        assert n["metadata"]["labels"]["gpu-bridge.io/phase"] == "lent"
        assert n["metadata"]["annotations"]["gpu-bridge.io/reason"] == "idle for 15m"
        assert kube.kubectl("label", "node", name, "gpu-bridge.io/phase=serving", check=False).returncode != 0
        kube.kubectl("label", "node", name, "gpu-bridge.io/phase=serving", "--overwrite")
        out = kube.kubectl("get", "nodes", "-l", "gpu-bridge.io/phase in (serving,returning)", "-o", "name").stdout
        assert out.strip() == f"node/{name}"
        kube.kubectl("label", "node", name, "gpu-bridge.io/phase-")
        kube.kubectl("annotate", "node", name, "gpu-bridge.io/reason-")
        n = _node(kube, name)
        assert "gpu-bridge.io/phase" not in n["metadata"].get("labels", {})
        assert "gpu-bridge.io/reason" not in (n["metadata"].get("annotations") or {})
    finally:
        core.delete_node(name)


@pytest.mark.integration
def test_drain_evicts_and_the_replacement_lands_on_the_spare_node(kube: Kube, serving: Serving) -> None:
    """What an operator's `kubectl drain` must do on a serving node: its vLLM pod is evicted through the
    PDB, and the Deployment's replacement lands on the one node with free GPUs."""
    before = serving.node_of()
    used = set(before.values())
    spare = [n for n in serving.nodes if n not in used]
    assert len(spare) == 1
    victim_node = sorted(used)[0]
    victim_pod = next(p for p, n in before.items() if n == victim_node)
    r = kube.kubectl("drain", victim_node, "--ignore-daemonsets", "--timeout=60s", timeout=90)
    assert f"pod/{victim_pod} evicted" in r.stdout and drained(victim_node, r.stdout)
    assert victim_pod not in serving.node_of()  # the drain waited until the pod was gone
    wait_for(lambda: len(serving.ready_pods()) == 3, 20, "3 Ready pods again")
    after = {p.spec.node_name for p in serving.ready_pods()}
    assert after == (used - {victim_node}) | set(spare)
    node = serving.core.read_node(victim_node)
    assert node.spec.unschedulable is True


@pytest.mark.integration
def test_drain_blocks_on_the_pdb_with_429_retries_then_succeeds(kube: Kube, serving: Serving) -> None:
    """Two nodes drained at once: the second eviction gets 429 until the first pod's
    replacement is Ready; with no spare capacity left it blocks until the budget is eased."""
    used = sorted(set(serving.node_of().values()))
    spare = [n for n in serving.nodes if n not in used]
    kube.kubectl("cordon", spare[0])  # no room for replacements: the PDB stays exhausted
    first, second = used[0], used[1]
    kube.kubectl("drain", first, "--ignore-daemonsets", "--timeout=30s")
    proc = kube.kubectl_bg("drain", second, "--ignore-daemonsets", "--timeout=60s")
    out_lines: list[str] = []
    reader = threading.Thread(target=lambda: out_lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("will retry after 5s" in ln and "disruption budget" in ln for ln in out_lines), 20,
                 "kubectl drain to report a 429 retry")
        assert proc.poll() is None  # still blocked
        pdb = serving.policy.read_namespaced_pod_disruption_budget("vllm", serving.ns)
        assert pdb.status.disruptions_allowed == 0
        serving.policy.patch_namespaced_pod_disruption_budget("vllm", serving.ns, {"spec": {"maxUnavailable": 2}})
        assert proc.wait(timeout=30) == 0, "".join(out_lines)
        reader.join(timeout=5)
        assert drained(second, "".join(out_lines))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=5)
        if proc.stdout:
            proc.stdout.close()


@pytest.mark.integration
def test_scale_and_rollout_status(kube: Kube, serving: Serving) -> None:
    r = kube.kubectl("scale", "-n", serving.ns, "deployment/vllm", "--replicas=2")
    assert "scaled" in r.stdout
    r = kube.kubectl("rollout", "status", "-n", serving.ns, "deployment/vllm", "--timeout=30s", timeout=40)
    assert 'successfully rolled out' in r.stdout
    wait_for(lambda: len(serving.pods()) == 2, 10, "the scaled-down pod to be gone")
    kube.kubectl("scale", "-n", serving.ns, "deployment/vllm", "--replicas=4", "--current-replicas=2")
    r = kube.kubectl("rollout", "status", "-n", serving.ns, "deployment/vllm", "--timeout=30s", timeout=40)
    assert "successfully rolled out" in r.stdout
    assert len(serving.ready_pods()) == 4
    bad = kube.kubectl("scale", "-n", serving.ns, "deployment/vllm", "--replicas=1", "--current-replicas=3",
                       check=False)
    assert bad.returncode != 0 and "expected replicas to be 3, was 4" in bad.stderr.lower()


@pytest.mark.integration
def test_rollout_of_a_new_template_replaces_every_pod(kube: Kube, serving: Serving) -> None:
    old = set(serving.node_of())
    kube.kubectl("set", "image", "-n", serving.ns, "deployment/vllm", "vllm=vllm/vllm-openai:v0.7.0")
    r = kube.kubectl("rollout", "status", "-n", serving.ns, "deployment/vllm", "--timeout=40s", timeout=50)
    assert "successfully rolled out" in r.stdout
    wait_for(lambda: len(serving.pods()) == 3, 10, "old pods to be gone")
    pods = serving.pods()
    assert not old & {p.metadata.name for p in pods}
    assert {p.spec.containers[0].image for p in pods} == {"vllm/vllm-openai:v0.7.0"}


def test_create_and_apply_with_validation_left_to_the_server(kube: Kube, tmp_path: Path) -> None:
    """kubectl create/apply -f (default --validate=strict) work: discovery plus the OpenAPI
    v3 documents tell kubectl that the server does field validation."""
    ns = kube.name("apply")
    f = tmp_path / "objs.yaml"
    f.write_text(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n"
                 f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: {ns}\ndata:\n  a: '1'\n")
    assert "created" in kube.kubectl("create", "-f", str(f)).stdout
    f.write_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: {ns}\n"
                 f"  labels: {{tier: x}}\ndata:\n  b: '2'\n")
    kube.kubectl("apply", "-f", str(f))
    cm = json.loads(kube.kubectl("get", "configmap", "cfg", "-n", ns, "-o", "json").stdout)
    assert cm["metadata"]["labels"] == {"tier": "x"} and cm["data"]["b"] == "2"
    assert "kubectl.kubernetes.io/last-applied-configuration" in cm["metadata"]["annotations"]
    kube.kubectl("delete", "namespace", ns)


def test_describe_events_and_api_resources(kube: Kube, serving: Serving) -> None:
    pod = serving.ready_pods()[0]
    node = pod.spec.node_name
    out = kube.kubectl("describe", "node", node).stdout
    assert "nvidia.com/gpu:" in out and pod.metadata.name in out  # allocatable and its non-terminated pod
    out = kube.kubectl("describe", "pod", "-n", serving.ns, pod.metadata.name).stdout
    # (column widths follow the longest label present: a real pod has "Service Account:")
    assert re.search(r"^Controlled By:\s+ReplicaSet/vllm-", out, re.M), out
    assert re.search(r"^Status:\s+Running$", out, re.M) and node in out, out
    ev = kube.kubectl("get", "events", "-n", serving.ns, "--field-selector",
                      f"involvedObject.name={pod.metadata.name}").stdout
    assert "Scheduled" in ev or not kube.sandbox
    res = kube.kubectl("api-resources").stdout
    for line in ("pods", "deployments", "poddisruptionbudgets", "leases", "events"):
        assert line in res


@pytest.mark.integration
def test_get_watch_prints_changes(kube: Kube) -> None:
    client, api = kube.client()
    core = client.CoreV1Api(api)
    name = kube.name("node-watch")
    make_node(core, client, name)
    proc = kube.kubectl_bg("get", "node", name, "-w")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any(ln.startswith(name) for ln in lines), 10, "the first row")
        kube.kubectl("cordon", name)
        wait_for(lambda: any("SchedulingDisabled" in ln for ln in lines), 10, "the cordoned row")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        reader.join(timeout=5)
        if proc.stdout:
            proc.stdout.close()
        core.delete_node(name)


@pytest.mark.integration
def test_drain_ignores_daemonset_pods_only_when_asked(kube: Kube, serving: Serving) -> None:
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": serving.ns},
          "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
              "metadata": {"labels": {"app": "agent"}},
              "spec": {"nodeSelector": {"gpu-bridge.io/pool": serving.pool},
                       "containers": [{"name": "agent", "image": "busybox:1.36"}]}}}}
    serving.apps.create_namespaced_daemon_set(serving.ns, ds)
    wait_for(lambda: (serving.apps.read_namespaced_daemon_set("agent", serving.ns).status.number_ready or 0) == 4,
             20, "the DaemonSet on every pool node")
    node = sorted(set(serving.node_of().values()))[0]
    r = kube.kubectl("drain", node, "--timeout=30s", check=False)
    assert r.returncode != 0 and "DaemonSet-managed Pods" in r.stderr
    r = kube.kubectl("drain", node, "--ignore-daemonsets", "--timeout=60s", timeout=90)
    assert "ignoring DaemonSet-managed Pods" in r.stderr + r.stdout and drained(node, r.stdout)
    agents = serving.core.list_namespaced_pod(serving.ns, label_selector="app=agent").items
    assert node in {p.spec.node_name for p in agents}  # the agent stays on the cordoned node
