"""The free-GPU check before a warm wake (issue 23, docs/warm-lending.md): a node returning with
its replica asleep is woken only once each of its GPUs shows ``pools[].wake_gpu_free_mib`` free
(dcgm-exporter's ``DCGM_FI_DEV_FB_FREE``); unknown counts as not free; still not free
``wake_gpu_wait_s`` into ``returning``, the wake is given up for the cold fallback."""

from __future__ import annotations

import dataclasses

import pytest

from bridge.adapters.prom.gpu import FB_FREE, build_gpu_query, parse_gpu_free
from bridge.adapters.prom.types import PromPool
from bridge.config import parse_config
from bridge.errors import ConfigError
from bridge.lifecycle import LENDING_POD_DELETION_COST, WAITS, HoldFacts, NodeFacts, Step, next_step
from bridge.model import Phase, WarmRecord, WarmState
from bridge.observer import Observer
from bridge.policy.forecast import horizon_s, return_s
from gpu_bridge_lab.fakes.kube import FakeProm

try:
    from test_actuate_warm import info_events
    from test_lifecycle_warm import ASLEEP, COLD, NOW, RETURNING, facts
except ImportError:  # run as a package
    from .test_actuate_warm import info_events  # type: ignore[no-redef]
    from .test_lifecycle_warm import ASLEEP, COLD, NOW, RETURNING, facts  # type: ignore[no-redef]

NEED = 70_000.0  # MiB each GPU must show free
WAIT = 60.0
BACK = facts(**{**RETURNING, "phase_since": NOW - 10}, warm=ASLEEP)  # returning asleep, 10 s ago, drained long ago


def step(f: NodeFacts, *, now: float = NOW, need: float | None = NEED) -> Step | None:
    return next_step(f, now=now, scaled_down=True, warm=True, wake_gpu_free_mib=need, wake_gpu_wait_s=WAIT)


# --- the give-up says what Slurm still has on the node -----------------------------------------

def test_the_give_up_names_what_slurm_still_has_on_the_node() -> None:
    """The bridge never kills what holds the GPUs: its message points the operator at it."""
    from bridge.actuate import gpu_holders
    from bridge.lifecycle import PreemptedJob

    assert "Slurm shows no research job on it" in gpu_holders(BACK)
    stuck = dataclasses.replace(BACK, research_jobs=("1234",), research_preempted=(PreemptedJob("1230", NOW - 300, 0),),
                                slurm_drained_by_other=True)
    said = gpu_holders(stuck)
    assert "research job(s) still on it in Slurm: 1230, 1234" in said and "drained in Slurm, not by gpu-bridge" in said
    many = dataclasses.replace(BACK, research_jobs=tuple(str(1000 + i) for i in range(9)))
    assert gpu_holders(many).endswith("1000, 1001, 1002, 1003, 1004 ...")  # capped


# --- the decision (pure) -----------------------------------------------------------------------

@pytest.mark.parametrize(("free", "now", "expected"), [
    (80_000.0, NOW, Step.WAKE_REPLICA),  # free: woken
    (NEED, NOW, Step.WAKE_REPLICA),  # exactly what it needs
    (10_000.0, NOW, Step.WAIT_GPU_FREE),  # held by a job stuck in "Kill task failed": wait
    (None, NOW, Step.WAIT_GPU_FREE),  # unknown: not free
    (10_000.0, NOW - 10 + WAIT, Step.GPU_HELD),  # held up to the give-up: the wake is given up (cold)
    (None, NOW + 1_000, Step.GPU_HELD),
    (80_000.0, NOW + 1_000, Step.WAKE_REPLICA),  # free late is still free: woken
])
def test_the_wake_waits_for_free_gpus_then_gives_up(free: float | None, now: float, expected: Step) -> None:
    assert step(dataclasses.replace(BACK, gpu_free_mib=free), now=now) is expected


def test_no_check_configured_wakes_as_before_whatever_the_gpus_show() -> None:
    assert step(dataclasses.replace(BACK, gpu_free_mib=0.0), need=None) is Step.WAKE_REPLICA
    assert step(dataclasses.replace(BACK, gpu_free_mib=None), need=None) is Step.WAKE_REPLICA


def test_the_wait_is_a_wait_and_the_checks_before_it_still_come_first() -> None:
    assert Step.WAIT_GPU_FREE in WAITS and Step.GPU_HELD not in WAITS
    young = dataclasses.replace(BACK, gpu_free_mib=None, slurm_drained_at=NOW - 1, slurm_now=NOW)
    assert next_step(young, now=NOW, scaled_down=True, drain_saved_after_s=5, wake_gpu_free_mib=NEED,
                     wake_gpu_wait_s=WAIT) is Step.WAIT_DRAIN_SAVED
    assert step(dataclasses.replace(BACK, research_jobs=("9",))) is Step.BLOCKED
    assert step(dataclasses.replace(BACK, mem_hold=HoldFacts("30", running=True))) is Step.CANCEL_MEM_HOLD
    assert step(dataclasses.replace(BACK, pods=())) is Step.WARM_LOST


