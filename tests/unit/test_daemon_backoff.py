"""A step something outside us refuses for long (a PDB that never allows the eviction) is
retried with exponential backoff and a warning per attempt, not every 0.25 s iteration
(reliability finding: 4 evictions a second against a PDB, forever, silently)."""

from __future__ import annotations

from bridge.adapters.fakes import FakeKube, FakeProm
from bridge.adapters.kube.protocol import PoolTarget
from bridge.adapters.prom import PromPool
from bridge.adapters.slurm.fake import FakeSlurm
from bridge.config import parse_config
from bridge.daemon import MAX_RETRY_BACKOFF_S, Daemon
from bridge.lifecycle import LENDING_POD_DELETION_COST
from bridge.model import LoadSignals, Phase

NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
T0 = 1_800_000_000.0


def test_blocked_eviction_backs_off_exponentially() -> None:
    cfg = parse_config({
        "pools": [{"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m",
                   "min_serving": 1, "cold_start_s": 3, "target": {"concurrency_per_replica": 60}}],
        "slurm": {"grace_s": 5},
        "policy": {"tick_s": 1000},  # the policy stays out of it: this is the lifecycle's retry
    })
    t = [T0]
    kube = FakeKube(now=T0)
    for n in NODES:
        kube.add_node(n, "default")
    # a PDB that allows no disruption at all: every replica must stay available
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=3, min_available=3, start_delay_s=0)
    slurm = FakeSlurm(grace_s=5, now=T0)
    for n in NODES:
        slurm.add_node(n)
    prom = FakeProm()
    daemon = Daemon(cfg, kube=kube, slurm=slurm, prom=prom, prom_pools={"default": PromPool("default", "m")},
                    clock=lambda: t[0])

    def tick() -> None:
        kube.step(t[0])
        slurm.advance(0.25)
        prom.set("default", LoadSignals(t[0], running=100.0, waiting=0.0, kv_cache_usage_sum=None,
                                        tokens_per_s=None, replicas_reporting=3))
        daemon.tick()
        t[0] += 0.25

    tick()
    # an operator lends gpu-node-01, but the ReplicaSet removes another node's pod (as when
    # its deletion cost was lower): the lending node keeps its pod, and evicting it is refused
    victim = next(p for p in kube.pods("default") if p.node == "gpu-node-02")
    kube.set_pod_deletion_cost("serving", victim.name, LENDING_POD_DELETION_COST - 1)
    kube.set_request("gpu-node-01", "lend")
    for _ in range(4 * 60):  # one minute of 0.25 s iterations
        tick()
    assert kube.node("gpu-node-01").phase is Phase.LENDING  # never released while its pod is there
    evictions = kube.calls[("create", "pods/eviction")]
    # evict_after_s (20 s) then tries at +1, +2, +4, +8, +16 s...: a handful, not 4 a second
    assert 1 <= evictions <= 7, evictions
    assert MAX_RETRY_BACKOFF_S == 60.0
    assert not any(j.state == "running" for j in slurm.snapshot().values() if j.partition == "preempt")
