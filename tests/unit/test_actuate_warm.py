"""Warm lending's writes (bridge.actuate) through the lab's FakeKube and a fake vLLM sleep
control: the readiness gate, sleep and wake with their record on the node, every failure
recorded cold (the lifecycle's fallback), the lost pod, the cold eviction; and the wiring's
sleep controls, built for warm pools only."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
import structlog
import structlog.testing
from gpu_bridge_lab.fakes.kube import FakeKube

from bridge import wellknown as wk
from bridge.actuate import WARM_FAILED_EVENT, Actuator
from bridge.adapters.protocols import PoolTarget, SleepControl
from bridge.adapters.vllm import VllmSleepClient, sleep_controls
from bridge.config import parse_config
from bridge.errors import AdapterError
from bridge.lifecycle import HoldFacts, NodeFacts, PodFacts, Step
from bridge.model import Phase, WarmRecord, WarmState

POOL = PoolTarget("default", "serving", "vllm")
NODE = "gpu-node-01"


class Engine:
    """A vLLM engine's sleep mode; ``fail`` makes the next calls raise (or lie, with "lie")."""

    def __init__(self) -> None:
        self.asleep = False
        self.calls: list[str] = []
        self.fail: str | None = None

    def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep{level}")
        if self.fail == "error":
            raise AdapterError("vllm", "POST /sleep: HTTP 500")
        if self.fail != "lie":
            self.asleep = True

    def wake_up(self, tags: object = ()) -> None:
        self.calls.append("wake_up")
        if self.fail == "error":
            raise AdapterError("vllm", "POST /wake_up: timed out")
        if self.fail != "lie":
            self.asleep = False

    def is_sleeping(self) -> bool:
        return self.asleep


class NoSlurm:
    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"no Slurm write expected, got {name}")


def world() -> tuple[FakeKube, Actuator, Engine, str]:
    kube = FakeKube(now=0.0)
    kube.add_node(NODE, "default")
    kube.add_pool(POOL, replicas=1)
    engine = Engine()
    seen: list[str | None] = []

    def control(pool: str, ip: str | None) -> SleepControl:
        seen.append(ip)
        return engine

    act = Actuator(kube=kube, slurm=NoSlurm(), clock=lambda: 0.0, targets={"default": POOL},  # type: ignore[arg-type]
                   sleep_control=control)
    return kube, act, engine, kube.pods("default")[0].name


def node_facts(kube: FakeKube, phase: Phase) -> NodeFacts:
    n = kube.node(NODE)
    assert n is not None
    pods = tuple(PodFacts(p.name, ready=p.ready, terminating=p.terminating, awake=p.awake, ip=p.ip)
                 for p in kube.pods("default"))
    return NodeFacts(name=NODE, phase=phase, phase_since=0.0, fenced=True, pods=pods, slurm_drained_by_us=True,
                     slurm_drained_by_other=False, slurm_down=False, slurm_allocated=True,
                     hold=HoldFacts("1", running=True), research_jobs=(), warm=n.warm)


def run(act: Actuator, kube: FakeKube, step: Step, phase: Phase) -> bool:
    return act.execute(step, node_facts(kube, phase), POOL, now=0.0).changed


def warm(kube: FakeKube) -> WarmRecord | None:
    n = kube.node(NODE)
    assert n is not None
    return n.warm


def test_the_gate_closes_and_opens_once() -> None:
    kube, act, _, pod = world()
    assert run(act, kube, Step.CLOSE_GATE, Phase.LENDING) is True
    assert kube.pods("default")[0].awake is False
    assert run(act, kube, Step.CLOSE_GATE, Phase.LENDING) is False  # idempotent: nothing to write
    assert run(act, kube, Step.OPEN_GATE, Phase.RETURNING) is True
    got = kube.pods("default")[0]
    assert got.awake is True and got.ready  # the Ready condition survived the status patch


