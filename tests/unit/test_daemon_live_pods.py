"""The daemon tells the Prometheus adapter which serving pods Kubernetes has, so a stale
series of a pod deleted during a Prometheus outage is dropped instead of blocking lending
(reliability finding 1)."""

from __future__ import annotations

from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from bridge.config import parse_config
from bridge.daemon import Daemon
from bridge.model import LoadSignals

T0 = 1_800_000_000.0


def test_observe_passes_the_pools_pods_to_prometheus() -> None:
    cfg = parse_config({"pools": [{"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m",
                                   "min_serving": 1, "cold_start_s": 3, "target": {"concurrency_per_replica": 60}}]})
    kube = FakeKube(now=T0)
    slurm = FakeSlurm(grace_s=5, now=T0)
    for n in ("gpu-node-01", "gpu-node-02"):
        kube.add_node(n, "default")
        slurm.add_node(n)
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=2)
    prom = FakeProm()
    prom.set("default", LoadSignals(T0, 10.0, 0.0, None, None, 2))
    daemon = Daemon(cfg, kube=kube, slurm=slurm, prom=prom, prom_pools={"default": PromPool("default", "m")},
                    clock=lambda: T0)
    daemon.observe(T0)
    assert prom.live_pods == {p.name for p in kube.pods("default")} and len(prom.live_pods) == 2
