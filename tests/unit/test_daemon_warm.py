"""Warm lending through the whole daemon (observe -> reconcile -> actuate) over the lab's
fakes: FakeKube with the pool's readiness gate, FakeSlurm, and one fake vLLM engine per pod
reached by its IP. A lend keeps each lent node's replica asleep and out of the Service, a
reclaim wakes it (no new pod), a failed wake falls back to a cold start; the daemon killed
right after each warm write (the lab's crash injection point, ``after_write``) and restarted
from nothing but the nodes converges with no research job lost and never a research job
beside a pod that may serve.

The memory hold (``gpu-bridge-warm:<node>``, FakeSlurm with memory as a consumable resource):
queued before a warm lend releases the node, so research jobs beside the sleeping replica get
the node's memory minus the hold; cancelled at the reclaim before the wake; a lent node that
loses it turns cold; an orphan is cancelled."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from bridge import wellknown as wk
from bridge.adapters.kube.objects import EvictOutcome
from bridge.adapters.prom.types import PromPool
from bridge.adapters.protocols import PoolTarget, SleepControl
from bridge.adapters.slurm.types import SlurmJobInfo
from bridge.config import Config, parse_config
from bridge.daemon import Daemon
from bridge.errors import AdapterError
from bridge.model import LoadSignals, Phase, WarmState
from bridge.wiring import policy_memory
from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from gpu_bridge_lab.sandbox.vllm.server import SimServer
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from tests.unit.test_daemon_loop import HIGH, LOW, NODES, T0
from tests.unit.test_vllm_adapter import FAST, IDLE

POOL = PoolTarget("default", "serving", "vllm")
HOLD_MB = 12_000  # the memory hold on a node lent warm (the fake's nodes have 16,000 MB)


def config(*, wake_s: float = 1.0, vllm_port: int = 8000, lend_timeout_s: float = 600.0) -> Config:
    """test_daemon_loop's seconds-scale world, the pool lending warm."""
    return parse_config(
        {
            "pools": [{"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m",
                       "min_serving": 1, "cold_start_s": 3, "drain_s": 2, "headroom": 0.2, "headroom_replicas": 0.2,
                       "warm_lending": True, "wake_s": wake_s, "vllm_port": vllm_port, "warm_hold_mb": HOLD_MB,
                       "target": {"concurrency_per_replica": 60, "kv_cache_usage": None}}],
            "slurm": {"grace_s": 5, "min_runtime_s": 0},
            "policy": {"tick_s": 1, "scale_down_window_s": 5, "min_lend_s": 3, "max_lends_per_tick": 1,
                       "lend_timeout_s": lend_timeout_s,
                       "signal_max_age_s": 10, "blind_after_s": 30,
                       "forecast": {"margin_s": 1, "burst_window_s": 5, "trend_window_s": 10,
                                    "compare_window_s": 10, "burst_history_s": 86400},
                       "calibration": {"enabled": False}},
            "prometheus": {"scrape_interval_s": 1, "step_s": 1},
        }
    )


class Crash(BaseException):
    """The injected SIGKILL: nothing of the process survives it (not an AdapterError)."""


class Engine:
    """One pod's vLLM engine; ``fail_wake`` makes its wake fail (an HTTP error); ``on_wake``
    is called first (the test's check of what Slurm holds at that moment)."""

    def __init__(self, busy_sleeps: int = 0, on_wake: Callable[[], None] = lambda: None) -> None:
        self.on_wake = on_wake
        self.asleep = False
        self.fail_wake = False
        self.wakes = 0
        self.busy_sleeps = busy_sleeps  # this many sleeps refused first (requests still in flight)
        self.sleeps = 0

    def sleep(self, level: int = 1) -> None:
        self.sleeps += 1
        if self.sleeps <= self.busy_sleeps:
            raise AdapterError("vllm", "POST /sleep: HTTP 500: Cannot put engine to sleep while requests are being processed")
        self.asleep = True

    def wake_up(self, tags: object = ()) -> None:
        self.on_wake()
        self.wakes += 1
        if self.fail_wake:
            raise AdapterError("vllm", "POST /wake_up: HTTP 500")
        self.asleep = False

    def is_sleeping(self) -> bool:
        return self.asleep