def test_sleep_then_wake_recorded_on_the_node() -> None:
    kube, act, engine, pod = world()
    assert run(act, kube, Step.SLEEP_REPLICA, Phase.LENDING) is True
    assert engine.asleep and engine.calls == ["sleep1"]
    assert warm(kube) == WarmRecord(WarmState.ASLEEP, pod)
    assert kube.node(NODE).annotations[wk.ANNOTATION_WARM] == f"asleep/{pod}"  # type: ignore[union-attr]
    # a crash after the sleep, before anything else: the step again calls no second sleep
    assert run(act, kube, Step.SLEEP_REPLICA, Phase.LENDING) is False and engine.calls == ["sleep1"]
    assert run(act, kube, Step.WAKE_REPLICA, Phase.RETURNING) is True
    assert not engine.asleep and warm(kube) == WarmRecord(WarmState.AWAKE, pod)
    assert run(act, kube, Step.CLEAR_WARM, Phase.SERVING) is True
    assert warm(kube) is None and wk.ANNOTATION_WARM not in kube.node(NODE).annotations  # type: ignore[union-attr]
    assert [e.reason for e in kube.events] == ["GpuBridgeReplicaAsleep", "GpuBridgeReplicaAwake"]


@pytest.mark.parametrize("fail", ["error", "lie"])
@pytest.mark.parametrize("step", [Step.SLEEP_REPLICA, Step.WAKE_REPLICA])
def test_a_failed_sleep_or_wake_is_recorded_cold(step: Step, fail: str) -> None:
    kube, act, engine, pod = world()
    if step is Step.WAKE_REPLICA:
        run(act, kube, Step.SLEEP_REPLICA, Phase.LENDING)
    engine.fail = fail
    assert run(act, kube, step, Phase.RETURNING if step is Step.WAKE_REPLICA else Phase.LENDING) is True
    assert warm(kube) == WarmRecord(WarmState.COLD, pod)
    failed = [e for e in kube.events if e.reason == WARM_FAILED_EVENT]
    assert len(failed) == 1 and failed[0].event_type == "Warning" and pod in failed[0].message


@pytest.mark.parametrize("fail", ["error", "lie"])
def test_a_sleep_refused_early_in_the_lend_is_retried_then_taken_cold_after_drain_s(fail: str) -> None:
    """vLLM refuses to sleep while requests are in flight (HTTP 500): within the pool's drain_s
    of the lend's start the step writes nothing and is named again next pass; after it, cold."""
    kube, act, engine, pod = world()
    act.sleep_retry_s = {"default": 30.0}
    engine.fail = fail
    facts = node_facts(kube, Phase.LENDING)  # the lend began at 0
    got = act.execute(Step.SLEEP_REPLICA, facts, POOL, now=29.0)
    assert got.changed is False and "retried until 30 s into the lend" in got.detail
    assert warm(kube) is None and not kube.events
    engine.fail = None  # its requests finished
    assert act.execute(Step.SLEEP_REPLICA, facts, POOL, now=29.5).changed is True
    assert warm(kube) == WarmRecord(WarmState.ASLEEP, pod)

    kube, act, engine, pod = world()
    act.sleep_retry_s = {"default": 30.0}
    engine.fail = fail
    assert act.execute(Step.SLEEP_REPLICA, node_facts(kube, Phase.LENDING), POOL, now=30.0).changed is True
    assert warm(kube) == WarmRecord(WarmState.COLD, pod)  # still refused after drain_s: lent cold
    # only the pool's own window counts
    kube2, act2, engine2, pod2 = world()
    act2.sleep_retry_s = {"other-pool": 30.0}
    engine2.fail = fail
    assert act2.execute(Step.SLEEP_REPLICA, node_facts(kube2, Phase.LENDING), POOL, now=1.0).changed is True
    assert warm(kube2) == WarmRecord(WarmState.COLD, pod2)


def test_a_wake_is_never_retried() -> None:
    kube, act, engine, pod = world()
    act.sleep_retry_s = {"default": 30.0}
    run(act, kube, Step.SLEEP_REPLICA, Phase.LENDING)
    engine.fail = "error"
    assert act.execute(Step.WAKE_REPLICA, node_facts(kube, Phase.RETURNING), POOL, now=1.0).changed is True
    assert warm(kube) == WarmRecord(WarmState.COLD, pod)  # a failed wake falls back cold at once


