"""``pools[].wake_gpu_free_mib: auto``: the need read from the sleeping engine itself, vLLM's
``gpu_memory_utilization`` (a label of ``vllm:cache_config_info``) x each GPU's memory
(``DCGM_FI_DEV_FB_FREE`` + ``_USED`` [+ ``_RESERVED``]); the node's reading is the lowest MiB free
beyond that need, woken at >= 0. Bad or missing data makes the node unknown (not free) with a
reason naming the series and the label."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.adapters.prom.gpu import (
    CACHE_INFO,
    FB_FREE,
    FB_RESERVED,
    FB_USED,
    build_gpu_query,
    engine_utilization,
    parse_gpu_free,
)
from bridge.adapters.prom.signals import _parsed
from bridge.adapters.prom.types import PromPool
from bridge.config import parse_config
from bridge.errors import AdapterError, ConfigError
from bridge.lifecycle import Step, next_step
from bridge.model import Phase, WarmRecord, WarmState
from gpu_bridge_lab.fakes.kube import FakeProm
from gpu_bridge_lab.sandbox.vllm.metrics import CACHE_CONFIG_LABELS, cache_config_values
from gpu_bridge_lab.sandbox.vllm.sleep import SleepParams

try:
    from test_actuate_warm import info_events
    from test_lifecycle_warm import ASLEEP, NOW, RETURNING, facts
    from test_wake_gpu_free import Node, observer, pool
except ImportError:  # run as a package
    from .test_actuate_warm import info_events  # type: ignore[no-redef]
    from .test_lifecycle_warm import ASLEEP, NOW, RETURNING, facts  # type: ignore[no-redef]
    from .test_wake_gpu_free import Node, observer, pool  # type: ignore[no-redef]

T = 1_700_000_000.0
TOTAL = 81_559.0  # an H100 80GB as CUDA (and FB_FREE + FB_USED) sees it
NODE, POD = "gpu-node-01", "llama-0"


def gpu(gpu: int, free: float, used: float, *, reserved: float | None = None, node: str = NODE) -> list[dict[str, object]]:
    """One GPU's series as the query tags them (``ts``: 5 s old)."""
    labels = {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}", "Hostname": node}
    out: list[dict[str, object]] = [
        {"metric": {"__name__": FB_FREE, **labels, "bridge_q": "value"}, "value": [T, str(free)]},
        {"metric": {**labels, "bridge_q": "ts"}, "value": [T, str(T - 5)]},
        {"metric": {"__name__": FB_USED, **labels, "bridge_q": "used"}, "value": [T, str(used)]},
        {"metric": {**labels, "bridge_q": "used_ts"}, "value": [T, str(T - 5)]},
    ]
    if reserved is not None:
        out.append({"metric": {"__name__": FB_RESERVED, **labels, "bridge_q": "reserved"}, "value": [T, str(reserved)]})
    return out


def info(util: str | None = "0.9", *, pod: str = POD, engine: str = "0", **labels: str) -> dict[str, object]:
    """vllm:cache_config_info as vLLM exports it (the lab simulator's labels), one engine."""
    metric = dict(zip(CACHE_CONFIG_LABELS, cache_config_values(0.9, 15_625), strict=True))
    metric.pop("gpu_memory_utilization")
    if util is not None:
        metric["gpu_memory_utilization"] = util
    return {"metric": {"__name__": CACHE_INFO, **metric, **labels, "engine": engine, "pod": pod, "namespace": "serving",
                       "bridge_q": "util"}, "value": [T, "1"]}


def asleep(held: float = 0.0, *, ctx: float = 600.0) -> list[dict[str, object]]:
    """A node whose engine sleeps (it keeps ``ctx`` MiB a GPU), ``held`` MiB more held on GPU 2."""
    return [s for i in range(4) for s in gpu(i, TOTAL - ctx - (held if i == 2 else 0), ctx + (held if i == 2 else 0))]


def parse(result: list[dict[str, object]]) -> tuple[float | None, tuple[str, str] | None]:
    free, problems = parse_gpu_free(result, nodes=[NODE], node_label="Hostname", gpus=4, now=T, staleness_s=60.0,
                                    pods={NODE: POD})
    return free[NODE], problems.get(NODE)


# --- the need and the margin (pure) ------------------------------------------------------------