class World:
    """``http_port``: each pod's engine is the lab's vLLM simulator (sleep mode on) listening
    on the pod's IP (127.0.0.N) at that port, reached by the daemon's own vLLM clients."""

    def __init__(self, *, crash_at: str | None = None, http_port: int | None = None) -> None:
        self.t = T0
        self.http_port = http_port
        self.kube = FakeKube(now=self.t, pod_network="127.0" if http_port else "10.0")
        for n in NODES:
            self.kube.add_node(n, "default")
        self.kube.add_pool(POOL, replicas=len(NODES), min_available=1, start_delay_s=3.0, grace_s=2, readiness_gate=True)
        for p in self.kube.pods("default"):  # serving already: their gates were opened by an earlier run
            self.kube.set_pod_awake(POOL.namespace, p.name, True)
        self.slurm = FakeSlurm(grace_s=5, now=self.t)
        for n in NODES:
            self.slurm.add_node(n)
        self.prom = FakeProm()
        self.engines: dict[str, Engine] = {}  # pod name -> its engine (a new pod starts awake)
        self.fail_wakes = False
        self.busy_sleeps = 0  # each new engine refuses this many sleeps first
        self.load = LOW
        self.config = config(wake_s=10.0, vllm_port=http_port) if http_port else config()
        self.servers: dict[str, SimServer] = {}  # pod name -> its simulated vLLM server (http_port)
        if http_port:
            for p in self.kube.pods("default"):
                sim = Simulation(IDLE, ["m"], seed=1, sleep_params=FAST)
                sim.add_replica("r0", "m", p.node or "")
                self.servers[p.name] = SimServer(sim, p.ip or "", http_port, tick_s=0.02, dev_mode=True).start()
        self.crash_at = crash_at
        self.crashes = 0
        self.durations: dict[str, float] = {}
        self.violations: list[str] = []
        self.daemon = self.new_daemon()

    def control(self, pool: str, ip: str | None) -> SleepControl:
        pod = next((p for p in self.kube.pods("default") if p.ip == ip and not p.terminating), None)
        if pod is None:
            raise AdapterError("vllm", f"{ip}: connection refused")
        node = pod.node or ""
        engine = self.engines.setdefault(pod.name, Engine(self.busy_sleeps, on_wake=lambda: self.check_wake(node)))
        engine.fail_wake = self.fail_wakes
        return engine

    def crash_hook(self, point: str) -> None:
        if point == self.crash_at and not self.crashes:
            self.crashes += 1
            raise Crash(point)

    def new_daemon(self) -> Daemon:
        pools = {"default": PromPool("default", "m")}
        d = Daemon(self.config, kube=self.kube, slurm=self.slurm, prom=self.prom, prom_pools=pools, clock=lambda: self.t,
                   memory=policy_memory(self.config, self.prom, pools, self.t), after_write=self.crash_hook)
        if not self.http_port:
            d.actuator.sleep_control = self.control
        return d

    def close(self) -> None:
        for srv in self.servers.values():
            srv.stop()

    def asleep(self, pod: str) -> bool | None:
        """The pod's engine sleeps (None: no engine known for it)."""
        if self.http_port:
            srv = self.servers.get(pod)
            return None if srv is None else srv.sim.sleep["r0"].sleep_state() != "awake"
        engine = self.engines.get(pod)
        return None if engine is None else engine.asleep

    def ready_pods(self) -> int:
        return sum(1 for p in self.kube.pods("default") if p.ready and not p.terminating)

    def tick(self) -> None:
        self.t += 1.0
        self.kube.step(self.t)
        self.slurm.advance(1.0)
        for job in self.slurm.snapshot().values():
            if job.state == "running" and job.job_id in self.durations and self.t - (job.start_time or self.t) >= self.durations[job.job_id]:
                self.slurm.finish(job.job_id)
        self.prom.set("default", LoadSignals(self.t, running=self.load, waiting=0.0, kv_cache_usage_sum=None,
                                             tokens_per_s=None, replicas_reporting=self.ready_pods()))
        try:
            self.daemon.iterate()
        except Crash:
            self.daemon = self.new_daemon()  # restarted from what is on the nodes only
        self.check()

    def mem_hold(self, node: str) -> SlurmJobInfo | None:
        """The node's memory hold in Slurm (any state), if any."""
        return next((j for j in self.slurm.snapshot().values()
                     if j.partition == wk.SLURM_WARM_PARTITION and j.name == wk.SLURM_WARM_HOLD_JOB_PREFIX + node), None)

    def check_wake(self, node: str) -> None:
        if self.mem_hold(node) is not None:
            self.violations.append(f"t={self.t - T0:.0f}: {node} woken while its memory hold is still in Slurm")

    def check(self) -> None:
        if self.ready_pods() < 1:
            self.violations.append(f"t={self.t - T0:.0f}: no Ready serving pod")
        pods = [p for p in self.kube.pods("default") if p.node and not p.terminating]
        for job in self.slurm.snapshot().values():
            if job.partition != wk.SLURM_PREEMPT_PARTITION or job.state != "running":
                continue
            for pod in (p for p in pods if p.node in job.nodes):
                asleep = self.asleep(pod.name)
                if pod.ready or pod.awake is not False or not asleep:
                    self.violations.append(f"t={self.t - T0:.0f}: {pod.node} runs {job.job_id} beside {pod.name} "
                                           f"(ready={pod.ready}, gate={pod.awake}, asleep={asleep})")
                node = self.kube.node(pod.node or "")
                hold = self.mem_hold(pod.node or "")
                if node is not None and node.phase in (Phase.LENDING, Phase.LENT) and (hold is None or hold.state != "running"):
                    # reclaiming: the hold is cancelled right after the serving hold, during the grace
                    self.violations.append(f"t={self.t - T0:.0f}: {pod.node} runs {job.job_id} beside the sleeping "
                                           f"{pod.name} without its memory hold running ({hold and hold.state})")

    def phases(self) -> dict[str, Phase | None]:
        return {n.name: n.phase for n in self.kube.nodes()}

    def count(self, phase: Phase) -> int:
        return sum(1 for p in self.phases().values() if p is phase)

    def run_until(self, cond: Callable[[], bool], limit: int, what: str) -> int:
        for i in range(limit):
            if cond():
                return i
            self.tick()
        raise AssertionError(f"not {what} after {limit} ticks: {self.phases()}, warm {self.warm()}")

    def warm(self) -> dict[str, str | None]:
        return {n.name: str(n.warm) if n.warm else None for n in self.kube.nodes()}

    def sbatch(self, name: str, duration_s: float) -> str:
        job_id = self.slurm.add_job(name=name)
        self.durations[job_id] = duration_s
        return job_id

    def lost_jobs(self, jobs: list[str]) -> list[str]:
        snap = self.slurm.snapshot()
        return [j for j in jobs if j not in snap or snap[j].state not in ("pending", "running", "completed")]

    def lend_then_reclaim(self) -> tuple[list[str], set[str], int]:
        """Lend down to min_serving, research on the lent nodes, reclaim: (jobs, pods before, ticks to serve)."""
        self.run_until(lambda: self.count(Phase.LENT) == 3, 120, "lent down to min_serving")
        jobs = [self.sbatch(f"research-{i}", duration_s=60) for i in range(3)]
        self.run_until(lambda: all(self.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
        before = {p.name for p in self.kube.pods("default") if not p.terminating}
        self.load = HIGH
        ticks = self.run_until(lambda: self.count(Phase.SERVING) == 4 and self.ready_pods() == 4, 80, "all serving again")
        return jobs, before, ticks


def test_a_warm_lend_keeps_the_replica_asleep_and_the_reclaim_wakes_it() -> None:
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    lent = [n for n, p in w.phases().items() if p is Phase.LENT]
    for node in lent:
        n = w.kube.node(node)
        assert n is not None and n.warm is not None and n.warm.state is WarmState.ASLEEP
        (pod,) = [p for p in w.kube.pods("default") if p.node == node and not p.terminating]
        assert pod.name == n.warm.pod and not pod.ready and pod.awake is False and w.engines[pod.name].asleep
    assert w.kube.deployment("default").replicas == 4  # type: ignore[union-attr]  # the sleeping replicas stay counted
    jobs = [w.sbatch(f"research-{i}", duration_s=60) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    before = {p.name for p in w.kube.pods("default") if not p.terminating}
    w.load = HIGH
    ticks = w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 80, "all serving again")
    assert {p.name for p in w.kube.pods("default") if not p.terminating} == before  # woken, none cold-started
    assert all(w.engines[p].wakes == 1 for p in before if p in w.engines and w.engines[p].wakes)
    assert all(v is None for v in w.warm().values())
    assert ticks <= 12, ticks  # grace 5 s + the wake, not a cold start on top
    assert not w.violations and not w.lost_jobs(jobs)
    assert all(w.slurm.snapshot()[j].state == "pending" and w.slurm.snapshot()[j].restart_count == 1 for j in jobs)


@pytest.mark.parametrize("busy", [2, 10_000])
def test_a_sleep_refused_while_requests_finish_is_retried_within_drain_s(busy: int) -> None:
    """vLLM refuses to sleep while requests are in flight: the lend tries again each pass
    for the pool's drain_s (2 s here), the gate closed; still refused after it, the node is
    lent cold (its pod evicted), never left half-way."""
    w = World()
    assert w.daemon.actuator.sleep_retry_s == {"default": 2.0}
    w.busy_sleeps = busy
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    records = {n.name: n.warm for n in w.kube.nodes() if n.phase is Phase.LENT}
    assert len(records) == 3
    if busy == 2:  # drained in time: asleep, each engine asked until it accepted
        assert all(r is not None and r.state is WarmState.ASLEEP for r in records.values()), records
        assert all(w.engines[r.pod].sleeps == 3 for r in records.values() if r is not None)
    else:  # never drained: cold, and the pod is gone from the node
        assert all(r is not None and r.state is WarmState.COLD for r in records.values()), records
        w.run_until(lambda: not any(p.node in records and not p.terminating for p in w.kube.pods("default")), 30,
                    "the cold-lent nodes' pods evicted")
    assert not w.violations


def test_a_failed_wake_falls_back_to_a_cold_start() -> None:
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=60) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    before = {p.name for p in w.kube.pods("default") if not p.terminating}
    w.fail_wakes = True
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 120, "all serving again")
    after = {p.name for p in w.kube.pods("default") if not p.terminating}
    assert len(after - before) == 3  # the three that failed to wake were replaced by new pods
    assert any(e.reason == "GpuBridgeWarmFailed" for e in w.kube.events)
    assert all(v is None for v in w.warm().values())
    assert not w.violations and not w.lost_jobs(jobs)