def test_after_the_give_up_the_record_is_cold_and_the_pod_is_evicted_as_after_a_failed_wake() -> None:
    given_up = dataclasses.replace(BACK, gpu_free_mib=None, warm=COLD)
    assert step(given_up, now=NOW + WAIT) is Step.MARK_POD  # the pod goes by the scale, marked first
    marked = dataclasses.replace(given_up, pods=tuple(dataclasses.replace(p, deletion_cost=LENDING_POD_DELETION_COST)
                                                      for p in given_up.pods))
    assert step(marked, now=NOW + WAIT) is Step.DELETE_ASLEEP  # outlived the scale: evicted
    # the new pod starts cold: the GPU check never applies to it (the record is not asleep)
    assert step(dataclasses.replace(given_up, pods=()), now=NOW + WAIT) is Step.UNFENCE


def test_a_restart_mid_wait_times_the_give_up_from_the_node_not_from_the_restart() -> None:
    """The daemon keeps no timer: killed at any point of the wait and restarted, the facts it
    reads back (the phase's time on the node) give the same steps at the same instants."""
    held = dataclasses.replace(BACK, gpu_free_mib=5_000.0)
    since = held.phase_since
    seen = {t: step(held, now=since + t) for t in range(0, 90)}
    for restart_at in (5, 30, 59):
        reread = NodeFacts(**{f.name: getattr(held, f.name) for f in dataclasses.fields(NodeFacts)})  # rebuilt from nothing
        assert {t: step(reread, now=since + t) for t in range(restart_at, 90)} == {t: seen[t] for t in range(restart_at, 90)}
    assert {t for t, s in seen.items() if s is Step.GPU_HELD} == set(range(int(WAIT), 90))
    assert all(s is Step.WAIT_GPU_FREE for t, s in seen.items() if t < WAIT)


# --- the query and its answer (pure) -----------------------------------------------------------

T = 1_700_000_000.0


def series(node: str | None, gpu: int, value: str, *, age: float | None = 5.0, label: str = "Hostname") -> list[dict[str, object]]:
    labels = {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}", **({label: node} if node is not None else {})}
    out: list[dict[str, object]] = [{"metric": {"__name__": FB_FREE, **labels, "bridge_q": "value"}, "value": [T, value]}]
    if age is not None:
        out.append({"metric": {**labels, "bridge_q": "ts"}, "value": [T, str(T - age)]})
    return out


def node_series(node: str, values: list[str], **kw: object) -> list[dict[str, object]]:
    return [s for i, v in enumerate(values) for s in series(node, i, v, **kw)]  # type: ignore[arg-type]


def parse(result: list[dict[str, object]], nodes: tuple[str, ...] = ("gpu-node-01",)) -> tuple[dict[str, float | None], dict[str, str]]:
    return parse_gpu_free(result, nodes=nodes, node_label="Hostname", gpus=4, now=T, staleness_s=60.0)


def test_the_query_selects_only_the_nodes_asked_for_on_the_configured_label() -> None:
    q = build_gpu_query(["gpu-node.02", "gpu-node-01"], node_label="node")
    assert q.count(FB_FREE) == 2 and 'node=~"gpu\\\\-node\\\\-01|gpu\\\\-node\\\\.02"' in q
    assert 'timestamp(DCGM_FI_DEV_FB_FREE{node=~' in q and "bridge_q" in q


def test_the_lowest_gpu_of_each_node_is_its_free_memory() -> None:
    free, problems = parse(node_series("gpu-node-01", ["80000", "79000.5", "81000", "80500"])
                           + node_series("gpu-node-02", ["80000", "9000", "81000", "80500"]), ("gpu-node-01", "gpu-node-02"))
    assert free == {"gpu-node-01": 79000.5, "gpu-node-02": 9000.0} and not problems


@pytest.mark.parametrize(("result", "why"), [
    (node_series("gpu-node-01", ["80000", "NaN", "81000", "80500"]), "is NaN"),
    (node_series("gpu-node-01", ["80000", "-1", "81000", "80500"]), "is negative"),
    (node_series("gpu-node-01", ["80000", "+Inf", "81000", "80500"]), "is infinite"),
    (node_series("gpu-node-01", ["80000", "81000", "80500"]), "3 series for Hostname='gpu-node-01', expected one per GPU (4)"),
    ([], "0 series"),
    (node_series("gpu-node-01", ["80000"] * 4, age=600.0), "is stale (sample 600 s old, limit 60 s)"),
    (node_series("gpu-node-01", ["80000"] * 4, age=None), "is stale (sample time missing"),
    (node_series("gpu-node-01", ["80000"] * 4) + series(None, 7, "80000"), "without the label Hostname"),
])
def test_a_bad_answer_makes_the_node_unknown_with_the_reason_naming_the_field(result: list[dict[str, object]], why: str) -> None:
    free, problems = parse(result)
    assert free == {"gpu-node-01": None}
    series, text = problems["gpu-node-01"]
    assert series == FB_FREE and why in text and FB_FREE in text


