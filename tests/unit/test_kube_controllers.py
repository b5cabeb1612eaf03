"""Controllers of the sandbox Kubernetes API server: scheduler, kubelet, ReplicaSet victim
choice, PDB status, graceful deletion, eviction."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_bridge_lab.sandbox.kube import resources as R
from gpu_bridge_lab.sandbox.kube.api import delete_object
from gpu_bridge_lab.sandbox.kube.controllers import Controllers
from gpu_bridge_lab.sandbox.kube.ranking import victim_order
from gpu_bridge_lab.sandbox.kube.scheduling import fit_problem, tolerates
from gpu_bridge_lab.sandbox.kube.defaults import on_create
from gpu_bridge_lab.sandbox.kube.eviction import evict
from gpu_bridge_lab.sandbox.kube.serving_model import ServingModel, node_object, seed_serving, wait_serving_ready
from gpu_bridge_lab.sandbox.kube.store import ApiError, Store

PODS, NODES = R.core("pods"), R.core("nodes")
DEPLOY, PDBS = R.get("apps", "deployments"), R.get("policy", "poddisruptionbudgets")


def wait_for(cond: Callable[[], Any], timeout_s: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError("timed out")


@pytest.fixture
def cluster() -> Iterator[tuple[Store, Controllers]]:
    store = Store()
    ctl = Controllers(store, pod_start_delay_s=0.05, pod_stop_s=0.1)
    ctl.start()
    try:
        yield store, ctl
    finally:
        ctl.stop()


def _pod(name: str, gpus: int = 4, **spec: Any) -> dict[str, Any]:
    body = {"metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
                     **spec}}
    on_create(PODS, body)
    return body


def _node(store: Store, name: str, **spec: Any) -> None:
    n = node_object(name, "p", 4)
    n["spec"].update(spec)
    store.create(NODES, n, keep_status=True)


def _phase(store: Store, name: str) -> tuple[str, str, bool]:
    p = store.get(PODS, "default", name)
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    return p["spec"].get("nodeName", ""), p["status"].get("phase", ""), ready


def test_scheduler_honours_gpus_cordon_taints_and_selectors(cluster: tuple[Store, Controllers]) -> None:
    store, _ = cluster
    _node(store, "a", unschedulable=True)
    _node(store, "b", taints=[{"key": "gpu-bridge.io/lent", "value": "true", "effect": "NoSchedule"}])
    _node(store, "c")
    store.create(PODS, _pod("p1"), keep_status=True)
    wait_for(lambda: _phase(store, "p1")[2])
    assert _phase(store, "p1")[0] == "c"
    store.create(PODS, _pod("p2"), keep_status=True)  # c is full, a cordoned, b tainted
    cond = wait_for(lambda: next((c for c in store.get(PODS, "default", "p2")["status"].get("conditions", [])
                                  if c["type"] == "PodScheduled"), None))
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"
    assert "1 Insufficient nvidia.com/gpu" in cond["message"] and "1 node(s) were unschedulable" in cond["message"]
    tol = [{"key": "gpu-bridge.io/lent", "operator": "Exists", "effect": "NoSchedule"}]
    store.create(PODS, _pod("p3", tolerations=tol), keep_status=True)
    wait_for(lambda: _phase(store, "p3")[0] == "b")
    store.create(PODS, _pod("p4", gpus=0, nodeSelector={"kubernetes.io/hostname": "c"}), keep_status=True)
    wait_for(lambda: _phase(store, "p4")[0] == "c")  # no GPU asked: fits next to p1


def test_kubelet_ready_after_start_delay_and_graceful_deletion() -> None:
    store = Store()
    ctl = Controllers(store, pod_start_delay_s=0.3)
    ctl.start()
    try:
        _node(store, "n")
        body = _pod("p", terminationGracePeriodSeconds=1)
        store.create(PODS, body, keep_status=True)
        wait_for(lambda: _phase(store, "p")[1] == "Running")
        assert not _phase(store, "p")[2]  # running, still cold-starting
        wait_for(lambda: _phase(store, "p")[2], 3)
        t0 = time.monotonic()
        obj, gone = delete_object(store, PODS, "default", "p", {})
        assert not gone and obj["metadata"]["deletionTimestamp"] and obj["metadata"]["deletionGracePeriodSeconds"] == 1
        wait_for(lambda: store.get_entry(PODS, "default", "p") is None, 3)
        assert time.monotonic() - t0 >= 0.9
    finally:
        ctl.stop()


def test_unscheduled_pod_deletes_at_once(cluster: tuple[Store, Controllers]) -> None:
    store, _ = cluster
    store.create(PODS, _pod("p"), keep_status=True)
    _, gone = delete_object(store, PODS, "default", "p", {})
    assert gone and store.get_entry(PODS, "default", "p") is None


def _rank_pod(name: str, node: str = "", phase: str = "Running", ready: bool = True, cost: int | None = None,
              created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    ann = {"controller.kubernetes.io/pod-deletion-cost": str(cost)} if cost is not None else {}
    return {"metadata": {"name": name, "annotations": ann, "creationTimestamp": created, "uid": name},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                                       "lastTransitionTime": created}]}}


def test_victim_order_is_the_real_controllers() -> None:
    pods = [
        _rank_pod("ready-old", "n1", created="2026-01-01T00:00:00Z"),
        _rank_pod("ready-new", "n2", created="2026-01-02T00:00:00Z"),
        _rank_pod("cheap", "n3", cost=-10),
        _rank_pod("not-ready", "n4", ready=False),
        _rank_pod("pending", "n5", phase="Pending", ready=False),
        _rank_pod("unscheduled", "", phase="Pending", ready=False),
        _rank_pod("dear", "n6", cost=10),
    ]
    order = [p["metadata"]["name"] for p in victim_order(pods, pods)]
    assert order == ["unscheduled", "pending", "not-ready", "cheap", "ready-new", "ready-old", "dear"]


def test_fit_problem_and_tolerations() -> None:
    node = node_object("n", "p", 4)
    pod = _pod("p")
    assert fit_problem(pod, node, {}, 0) == ""
    assert fit_problem(pod, node, {"nvidia.com/gpu": 1.0}, 1) == "Insufficient nvidia.com/gpu"
    node["spec"]["taints"] = [{"key": "k", "value": "v", "effect": "NoExecute"}]
    assert "untolerated taint" in fit_problem(pod, node, {}, 0)
    assert tolerates([{"key": "k", "operator": "Equal", "value": "v"}], {"key": "k", "value": "v", "effect": "NoExecute"})
    assert not tolerates([{"key": "k", "value": "w"}], {"key": "k", "value": "v", "effect": "NoExecute"})
    assert tolerates([{"operator": "Exists"}], {"key": "any", "effect": "NoSchedule"})
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu-bridge.io/pool", "operator": "In",
                                                     "values": ["other"]}]}]}}}
    node["spec"]["taints"] = []
    assert "affinity" in fit_problem(pod, node, {}, 0)


def test_serving_model_pdb_and_eviction(cluster: tuple[Store, Controllers]) -> None:
    store, ctl = cluster
    m = ServingModel(nodes=3, termination_grace_s=1)
    names = seed_serving(store, m, spare_nodes=1)
    assert names == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    assert wait_serving_ready(store, m, 5)
    wait_for(lambda: (store.get(PDBS, "serving", "vllm").get("status") or {}).get("disruptionsAllowed") == 1)
    pdb = store.get(PDBS, "serving", "vllm")["status"]
    assert (pdb["expectedPods"], pdb["desiredHealthy"], pdb["currentHealthy"]) == (3, 2, 3)
    pods = sorted(p["metadata"]["name"] for p in store.objs(PODS, "serving"))
    for n in names:  # nothing may land anywhere: the budget stays spent
        store.mutate(NODES, "", n, lambda o: o["spec"].update(unschedulable=True))
    evict(store, "serving", pods[0], {})
    p0 = store.get(PODS, "serving", pods[0])
    assert p0["metadata"]["deletionTimestamp"]
    assert any(c["type"] == "DisruptionTarget" for c in p0["status"]["conditions"])
    with pytest.raises(ApiError) as exc:
        evict(store, "serving", pods[1], {})
    assert exc.value.code == 429 and exc.value.details["causes"][0]["reason"] == "DisruptionBudget"
    evict(store, "serving", pods[0], {})  # terminating: no budget needed
    with pytest.raises(ApiError) as exc:
        evict(store, "serving", "nope", {})
    assert exc.value.code == 404


def test_deployment_scale_down_and_up(cluster: tuple[Store, Controllers]) -> None:
    store, ctl = cluster
    m = ServingModel(nodes=3, termination_grace_s=1)
    seed_serving(store, m)
    assert wait_serving_ready(store, m, 5)
    pods = sorted(store.objs(PODS, "serving"), key=lambda p: p["metadata"]["name"])
    victim = pods[2]["metadata"]["name"]
    store.mutate(PODS, "serving", victim, lambda o: o["metadata"].setdefault("annotations", {}).update(
        {"controller.kubernetes.io/pod-deletion-cost": "-5"}))
    store.mutate(DEPLOY, "serving", "vllm", lambda o: o["spec"].update(replicas=2))
    wait_for(lambda: store.get_entry(PODS, "serving", victim) is None, 5)
    assert len(store.objs(PODS, "serving")) == 2
    store.mutate(DEPLOY, "serving", "vllm", lambda o: o["spec"].update(replicas=3))
    m3 = ServingModel(nodes=3)
    wait_for(lambda: wait_serving_ready(store, m3, 0.05), 5)
    d = store.get(DEPLOY, "serving", "vllm")
    assert d["status"]["observedGeneration"] == d["metadata"]["generation"] == 3


def test_pods_of_a_deleted_node_are_collected(cluster: tuple[Store, Controllers]) -> None:
    store, _ = cluster
    _node(store, "n")
    store.create(PODS, _pod("p"), keep_status=True)
    wait_for(lambda: _phase(store, "p")[0] == "n")
    store.remove(NODES, "", "n")
    wait_for(lambda: store.get_entry(PODS, "default", "p") is None)


@pytest.mark.parametrize("spec,expected,desired,allowed", [
    ({"maxUnavailable": 1}, 4, 3, 1),
    ({"maxUnavailable": "50%"}, 4, 2, 2),
    ({"minAvailable": 4}, 4, 4, 0),
    ({"minAvailable": "50%"}, 4, 2, 2),
])
def test_pdb_status_arithmetic(cluster: tuple[Store, Controllers], spec: dict[str, Any], expected: int,
                               desired: int, allowed: int) -> None:
    store, _ = cluster
    m = ServingModel(nodes=4)
    seed_serving(store, m)
    assert wait_serving_ready(store, m, 5)
    store.mutate(PDBS, "serving", "vllm", lambda o: o.update(spec={**spec, "selector": {"matchLabels": {"app": "vllm"}}}))

    def status() -> Any:
        pdb = store.get(PDBS, "serving", "vllm")
        st = pdb.get("status") or {}
        return st if st.get("observedGeneration") == pdb["metadata"]["generation"] else None
    st = wait_for(status)
    assert (st["expectedPods"], st["desiredHealthy"], st["currentHealthy"], st["disruptionsAllowed"]) == (
        expected, desired, 4, allowed)


def test_concurrent_evictions_cannot_both_spend_a_budget_of_one(cluster: tuple[Store, Controllers]) -> None:
    import threading

    store, _ = cluster
    m = ServingModel(nodes=3)
    seed_serving(store, m)
    assert wait_serving_ready(store, m, 5)
    wait_for(lambda: (store.get(PDBS, "serving", "vllm").get("status") or {}).get("disruptionsAllowed") == 1)
    names = sorted(p["metadata"]["name"] for p in store.objs(PODS, "serving"))
    results: list[int] = []
    barrier = threading.Barrier(3)

    def go(name: str) -> None:
        barrier.wait()
        try:
            evict(store, "serving", name, {})
            results.append(201)
        except ApiError as exc:
            results.append(exc.code)
    ts = [threading.Thread(target=go, args=(n,)) for n in names]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(results) == [201, 429, 429]


def test_a_second_delete_may_only_shorten_the_grace(cluster: tuple[Store, Controllers]) -> None:
    store, _ = cluster
    _node(store, "n")
    store.create(PODS, _pod("p", terminationGracePeriodSeconds=60), keep_status=True)
    wait_for(lambda: _phase(store, "p")[1] == "Running")
    obj, _ = delete_object(store, PODS, "default", "p", {"gracePeriodSeconds": 30})
    assert obj["metadata"]["deletionGracePeriodSeconds"] == 30
    obj, _ = delete_object(store, PODS, "default", "p", {"gracePeriodSeconds": 50})
    assert obj["metadata"]["deletionGracePeriodSeconds"] == 30  # not extended
    rv = obj["metadata"]["resourceVersion"]
    assert store.get(PODS, "default", "p")["metadata"]["resourceVersion"] == rv
    delete_object(store, PODS, "default", "p", {"gracePeriodSeconds": 0})  # force: gone now
    assert store.get_entry(PODS, "default", "p") is None


def test_pod_stop_s_caps_the_grace_period(cluster: tuple[Store, Controllers]) -> None:
    store, _ = cluster  # pod_stop_s=0.1 in the fixture
    _node(store, "n")
    store.create(PODS, _pod("p", terminationGracePeriodSeconds=60), keep_status=True)
    wait_for(lambda: _phase(store, "p")[2])
    delete_object(store, PODS, "default", "p", {})
    wait_for(lambda: store.get_entry(PODS, "default", "p") is None, 3)


def _template(labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}], **spec}}


def test_statefulset_creates_ordered_pods_and_scales_down_from_the_top(cluster: tuple[Store, Controllers]) -> None:
    store, _ = cluster
    _node(store, "n")
    sts_r = R.get("apps", "statefulsets")
    body = {"metadata": {"name": "db", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "db"}}, "template": _template({"app": "db"})}}
    on_create(sts_r, body)
    store.create(sts_r, body)
    wait_for(lambda: (store.get(sts_r, "default", "db").get("status") or {}).get("readyReplicas") == 3, 5)
    assert sorted(p["metadata"]["name"] for p in store.objs(PODS, "default")) == ["db-0", "db-1", "db-2"]
    store.mutate(sts_r, "default", "db", lambda o: o["spec"].update(replicas=1))
    wait_for(lambda: sorted(p["metadata"]["name"] for p in store.objs(PODS, "default")) == ["db-0"], 5)


def test_daemonset_runs_one_pod_per_fitting_node_even_cordoned(cluster: tuple[Store, Controllers]) -> None:
    store, _ = cluster
    _node(store, "a", unschedulable=True)
    _node(store, "b", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])
    _node(store, "c")
    ds_r = R.get("apps", "daemonsets")
    body = {"metadata": {"name": "agent", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": _template({"app": "agent"})}}
    on_create(ds_r, body)
    store.create(ds_r, body)

    def placed() -> list[str]:
        return sorted((p.get("spec") or {}).get("nodeName", "") for p in store.objs(PODS, "default"))
    wait_for(lambda: placed() == ["a", "c"], 5)  # cordon tolerated, foreign taint not
    wait_for(lambda: (store.get(ds_r, "default", "agent").get("status") or {}).get("numberReady") == 2, 5)
    _node(store, "d")
    wait_for(lambda: placed() == ["a", "c", "d"], 5)