def test_an_engine_that_wakes_under_research_is_evicted_and_the_node_stays_lent() -> None:
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=600) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    node = sorted(n for n, p in w.phases().items() if p is Phase.LENT)[0]
    (pod,) = [p for p in w.kube.pods("default") if p.node == node and not p.terminating]
    w.engines[pod.name].asleep = False  # its container restarted: vLLM is back on the GPUs, awake
    w.tick()
    assert not any(p.name == pod.name and not p.terminating for p in w.kube.pods("default"))  # evicted in that pass
    n = w.kube.node(node)
    assert n is not None and n.phase is Phase.LENT and n.warm is not None and n.warm.state is WarmState.COLD
    assert any(e.reason == "GpuBridgeWarmFailed" and "awake on a lent node" in e.message for e in w.kube.events)
    w.tick(); w.tick()
    assert all(w.slurm.snapshot()[j].state == "running" for j in jobs)  # research untouched
    w.run_until(lambda: w.mem_hold(node) is None, 10, "the memory hold of the node now lent cold cancelled")
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 80, "all serving again")
    assert all(v is None for v in w.warm().values())
    assert not w.violations and not w.lost_jobs(jobs)


# every write of the warm path, the transitions' starts and the scale around them
WARM_POINTS = ("close_gate", "sleep_replica", "submit_mem_hold", "cancel_hold", "resume", "mark_lent", "submit_hold",
               "cancel_mem_hold", "drain", "mark_returning", "wake_replica", "open_gate", "unfence", "mark_serving", "clear_warm")


