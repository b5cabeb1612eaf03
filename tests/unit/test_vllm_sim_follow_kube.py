"""Follow-kube: pod JSON -> replica actions, with plain dicts (no API server)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_bridge_lab.sandbox.vllm.follow_kube import MODEL_LABEL, Action, PodTracker, PodView, plan, pod_view
from gpu_bridge_lab.sandbox.vllm.model import DRAINING, SERVING
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from bridge.trace import Trace

FLAT = Trace((0.0, 600.0), (20.0, 20.0), (1.0, 1.0), 600.0, "flat")


def pod(name: str, *, ready: bool = True, node: str = "gpu-node-01", deleting: bool = False,
        model: str | None = None, phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "serving", "labels": {"app": "vllm"}}
    if model:
        meta["labels"][MODEL_LABEL] = model
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ]},
    }


def test_pod_view() -> None:
    assert pod_view(pod("a"), "m") == PodView("a", "gpu-node-01", "m", True)
    assert pod_view(pod("a", model="qwen"), "m").model == "qwen"
    assert not pod_view(pod("a", ready=False), "m").serving
    assert not pod_view(pod("a", deleting=True), "m").serving
    assert not pod_view(pod("a", phase="Succeeded"), "m").serving
    pending = {"metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Pending"}}
    assert pod_view(pending, "m") == PodView("p", "", "m", False)
    with pytest.raises(ValueError, match="metadata.name"):
        pod_view({"metadata": {}}, "m")


def test_plan_adds_drains_and_removes_only_what_it_owns() -> None:
    pods = {
        "new": PodView("new", "n1", "m", True),
        "going": PodView("going", "n2", "m", False),
        "back": PodView("back", "n3", "m", True),
        "manual": PodView("manual", "n4", "m", False),
    }
    replicas = {"going": SERVING, "back": DRAINING, "gone": SERVING, "manual": SERVING, "static": SERVING}
    owned = {"going", "back", "gone"}
    assert plan(pods, replicas, owned) == [
        Action("add", "back", "m", "n3"),
        Action("drain", "going"),
        Action("add", "new", "m", "n1"),
        Action("remove", "gone"),
    ]
    assert plan({}, {}, set()) == []


def test_tracker_follows_a_pod_lifecycle() -> None:
    sim = Simulation(FLAT, ["m"], seed=2)
    sim.add_replica("static-0", "m")
    tr = PodTracker(sim, "m")
    tr.event("ADDED", pod("vllm-1", ready=False, node=""))
    assert set(sim.replicas) == {"static-0"}
    tr.event("MODIFIED", pod("vllm-1"))
    rep = sim.replicas["vllm-1"]
    assert rep.state == SERVING and rep.node == "gpu-node-01"
    sim.advance(20)
    assert rep.load > 0
    tr.event("MODIFIED", pod("vllm-1", deleting=True))
    assert rep.state == DRAINING
    tr.event("MODIFIED", pod("vllm-1", deleting=True, ready=False))
    assert rep.state == DRAINING
    tr.event("DELETED", pod("vllm-1", deleting=True, ready=False))
    assert "vllm-1" not in sim.replicas
    assert set(sim.replicas) == {"static-0"}  # never touches replicas it did not create


def test_drained_replica_disappears_and_the_pod_name_can_come_back() -> None:
    sim = Simulation(FLAT, ["m"], seed=2)
    tr = PodTracker(sim, "m")
    tr.event("ADDED", pod("vllm-0"))
    sim.advance(5)
    tr.event("MODIFIED", pod("vllm-0", ready=False))
    sim.advance(sim.params.shutdown_timeout_s + 1)
    assert "vllm-0" not in sim.replicas
    tr.event("MODIFIED", pod("vllm-0", ready=False))  # more events for a pod already drained
    assert "vllm-0" not in sim.replicas
    tr.event("MODIFIED", pod("vllm-0", node="gpu-node-02"))  # ready again
    assert sim.replicas["vllm-0"].state == SERVING and sim.replicas["vllm-0"].node == "gpu-node-02"


def test_relist_replaces_the_pod_set() -> None:
    sim = Simulation(FLAT, ["m", "qwen"], seed=2)
    tr = PodTracker(sim, "m")
    tr.replace([pod("a"), pod("b", model="qwen"), pod("c", ready=False)])
    assert set(sim.replicas) == {"a", "b"} and sim.replicas["b"].model == "qwen"
    tr.replace([pod("b", model="qwen"), pod("c")])  # a vanished while we were disconnected
    assert set(sim.replicas) == {"b", "c"}


def test_pod_of_an_unknown_model_is_logged_not_fatal() -> None:
    sim = Simulation(FLAT, ["m"], seed=2)
    tr = PodTracker(sim, "m")
    tr.event("ADDED", pod("x", model="not-served"))
    assert sim.replicas == {}
    tr.event("ADDED", pod("y"))
    assert set(sim.replicas) == {"y"}
