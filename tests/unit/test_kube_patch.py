"""PATCH flavours of the sandbox Kubernetes API server."""

from __future__ import annotations

import pytest

from gpu_bridge_lab.sandbox.kube.patch import PatchError, apply, json_merge_patch, json_patch, strategic_merge_patch

SMP = "application/strategic-merge-patch+json"


def test_merge_patch_null_deletes_and_lists_replace() -> None:
    doc = {"a": {"b": 1, "c": 2}, "l": [1, 2]}
    assert json_merge_patch(doc, {"a": {"b": None, "d": 3}, "l": [3]}) == {"a": {"c": 2, "d": 3}, "l": [3]}
    assert doc == {"a": {"b": 1, "c": 2}, "l": [1, 2]}  # input untouched


def test_strategic_taints_are_replaced_whole() -> None:
    node = {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]}}
    out = strategic_merge_patch(node, {"spec": {"taints": [{"key": "c", "effect": "NoSchedule"}]}})
    assert out["spec"]["taints"] == [{"key": "c", "effect": "NoSchedule"}]
    assert strategic_merge_patch(node, {"spec": {"taints": None}}) == {"spec": {}}


def test_strategic_containers_merge_by_name_and_delete_directive() -> None:
    pod = {"spec": {"containers": [{"name": "vllm", "image": "a", "env": [{"name": "X", "value": "1"}]},
                                   {"name": "side", "image": "s"}]}}
    out = strategic_merge_patch(pod, {"spec": {"containers": [
        {"name": "vllm", "image": "b", "env": [{"name": "Y", "value": "2"}]},
        {"name": "side", "$patch": "delete"}]}})
    assert out["spec"]["containers"] == [{"name": "vllm", "image": "b", "env": [{"name": "X", "value": "1"},
                                                                                 {"name": "Y", "value": "2"}]}]


def test_strategic_conditions_merge_by_type() -> None:
    st = {"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}}
    out = strategic_merge_patch(st, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert out["status"]["conditions"] == [{"type": "Ready", "status": "True"}, {"type": "PodScheduled",
                                                                                 "status": "True"}]


def test_strategic_replace_directives_and_primitive_lists() -> None:
    doc = {"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]}}
    assert strategic_merge_patch(doc, {"metadata": {"labels": {"$patch": "replace", "c": "3"}}})["metadata"][
        "labels"] == {"c": "3"}
    out = strategic_merge_patch(doc, {"metadata": {"finalizers": ["y", "x"]}})
    assert out["metadata"]["finalizers"] == ["x", "y"]
    out = strategic_merge_patch(doc, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}})
    assert out["metadata"]["finalizers"] == []
    items = {"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}
    out = strategic_merge_patch(items, {"spec": {"containers": [{"name": "z"}, {"$patch": "replace"}]}})
    assert out["spec"]["containers"] == [{"name": "z"}]


def test_json_patch_ops_and_failed_test_is_422() -> None:
    doc = {"metadata": {"labels": {"phase": "serving"}}, "spec": {"l": [1, 2]}}
    out = json_patch(doc, [{"op": "test", "path": "/metadata/labels/phase", "value": "serving"},
                           {"op": "replace", "path": "/metadata/labels/phase", "value": "lending"},
                           {"op": "add", "path": "/spec/l/-", "value": 3},
                           {"op": "add", "path": "/metadata/labels/gpu-bridge.io~1pool", "value": "p"},
                           {"op": "remove", "path": "/spec/l/0"},
                           {"op": "copy", "from": "/spec/l", "path": "/spec/m"},
                           {"op": "move", "from": "/spec/m", "path": "/spec/n"}])
    assert out == {"metadata": {"labels": {"phase": "lending", "gpu-bridge.io/pool": "p"}},
                   "spec": {"l": [2, 3], "n": [2, 3]}}
    with pytest.raises(PatchError) as exc:
        json_patch(doc, [{"op": "test", "path": "/metadata/labels/phase", "value": "lent"}])
    assert exc.value.code == 422
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "remove", "path": "/nope"}])


def test_apply_dispatches_on_content_type() -> None:
    assert apply(SMP, {"a": 1}, {"b": 2}) == {"a": 1, "b": 2}
    assert apply("application/merge-patch+json; charset=utf-8", {"a": 1}, {"a": None}) == {}
    assert apply("application/json-patch+json", {"a": 1}, [{"op": "remove", "path": "/a"}]) == {}
    with pytest.raises(PatchError) as exc:
        apply("application/apply-patch+yaml", {}, {})
    assert exc.value.code == 415