def test_no_sleep_control_is_a_failure_too() -> None:
    kube = FakeKube(now=0.0)
    kube.add_node(NODE, "default")
    kube.add_pool(POOL, replicas=1)
    act = Actuator(kube=kube, slurm=NoSlurm(), clock=lambda: 0.0, targets={"default": POOL})  # type: ignore[arg-type]
    run(act, kube, Step.SLEEP_REPLICA, Phase.LENDING)
    assert warm(kube) is not None and warm(kube).state is WarmState.COLD  # type: ignore[union-attr]


def test_a_lost_pod_is_recorded_cold_and_the_asleep_pod_evicted() -> None:
    kube, act, _, pod = world()
    kube.set_warm(NODE, WarmRecord(WarmState.ASLEEP, "vllm-gone"))
    assert run(act, kube, Step.WARM_LOST, Phase.LENT) is True
    assert warm(kube) == WarmRecord(WarmState.COLD, "vllm-gone")
    assert [e.event_type for e in kube.events if e.reason == "GpuBridgeWarmLost"] == ["Warning"]
    kube.set_warm(NODE, WarmRecord(WarmState.COLD, pod))
    assert run(act, kube, Step.DELETE_ASLEEP, Phase.RETURNING) is True
    assert kube.pods("default")[0].terminating


def test_sleep_controls_only_for_warm_pools() -> None:
    cfg = parse_config({"pools": [{"name": "hot", "warm_lending": True, "vllm_port": 8001, "wake_s": 12.0, "warm_hold_mb": 140_000}, {"name": "cold"}]})
    control = sleep_controls(cfg.pools)
    got = control("hot", "10.1.2.3")
    assert isinstance(got, VllmSleepClient) and got.base_url == "http://10.1.2.3:8001" and got.timeout_s == 12.0
    assert control("hot", "fd00::7").base_url == "http://[fd00::7]:8001"  # type: ignore[attr-defined]
    with pytest.raises(AdapterError, match="warm_lending is off"):
        control("cold", "10.1.2.4")
    with pytest.raises(AdapterError, match="no IP"):
        control("hot", None)


@pytest.mark.parametrize("engine_state", ["asleep", "awake", "silent"])
def test_the_per_pass_probe_records_cold_only_an_engine_awake_or_silent(engine_state: str) -> None:
    kube, act, engine, pod = world()
    run(act, kube, Step.SLEEP_REPLICA, Phase.LENDING)
    run(act, kube, Step.CLOSE_GATE, Phase.LENDING)
    engine.asleep = engine_state == "asleep"
    if engine_state == "silent":
        act.sleep_control = lambda pool, ip: (_ for _ in ()).throw(AdapterError("vllm", "connection refused"))
    changed = run(act, kube, Step.CHECK_ASLEEP, Phase.LENT)
    assert changed is (engine_state != "asleep")
    assert warm(kube) == WarmRecord(WarmState.ASLEEP if engine_state == "asleep" else WarmState.COLD, pod)
    assert len([e for e in kube.events if e.reason == WARM_FAILED_EVENT]) == (engine_state != "asleep")