@pytest.mark.parametrize("point", WARM_POINTS)
def test_a_crash_right_after_each_warm_write_converges_with_no_job_lost(point: str) -> None:
    w = World(crash_at=point)
    jobs, before, _ = w.lend_then_reclaim()
    assert w.crashes == 1, f"{point} never written"
    assert {p.name for p in w.kube.pods("default") if not p.terminating} == before  # still warm: nothing cold-started
    w.run_until(lambda: all(v is None for v in w.warm().values()), 10, "the warm records cleared")
    assert not w.violations and not w.lost_jobs(jobs)
    assert not any(w.mem_hold(n) for n in NODES)  # every memory hold gone with the warm lends


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_over_http_the_daemon_sleeps_and_wakes_the_simulated_vllm_servers() -> None:
    """The real path: sleep_controls' clients (pod IP + vllm_port) against the simulator's
    /sleep, /wake_up, /is_sleeping, its wake taking real seconds."""
    w = World(http_port=_free_port())
    try:
        w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
        lent = {n for n, p in w.phases().items() if p is Phase.LENT}
        asleep = {p.node for p in w.kube.pods("default") if w.asleep(p.name)}
        assert asleep == lent
        assert all(w.servers[p].sim.sleep["r0"].sleep_state() == "weights_offloaded"
                   for p, srv in w.servers.items() if srv.sim.replicas["r0"].node in lent)
        jobs = [w.sbatch(f"research-{i}", duration_s=60) for i in range(3)]
        w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
        before = {p.name for p in w.kube.pods("default") if not p.terminating}
        w.load = HIGH
        started = time.monotonic()
        w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 80, "all serving again")
        wall = time.monotonic() - started
        assert {p.name for p in w.kube.pods("default") if not p.terminating} == before  # woken, none cold-started
        assert not any(w.asleep(p) for p in before)
        assert not w.violations and not w.lost_jobs(jobs)
        assert wall < 30, wall  # three wakes of ~1.2 s each (the simulator's FAST model), not cold starts
    finally:
        w.close()