def test_the_margin_is_the_lowest_gpu_s_free_memory_beyond_utilization_x_its_total() -> None:
    margin, problem = parse([*asleep(), info("0.9")])
    assert problem is None and margin == pytest.approx(TOTAL - 600 - 0.9 * TOTAL)  # 7,555.1 MiB to spare
    margin, problem = parse([*asleep(held=10_000), info("0.9")])  # a stuck job keeps 10,000 MiB on GPU 2
    assert problem is None and margin == pytest.approx(TOTAL - 10_600 - 0.9 * TOTAL)  # < 0: not free


def test_reserved_memory_counts_in_the_total_where_exported_and_engines_take_the_largest_share() -> None:
    with_reserved = [s for i in range(4) for s in gpu(i, 80_000, 900, reserved=659)]  # free + used + reserved = 81,559
    margin, _ = parse([*with_reserved, info("0.9")])
    assert margin == pytest.approx(80_000 - 0.9 * TOTAL)
    margin, _ = parse([*asleep(), info("0.5"), info("0.92", engine="1")])  # data parallel: one series per engine
    assert margin == pytest.approx(TOTAL - 600 - 0.92 * TOTAL)


@pytest.mark.parametrize(("result", "series", "why"), [
    ([*asleep()], CACHE_INFO, "no vllm:cache_config_info series for pod='llama-0'"),
    ([*asleep(), info(pod="llama-1")], CACHE_INFO, "no vllm:cache_config_info series for pod='llama-0'"),
    ([*asleep(), info(None)], CACHE_INFO, "has no label gpu_memory_utilization"),
    ([*asleep(), info("lots")], CACHE_INFO, "label gpu_memory_utilization='lots' is not a number in (0, 1]"),
    ([*asleep(), info("0")], CACHE_INFO, "gpu_memory_utilization='0' is not a number in (0, 1]"),
    ([*asleep(), info("1.5")], CACHE_INFO, "gpu_memory_utilization='1.5' is not a number in (0, 1]"),
    ([*asleep(), info("NaN")], CACHE_INFO, "gpu_memory_utilization='NaN' is not a number in (0, 1]"),
    ([*asleep(), info("0.9", kv_cache_memory_bytes="8589934592")], CACHE_INFO,
     "kv_cache_memory_bytes='8589934592' is set"),
    ([*asleep(), info("0.9"), info("0.9x", engine="1")], CACHE_INFO, 'engine="1"}: label gpu_memory_utilization'),
    ([s for s in asleep() if not (s["metric"].get("bridge_q") == "used" and s["metric"]["gpu"] == "3")]  # type: ignore[union-attr]
     + [info()], FB_USED, 'DCGM_FI_DEV_FB_USED{Hostname="gpu-node-01",UUID="GPU-gpu-node-01-3",gpu="3"} is missing'),
    ([s for i in range(4) for s in gpu(i, 80_000, float("nan"))] + [info()], FB_USED, "is NaN: the GPU's total memory"),
    ([s for i in range(4) for s in gpu(i, 80_000, 900, reserved=-1)] + [info()], FB_RESERVED, "is negative"),
])
def test_bad_or_missing_data_is_unknown_naming_the_series_and_the_label(
        result: list[dict[str, object]], series: str, why: str) -> None:
    margin, problem = parse(result)
    assert margin is None and problem is not None
    assert problem[0] == series and why in problem[1], problem


def test_used_memory_is_aged_on_its_own_sample_times() -> None:
    """FB_USED may come from another job than FB_FREE: an old sample of it is unknown, not total memory."""
    def aged(age: float) -> list[dict[str, object]]:
        return [{**s, "value": [T, str(T - age)]} if s["metric"].get("bridge_q") == "used_ts" else s  # type: ignore[union-attr]
                for s in asleep()]
    margin, problem = parse([*aged(600), info()])
    assert margin is None and problem is not None and problem[0] == FB_USED and "is stale (sample 600 s old" in problem[1]
    no_ts = [s for s in asleep() if s["metric"].get("bridge_q") != "used_ts"]  # type: ignore[union-attr]
    margin, problem = parse([*no_ts, info()])
    assert margin is None and problem is not None and problem[0] == FB_USED and "sample time missing" in problem[1]
    assert parse([*aged(30), info()])[0] is not None  # within the limit (60 s): read


def test_the_free_memory_checks_still_come_first() -> None:
    stale = [{**s, "value": [T, str(T - 600)]} if s["metric"].get("bridge_q") == "ts" else s for s in asleep()]  # type: ignore[union-attr]
    margin, problem = parse([*stale, info()])
    assert margin is None and problem is not None and problem[0] == FB_FREE and "is stale" in problem[1]