def test_the_wakes_of_one_pass_run_at_once_and_each_node_records_its_own() -> None:
    """Three nodes returning in one pass: their engines are woken together (each wake holds
    its call for 0.3 s, as copying the weights back does), not one after another; the node
    whose wake fails is recorded cold, the others awake."""
    import threading
    import time

    from bridge.model import ClusterView
    from bridge.observe import Observation
    from bridge.reconcile import Intents

    nodes = ("gpu-node-01", "gpu-node-02", "gpu-node-03")
    kube = FakeKube(now=0.0)
    for n in nodes:
        kube.add_node(n, "default")
    kube.add_pool(POOL, replicas=3)
    pods = {p.node: p for p in kube.pods("default")}
    engines = {pods[n].ip: Engine() for n in nodes}
    for e in engines.values():
        e.asleep = True
    engines[pods["gpu-node-02"].ip].fail = "error"
    busy, most = [0], [0]
    lock = threading.Lock()

    class Slow:
        def __init__(self, engine: Engine) -> None:
            self.engine = engine

        def wake_up(self, tags: object = ()) -> None:
            with lock:
                busy[0] += 1
                most[0] = max(most[0], busy[0])
            time.sleep(0.3)
            with lock:
                busy[0] -= 1
            self.engine.wake_up(tags)

        def sleep(self, level: int = 1) -> None:
            self.engine.sleep(level)

        def is_sleeping(self) -> bool:
            return self.engine.is_sleeping()

    act = Actuator(kube=kube, slurm=NoSlurm(), clock=lambda: 0.0, targets={"default": POOL},  # type: ignore[arg-type]
                   sleep_control=lambda pool, ip: Slow(engines[ip]))  # type: ignore[arg-type,index]
    steps = []
    for n in nodes:
        kube.set_warm(n, WarmRecord(WarmState.ASLEEP, pods[n].name))
        p = pods[n]
        facts = NodeFacts(name=n, phase=Phase.RETURNING, phase_since=0.0, fenced=True,
                          pods=(PodFacts(p.name, ready=False, terminating=False, awake=False, ip=p.ip),),
                          slurm_drained_by_us=True, slurm_drained_by_other=False, slurm_down=False, slurm_allocated=False,
                          hold=None, research_jobs=(), warm=WarmRecord(WarmState.ASLEEP, p.name))
        steps.append((Step.WAKE_REPLICA, facts, "default"))
    obs = Observation(view=ClusterView(now=0.0, nodes=(), pools={}), facts={}, pool_of={})
    t0 = time.monotonic()
    records = act.apply(Intents(observation=obs, steps=tuple(steps)))
    took = time.monotonic() - t0
    assert most[0] == 3 and took < 0.75, f"{most[0]} wakes at once, {took:.2f} s for three 0.3 s wakes"
    assert [r.node for r in records] == list(nodes) and all(r.changed for r in records)
    states = {n: kube.node(n).warm.state for n in nodes}  # type: ignore[union-attr]
    assert states == {"gpu-node-01": WarmState.AWAKE, "gpu-node-02": WarmState.COLD, "gpu-node-03": WarmState.AWAKE}
    # outside a pass a step wakes its own engine only
    kube.set_warm("gpu-node-02", WarmRecord(WarmState.ASLEEP, pods["gpu-node-02"].name))
    engines[pods["gpu-node-02"].ip].fail = None
    assert act.execute(Step.WAKE_REPLICA, steps[1][1], POOL, now=0.0).changed is True
    assert kube.node("gpu-node-02").warm.state is WarmState.AWAKE  # type: ignore[union-attr]


@contextlib.contextmanager
def info_events() -> Iterator[list[MutableMapping[str, Any]]]:
    """The structlog events logged inside, at info level, whatever an earlier test configured
    (a CLI test sends the lines to stderr, a bench raises the level)."""
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        with structlog.testing.capture_logs() as got:
            yield got
    finally:
        structlog.configure(**old)


def test_a_refused_sleep_retried_each_pass_is_logged_once_then_on_a_new_reason_or_each_minute() -> None:
    kube, act, engine, pod = world()
    act.sleep_retry_s = {"default": 120.0}
    engine.fail = "error"
    facts = node_facts(kube, Phase.LENDING)
    with info_events() as events:

        def lines() -> list[MutableMapping[str, Any]]:
            new = [e for e in events if e.get("event") == "node_step" and e.get("step") == "sleep_replica"]
            events.clear()
            return new

        for t in (1.0, 1.25, 1.5, 30.0):  # every pass while vLLM still has requests in flight
            assert act.execute(Step.SLEEP_REPLICA, facts, POOL, now=t).changed is False
        got = lines()
        assert len(got) == 1 and "HTTP 500" in got[0]["detail"] and "retried until 120 s" in got[0]["detail"]
        act.execute(Step.SLEEP_REPLICA, facts, POOL, now=61.0)  # a minute on: said again
        assert len(lines()) == 1
        engine.fail = "lie"  # another reason: said at once
        act.execute(Step.SLEEP_REPLICA, facts, POOL, now=61.5)
        act.execute(Step.SLEEP_REPLICA, facts, POOL, now=62.0)
        assert len(lines()) == 1
        engine.fail = None
        assert act.execute(Step.SLEEP_REPLICA, facts, POOL, now=62.5).changed is True
        got = lines()
        assert len(got) == 1 and got[0]["changed"] is True  # done: said
        engine.fail = "error"  # a later refusal (the next lend) is said again
        act.execute(Step.SLEEP_REPLICA, facts, POOL, now=63.0)
        assert len(lines()) == 1
