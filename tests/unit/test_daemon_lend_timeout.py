"""A lend whose serving pod never goes (a PodDisruptionBudget refusing the eviction for
good) is abandoned after ``policy.lend_timeout_s``: the node serves again (phase, unfenced,
pod deletion cost restored, the Deployment's replica back), with a Warning Event and
``gpu_bridge_lend_failures_total``; nothing was ever given to Slurm."""

from __future__ import annotations

from bridge.adapters.fakes import FakeKube, FakeProm
from bridge.adapters.kube.protocol import PoolTarget
from bridge.adapters.prom import PromPool
from bridge.adapters.slurm.fake import FakeSlurm
from bridge.config import parse_config
from bridge.daemon import Daemon
from bridge.errors import ConfigError
from bridge.lifecycle import LENDING_POD_DELETION_COST
from bridge.metrics import BridgeMetrics
from bridge.model import LoadSignals, Phase

NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
T0 = 1_800_000_000.0
POOL = {"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m", "min_serving": 1,
        "cold_start_s": 3, "drain_s": 5, "target": {"concurrency_per_replica": 60}}


def test_a_lend_blocked_by_a_pdb_is_abandoned_and_the_node_serves_again() -> None:
    cfg = parse_config({
        "pools": [POOL],
        "slurm": {"grace_s": 5},
        "policy": {"tick_s": 1000, "lend_timeout_s": 60},  # the policy stays out: operator lend only
    })
    t = [T0]
    kube = FakeKube(now=T0)
    for n in NODES:
        kube.add_node(n, "default")
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=3, min_available=3, start_delay_s=0)
    slurm = FakeSlurm(grace_s=5, now=T0)
    for n in NODES:
        slurm.add_node(n)
    prom = FakeProm()
    metrics = BridgeMetrics()
    daemon = Daemon(cfg, kube=kube, slurm=slurm, prom=prom, prom_pools={"default": PromPool("default", "m")},
                    metrics=metrics, clock=lambda: t[0])

    def tick() -> None:
        kube.step(t[0])
        slurm.advance(0.25)
        prom.set("default", LoadSignals(t[0], running=100.0, waiting=0.0, kv_cache_usage_sum=None,
                                        tokens_per_s=None, replicas_reporting=3))
        daemon.tick()
        t[0] += 0.25

    tick()
    # the ReplicaSet removes another node's pod, and the PDB refuses evicting the lending one
    victim = next(p for p in kube.pods("default") if p.node == "gpu-node-02")
    kube.set_pod_deletion_cost("serving", victim.name, LENDING_POD_DELETION_COST - 1)
    kube.set_request("gpu-node-01", "lend")
    for _ in range(4 * 50):
        tick()
    assert kube.node("gpu-node-01").phase is Phase.LENDING  # still trying at 50 s
    assert kube.deployment("default").replicas == 2
    for _ in range(4 * 30):
        tick()
    node = kube.node("gpu-node-01")
    assert node.phase is Phase.SERVING and not node.fenced and not node.unschedulable
    assert "lend abandoned" in (node.reason or "")
    pods = [p for p in kube.pods("default") if p.node == "gpu-node-01"]
    assert len(pods) == 1 and pods[0].deletion_cost != LENDING_POD_DELETION_COST
    assert kube.deployment("default").replicas == 3  # its replica counted again
    warnings = [e for e in kube.events if e.node == "gpu-node-01" and e.event_type == "Warning"]
    assert [e.reason for e in warnings] == ["GpuBridgeLendAborted"]
    assert metrics.lend_failures.labels(pool="default", reason="pod_not_gone")._value.get() == 1
    # never released to Slurm: our drain and hold stay, no research job ran there
    snap = slurm.snapshot()
    assert not any(j.state == "running" for j in snap.values() if j.partition == "preempt")
    evictions = kube.calls[("create", "pods/eviction")]
    for _ in range(4 * 60):  # and it stays put: no more eviction attempts
        tick()
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
