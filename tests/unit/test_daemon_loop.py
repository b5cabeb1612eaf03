"""The daemon's loop (observe -> plan -> act) over honest in-memory fakes of Kubernetes,
Slurm and Prometheus, with a fake clock: lend, reclaim with requeue, restarts at any tick,
operators' requests, a node that never gets Ready, Slurm down. Fast; the same scenarios run
against the real sandbox in tests/integration/test_e2e_lend_reclaim.py."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from bridge import wellknown as wk
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from bridge.config import Config, parse_config
from bridge.daemon import Daemon
from bridge.wiring import policy_memory
from bridge.errors import AdapterError
from bridge.model import LoadSignals, Phase

NODES = tuple(f"gpu-node-{i:02d}" for i in range(1, 5))
POOL = PoolTarget("default", "serving", "vllm")
T0 = 1_800_000_000.0
LOW, HIGH = 10.0, 400.0  # requests running+waiting: ~0.2 and ~7 replicas at 60 per replica


def config(**policy: object) -> Config:
    return parse_config(
        {
            "pools": [{"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m",
                       "min_serving": 1, "cold_start_s": 3, "drain_s": 2, "headroom": 0.2, "headroom_replicas": 0.2,
                       "target": {"concurrency_per_replica": 60, "kv_cache_usage": None}}],
            "slurm": {"grace_s": 5, "min_runtime_s": 0},
            "policy": {"tick_s": 1, "scale_down_window_s": 5, "min_lend_s": 3, "max_lends_per_tick": 1,
                       "signal_max_age_s": 10, "blind_after_s": 30,
                       "forecast": {"margin_s": 1, "burst_window_s": 5, "trend_window_s": 10,
                                    "compare_window_s": 10, "burst_history_s": 86400, "lend_lookback_s": 10},
                       # seconds-scale fake world: the headroom floors, no week-long calibration, a
                       # lend lookback of seconds (the product's hour, now read whole, would keep
                       # these worlds from lending again within their few hundred ticks)
                       "calibration": {"enabled": False}, **policy},
            "prometheus": {"scrape_interval_s": 1, "step_s": 1},
        }
    )


class World:
    def __init__(self, *, start_delay_s: float = 3.0) -> None:
        self.t = T0
        self.kube = FakeKube(now=self.t)
        for n in NODES:
            self.kube.add_node(n, "default")
        self.kube.add_pool(POOL, replicas=len(NODES), min_available=1, start_delay_s=start_delay_s, grace_s=2)
        self.slurm = FakeSlurm(grace_s=5, now=self.t)
        for n in NODES:
            self.slurm.add_node(n)
        self.durations: dict[str, float] = {}  # research job -> run time it needs
        self.completed: set[str] = set()
        self.prom = FakeProm()
        self.load = LOW
        self.config = config()
        self.daemon = self.new_daemon()
        self.violations: list[str] = []
        self.min_ready = len(NODES)

    def new_daemon(self) -> Daemon:
        """A fresh process: nothing carried over but what is on the nodes."""
        pools = {"default": PromPool("default", "m")}
        return Daemon(self.config, kube=self.kube, slurm=self.slurm, prom=self.prom, prom_pools=pools,
                      clock=lambda: self.t, memory=policy_memory(self.config, self.prom, pools, self.t))

    def ready_pods(self) -> int:
        return sum(1 for p in self.kube.pods("default") if p.ready and not p.terminating)

    def tick(self, n: int = 1, *, restart_every: int = 0) -> None:
        for i in range(n):
            self.t += 1.0
            self.kube.step(self.t)
            self.slurm.advance(1.0)
            for job in self.slurm.snapshot().values():  # the world's own view: never fails
                if job.state == "running" and job.job_id in self.durations and self.t - (job.start_time or self.t) >= self.durations[job.job_id]:
                    self.slurm.finish(job.job_id)
                    self.completed.add(job.job_id)
            ready = self.ready_pods()
            self.prom.set("default", LoadSignals(self.t, running=self.load, waiting=0.0, kv_cache_usage_sum=None,
                                                 tokens_per_s=None, replicas_reporting=ready))
            if restart_every and i % restart_every == restart_every - 1:
                self.daemon = self.new_daemon()
            self.daemon.iterate()
            self.check()

    def check(self) -> None:
        ready = self.ready_pods()
        self.min_ready = min(self.min_ready, ready)
        if ready < 1:
            self.violations.append(f"t={self.t - T0:.0f}: {ready} Ready serving pods")
        pod_nodes = {p.node for p in self.kube.pods("default") if p.node}
        for job in self.slurm.snapshot().values():
            if job.partition != wk.SLURM_PREEMPT_PARTITION or job.state != "running":
                continue
            for node in job.nodes:
                if node in pod_nodes:
                    self.violations.append(f"t={self.t - T0:.0f}: {node} runs {job.job_id} and a serving pod")

    def sbatch(self, name: str, duration_s: float) -> str:
        job_id = self.slurm.add_job(name=name)
        self.durations[job_id] = duration_s
        return job_id

    def job(self, job_id: str) -> object:
        return self.slurm.snapshot()[job_id]

    def phases(self) -> dict[str, Phase | None]:
        return {n.name: n.phase for n in self.kube.nodes()}

    def run_until(self, cond: Callable[[], bool], limit: int, what: str, **kw: int) -> int:
        for i in range(limit):
            if cond():
                return i
            self.tick(**kw)
        raise AssertionError(f"not {what} after {limit} ticks: {self.phases()}")

    def count(self, phase: Phase) -> int:
        return sum(1 for p in self.phases().values() if p is phase)


@pytest.mark.parametrize("restart_every", [0, 1, 2, 3, 7], ids=lambda k: f"restart-every-{k}" if k else "no-restart")
def test_lend_reclaim_cycle_keeps_invariants_across_restarts(restart_every: int) -> None:
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving", restart_every=restart_every)
    jobs = [w.sbatch(f"research-{i}", duration_s=40) for i in range(3)]
    w.tick(2, restart_every=restart_every)
    assert all(w.job(j).state == "running" for j in jobs)
    w.load = HIGH
    ticks = w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 60, "all serving again",
                        restart_every=restart_every)
    # GraceTime (5 s) + pod start (3 s) + scheduling: the daemon adds a tick or two, not more
    assert ticks <= 14
    assert all(w.job(j).restart_count == 1 and w.job(j).state == "pending" for j in jobs)
    w.load = LOW
    w.run_until(lambda: w.completed >= set(jobs), 200, "requeued jobs finished", restart_every=restart_every)
    assert w.violations == []
    assert w.min_ready >= 1
    # research jobs were requeued by Slurm's preemption or the daemon, never cancelled
    assert not [x for x in w.slurm.writes if x[0] == "cancel" or (x[0] == "cancel_hold" and x[1] not in NODES)]


def test_operator_lend_and_refused_lend_at_min_serving() -> None:
    w = World()
    w.load = HIGH  # the policy itself wants every node serving
    w.tick(3)
    assert w.count(Phase.SERVING) == 4
    w.kube.set_request("gpu-node-02", "lend")
    w.run_until(lambda: w.phases()["gpu-node-02"] is Phase.LENT, 20, "lent on request")
    assert wk.ANNOTATION_REQUEST not in w.kube.node("gpu-node-02").annotations
    # the policy, seeing the load, takes it back: manual moves get no special protection
    w.run_until(lambda: w.count(Phase.SERVING) == 4, 40, "back to serving")
    # at min_serving an operator's lend is refused, with a Warning Event saying why
    w.load = LOW
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    last = next(n for n, p in w.phases().items() if p is Phase.SERVING)
    w.kube.set_request(last, "lend")
    w.tick(2)
    assert w.phases()[last] is Phase.SERVING
    refused = [e for e in w.kube.events if e.node == last and e.reason == "GpuBridgeRequestRefused"]
    assert refused and "min_serving 1" in refused[-1].message and refused[-1].event_type == "Warning"


def test_node_that_never_gets_ready_is_reported_and_another_reclaimed() -> None:
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    w.kube._pools["default"].start_delay_s = 10_000.0  # every new vLLM pod hangs in its cold start
    w.load = 70.0  # ~1.2 replicas: one more node is needed
    w.run_until(lambda: w.count(Phase.RETURNING) >= 1, 30, "a node returning")
    stuck = next(n for n, p in w.phases().items() if p is Phase.RETURNING)
    w.tick(int(2 * 3 + 120 + 5))
    events = [e for e in w.kube.events if e.node == stuck and e.reason == "GpuBridgeNotReady"]
    assert events and events[0].event_type == "Warning"
    assert w.count(Phase.RETURNING) + w.count(Phase.RECLAIMING) >= 2, "another node is tried"
    assert w.violations == []


def test_slurm_down_holds_everything_and_writes_nothing() -> None:
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    before = dict(w.kube.calls)
    down = AdapterError("slurm", "squeue: Unable to contact slurm controller (connect failure)")
    w.slurm.fail = {"nodes": down, "jobs": down}
    w.load = HIGH
    w.tick(5)
    writes = {k: v - before.get(k, 0) for k, v in w.kube.calls.items() if k[0] in ("patch", "update", "create")}
    assert not any(writes.values()), writes
    assert w.count(Phase.LENT) == 3
    w.slurm.fail = {}
    w.run_until(lambda: w.count(Phase.SERVING) == 4, 60, "all serving once Slurm answers again")
    assert w.violations == []


# --- calibration: rebuilt from Prometheus at start-up, measured delays ------------

CALIBRATED = {"enabled": True, "window_s": 3600, "step_s": 1, "interval_s": 5, "min_history_s": 600,
              "delay_min_samples": 1}


class RecordingProm(FakeProm):
    """A Prometheus that keeps what it served: later range queries see it, as the real one's."""

    def set(self, pool: str, signals: LoadSignals, problems: object = None) -> None:
        super().set(pool, signals)
        self.histories[pool] = (*self.histories.get(pool, ()), signals)


