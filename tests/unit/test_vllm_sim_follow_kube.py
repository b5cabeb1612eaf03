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


def gated(name: str, *, awake: bool, node: str = "gpu-node-01", ip: str = "127.1.0.9") -> dict[str, Any]:
    """A pod with the readiness gate gpu-bridge.io/awake, its containers ready, as kwok reports it."""
    p = pod(name, ready=awake, node=node)
    p["status"]["conditions"] += [{"type": "ContainersReady", "status": "True"},
                                  {"type": "gpu-bridge.io/awake", "status": "True" if awake else "False"}]
    p["status"]["podIP"] = ip
    return p


def test_a_gated_out_pod_keeps_its_engine_out_of_the_load_balancing() -> None:
    """A closed readiness gate takes the pod out of the Service, not its process: the replica
    gets no new requests, finishes the ones it has, can sleep and wake, and serves again once
    Ready. A pod not Ready for any other reason is drained as before."""
    from gpu_bridge_lab.sandbox.vllm.sleep import SleepParams

    sim = Simulation(FLAT, ["m"], seed=2, sleep_params=SleepParams())
    tr = PodTracker(sim, "m")
    tr.event("ADDED", gated("vllm-0", awake=True))
    tr.event("ADDED", gated("vllm-1", awake=True, node="gpu-node-02", ip="127.1.0.10"))
    assert pod_view(gated("vllm-0", awake=False), "m") == PodView("vllm-0", "gpu-node-01", "m", False, True, "127.1.0.9")
    sim.advance(20)
    rep = sim.replicas["vllm-0"]
    assert rep.load > 0
    tr.event("MODIFIED", gated("vllm-0", awake=False))
    assert rep.state == SERVING and not rep.routed and not rep.accepting
    finished = sum(rep.success.values())
    sim.advance(120)  # longer than any request: the ones it had finish, no new one arrives
    assert rep.load == 0 and sum(rep.success.values()) > finished and rep.aborted_total == 0
    assert sim.replicas["vllm-1"].load > 0  # the traffic went to the other replica
    sim.sleep_replica("vllm-0", 1)
    sim.advance(10)
    assert sim.is_sleeping("vllm-0")
    tr.event("MODIFIED", gated("vllm-0", awake=False))  # more events while asleep: nothing changes
    assert sim.replicas["vllm-0"] is rep and sim.is_sleeping("vllm-0")
    sim.wake_replica("vllm-0")
    sim.advance(10)
    tr.event("MODIFIED", gated("vllm-0", awake=True))
    assert rep.routed and rep.accepting
    sim.advance(10)
    assert rep.load > 0
    # not Ready without containers ready (a crash, a failing probe): drained as before
    tr.event("MODIFIED", pod("vllm-1", ready=False, node="gpu-node-02"))
    assert sim.replicas["vllm-1"].state == DRAINING
    # gated out, then drained (its container failed), then Ready again: serving and routed
    tr.event("MODIFIED", gated("vllm-0", awake=False))
    tr.event("MODIFIED", pod("vllm-0", ready=False))
    assert rep.state == DRAINING and not rep.routed
    tr.event("MODIFIED", gated("vllm-0", awake=True))
    assert rep.state == SERVING and rep.routed and rep.accepting
