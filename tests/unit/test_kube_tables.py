"""Server-side Table output for kubectl get."""

from __future__ import annotations

from gpu_bridge_lab.sandbox.kube import resources as R
from gpu_bridge_lab.sandbox.kube.serving_model import node_object
from gpu_bridge_lab.sandbox.kube.tables import human_duration, table, wants_table

KUBECTL_ACCEPT = ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;"
                  "g=meta.k8s.io,application/json")


def test_wants_table() -> None:
    assert wants_table(KUBECTL_ACCEPT) == "v1"
    assert wants_table("application/json") == ""
    assert wants_table("application/json;as=Table;v=v1beta1;g=meta.k8s.io") == "v1beta1"


def test_node_rows_show_status_and_cordon() -> None:
    n = node_object("gpu-node-01", "p", 4)
    n["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    n["metadata"]["labels"]["node-role.kubernetes.io/gpu"] = ""
    n["spec"]["unschedulable"] = True
    t = table(R.core("nodes"), [n], "7", "v1", "PartialObjectMetadata")
    assert t["kind"] == "Table" and t["metadata"]["resourceVersion"] == "7"
    assert [c["name"] for c in t["columnDefinitions"][:5]] == ["Name", "Status", "Roles", "Age", "Version"]
    cells = t["rows"][0]["cells"]
    assert cells[:3] == ["gpu-node-01", "Ready,SchedulingDisabled", "gpu"] and cells[4] == "v1.32.0"
    assert t["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def test_pod_rows() -> None:
    pod = {"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": "x"},
           "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
           "status": {"phase": "Running", "podIP": "10.0.0.9", "containerStatuses": [{"ready": True, "restartCount": 2}]}}
    cells = table(R.core("pods"), [pod], "1", "v1", "None")["rows"][0]["cells"]
    assert cells[:4] == ["p", "1/1", "Terminating", 2] and cells[5:7] == ["10.0.0.9", "n"]


def test_human_duration_like_kubectl() -> None:
    assert [human_duration(s) for s in (5, 119, 150, 600, 7200, 3 * 86400)] == ["5s", "119s", "2m30s", "10m", "120m",
                                                                                "3d"]
