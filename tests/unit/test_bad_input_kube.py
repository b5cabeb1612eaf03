"""Kubernetes objects with fields removed: the parsers never crash (an object without
metadata is refused with ValueError, which the informer logs and drops), a field every API
object has (name, uid, resourceVersion; a Deployment's spec.replicas) missing becomes the
snapshot's ``problem``, and the daemon holds that node (or the pool's nodes) and writes
nothing to it, while the same world with whole objects acts (the control)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import pytest

from bridge import wellknown as wk
from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from bridge.adapters.kube.objects import DeploymentInfo, parse_deployment, parse_node, parse_pod
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from bridge.adapters.slurm.cli import CliSlurm, CommandResult
from tests.slurm_text import sdiag
from bridge.config import default_config
from bridge.daemon import Daemon
from bridge.model import HoldReason, LoadSignals
from gpu_bridge_lab.sandbox.realkube.serving_model import node_object

NOW = 1_767_225_600.0
NODES = [f"gpu-node-0{i}" for i in range(1, 5)]


def full_node() -> dict[str, Any]:
    n = node_object("gpu-node-01", "default", 4, 1)
    # what a kubelet (kwok in the sandbox) adds: conditions and a complete NodeSystemInfo
    n["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                  "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    n["status"]["nodeInfo"] = {"architecture": "amd64", "bootID": "b1", "containerRuntimeVersion": "containerd://1.7.22",
                               "kernelVersion": "6.1.0", "kubeProxyVersion": "", "kubeletVersion": "v1.36.3",
                               "machineID": "m1", "operatingSystem": "linux", "osImage": "Debian GNU/Linux 12 (bookworm)",
                               "systemUUID": "s1"}
    n["metadata"].update(uid="uid-1", resourceVersion="17", creationTimestamp="2026-01-01T00:00:00Z")
    n["metadata"]["labels"][wk.LABEL_PHASE] = "serving"
    n["metadata"]["annotations"] = {wk.ANNOTATION_PHASE_SINCE: "1767139200.000", wk.ANNOTATION_REASON: "adopted"}
    n["spec"] = {"taints": [{"key": "x", "effect": "NoSchedule"}], "unschedulable": False}
    return n


def full_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "vllm-1", "namespace": "serving", "uid": "uid-p", "resourceVersion": "21",
                     "labels": {"app": "vllm"}, "annotations": {wk.POD_DELETION_COST: "0"}},
        "spec": {"nodeName": "gpu-node-01", "containers": [{"name": "vllm"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def full_deployment() -> dict[str, Any]:
    return {
        "metadata": {"name": "vllm", "namespace": "serving", "resourceVersion": "30", "generation": 2},
        "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "vllm"}}},
        "status": {"observedGeneration": 2, "replicas": 4, "readyReplicas": 4, "availableReplicas": 4, "updatedReplicas": 4},
    }


def key_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((*prefix, k))
            out += key_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += key_paths(v, (*prefix, i))
    return out


def without(obj: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    cur: Any = obj
    for p in path[:-1]:
        cur = cur[p]
    del cur[path[-1]]
    return obj


REQUIRED = {
    "node": {("metadata", "name"), ("metadata", "uid"), ("metadata", "resourceVersion"),
             ("metadata", "annotations"), ("metadata", "annotations", wk.ANNOTATION_PHASE_SINCE)},
    "pod": {("metadata", "name"), ("metadata", "namespace"), ("metadata", "uid"), ("metadata", "resourceVersion")},
    "deployment": {("metadata", "name"), ("metadata", "namespace"), ("metadata", "resourceVersion"), ("spec",),
                   ("spec", "replicas")},
}
PARSERS = {"node": (full_node, parse_node), "pod": (full_pod, lambda o: parse_pod(o, "default")),
           "deployment": (full_deployment, parse_deployment)}
CASES = [(kind, path) for kind, (make, _p) in PARSERS.items() for path in key_paths(make())]


def test_whole_objects_have_no_problem() -> None:
    for kind, (make, parse) in PARSERS.items():
        assert parse(make()).problem is None, kind


@pytest.mark.parametrize(("kind", "path"), CASES, ids=[f"{k}:{'.'.join(map(str, p))}" for k, p in CASES])
def test_field_removed(kind: str, path: tuple[Any, ...]) -> None:
    make, parse = PARSERS[kind]
    obj = without(make(), path)
    if path == ("metadata",):
        with pytest.raises(ValueError, match="without metadata"):
            parse(obj)
        return
    snap = parse(obj)  # never any other exception
    if path in REQUIRED[kind]:
        assert snap.problem, f"{kind} without {'.'.join(map(str, path))} has no problem"
        leaf = {"spec": "replicas", "annotations": wk.ANNOTATION_PHASE_SINCE}.get(str(path[-1]), str(path[-1]))
        assert leaf in snap.problem, snap.problem


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [("node", ("metadata", "labels"), ["not", "a", "map"]), ("node", ("spec", "taints"), "NoSchedule"),
     ("node", ("spec", "taints"), [None, 3, "x"]), ("node", ("status", "conditions"), [None, "Ready"]),
     ("node", ("status", "allocatable"), None), ("node", ("metadata", "resourceVersion"), 17),
     ("pod", ("status", "conditions"), "True"), ("pod", ("metadata", "annotations"), "cost=1"),
     ("deployment", ("spec", "replicas"), "four"), ("deployment", ("spec", "replicas"), -1),
     ("deployment", ("spec", "replicas"), True), ("deployment", ("spec", "selector"), "app=vllm")],
)
def test_wrong_types_never_crash(kind: str, path: tuple[Any, ...], value: Any) -> None:
    make, parse = PARSERS[kind]
    obj = make()
    cur: Any = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    try:
        snap = parse(obj)
    except (ValueError, TypeError) as exc:  # refused whole: the informer logs and drops it
        assert str(exc)
        return
    if kind == "deployment" and path[-1] == "replicas":
        assert snap.problem and "spec.replicas" in snap.problem


# --- through the daemon -------------------------------------------------------------------------

def sinfo(nodes: Sequence[str]) -> str:
    return json.dumps({"meta": {}, "errors": [], "nodes": [
        {"name": n, "state": "allocated", "state_flags": ["DRAIN"], "reason": "gpu-bridge: serving (pool default)",
         "gres": "gpu:4", "partitions": ["preempt", "gpu-bridge"]} for n in nodes]})


def squeue(nodes: Sequence[str]) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": [
        {"job_id": 100 + i, "name": wk.SLURM_HOLD_JOB_PREFIX + n, "user_name": "root", "partition": "gpu-bridge",
         "job_state": "RUNNING", "nodes": n, "start_time": int(NOW - 3600)} for i, n in enumerate(nodes)]})


class Runner:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append(list(argv))
        if list(argv) == ["sinfo", "--json", "--Node"]:
            return CommandResult(0, sinfo(NODES), "")
        if list(argv) == ["squeue", "--json"]:
            return CommandResult(0, squeue(NODES), "")
        if list(argv) == ["sdiag"]:
            return CommandResult(*sdiag(1_800_000_000.0))
        return CommandResult(0, "901\n" if argv[0] == "sbatch" else "", "")

    def writes(self) -> list[list[str]]:
        return [c for c in self.calls if c[1:2] != ["--json"] and c != ["sdiag"]]


class BrokenDeploymentKube(FakeKube):
    """FakeKube whose watch cache holds a Deployment with a field removed."""

    remove: tuple[str, ...] = ()

    def deployment(self, pool: str) -> DeploymentInfo | None:
        good = super().deployment(pool)
        assert good is not None
        obj = {"metadata": {"name": good.name, "namespace": good.namespace, "resourceVersion": good.resource_version},
               "spec": {"replicas": good.replicas}, "status": {"readyReplicas": good.ready_replicas}}
        return parse_deployment(without(obj, self.remove)) if self.remove else parse_deployment(obj)


def world(kube: FakeKube | None = None, *, unadopted: str = "gpu-node-04") -> tuple[Daemon, FakeKube, Runner]:
    kube = kube or FakeKube(now=NOW)
    for n in NODES:
        if n == unadopted:
            kube.add_node(n, "default")
        else:
            kube.add_node(n, "default", labels={wk.LABEL_PHASE: "serving"},
                          annotations={wk.ANNOTATION_PHASE_SINCE: f"{NOW - 86400:.3f}"})
    kube.add_pool(PoolTarget("default", "default", "vllm"), replicas=len(NODES))
    kube.calls.clear()
    prom = FakeProm()
    prom.set("default", LoadSignals(t=NOW, running=3.5 * 24, waiting=0.0, kv_cache_usage_sum=0.4, tokens_per_s=None,
                                    replicas_reporting=len(NODES)))
    runner = Runner()
    d = Daemon(default_config(min_serving=1), kube=kube, slurm=CliSlurm(runner=runner), prom=prom,
               prom_pools={"default": PromPool("default", "default")}, clock=lambda: NOW)
    return d, kube, runner


def delivered(kube: FakeKube, obj: dict[str, Any]) -> None:
    """A malformed object as a watch delivers it: with a new resourceVersion when it has one (the
    fake, like the real adapter's informers, parses an object once per version)."""
    if "resourceVersion" in obj["metadata"]:
        kube._bump(obj)


def snapshot(kube: FakeKube) -> tuple[dict[str, Any], dict[str, Any]]:
    return copy.deepcopy(kube._nodes), copy.deepcopy(kube._pods)


def test_control_the_unadopted_node_is_adopted() -> None:
    d, kube, _runner = world()
    assert d.iterate().observed
    assert kube.node("gpu-node-04").phase is not None  # type: ignore[union-attr]
    assert kube.calls[("patch", "nodes")] >= 1


@pytest.mark.parametrize("field", ["name", "uid", "resourceVersion"])
@pytest.mark.parametrize("node", ["gpu-node-02", "gpu-node-04"], ids=["serving", "unadopted"])
def test_node_missing_a_field_is_held_and_never_written(field: str, node: str) -> None:
    d, kube, runner = world()
    if field == "name":  # the watch cache keys objects by name: the snapshot keeps its key
        kube._nodes[node]["metadata"]["name"] = ""
    else:
        del kube._nodes[node]["metadata"][field]
    delivered(kube, kube._nodes[node])
    before = copy.deepcopy(kube._nodes[node])
    pods_before = {k: copy.deepcopy(v) for k, v in kube._pods.items() if v["spec"].get("nodeName") == node}
    for _ in range(2):
        d.iterate()
    assert kube._nodes[node] == before, "the node was written"
    assert {k: v for k, v in kube._pods.items() if v["spec"].get("nodeName") == node} == pods_before
    assert not [e for e in kube.events if e.node == node]
    assert not [c for c in runner.writes() if any(node in a for a in c)]
    if field != "name":
        plan = d.ledger.last_plan
        assert plan is not None and plan.hold_reasons.get(node) == HoldReason.PROBLEM
        assert field in plan.held[node]


@pytest.mark.parametrize("field", ["name", "namespace", "uid", "resourceVersion"])
def test_pod_missing_a_field_holds_its_node(field: str) -> None:
    d, kube, runner = world()
    pod = next(k for k, v in kube._pods.items() if v["spec"].get("nodeName") == "gpu-node-02")
    del kube._pods[pod]["metadata"][field]
    delivered(kube, kube._pods[pod])
    nodes_before, pods_before = snapshot(kube)
    d.iterate()
    plan = d.ledger.last_plan
    assert plan is not None and plan.hold_reasons.get("gpu-node-02") == HoldReason.PROBLEM
    assert f"metadata.{field}" in plan.held["gpu-node-02"]
    assert kube._nodes["gpu-node-02"] == nodes_before["gpu-node-02"] and kube._pods[pod] == pods_before[pod]


@pytest.mark.parametrize("remove", [("spec", "replicas"), ("spec",), ("metadata", "resourceVersion")])
def test_deployment_missing_a_field_holds_every_node_of_the_pool(remove: tuple[str, ...]) -> None:
    kube = BrokenDeploymentKube(now=NOW)
    kube.remove = remove
    d, kube, runner = world(kube, unadopted="")
    nodes_before, pods_before = snapshot(kube)
    for _ in range(2):
        d.iterate()
    plan = d.ledger.last_plan
    assert plan is not None and set(plan.hold_reasons) == set(NODES)
    assert all("deployment default/vllm" in why for why in plan.held.values())
    assert not plan.actions
    assert (kube._nodes, kube._pods) == (nodes_before, pods_before)
    assert kube.calls[("update", "deployments/scale")] == 0 and runner.writes() == []


@pytest.mark.parametrize("raw", ["1767139200000", "1e300", "253402300800"])
def test_a_phase_since_beyond_any_date_is_a_problem_not_a_crash(raw: str) -> None:
    """A hand-edited phase-since in milliseconds (``date +%s%3N``) or 1e300 was taken: finite and
    >= 0. ``gpu-bridge status`` and the web view then raised ValueError ('year 57976 is out of
    range') on every call, and the node's timeouts (``now - since``) could never expire."""
    n = full_node()
    n["metadata"]["annotations"][wk.ANNOTATION_PHASE_SINCE] = raw
    info = parse_node(n)
    assert info.phase_since is None
    assert info.problem is not None and f"annotation {wk.ANNOTATION_PHASE_SINCE}: expected unix seconds" in info.problem
    assert raw in info.problem


def test_status_rows_and_the_web_view_survive_such_a_node() -> None:
    from bridge.cli.daemon import status_rows
    from tests.unit.test_web_app import T0, site
    from starlette.testclient import TestClient
    from bridge.model import Phase
    from bridge.web.app import build_app

    s = site()
    s.kube.set_phase("gpu-node-03", Phase.LENT, "hand-edited", 1.8e12)  # milliseconds
    rows = {r["node"]: r for r in status_rows(s.source._daemon.observe(T0))}
    assert rows["gpu-node-03"]["problem"] and "phase-since" in rows["gpu-node-03"]["problem"]
    with TestClient(build_app(s.source)) as c:
        r = c.get("/pool")
        assert r.status_code == 200 and "held: " in r.text


def test_a_phase_since_far_in_the_future_holds_the_node_with_the_reason() -> None:
    """A hand-edited phase-since a year ahead (a wrong year) is a date, so it parses; every
    timeout of the phase counts from it and would never expire ('lent for -31536000 s'). The
    node is held, saying why; an hour of clock skew between two daemons is not."""
    from tests.unit.test_web_app import T0, site
    from bridge.model import Phase

    s = site()
    s.kube.set_phase("gpu-node-03", Phase.LENT, "hand-edited", T0 + 365 * 86400)
    s.kube.set_phase("gpu-node-02", Phase.SERVING, "skewed clock", T0 + 1800)
    nodes = {n.name: n for n in s.source._daemon.observe(T0).view.nodes}
    assert nodes["gpu-node-03"].problem == (f"annotation {wk.ANNOTATION_PHASE_SINCE}: {T0 + 365 * 86400:.0f} is "
                                            f"{365 * 86400} s in the future; the phase's timeouts count from it")
    assert nodes["gpu-node-02"].problem is None
