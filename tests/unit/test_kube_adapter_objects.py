"""Kubernetes adapter, pure parts: parsing node/pod/deployment JSON with validation of our
labels and annotations, and the patch builders (idempotence, taint preservation, cordon
ownership, resourceVersion carried for optimistic concurrency)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge import wellknown as wk
from bridge.adapters.kube import objects as o
from bridge.adapters.kube import patches as p
from bridge.adapters.kube.calls import KubeApiError, sanitize
from bridge.model import Phase, Pin


def node_json(
    name: str = "gpu-node-01",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    unschedulable: bool | None = None,
    taints: list[dict[str, str]] | None = None,
    gpus: str | None = "4",
    ready: bool = True,
    rv: str = "17",
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    if taints is not None:
        spec["taints"] = taints
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if gpus is not None:
        status["allocatable"] = {"cpu": "32", wk.GPU_RESOURCE: gpus}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "uid-" + name,
            "resourceVersion": rv,
            "labels": {wk.LABEL_POOL: "llama", **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": status,
    }


def phased(phase: str = "lent", since: str = "1700000000.5", **kw: Any) -> dict[str, Any]:
    labels = {wk.LABEL_PHASE: phase, **kw.pop("labels", {})}
    annotations = {wk.ANNOTATION_PHASE_SINCE: since, wk.ANNOTATION_REASON: "low load", wk.ANNOTATION_OWNER: "bridge-a"}
    annotations.update(kw.pop("annotations", {}))
    return node_json(labels=labels, annotations=annotations, **kw)


def test_node_parses_every_field() -> None:
    n = o.parse_node(phased(labels={wk.LABEL_PIN: "slurm"}, taints=[{"key": "other", "effect": "NoExecute", "value": "x"}], unschedulable=True))
    assert n.name == "gpu-node-01" and n.uid == "uid-gpu-node-01" and n.resource_version == "17"
    assert n.pool == "llama"
    assert n.phase is Phase.LENT and n.phase_since == 1700000000.5
    assert n.reason == "low load" and n.owner == "bridge-a"
    assert n.pin is Pin.SLURM
    assert n.unschedulable and n.taints == (o.Taint("other", "x", "NoExecute"),)
    assert not n.fenced and not n.cordoned_by_bridge
    assert n.allocatable_gpus == 4 and n.ready
    assert n.problem is None


def test_node_without_our_labels_is_not_a_problem() -> None:
    n = o.parse_node(node_json(gpus=None, ready=False))
    assert n.phase is None and n.phase_since is None and n.pin is None
    assert n.allocatable_gpus is None and not n.ready
    assert n.problem is None


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        (
            phased(phase="borrowed"),
            'label gpu-bridge.io/phase: expected one of serving|lending|lent|reclaiming|returning, got "borrowed"',
        ),
        (phased(labels={wk.LABEL_PIN: "k8s"}), 'label gpu-bridge.io/pin: expected one of serving|slurm, got "k8s"'),
        (phased(since="yesterday"), 'annotation gpu-bridge.io/phase-since: expected unix seconds (a number >= 0 up to 253402300799), got "yesterday"'),
        (phased(since="nan"), 'annotation gpu-bridge.io/phase-since: expected unix seconds (a number >= 0 up to 253402300799), got "nan"'),
        (phased(since="-5"), 'annotation gpu-bridge.io/phase-since: expected unix seconds (a number >= 0 up to 253402300799), got "-5"'),
        (
            node_json(labels={wk.LABEL_PHASE: "serving"}),
            "annotation gpu-bridge.io/phase-since: missing while label gpu-bridge.io/phase is set",
        ),
        (phased(annotations={wk.ANNOTATION_CORDONED: "yes"}), 'annotation gpu-bridge.io/cordoned: expected "true", got "yes"'),
        (phased(gpus="four"), 'status.allocatable[nvidia.com/gpu]: expected a whole number, got "four"'),
    ],
    ids=["bad-phase", "bad-pin", "since-text", "since-nan", "since-negative", "since-missing", "bad-cordoned", "bad-gpus"],
)
def test_node_invalid_values_give_a_problem_never_a_guess(doc: dict[str, Any], problem: str) -> None:
    n = o.parse_node(doc)
    assert n.problem == problem


def test_node_problems_are_all_listed_and_bad_fields_stay_none() -> None:
    n = o.parse_node(phased(phase="x", since="y"))
    assert n.phase is None and n.phase_since is None
    assert n.problem is not None and n.problem.count(";") == 1


def test_node_fenced_only_by_our_key_and_effect() -> None:
    assert o.parse_node(node_json(taints=[{"key": wk.TAINT_KEY, "effect": "NoSchedule"}])).fenced
    assert not o.parse_node(node_json(taints=[{"key": wk.TAINT_KEY, "effect": "NoExecute"}])).fenced


@pytest.mark.parametrize(("text", "value"), [("4", 4), ("8000m", 8), ("0", 0), ("1k", 1000)])
def test_quantity(text: str, value: int) -> None:
    assert o.parse_quantity_int(text) == value


@pytest.mark.parametrize("text", ["1500m", "x", "1.5"])
def test_quantity_rejects_fractions_and_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        o.parse_quantity_int(text)


def pod_json(name: str = "vllm-abc", *, node: str | None = "gpu-node-01", ready: bool = True, deleting: bool = False, cost: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "serving", "uid": "u1", "resourceVersion": "5", "labels": {"app": "vllm"}, "annotations": {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T12:00:00Z"
    if cost is not None:
        meta["annotations"][wk.POD_DELETION_COST] = cost
    return {
        "metadata": meta,
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_pod_parses() -> None:
    pod = o.parse_pod(pod_json(cost="-100", deleting=True), "llama")
    assert (pod.name, pod.namespace, pod.node, pod.phase, pod.ready, pod.pool) == ("vllm-abc", "serving", "gpu-node-01", "Running", True, "llama")
    assert pod.terminating and pod.deletion_timestamp == "2026-12-02T12:00:00Z"
    assert pod.deletion_cost == -100 and pod.problem is None


@pytest.mark.parametrize("cost", ["cheap", "99999999999", "1.5"])
def test_pod_invalid_deletion_cost(cost: str) -> None:
    pod = o.parse_pod(pod_json(cost=cost), "llama")
    assert pod.deletion_cost is None
    assert pod.problem == f'annotation controller.kubernetes.io/pod-deletion-cost: expected an int32, got "{cost}"'


def test_pending_pod_has_no_node() -> None:
    pod = o.parse_pod(pod_json(node=None, ready=False), "llama")
    assert pod.node is None and not pod.ready and not pod.terminating


def test_deployment_and_scale() -> None:
    d = o.parse_deployment(
        {
            "metadata": {"name": "vllm", "namespace": "serving", "resourceVersion": "9", "generation": 3},
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "vllm", "model": "llama"}}},
            "status": {"observedGeneration": 3, "replicas": 4, "readyReplicas": 3, "availableReplicas": 3, "updatedReplicas": 4},
        }
    )
    assert (d.replicas, d.generation, d.observed_generation, d.ready_replicas, d.available_replicas, d.updated_replicas) == (4, 3, 3, 3, 3, 4)
    assert o.selector_from_match_labels(d.match_labels) == "app=vllm,model=llama"
    assert o.parse_deployment({"metadata": {"name": "x"}, "spec": {}}).replicas == 1
    s = o.parse_scale({"metadata": {"name": "vllm", "namespace": "serving", "resourceVersion": "9"}, "spec": {"replicas": 2}, "status": {"replicas": 3, "selector": "app=vllm"}})
    assert (s.replicas, s.status_replicas, s.selector, s.resource_version) == (2, 3, "app=vllm", "9")


# --- patches --------------------------------------------------------------------------------


def test_phase_patch_is_one_patch_with_rv_and_idempotent() -> None:
    n = o.parse_node(node_json())
    patch = p.phase_patch(n, Phase.LENDING, "low\nload", 1700000000.25, "bridge-a")
    assert patch == {
        "metadata": {
            "resourceVersion": "17",
            "labels": {wk.LABEL_PHASE: "lending"},
            "annotations": {wk.ANNOTATION_PHASE_SINCE: "1700000000.250", wk.ANNOTATION_REASON: "low load", wk.ANNOTATION_OWNER: "bridge-a"},
        }
    }
    applied = node_json(labels=patch["metadata"]["labels"], annotations=patch["metadata"]["annotations"])
    assert p.phase_patch(o.parse_node(applied), Phase.LENDING, "low\nload", 1700000000.25, "bridge-a") is None


def test_fence_keeps_other_taints_and_records_our_cordon() -> None:
    n = o.parse_node(node_json(taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]))
    patch = p.fence_patch(n)
    assert patch == {
        "metadata": {"resourceVersion": "17", "annotations": {wk.ANNOTATION_CORDONED: "true"}},
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}, {"key": wk.TAINT_KEY, "effect": "NoSchedule"}],
        },
    }


def test_fence_of_an_admin_cordoned_node_does_not_claim_the_cordon() -> None:
    patch = p.fence_patch(o.parse_node(node_json(unschedulable=True)))
    assert patch is not None
    assert "annotations" not in patch["metadata"] and "unschedulable" not in patch["spec"]
    assert patch["spec"]["taints"] == [{"key": wk.TAINT_KEY, "effect": "NoSchedule"}]


def test_fence_is_idempotent() -> None:
    n = o.parse_node(node_json(unschedulable=True, taints=[{"key": wk.TAINT_KEY, "effect": "NoSchedule"}]))
    assert p.fence_patch(n) is None


def test_unfence_uncordons_only_what_we_cordoned() -> None:
    ours = o.parse_node(
        node_json(
            unschedulable=True,
            annotations={wk.ANNOTATION_CORDONED: "true"},
            taints=[{"key": "dedicated", "effect": "NoSchedule"}, {"key": wk.TAINT_KEY, "effect": "NoSchedule"}],
        )
    )
    assert p.unfence_patch(ours) == {
        "metadata": {"resourceVersion": "17", "annotations": {wk.ANNOTATION_CORDONED: None}},
        "spec": {"taints": [{"key": "dedicated", "effect": "NoSchedule"}], "unschedulable": None},
    }
    admins = o.parse_node(node_json(unschedulable=True, taints=[{"key": wk.TAINT_KEY, "effect": "NoSchedule"}]))
    assert p.unfence_patch(admins) == {"metadata": {"resourceVersion": "17"}, "spec": {"taints": None}}
    assert p.unfence_patch(o.parse_node(node_json())) is None


def test_deletion_cost_patch() -> None:
    pod = o.parse_pod(pod_json(), "llama")
    assert p.deletion_cost_patch(pod, -50) == {"metadata": {"resourceVersion": "5", "annotations": {wk.POD_DELETION_COST: "-50"}}}
    assert p.deletion_cost_patch(o.parse_pod(pod_json(cost="-50"), "llama"), -50) is None


def test_error_text_is_capped_and_redacts_tokens() -> None:
    text = sanitize("Authorization: Bearer abc.def-123 " + "x" * 1000)
    assert "abc.def" not in text and "<redacted>" in text and text.endswith("...(capped)") and len(text) < 320
    e = KubeApiError("patch", "nodes", "n1", 409, "Conflict\nthe object has been modified")
    assert str(e) == "kubernetes: patch nodes n1: HTTP 409: Conflict the object has been modified"
    assert e.status == 409 and e.system == "kubernetes"


def test_missing_kubeconfig_is_an_adapter_error(tmp_path: Any) -> None:
    from bridge.adapters.kube.client import api_client_from_config
    from bridge.errors import AdapterError

    with pytest.raises(AdapterError, match=r"^kubernetes: cannot load kubeconfig configuration: "):
        api_client_from_config(kubeconfig=str(tmp_path / "nope"))


def test_kubeconfig_loads_unchanged(tmp_path: Any) -> None:
    from bridge.adapters.kube.client import api_client_from_config

    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: tok-123}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    api = api_client_from_config(kubeconfig=str(path))
    try:
        assert api.configuration.host == "http://127.0.0.1:1"
        assert "Bearer tok-123" in api.configuration.api_key.values()
    finally:
        api.close()
