"""A three-node fake site whose PodDisruptionBudget allows no disruption, driven in 0.25 s
iterations: the lend of gpu-node-01 gets stuck because the ReplicaSet removes another
node's pod. Shared by the eviction-backoff and lend-timeout tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from bridge.config import parse_config
from bridge.daemon import Daemon
from bridge.lifecycle import LENDING_POD_DELETION_COST
from bridge.model import LoadSignals

NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
T0 = 1_800_000_000.0
POOL = {"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m", "min_serving": 1,
        "cold_start_s": 3, "drain_s": 5, "target": {"concurrency_per_replica": 60}}


@dataclass
class PdbWorld:
    kube: FakeKube
    slurm: FakeSlurm
    prom: FakeProm
    daemon: Daemon
    t: list[float]

    def tick(self) -> None:
        self.kube.step(self.t[0])
        self.slurm.advance(0.25)
        self.prom.set("default", LoadSignals(self.t[0], running=100.0, waiting=0.0, kv_cache_usage_sum=None,
                                             tokens_per_s=None, replicas_reporting=3))
        self.daemon.iterate()
        self.t[0] += 0.25

    def start_stuck_lend(self) -> None:
        """An operator lends gpu-node-01, but the ReplicaSet removes gpu-node-02's pod (its
        deletion cost is lower): the lending node keeps its pod and evicting it is refused."""
        self.tick()
        victim = next(p for p in self.kube.pods("default") if p.node == "gpu-node-02")
        self.kube.set_pod_deletion_cost("serving", victim.name, LENDING_POD_DELETION_COST - 1)
        self.kube.set_request("gpu-node-01", "lend")


def pdb_world(policy: Mapping[str, Any], *, metrics: Any = None) -> PdbWorld:
    cfg = parse_config({"pools": [POOL], "slurm": {"grace_s": 5}, "policy": dict(policy)})
    t = [T0]
    kube = FakeKube(now=T0)
    slurm = FakeSlurm(grace_s=5, now=T0)
    for n in NODES:
        kube.add_node(n, "default")
        slurm.add_node(n)
    # a PDB that allows no disruption at all: every replica must stay available
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=3, min_available=3, start_delay_s=0)
    prom = FakeProm()
    daemon = Daemon(cfg, kube=kube, slurm=slurm, prom=prom, prom_pools={"default": PromPool("default", "m")},
                    metrics=metrics, clock=lambda: t[0])
    return PdbWorld(kube, slurm, prom, daemon, t)