def test_engine_utilization_reads_vllm_s_label_value() -> None:
    assert engine_utilization(POD, [{"gpu_memory_utilization": "0.9", "kv_cache_memory_bytes": "None"}]) == (0.9, "")
    assert engine_utilization(POD, [{"gpu_memory_utilization": "1"}]) == (1.0, "")  # older vLLM: no kv_cache_memory_bytes


def test_the_auto_query_adds_used_reserved_and_the_pods_cache_config_in_the_same_query() -> None:
    plain = build_gpu_query(["gpu-node-01"], node_label="Hostname")
    assert FB_USED not in plain and CACHE_INFO not in plain  # a number configured: the query as before
    q = build_gpu_query(["gpu-node-01"], node_label="Hostname", pods=["llama-0", "llama.1"],
                        pool=PromPool("default", "m", namespace="serving", matchers={"job": "vllm", "cluster": "a"}))
    assert f'{FB_USED}{{Hostname=~"gpu\\\\-node\\\\-01"}}' in q and f"{FB_RESERVED}{{" in q
    # no model_name (vLLM sets none on it); the namespace and the pool's prometheus_matchers as on its other series
    assert f'{CACHE_INFO}{{pod=~"llama\\\\-0|llama\\\\.1",namespace="serving",cluster="a",job="vllm"}}' in q
    assert f'timestamp({FB_USED}{{Hostname=~"gpu\\\\-node\\\\-01"}})' in q  # aged on its own
    assert q.count("bridge_q") == 6


# --- the decision: the lifecycle compares the margin with 0 ------------------------------------

def test_the_comparison_is_conservative_by_what_the_sleeping_engine_keeps() -> None:
    """The engine's whole budget (utilization x total) must be free although the sleeping process
    still holds its CUDA context inside that budget: free enough means the wake fits with room to
    spare; a leftover smaller than the context it would have fitted waits instead."""
    need = parse_config({"pools": [pool(wake_gpu_free_mib="auto")]}).pools[0].wake_gpu_need_mib
    back = facts(**{**RETURNING, "phase_since": NOW - 10}, warm=ASLEEP)
    params = SleepParams()  # the lab's engine: 0.9 of 81,559 MiB, 600 MiB kept asleep
    ctx, util, total = params.cuda_context_mib, params.gpu_memory_utilization, params.gpu_total_mib
    wake_allocates = util * total - ctx  # weights + KV cache (+ activations) come back; the context stayed

    def decide(held: float) -> Step | None:
        margin, _ = parse([*asleep(held, ctx=ctx), info(str(util))])
        return next_step(dataclasses.replace(back, gpu_free_mib=margin), now=NOW, scaled_down=True, warm=True,
                         wake_gpu_free_mib=need, wake_gpu_wait_s=60.0)

    room = total - ctx - util * total  # what a stuck job may keep with the wake still allowed
    assert decide(0) is Step.WAKE_REPLICA and decide(room - 0.5) is Step.WAKE_REPLICA
    assert total - ctx - room >= wake_allocates + ctx  # allowed -> the wake fits, with the context's worth to spare
    assert decide(room + 1) is Step.WAIT_GPU_FREE  # would still have fitted (by up to ctx): waits, conservatively
    assert decide(room + ctx + 1) is Step.WAIT_GPU_FREE  # would not fit: waits


# --- config and the read ------------------------------------------------------------------------

def test_config_takes_auto_a_number_or_null_and_names_the_field_otherwise() -> None:
    p = parse_config({"pools": [pool(wake_gpu_free_mib="auto")]}).pools[0]
    assert p.wake_gpu_free_mib == "auto" and p.wake_gpu_need_mib == 0.0
    assert parse_config({"pools": [pool(wake_gpu_free_mib=70000.0)]}).pools[0].wake_gpu_need_mib == 70000
    assert parse_config({"pools": [pool()]}).pools[0].wake_gpu_need_mib is None
    for bad in ("Auto", "70000", 0, -5, 1.5, True, [1], 20_000_000):
        with pytest.raises(ConfigError) as exc:
            parse_config({"pools": [pool(wake_gpu_free_mib=bad)]})
        problems = exc.value.problems
        assert len(problems) == 1 and ('pools[0].wake_gpu_free_mib: expected a whole number of MiB (1 to 10,000,000), '
                                       '"auto" or null, got ') in problems[0], (bad, problems)


