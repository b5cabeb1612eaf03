"""The tick as one pass: each system read once, decisions as data (``reconcile``), applied by
the actuator only outside a dry run, chained by ``iterate`` while a pass changed something."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bridge.adapters.prom.types import PromPool
from bridge.adapters.protocols import PoolTarget
from bridge.config import parse_config
from bridge.daemon import Daemon
from bridge.model import LoadSignals, Phase
from bridge.reconcile import LoopState, reconcile
from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from gpu_bridge_lab.fakes.slurm import FakeSlurm

T0 = 1_767_225_600.0
NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")


class CountingSlurm(FakeSlurm):
    reads: Counter[str] = Counter()

    def nodes(self, names: Any = None) -> Any:
        self.reads["nodes"] += 1
        return super().nodes(names)

    def jobs(self, **kw: Any) -> Any:
        self.reads["jobs"] += 1
        return super().jobs(**kw)


class CountingProm(FakeProm):
    def current(self, pool: PromPool, **kw: Any) -> Any:
        self.queries = getattr(self, "queries", 0) + 1
        return super().current(pool, **kw)


def _daemon(*, dry_run: bool) -> tuple[Daemon, FakeKube, CountingSlurm, CountingProm]:
    cfg = parse_config({"pools": [{"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m",
                                   "min_serving": 1, "cold_start_s": 3}], "slurm": {"grace_s": 5}})
    kube = FakeKube(now=T0)
    slurm = CountingSlurm(grace_s=5, now=T0)
    slurm.reads = Counter()
    for n in NODES:
        kube.add_node(n, "default")
        slurm.add_node(n)
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=len(NODES), start_delay_s=0)
    prom = CountingProm()
    prom.set("default", LoadSignals(T0, running=1.0, waiting=0.0, kv_cache_usage_sum=None, tokens_per_s=None,
                                    replicas_reporting=len(NODES)))
    d = Daemon(cfg, kube=kube, slurm=slurm, prom=prom, prom_pools={"default": PromPool("default", "m")},
               clock=lambda: T0, dry_run=dry_run)
    return d, kube, slurm, prom


def test_a_pass_reads_each_system_once() -> None:
    d, kube, slurm, prom = _daemon(dry_run=False)
    result = d.tick()
    assert result.observed and result.more  # it adopted the nodes: the next pass comes at once
    assert slurm.reads == {"nodes": 1, "jobs": 1} and prom.queries == 1
    assert {n.phase for n in kube.nodes()} == {Phase.SERVING}


def test_iterate_chains_passes_until_nothing_changes() -> None:
    d, kube, slurm, prom = _daemon(dry_run=False)
    reads: list[float] = []
    read = d.observer.read
    d.observer.read = lambda now, since=None: reads.append(now) or read(now, since)  # type: ignore[method-assign]
    result = d.iterate()
    assert not result.more and len(reads) > 1 and prom.queries == len(reads)  # adopt, hold, drain, then nothing
    assert all(n.phase is Phase.SERVING for n in kube.nodes())


def test_a_dry_run_reconciles_the_same_and_writes_nothing() -> None:
    d, kube, slurm, prom = _daemon(dry_run=True)
    snapshot = d.observer.read(T0)
    intents = reconcile(snapshot, d.memory, d.config, LoopState())
    assert {s.value for s, _, _ in intents.steps} == {"adopt"}  # what a real run would do first
    result = d.iterate()
    assert result.observed and slurm.reads["nodes"] == 2  # one pass (and the read above)
    assert sum(kube.calls.values()) == 0 and slurm.writes == [] and {n.phase for n in kube.nodes()} == {None}
