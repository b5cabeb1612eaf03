"""The daemon's loop with two pools over one Slurm cluster (nodes 01-02 serve pool "a", 03-04
pool "b"), against the in-memory fakes: what one pool's trouble must not do to the other,
and the lend order by in-flight requests that the adapter reads per pod."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from bridge.config import Config, parse_config
from bridge.daemon import Daemon
from bridge.model import LoadSignals, Phase

T0 = 1_800_000_000.0
POOLS = {"a": ("gpu-node-01", "gpu-node-02"), "b": ("gpu-node-03", "gpu-node-04")}


def config(pools: Mapping[str, tuple[str, ...]]) -> Config:
    return parse_config(
        {
            "pools": [{"name": name, "namespace": "serving", "deployment": f"vllm-{name}", "model_name": f"m-{name}",
                       "min_serving": 1, "cold_start_s": 3, "drain_s": 2, "headroom": 0.2, "headroom_replicas": 0.2,
                       "target": {"concurrency_per_replica": 60, "kv_cache_usage": None}} for name in pools],
            "slurm": {"grace_s": 5, "min_runtime_s": 0},
            "policy": {"tick_s": 1, "scale_down_window_s": 5, "min_lend_s": 3, "max_lends_per_tick": 1,
                       "signal_max_age_s": 10, "blind_after_s": 30,
                       "forecast": {"margin_s": 1, "burst_window_s": 5, "trend_window_s": 10, "compare_window_s": 10},
                       # seconds-scale fake world: the headroom floors, no week-long calibration
                       "calibration": {"enabled": False}},
            "prometheus": {"scrape_interval_s": 1, "step_s": 1},
        }
    )


class World:
    def __init__(self, pools: Mapping[str, tuple[str, ...]], *, unknown_to_slurm: tuple[str, ...] = ()) -> None:
        self.t = T0
        self.pools = pools
        self.kube = FakeKube(now=self.t)
        self.slurm = FakeSlurm(grace_s=5, now=self.t)
        for pool, nodes in pools.items():
            for n in nodes:
                self.kube.add_node(n, pool)
                if n not in unknown_to_slurm:
                    self.slurm.add_node(n)
            self.kube.add_pool(PoolTarget(pool, "serving", f"vllm-{pool}"), replicas=len(nodes), min_available=1,
                               start_delay_s=1, grace_s=1)
        self.prom = FakeProm()
        self.inflight: Callable[[str, str], float] = lambda pool, pod: 0.0
        self.config = config(pools)
        self.daemon = Daemon(self.config, kube=self.kube, slurm=self.slurm, prom=self.prom,
                             prom_pools={p: PromPool(p, f"m-{p}") for p in pools}, clock=lambda: self.t)

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.t += 1.0
            self.kube.step(self.t)
            self.slurm.advance(1.0)
            for pool in self.pools:
                ready = [p for p in self.kube.pods(pool) if p.ready and not p.terminating]
                per_pod = {p.name: self.inflight(pool, p.name) for p in ready}
                self.prom.set(pool, LoadSignals(self.t, running=sum(per_pod.values()), waiting=0.0, kv_cache_usage_sum=None,
                                                tokens_per_s=None, replicas_reporting=len(ready)), inflight_by_pod=per_pod)
            self.daemon.iterate()

    def phase(self, node: str) -> Phase | None:
        return self.kube.node(node).phase

    def run_until(self, cond: Callable[[], bool], limit: int, what: str) -> None:
        for _ in range(limit):
            if cond():
                return
            self.tick()
        raise AssertionError(f"not {what} after {limit} ticks: {[(n.name, n.phase) for n in self.kube.nodes()]}")


def test_a_problem_node_in_one_pool_does_not_stop_scaling_in_the_other() -> None:
    # gpu-node-04 is unknown to Slurm: pool b holds its Deployment's scale, pool a must not care
    w = World(POOLS, unknown_to_slurm=("gpu-node-04",))
    w.run_until(lambda: Phase.LENT in (w.phase("gpu-node-01"), w.phase("gpu-node-02")), 40, "a node of pool a lent")
    lent = next(n for n in POOLS["a"] if w.phase(n) is Phase.LENT)
    assert not [p for p in w.kube.pods("a") if p.node == lent]
    assert w.kube.deployment("a").replicas == 1
    assert w.phase("gpu-node-04") in (None, Phase.SERVING)  # held where it was
    # and the other way round: a lent node of pool a comes back with its replica
    w.inflight = lambda pool, pod: 100.0 if pool == "a" else 0.0
    w.run_until(lambda: all(w.phase(n) is Phase.SERVING for n in POOLS["a"]), 60, "pool a all serving again")
    w.run_until(lambda: sum(p.ready for p in w.kube.pods("a")) == 2, 20, "pool a's replicas Ready")


def test_the_serving_node_with_the_least_inflight_work_is_lent_first() -> None:
    nodes = tuple(f"gpu-node-{i:02d}" for i in range(1, 5))
    w = World({"a": nodes})
    pod_node = {p.name: p.node for p in w.kube.pods("a")}
    busy = {"gpu-node-01": 9.0, "gpu-node-02": 7.0, "gpu-node-03": 1.0, "gpu-node-04": 4.0}  # 21 requests: 1 replica
    w.inflight = lambda pool, pod: busy.get(pod_node.get(pod, ""), 0.0)
    w.run_until(lambda: any(w.phase(n) is not Phase.SERVING and w.phase(n) is not None for n in nodes), 40, "a lend started")
    started = [n for n in nodes if w.phase(n) not in (None, Phase.SERVING)]
    assert started == ["gpu-node-03"]
    view = w.daemon.ledger.last_observation.view
    assert {n.name: n.inflight for n in view.nodes}["gpu-node-01"] == 9.0