def test_auto_reads_each_node_with_its_sleeping_pod_and_logs_the_margin() -> None:
    nodes = [Node("a", Phase.RETURNING, WarmRecord(WarmState.ASLEEP, "llama-7")), Node("c", Phase.LENT, ASLEEP),
             Node("e", Phase.RETURNING, WarmRecord(WarmState.ASLEEP, "llama-2"))]
    prom = FakeProm(gpu={"a": 1_200.0, "e": -9_000.0})
    with info_events() as logs:
        snap = observer(nodes, prom, wake_gpu_free_mib="auto").read(NOW)
    assert prom.gpu_queries == [("a", "e")] and prom.gpu_pods == [{"a": "llama-7", "e": "llama-2"}]
    assert snap.gpu_free == {"a": 1_200.0, "e": -9_000.0}
    assert {(e["node"], e["margin_mib"], e["need_mib"]) for e in logs if e["event"] == "wake_gpu_check"} == {
        ("a", 1_200.0, "auto"), ("e", -9_000.0, "auto")}
    prom = FakeProm(gpu={"a": 80_000.0})
    observer(nodes[:1], prom, wake_gpu_free_mib=70_000).read(NOW)
    assert prom.gpu_pods == [None]  # a number configured: no pods, the query as before
    steady = FakeProm()
    observer([Node("c", Phase.LENT, ASLEEP)], steady, wake_gpu_free_mib="auto").read(NOW)
    assert steady.gpu_queries == []  # nothing returning asleep: no query


# --- any answer: unknown or a number, never a crash ---------------------------------------------

_TEXT = st.sampled_from(["0.9", "1", "0", "NaN", "+Inf", "-5", "8e4", "", "None", "x", "1e400"])
_LABEL = st.sampled_from(["Hostname", "gpu", "UUID", "bridge_q", "pod", "gpu_memory_utilization", "kv_cache_memory_bytes",
                          "engine", "__name__"])
_VALUE = st.sampled_from([NODE, POD, "value", "ts", "used", "used_ts", "reserved", "util", "0", "1", "2", "3", "gpu-node-02"])
_METRIC = st.one_of(st.none(), st.integers(), st.lists(_VALUE))
_SAMPLE = st.one_of(st.lists(st.one_of(st.floats(allow_nan=True), _TEXT, st.none()), max_size=3), st.none(), _TEXT)
_SERIES = st.fixed_dictionaries({"metric": st.dictionaries(_LABEL, st.one_of(_VALUE, _TEXT), max_size=6),
                                  "value": st.tuples(st.just(T), _TEXT).map(list)})
_MALFORMED = st.one_of(st.fixed_dictionaries({"metric": _METRIC, "value": _SAMPLE}),
                       st.dictionaries(st.sampled_from(["metric", "value"]), _SAMPLE), st.none(), _TEXT)


@settings(max_examples=400, deadline=None)
@given(noise=st.lists(_SERIES, max_size=6), malformed=st.lists(_MALFORMED, max_size=1),
       keep=st.one_of(st.just(21), st.integers(0, 21)), spoil=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), _TEXT), max_size=3))
def test_any_answer_is_unknown_or_a_finite_margin_or_an_adapter_error(
        noise: list[object], malformed: list[object], keep: int, spoil: list[tuple[int, int, str]]) -> None:
    """Whatever Prometheus answers (a good node's series partly kept, some of their values
    replaced by garbage, garbage items mixed in), the read gives each node a finite number or None
    (unknown, with why), or one AdapterError: never another exception, never NaN or infinity."""
    good: list[dict[str, object]] = [*asleep(), info()][:keep]
    for gpu_i, part, text in spoil:  # asleep(): per GPU, its free value, ts, used, used_ts in that order
        if (i := 4 * gpu_i + part) < len(good):
            good[i] = {**good[i], "value": [T, text]}
    result = [*good, *noise, *malformed]
    try:
        free, problems = _parsed("query", PromPool("default", "m"), lambda: parse_gpu_free(
            result, nodes=[NODE], node_label="Hostname", gpus=4, now=T, staleness_s=60.0, pods={NODE: POD}))  # type: ignore[arg-type]
    except AdapterError:
        return
    assert set(free) == {NODE}
    value = free[NODE]
    assert (value is None) == (NODE in problems)
    assert value is None or math.isfinite(value)