@pytest.mark.parametrize("point", ["wake_replica", "delete_asleep", "open_gate", "clear_warm"])
def test_a_crash_on_the_cold_fallback_of_a_failed_wake_converges(point: str) -> None:
    w = World(crash_at=point)
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=60) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    w.fail_wakes = True
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 120, "all serving again")
    w.run_until(lambda: all(v is None for v in w.warm().values()), 10, "the warm records cleared")
    assert w.crashes == 1, f"{point} never written"
    assert not w.violations and not w.lost_jobs(jobs)


@pytest.mark.parametrize("point", ["check_asleep", "delete_asleep"])
def test_a_crash_after_noticing_an_awake_engine_converges(point: str) -> None:
    w = World(crash_at=point)
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=60) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    node = sorted(n for n, p in w.phases().items() if p is Phase.LENT)[0]
    (pod,) = [p for p in w.kube.pods("default") if p.node == node and not p.terminating]
    w.engines[pod.name].asleep = False
    w.run_until(lambda: not any(p.name == pod.name and not p.terminating for p in w.kube.pods("default")), 5, "the pod evicted")
    assert w.crashes == 1, f"{point} never written"
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 120, "all serving again")
    w.run_until(lambda: all(v is None for v in w.warm().values()), 10, "the warm records cleared")
    assert not w.lost_jobs(jobs)
    # research beside the awake engine for at most the one pass the crash interrupted
    assert len(w.violations) <= 1 and all(node in v for v in w.violations), w.violations


# --- the memory hold ----------------------------------------------------------------------------


def _writes(w: World, node: str) -> list[str]:
    """The Slurm writes made for ``node``, in order."""
    return [intent for intent, n in w.slurm.writes if n == node]


