"""The loop chains lifecycle steps within one iteration only after a real write. A step that
wrote nothing (a PDB-blocked eviction, a drain that was a no-op) was repeated
MAX_CHAINED_STEPS times per iteration: ~50 evictions a second against a PDB in the sandbox
(found by scripts/reliability.py)."""

from __future__ import annotations

from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from bridge.config import parse_config
from bridge.daemon import MAX_CHAINED_STEPS, Daemon
from bridge.model import LoadSignals

NODES = ("gpu-node-01", "gpu-node-02")
T0 = 1_800_000_000.0


class NoopDrainSlurm(FakeSlurm):
    """A Slurm whose drain never takes (and says so): the step writes nothing."""

    drain_calls = 0

    def drain(self, node: str, reason: str) -> bool:
        self.drain_calls += 1
        return False


def test_a_step_that_wrote_nothing_is_not_chained() -> None:
    cfg = parse_config({
        "pools": [{"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m",
                   "min_serving": 1, "cold_start_s": 3, "target": {"concurrency_per_replica": 60}}],
        "slurm": {"grace_s": 5},
    })
    kube = FakeKube(now=T0)
    for n in NODES:
        kube.add_node(n, "default")
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=len(NODES), min_available=1, start_delay_s=0)
    kube.step(T0 + 1)
    slurm = NoopDrainSlurm(grace_s=5, now=T0)
    for n in NODES:
        slurm.add_node(n)
    prom = FakeProm()
    prom.set("default", LoadSignals(T0 + 1, running=100.0, waiting=0.0, kv_cache_usage_sum=None, tokens_per_s=None,
                                    replicas_reporting=len(NODES)))
    daemon = Daemon(cfg, kube=kube, slurm=slurm, prom=prom, prom_pools={"default": PromPool("default", "m")},
                    clock=lambda: T0 + 1)
    daemon.iterate()  # adopts both nodes (a write), then tries ENSURE_DRAINED, which writes nothing
    assert 1 <= slurm.drain_calls <= 2 * len(NODES) < MAX_CHAINED_STEPS * len(NODES)
