"""A query outage is recounted, not charged: while Prometheus answers nothing the governor counts
the gap conservatively (every minute with something lent is a violation); once it answers
again, the samples it kept through the gap are read once (``Observer.read``'s ``since``) and
the memory takes them in order, so the count of the gap becomes the real one. A gap Prometheus
did not scrape (it was down) stays counted conservatively."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from bridge.config import parse_config
from bridge.daemon import Daemon
from bridge.model import LoadSignals
from bridge.observer import Observer
from bridge.simulate.baselines import BridgeController
from bridge.simulate.engine import Setup, simulate
from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from test_governor import NODES, config, workload

T0 = 1_800_000_000.0
POOL = PromPool("default", "m")


def sample(t: float, running: float = 30.0) -> LoadSignals:
    return LoadSignals(t, running=running, waiting=0.0, kv_cache_usage_sum=None, tokens_per_s=None, replicas_reporting=2)


def cluster() -> tuple[object, FakeKube, FakeSlurm, FakeProm]:
    cfg = parse_config({
        "pools": [{"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m",
                   "min_serving": 1, "cold_start_s": 3, "target": {"concurrency_per_replica": 60}}],
        "slurm": {"grace_s": 5},
    })
    kube = FakeKube(now=T0)
    for n in ("gpu-node-01", "gpu-node-02"):
        kube.add_node(n, "default")
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=2, min_available=1, start_delay_s=0)
    kube.step(T0 + 1)
    slurm = FakeSlurm(grace_s=5, now=T0)
    for n in ("gpu-node-01", "gpu-node-02"):
        slurm.add_node(n)
    return cfg, kube, slurm, FakeProm()


class CountingProm(FakeProm):
    ranges: int = 0

    def history(self, pool: PromPool, *, start: float, end: float, step_s: float) -> tuple[LoadSignals, ...]:
        self.ranges += 1
        return super().history(pool, start=start, end=end, step_s=step_s)


def test_a_reading_after_a_gap_brings_the_samples_prometheus_kept_and_only_then() -> None:
    cfg, kube, slurm, _ = cluster()
    prom = CountingProm()
    prom.set("default", sample(T0 + 600))
    prom.histories["default"] = tuple(sample(T0 + k * 30.0) for k in range(0, 21))  # T0 .. T0 + 600
    obs = Observer(cfg, kube, slurm, prom, {"default": POOL})  # type: ignore[arg-type]

    got = obs.read(T0 + 600, since={"default": T0}).readings["default"]
    assert got.current is not None and got.current.t == T0 + 600
    # strictly between the memory's newest sample and the new one, oldest first
    assert [s.t for s in got.recovered] == [T0 + k * 30.0 for k in range(1, 20)]
    assert prom.ranges == 1

    # a late tick (two ticks or less) is not a gap: no range query
    assert obs.read(T0 + 600, since={"default": T0 + 540}).readings["default"].recovered == ()
    # a pool the memory has no sample of yet, or no ``since`` at all: nothing to recount
    assert obs.read(T0 + 600).readings["default"].recovered == ()
    assert obs.read(T0 + 600, since={"default": float("-inf")}).readings["default"].recovered == ()
    assert prom.ranges == 1


def test_a_failed_range_read_keeps_the_current_sample_and_the_conservative_count() -> None:
    cfg, kube, slurm, prom = cluster()

    class RangeDown(FakeProm):
        def history(self, pool: PromPool, *, start: float, end: float, step_s: float) -> tuple[LoadSignals, ...]:
            from bridge.errors import AdapterError

            raise AdapterError("prometheus", "query_range failed: injected")

    down = RangeDown()
    down.set("default", sample(T0 + 600))
    got = Observer(cfg, kube, slurm, down, {"default": POOL}).read(T0 + 600, since={"default": T0})  # type: ignore[arg-type]
    assert got.readings["default"].current is not None
    assert got.readings["default"].recovered == ()
    assert got.errors == ()


def test_the_daemon_feeds_the_recovered_samples_to_its_memory_in_order() -> None:
    cfg, kube, slurm, prom = cluster()
    prom.set("default", sample(T0 + 1))
    now = [T0 + 1]
    daemon = Daemon(cfg, kube=kube, slurm=slurm, prom=prom, prom_pools={"default": POOL}, clock=lambda: now[0])
    daemon.tick()
    mem = daemon.memory["default"]
    assert mem.last_t == T0 + 1
    # an hour without an answer, then Prometheus answers again and kept its scrapes
    prom.histories["default"] = tuple(sample(T0 + 1 + k * 30.0, running=90.0) for k in range(1, 120))
    prom.set("default", sample(T0 + 3601))
    now[0] = T0 + 3601
    daemon.tick()
    assert mem.last_t == T0 + 3601
    assert mem.calibrator is not None
    demand, _ = mem.calibrator.arrays(T0 + 3601)
    # every minute of the gap has its sample (none is a gap to the governor any more)
    assert np.isfinite(demand[-60:]).all()


@pytest.mark.parametrize("recorded", [True, False], ids=["prometheus-kept-the-gap", "prometheus-was-down"])
def test_the_simulated_gap_is_recounted_only_when_prometheus_kept_it(recorded: bool) -> None:
    """A calm pool lends most nodes, then its signals go for two hours: counted blind, the
    governor charges the gap's minutes and holds lending; recounted, it charges what happened."""
    minutes = 8 * 60
    load = np.full(minutes, 1.0)
    w = workload(np.concatenate(([4.0], load[1:])))
    gaps = ((float(3 * 3600), float(5 * 3600)),)
    c = config(0.08, w.duration_s)
    setup = Setup(c, w, NODES, 4, seed=1, signal_gaps=gaps, signal_gaps_recorded=recorded)
    ctl = BridgeController(setup)
    r = simulate(setup, ctl)
    avoidable = int((w.load[r.violation_minutes] <= NODES + 1e-9).sum())
    spent = ctl.governors[-1].spent_min
    assert spent >= avoidable  # the count never misses a violation
    if recorded:
        assert spent == avoidable == 0
    else:
        assert spent >= 10  # the blind minutes, until the governor itself took the nodes back
    blind = dataclasses.replace(setup, signal_gaps_recorded=False)
    assert r.metrics.lent_gpu_hours >= simulate(blind, BridgeController(blind)).metrics.lent_gpu_hours