def test_the_memory_hold_is_queued_before_research_can_start_and_cancelled_before_the_wake() -> None:
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    lent = sorted(n for n, p in w.phases().items() if p is Phase.LENT)
    for node in lent:
        hold = w.mem_hold(node)
        assert hold is not None and hold.state == "running" and hold.nodes == (node,) and hold.gpus_per_node == 0
        writes = _writes(w, node)
        # queued while the node was still the serving side's (its serving hold, our drain): the first job it takes
        assert writes.count("submit_mem_hold") == 1
        released = [writes.index(r) for r in ("cancel_hold", "resume") if r in writes]  # none: lent before it was ever held
        assert all(writes.index("submit_mem_hold") < i for i in released), writes
    assert any({"cancel_hold", "resume"} <= set(_writes(w, n)) for n in lent)
    (serving,) = [n for n, p in w.phases().items() if p is Phase.SERVING]
    assert w.mem_hold(serving) is None
    # research jobs get each lent node's memory minus the hold: 4,000 of 16,000 MB fit beside 12,000, 8,000 do not
    small = [w.slurm.add_job(name=f"small-{i}", mem_mb=4000) for i in range(3)]
    big = w.slurm.add_job(name="big", mem_mb=8000)
    w.durations.update({j: 600.0 for j in [*small, big]})
    w.tick()
    snap = w.slurm.snapshot()
    assert sorted(snap[j].nodes[0] for j in small if snap[j].state == "running") == lent
    assert snap[big].state == "pending"
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 80, "all serving again")
    assert not any(w.mem_hold(n) for n in NODES)
    for node in lent:
        reclaim = _writes(w, node)[_writes(w, node).index("submit_mem_hold"):]  # from the lend on
        # right after the serving hold (Slurm never preempts for it while the memory hold runs), before the drain
        assert reclaim.index("submit_hold") < reclaim.index("cancel_mem_hold") < reclaim.index("drain"), reclaim
    assert sum(e.wakes for e in w.engines.values()) == 3
    assert not w.violations, w.violations  # incl. no wake while a memory hold was in Slurm
    assert not w.lost_jobs([*small, big])
    assert all(w.slurm.snapshot()[j].restart_count == 1 for j in small)  # preempted and requeued, never cancelled


@pytest.mark.parametrize("crash_at", [None, "mem_hold_lost", "delete_asleep", "cancel_mem_hold"])
def test_a_lent_node_whose_memory_hold_is_cancelled_turns_cold(crash_at: str | None) -> None:
    """An administrator scancels a memory hold: the replica is evicted (its memory freed, the
    node lent cold), not a new hold that would preempt the research jobs running there."""
    w = World(crash_at=crash_at)
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=600) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    lent = sorted(n for n, p in w.phases().items() if p is Phase.LENT)
    node = lent[0]
    (pod,) = [p for p in w.kube.pods("default") if p.node == node and not p.terminating]
    hold = w.mem_hold(node)
    assert hold is not None
    w.slurm.finish(hold.job_id)  # scancel by someone else
    w.run_until(lambda: not any(p.name == pod.name and not p.terminating for p in w.kube.pods("default")), 5, "the replica evicted")
    n = w.kube.node(node)
    assert n is not None and n.phase is Phase.LENT and n.warm is not None and n.warm.state is WarmState.COLD
    assert any(e.reason == "GpuBridgeMemoryHoldLost" for e in w.kube.events)
    w.tick(); w.tick()
    assert w.mem_hold(node) is None and _writes(w, node).count("submit_mem_hold") == 1  # never resubmitted
    assert all(w.slurm.snapshot()[j].state == "running" and w.slurm.snapshot()[j].restart_count == 0 for j in jobs)
    assert all((h := w.mem_hold(other)) is not None and h.state == "running" for other in lent[1:])  # the others stay warm
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 120, "all serving again")
    w.run_until(lambda: all(v is None for v in w.warm().values()), 10, "the warm records cleared")
    assert not any(w.mem_hold(n) for n in NODES) and not w.lost_jobs(jobs)
    assert w.crashes == (1 if crash_at else 0), f"{crash_at} never written"
    # the one pass a crash interrupted may see the research beside the sleeping replica without its hold
    assert len(w.violations) <= (1 if crash_at == "mem_hold_lost" else 0) and all(node in v for v in w.violations), w.violations


