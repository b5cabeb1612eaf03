"""A lend whose serving pod never goes (a PodDisruptionBudget refusing the eviction for
good) is abandoned after ``policy.lend_timeout_s``: the node serves again (phase, unfenced,
pod deletion cost restored, the Deployment's replica back), with a Warning Event and
``gpu_bridge_lend_failures_total``; nothing was ever given to Slurm."""

from __future__ import annotations

from bridge.config import parse_config
from bridge.errors import ConfigError
from bridge.lifecycle import LENDING_POD_DELETION_COST
from bridge.metrics import BridgeMetrics
from bridge.model import Phase
from tests.pdb_world import POOL, pdb_world


def test_a_lend_blocked_by_a_pdb_is_abandoned_and_the_node_serves_again() -> None:
    metrics = BridgeMetrics()
    w = pdb_world({"tick_s": 1000, "lend_timeout_s": 60}, metrics=metrics)  # operator lend only
    kube = w.kube
    w.start_stuck_lend()
    for _ in range(4 * 50):
        w.tick()
    assert kube.node("gpu-node-01").phase is Phase.LENDING  # still trying at 50 s
    assert kube.deployment("default").replicas == 2
    for _ in range(4 * 30):
        w.tick()
    node = kube.node("gpu-node-01")
    assert node.phase is Phase.SERVING and not node.fenced and not node.unschedulable
    assert "lend abandoned" in (node.reason or "")
    pods = [p for p in kube.pods("default") if p.node == "gpu-node-01"]
    assert len(pods) == 1 and pods[0].deletion_cost != LENDING_POD_DELETION_COST
    assert kube.deployment("default").replicas == 3  # its replica counted again
    warnings = [e for e in kube.events if e.node == "gpu-node-01" and e.event_type == "Warning"]
    assert [e.reason for e in warnings] == ["GpuBridgeLendAborted"]
    assert metrics.lend_failures.labels(pool="default", reason="pod_not_gone")._value.get() == 1
    # never released to Slurm: no research job ran there
    assert not any(j.state == "running" for j in w.slurm.snapshot().values() if j.partition == "preempt")
    evictions = kube.calls[("create", "pods/eviction")]
    for _ in range(4 * 60):  # and it stays put: no more eviction attempts
        w.tick()
    assert kube.calls[("create", "pods/eviction")] == evictions
    assert kube.node("gpu-node-01").phase is Phase.SERVING


def test_a_lend_timeout_shorter_than_a_drain_is_refused_by_name() -> None:
    try:
        parse_config({"pools": [dict(POOL, drain_s=90)], "policy": {"lend_timeout_s": 100}})
    except ConfigError as exc:
        text = str(exc)
    else:
        raise AssertionError("accepted")
    assert "policy.lend_timeout_s: must be > pools[0].drain_s + 20 s (110), got 100" in text