def calibrated_world(history_s: float) -> World:
    w = World()
    w.prom = RecordingProm()
    w.config = config(calibration=CALIBRATED)
    # what Prometheus already holds: the pool served its low load for history_s
    w.prom.histories["default"] = tuple(
        LoadSignals(T0 - history_s + i, running=LOW, waiting=0.0, kv_cache_usage_sum=None, tokens_per_s=None,
                    replicas_reporting=4)
        for i in range(int(history_s))
    )
    w.daemon = w.new_daemon()
    return w


def test_without_history_the_daemon_waits_to_calibrate_and_says_so() -> None:
    w = calibrated_world(0.0)
    w.tick(20)
    assert w.count(Phase.LENT) == 0
    d = w.daemon.ledger.last_plan.pools[0]
    assert d.reason == "calibrating" and "minutes of history to calibrate" in d.detail


def test_prometheus_history_calibrates_at_start_up_and_again_after_a_restart() -> None:
    w = calibrated_world(1800.0)
    w.tick(1)
    cal = w.daemon.ledger.last_observation.view.pools["default"].calibration
    assert cal is not None and cal.margin is not None and cal.samples >= 600
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    lend_details = [a.detail for a in w.daemon.ledger.last_plan.actions] or [w.daemon.ledger.last_plan.pools[0].detail]
    assert any("calibrated margin x" in t and "budget spent" in t for t in lend_details)
    # a restart rebuilds the same calibration from the same history (no state of its own)
    old = w.daemon.memory["default"].calibrator
    w.daemon = w.new_daemon()
    w.daemon.iterate()
    new = w.daemon.memory["default"].calibrator
    assert old is not None and new is not None
    for a, b in zip(old.arrays(w.t), new.arrays(w.t)):
        assert np.array_equal(a, b, equal_nan=True)
    old._cached = new._cached = None  # both computed now, not at their last 5 s slot
    assert old.calibration(w.t, capacity=4) == new.calibration(w.t, capacity=4)


def test_measured_reclaims_set_the_planned_horizon() -> None:
    w = calibrated_world(1800.0)
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 60, "all serving again")
    delays = w.daemon.memory["default"].delays
    assert delays and all(x > 0 for x in delays)
    w.tick(1)
    h = w.daemon.ledger.last_observation.view.pools["default"].horizon_s
    # configured: grace 5 + cold start 3 + margin 1 + tick 1 + scrape 1 = 11 s; measured is longer
    assert h is not None and h >= 11.0 and h >= max(delays)