def test_a_memory_hold_on_a_node_not_lent_warm_is_cancelled() -> None:
    """Lent cold (every sleep refused) or serving: no memory hold is ever submitted, and one
    found there (left by a crash, an operator's mistake) is cancelled; research untouched."""
    w = World()
    w.busy_sleeps = 10_000
    w.run_until(lambda: w.count(Phase.LENT) == 3 and not any(p.node in {n for n, ph in w.phases().items() if ph is Phase.LENT}
                                                              for p in w.kube.pods("default")), 150, "lent cold, pods gone")
    assert not any(intent == "submit_mem_hold" for intent, _ in w.slurm.writes)
    jobs = [w.sbatch(f"research-{i}", duration_s=600) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    lent = sorted(n for n, p in w.phases().items() if p is Phase.LENT)
    (serving,) = [n for n, p in w.phases().items() if p is Phase.SERVING]
    for node in (lent[0], serving):
        w.slurm.submit_mem_hold(node, 1000)
    w.tick()
    assert w.mem_hold(lent[0]) is None and w.mem_hold(serving) is None
    assert all(w.slurm.snapshot()[j].state == "running" and w.slurm.snapshot()[j].restart_count == 0 for j in jobs)
    assert not w.violations


def test_a_warm_lend_that_never_gets_its_memory_hold_is_abandoned() -> None:
    """Slurm refuses the memory hold (here: every sbatch of it fails, as with the warm partition
    missing): no research job ever runs beside the sleeping replica without it; after
    policy.lend_timeout_s the lend is abandoned, as any lend that does not finish in time, and
    the node serves again (its replica restarted: a sleeping one never serves). Lent again
    later, it may be lent cold (its new replica not started yet), never warm without its hold."""
    w = World()
    w.config = config(lend_timeout_s=30.0)
    w.daemon = w.new_daemon()
    w.slurm.fail["submit_mem_hold"] = AdapterError("slurm", "sbatch failed (rc 1): invalid partition specified: gpu-bridge-warm")
    for n in NODES:  # a site's lendable nodes start drained (slurm_conf/README.md): jobs start only where lent
        w.slurm.drain(n, "serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=600) for i in range(3)]
    w.run_until(lambda: any(e.reason == "GpuBridgeLendAborted" for e in w.kube.events), 80, "a lend abandoned")
    (event,) = [e for e in w.kube.events if e.reason == "GpuBridgeLendAborted"][:1]
    assert "no memory hold for the sleeping replica" in event.message, event.message
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 120, "every node serving again")
    assert not any(w.mem_hold(n) for n in NODES) and not any(intent == "submit_mem_hold" for intent, _ in w.slurm.writes)
    assert not w.violations and not w.lost_jobs(jobs)  # never research beside a sleeping replica without its hold


def test_a_blocked_eviction_of_a_cold_pod_never_costs_another_node_its_sleeping_replica() -> None:
    """Seen on the sandbox (scripts/reliability.py --warm-fallback, row lent check_asleep
    unreachable, 2026-12-07): check_asleep recorded gpu-node-01 cold; the next pass's
    delete_asleep was refused by the PodDisruptionBudget (the API server's 429 for the not-Ready
    pod), and the same pass scaled the Deployment 3 -> 2, the cold node no longer counted. The
    ReplicaSet removes a not-Ready pod first, and every pod of a lent node is not Ready, with the
    same deletion cost: it removed gpu-node-02's sleeping replica (warm_lost: that node
    reclaimed cold later; research beside a terminating pod meanwhile). Seen again in the next
    run on row lent mem_hold_lost. With the sandbox's PDB (maxUnavailable 1) the refusal is the
    rule, not bad luck: the sleeping pods of the lent-warm nodes are not Ready, so no disruption
    is allowed until the scale-down lowers the expected count, and the daemon's eviction and the
    ReplicaSet's choice then race (the ReplicaSet deletes a not-Ready pod, the newer first among
    equal deletion costs). The cold node's own pod must be the one that goes (marked cheapest
    first, as a cold lend's is, or the scale held until it is gone)."""
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=600) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    asleep = {p.node: p.name for p in w.kube.pods("default") if p.node and not p.terminating
              and w.phases()[p.node] is Phase.LENT}
    assert len(asleep) == 3
    # the failed node: the one whose pod the ReplicaSet's tie-break (by name) would keep last
    node = max(asleep, key=lambda n: asleep[n])
    pod = asleep[node]
    evict = w.kube.evict
    refused: list[float] = []  # the passes (times) the eviction was refused in

    def evict_refused_for_one_pass(namespace: str, name: str) -> EvictOutcome:
        if name == pod and (not refused or refused[0] == w.t):  # the API server's 429, as the sandbox's for this pod
            refused.append(w.t)
            return EvictOutcome.BLOCKED
        return evict(namespace, name)

    w.kube.evict = evict_refused_for_one_pass  # type: ignore[method-assign]
    w.engines[pod].asleep = False  # its engine restarted awake under research: check_asleep records it cold
    w.run_until(lambda: not any(p.name == pod for p in w.kube.pods("default")), 20, "the cold node's pod gone")
    assert refused and set(refused) == {refused[0]}  # refused in one pass only
    for other, name in asleep.items():
        if other != node:
            n = w.kube.node(other)
            assert n is not None and n.warm is not None and n.warm.state is WarmState.ASLEEP, (other, n and n.warm)
            assert any(p.name == name and not p.terminating for p in w.kube.pods("default")), f"{other} lost {name}"
    assert not w.lost_jobs(jobs)