def test_a_node_not_asked_for_is_ignored() -> None:
    free, problems = parse(node_series("gpu-node-01", ["80000"] * 4) + node_series("other", ["1"] * 4))
    assert free == {"gpu-node-01": 80000.0} and not problems


# --- config, horizon ---------------------------------------------------------------------------

def pool(**kw: object) -> dict[str, object]:
    return {"name": "default", "warm_lending": True, "warm_hold_mb": 1000, **kw}


def test_config_defaults_leave_the_check_off_and_bad_values_name_the_field() -> None:
    p = parse_config({"pools": [pool()]}).pools[0]
    assert p.wake_gpu_free_mib is None and p.wake_gpu_wait_s == 60.0 and p.gpus_per_node == 4
    for bad, field in (({"pools": [pool(wake_gpu_free_mib=0)]}, "wake_gpu_free_mib"),
                       ({"pools": [pool(wake_gpu_wait_s=0)]}, "wake_gpu_wait_s"),
                       ({"pools": [pool(gpus_per_node=0)]}, "gpus_per_node"),
                       ({"pools": [pool()], "prometheus": {"gpu_node_label": "host-name"}}, "gpu_node_label")):
        with pytest.raises(ConfigError, match=field):
            parse_config(bad)


def test_the_warm_horizon_includes_the_give_up_only_when_the_check_is_on() -> None:
    off = parse_config({"pools": [pool(wake_s=30)]})
    on = parse_config({"pools": [pool(wake_s=30, wake_gpu_free_mib=70000, wake_gpu_wait_s=45)]})
    assert return_s(off.pools[0]) == 30 and return_s(on.pools[0]) == 75
    assert horizon_s(on, on.pools[0]) - horizon_s(off, off.pools[0]) == 45
    cold = parse_config({"pools": [{"name": "default", "wake_gpu_free_mib": 70000}]})
    assert return_s(cold.pools[0]) == cold.pools[0].cold_start_s


# --- the read: only for nodes returning asleep -------------------------------------------------

@dataclasses.dataclass
class Node:
    name: str
    phase: Phase | None
    warm: WarmRecord | None = None
    pool: str | None = "default"
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    phase_since: float | None = NOW
    pin: None = None
    fenced: bool = True
    problem: str | None = None
    reason: str | None = None


class Kube:
    def __init__(self, nodes: list[Node]) -> None:
        self._nodes = nodes

    def nodes(self) -> list[Node]:
        return self._nodes

    def pods(self, pool: str) -> list[object]:
        return []

    def deployment(self, pool: str) -> None:
        return None


class Slurm:
    def nodes(self) -> list[object]:
        return []

    def jobs(self) -> list[object]:
        return []

    def clock(self) -> float:
        return NOW


def observer(nodes: list[Node], prom: FakeProm, **kw: object) -> Observer:
    config = parse_config({"pools": [pool(**kw)], "prometheus": {"gpu_node_label": "node"}})
    return Observer(config, Kube(nodes), Slurm(), prom, {"default": PromPool("default", "m")})  # type: ignore[arg-type]


def test_gpus_are_read_only_for_nodes_returning_asleep_in_one_query() -> None:
    nodes = [Node("a", Phase.RETURNING, ASLEEP), Node("b", Phase.RETURNING, WarmRecord(WarmState.COLD, "p")),
             Node("c", Phase.LENT, ASLEEP), Node("d", Phase.SERVING), Node("e", Phase.RETURNING, ASLEEP),
             Node("f", Phase.RETURNING, ASLEEP, pool="other")]
    prom = FakeProm(gpu={"a": 80_000.0})
    with info_events() as logs:
        snap = observer(nodes, prom, wake_gpu_free_mib=70_000).read(NOW)
    assert prom.gpu_queries == [("a", "e")]
    assert snap.gpu_free == {"a": 80_000.0, "e": None}
    assert {(e["node"], e["phase"], e["free_mib"]) for e in logs if e["event"] == "wake_gpu_check"} == {
        ("a", "returning", 80_000.0), ("e", "returning", None)}


def test_a_steady_tick_and_a_pool_without_the_check_make_no_gpu_query() -> None:
    prom = FakeProm()
    observer([Node("a", Phase.LENT, ASLEEP), Node("d", Phase.SERVING)], prom, wake_gpu_free_mib=70_000).read(NOW)
    observer([Node("a", Phase.RETURNING, ASLEEP)], prom).read(NOW)
    assert prom.gpu_queries == []


def test_a_failed_gpu_read_leaves_the_nodes_unknown_and_is_counted_as_a_prometheus_error() -> None:
    prom = FakeProm(fail=True)
    snap = observer([Node("a", Phase.RETURNING, ASLEEP)], prom, wake_gpu_free_mib=70_000).read(NOW)
    assert "a" not in snap.gpu_free and "prometheus" in snap.errors