def test_two_failed_wakes_in_one_reclaim_still_serve_again_under_a_max_unavailable_pdb() -> None:
    """Seen on the sandbox (scripts/reliability.py --warm-fallback, row reclaim wake_replica with
    wake_hangs, 2026-12-07): both lent nodes' wakes timed out, both were recorded cold, and
    delete_asleep's eviction was refused 823 times in 120 s (PDB maxUnavailable 1: the Deployment
    expects 3, the returning nodes still counted; 1 Ready < 3 - 1, and the API server lets an
    unhealthy pod go only while the budget is healthy), so the nodes never served again. The
    fake's evict checks the PDB for Ready pods only; here it answers as the API server does."""
    w = World()
    evict = w.kube.evict

    def evict_as_the_api_server(namespace: str, name: str) -> EvictOutcome:
        pod = next((p for p in w.kube.pods("default") if p.name == name), None)
        dep = w.kube.deployment("default")
        if pod is not None and dep is not None and not pod.terminating and not pod.ready:
            healthy = sum(1 for p in w.kube.pods("default") if p.ready and not p.terminating)
            if healthy < dep.replicas - 1:  # IfHealthyBudget: an unhealthy pod goes only while the budget is healthy
                return EvictOutcome.BLOCKED
        return evict(namespace, name)

    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    w.kube.evict = evict_as_the_api_server  # type: ignore[method-assign]
    jobs = [w.sbatch(f"research-{i}", duration_s=60) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    w.fail_wakes = True
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 120, "all serving again")
    assert all(v is None for v in w.warm().values())
    assert not w.violations and not w.lost_jobs(jobs)


def test_a_cold_pod_that_outlives_the_scale_is_evicted_with_backoff_not_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback's pod, marked and left out of the scale, still there (a ReplicaSet that
    removed another pod): delete_asleep evicts it, and a PDB's refusal is retried with the
    lifecycle's backoff (1 s doubling to a minute), not at every pass (the sandbox saw 823
    refusals in 120 s before the fallback went by the scale)."""
    import gpu_bridge_lab.fakes.kube as fake_kube

    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=600) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    node, pod = next((p.node, p.name) for p in w.kube.pods("default") if p.node and w.phases()[p.node] is Phase.LENT)
    rank = fake_kube._deletion_rank
    monkeypatch.setattr(fake_kube, "_deletion_rank", lambda p: (1, 9, True, 10**9, p.name) if p.name == pod else rank(p))
    evict = w.kube.evict
    refused: list[float] = []

    def refuse(namespace: str, name: str) -> EvictOutcome:
        if name == pod:
            refused.append(w.t)
            return EvictOutcome.BLOCKED
        return evict(namespace, name)

    w.kube.evict = refuse  # type: ignore[method-assign]
    w.engines[pod].asleep = False  # check_asleep records it cold
    w.run_until(lambda: bool(refused), 30, "the stuck pod's first eviction")
    for _ in range(60):
        w.tick()
    assert 3 <= len(refused) <= 8, refused  # +1, +2, +4, +8, +16, +32 s: not one a second
    assert any(p.name == pod and not p.terminating for p in w.kube.pods("default"))
    n = w.kube.node(node)
    assert n is not None and n.warm is not None and n.warm.state is WarmState.COLD
