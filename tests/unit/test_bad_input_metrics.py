"""Bad metrics: NaN, negative, infinite, out-of-range, garbage text, missing labels, an
unknown model, malformed result items. The Prometheus adapter's parsing turns each into a
missing signal with its reason (or an AdapterError for a result it cannot read), and the
policy lends nothing on them, while the same situation with clean metrics does lend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from bridge.adapters.prom.signals import PromAdapter
from bridge.adapters.prom.history import MAX_RANGE_POINTS
from bridge.adapters.prom.types import KV_V0, KV_V1, RUNNING, TAG, WAITING, PromPool
from bridge.config import default_config
from bridge.errors import AdapterError
from bridge.model import ActionKind, ClusterView, LoadSignals, NodeState, Phase, PoolState
from bridge.policy import plan

NOW = 1_767_225_600.0
POOL = PromPool(name="default", model="llama")
CFG = default_config()
REPLICAS = 8


class FakeClient:
    """Stands in for PrometheusConnect: answers custom_query with a fixed result."""

    def __init__(self, result: Any, range_result: Any = ()) -> None:
        self.result = result
        self.range_result = list(range_result) if isinstance(range_result, tuple) else range_result

    def custom_query(self, query: str, params: Mapping[str, Any] | None = None, timeout: float | None = None) -> Any:
        return self.result

    def custom_query_range(self, query: str, **kw: Any) -> Any:
        return self.range_result


def item(tag: str, value: Any, *, pod: str, ts: Any = NOW, **labels: str) -> dict[str, Any]:
    metric = {"model_name": "llama", "pod": pod, "namespace": "serving", **labels, TAG: tag}
    return {"metric": {k: v for k, v in metric.items() if v is not None}, "value": [ts, value]}


def clean(replicas: int = REPLICAS, running: float = 1.0) -> list[dict[str, Any]]:
    """Low load on every replica: a clean pool the policy lends from."""
    out = []
    for i in range(replicas):
        pod = f"vllm-{i}"
        for metric, v in ((RUNNING, running), (WAITING, 0.0), (KV_V1, 0.05)):
            out.append(item(f"value:{metric}", str(v), pod=pod))
            out.append(item(f"ts:{metric}", str(NOW - 5), pod=pod))
        out.append(item("rate:prompt", "10", pod=pod))
        out.append(item("rate:generation", "20", pod=pod))
    return out


def read(result: Any) -> Any:
    return PromAdapter("http://unused", staleness_s=60, client=FakeClient(result)).current(POOL, at=NOW)  # type: ignore[arg-type]


def with_value(result: list[dict[str, Any]], tag: str, value: Any, n: int = 1) -> list[dict[str, Any]]:
    out, done = [], 0
    for it in result:
        if it["metric"][TAG] == tag and done < n:
            it = {"metric": it["metric"], "value": [it["value"][0], value]}
            done += 1
        out.append(it)
    return out


def policy_view(signals: LoadSignals | None) -> ClusterView:
    """8 serving nodes that have been idle for two hours: lending is wanted on clean signals."""
    history = tuple(
        LoadSignals(t=NOW - 7200 + k * 30, running=8.0, waiting=0.0, kv_cache_usage_sum=0.4, tokens_per_s=240.0,
                    replicas_reporting=REPLICAS)
        for k in range(240)
    )
    nodes = tuple(
        NodeState(name=f"gpu-node-{i:02d}", pool="default", phase=Phase.SERVING, phase_since=NOW - 86400,
                  serving_pods=1, serving_ready=True, slurm_state="drained")
        for i in range(REPLICAS)
    )
    pool = PoolState(name="default", signals=signals, history=history, ready_replicas=REPLICAS, desired_replicas=REPLICAS)
    return ClusterView(now=NOW, nodes=nodes, pools={"default": pool})


def lends(signals: LoadSignals | None) -> list[str]:
    p = plan(policy_view(signals), CFG)
    return [a.node for a in p.actions if a.kind is ActionKind.LEND]


def test_clean_metrics_parse_and_lend() -> None:
    r = read(clean())
    assert not r.problems
    assert r.signals.running == REPLICAS * 1.0 and r.signals.replicas_reporting == REPLICAS
    assert lends(r.signals), "the control case must lend, or the bad-input cases prove nothing"


BAD_VALUES: list[tuple[str, str, Any, str]] = [
    # (case, tag, value, expected problem text)
    ("nan", f"value:{RUNNING}", "NaN", "is NaN"),
    ("negative", f"value:{RUNNING}", "-3", "is negative (-3)"),
    ("inf", f"value:{WAITING}", "+Inf", "is infinite"),
    ("-inf", f"value:{WAITING}", "-Inf", "is infinite"),
    ("garbage text", f"value:{RUNNING}", "lots", "is NaN"),
    ("kv above 1", f"value:{KV_V1}", "1.7", "is above 1 (1.7)"),
    ("negative kv", f"value:{KV_V1}", "-0.1", "is negative"),
    ("nan timestamp", f"ts:{RUNNING}", "NaN", "timestamp"),
    ("garbage timestamp", f"ts:{WAITING}", "yesterday", "timestamp"),
    ("stale", f"ts:{RUNNING}", str(NOW - 3600), "is stale"),
    ("negative rate", "rate:prompt", "-5", "is negative"),
]


@pytest.mark.parametrize(("case", "tag", "value", "why"), BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_bad_value_is_a_missing_signal_and_no_lend(case: str, tag: str, value: Any, why: str) -> None:
    r = read(with_value(clean(), tag, value))
    assert r.problems, f"{case}: accepted as a valid signal"
    assert any(why in text for text in r.problems.values()), r.problems
    missing = [k for k in ("running", "waiting", "kv_cache_usage_sum", "tokens_per_s") if getattr(r.signals, k) is None]
    assert set(missing) == set(r.problems)  # a partial sum is never reported
    enabled_missing = {"running", "waiting", "kv_cache_usage_sum"} & set(missing)
    if enabled_missing:  # a signal the default targets use (tokens/s is not enabled by default)
        assert lends(r.signals) == [], f"{case}: lent on {r.problems}"


@pytest.mark.parametrize("tag", [f"value:{RUNNING}", f"value:{KV_V1}", "rate:generation"])
def test_a_series_given_twice_is_a_missing_signal_not_the_last_value(tag: str) -> None:
    """One replica's series twice in one answer (a broken or hostile Prometheus; a real one
    refuses a vector with two equal label sets): the last value won silently before, so a 0
    after the real value read the replica as idle (running 210 instead of 240 here: load
    under-read, the direction that lends)."""
    busy = clean(running=30.0)  # every replica busy: nothing to lend
    assert not lends(read(busy).signals)
    r = read(busy + [item(tag, "0", pod="vllm-3")])
    assert any("vllm-3" in text and "appears more than once in one answer" in text for text in r.problems.values()), r.problems
    if tag != "rate:generation":  # tokens/s is not a default target
        assert lends(r.signals) == []


def test_finite_values_whose_sum_overflows_are_a_named_missing_signal() -> None:
    """Two replicas at 1e308 each: the sum was inf with no problem named (the policy read it as
    missing without saying why); now the signal's problem says so."""
    r = read(with_value(clean(), f"value:{RUNNING}", "1e308", n=2))
    assert r.signals.running is None
    assert r.problems["running"] == f"the sum over {REPLICAS} replicas is not a finite number (each value finite)"
    assert lends(r.signals) == []


def test_missing_model_label_is_ignored_then_no_series_no_lend() -> None:
    result = [{"metric": {k: v for k, v in it["metric"].items() if k != "model_name"}, "value": it["value"]} for it in clean()]
    r = read(result)
    assert r.signals.running is None and "no series" in r.problems["running"]
    assert r.ignored and all("model_name is not 'llama'" in x for x in r.ignored)
    assert lends(r.signals) == []


def test_metric_labels_missing_entirely() -> None:
    r = read([{"value": [NOW, "3"]}, *[{"metric": None, "value": [NOW, "1"]}]])
    assert r.signals.running is None and r.ignored
    assert lends(r.signals) == []


def test_unknown_model_is_dropped_not_summed() -> None:
    other = [item(it["metric"][TAG], "500", pod=it["metric"]["pod"] + "-x", model_name="mistral") for it in clean()]
    r = read(clean() + other)
    assert r.signals.running == REPLICAS * 1.0  # the other model's load is not counted
    assert r.ignored and all("model_name is not 'llama'" in x for x in r.ignored)
    only_other = read(other)
    assert only_other.signals.running is None and lends(only_other.signals) == []


def test_one_replica_missing_its_timestamp_fails_closed() -> None:
    result = [it for it in clean() if not (it["metric"][TAG] == f"ts:{RUNNING}" and it["metric"]["pod"] == "vllm-3")]
    r = read(result)
    assert r.signals.running is None and "has no sample timestamp" in r.problems["running"]
    assert lends(r.signals) == []


def test_v0_only_replicas_are_read_and_bad_v0_fails_closed() -> None:
    result = [it for it in clean() if KV_V1 not in it["metric"][TAG]]
    for i in range(REPLICAS):
        result += [item(f"value:{KV_V0}", "0.05", pod=f"vllm-{i}"), item(f"ts:{KV_V0}", str(NOW - 5), pod=f"vllm-{i}")]
    assert read(result).signals.kv_cache_usage_sum == pytest.approx(REPLICAS * 0.05)
    bad = read(with_value(result, f"value:{KV_V0}", "NaN"))
    assert bad.signals.kv_cache_usage_sum is None and lends(bad.signals) == []


@pytest.mark.parametrize(
    "result",
    [
        [{"metric": {"model_name": "llama", TAG: f"value:{RUNNING}"}}],  # no value
        [{"metric": {"model_name": "llama", TAG: f"value:{RUNNING}"}, "value": [NOW]}],  # truncated pair
        [{"metric": {"model_name": "llama", TAG: f"value:{RUNNING}"}, "value": None}],
        [{"metric": {"model_name": "llama", TAG: f"value:{RUNNING}"}, "value": "1"}],
        ["not a series"],
        [None],
        {"resultType": "vector"},  # not a list at all
        "garbage",
    ],
    ids=["no-value", "truncated-pair", "value-null", "value-string", "string-item", "null-item", "dict", "str"],
)
def test_unreadable_result_is_an_adapter_error(result: Sequence[Any]) -> None:
    with pytest.raises(AdapterError) as info:
        read(result)
    msg = str(info.value)
    assert msg.startswith("prometheus: pool default:") and len(msg) < 600


def test_empty_result_is_missing_not_zero_load() -> None:
    r = read([])
    assert r.signals.running is None and r.signals.kv_cache_usage_sum is None
    assert lends(r.signals) == []


@pytest.mark.parametrize(
    "result",
    [[None], ["x"], [{"metric": {"model_name": "llama", TAG: f"value:{RUNNING}"}, "values": [[NOW]]}],
     [{"metric": {"model_name": "llama", TAG: f"value:{RUNNING}"}, "values": [["yesterday", "1"]]}], "garbage"],
    ids=["null-item", "string-item", "truncated-pair", "garbage-time", "str"],
)
def test_unreadable_history_is_an_adapter_error(result: Any) -> None:
    prom = PromAdapter("http://unused", staleness_s=60, client=FakeClient([], range_result=result))  # type: ignore[arg-type]
    with pytest.raises(AdapterError):
        prom.history(POOL, start=NOW - 600, end=NOW, step_s=60)


def test_bad_history_values_are_missing_steps() -> None:
    values = [[NOW - 600 + 60 * k, v] for k, v in enumerate(["1", "NaN", "-1", "+Inf", "2"])]
    result = [{"metric": {"model_name": "llama", "pod": "p", TAG: f"value:{RUNNING}"}, "values": values}]
    prom = PromAdapter("http://unused", staleness_s=60, client=FakeClient([], range_result=result))  # type: ignore[arg-type]
    steps = prom.history(POOL, start=NOW - 600, end=NOW, step_s=60)
    assert [s.running for s in steps[:5]] == [1.0, None, None, None, 2.0]


class RangeRecorder(FakeClient):
    """Records every range query's window; answers each with one sample per step."""

    def __init__(self) -> None:
        super().__init__([])
        self.windows: list[tuple[float, float]] = []

    def custom_query_range(self, query: str, **kw: Any) -> Any:
        a, b, step = kw["start_time"].timestamp(), kw["end_time"].timestamp(), float(kw["step"])
        self.windows.append((a, b))
        values = [[a + step * k, "1"] for k in range(int((b - a) // step) + 1)]
        return [{"metric": {"model_name": "llama", "pod": "p", TAG: f"value:{RUNNING}"}, "values": values}]


def test_long_history_is_split_under_prometheus_point_limit_with_no_step_lost_or_repeated() -> None:
    client = RangeRecorder()
    prom = PromAdapter("http://unused", staleness_s=60, client=client)  # type: ignore[arg-type]
    steps = prom.history(POOL, start=NOW - 60 * 25_000, end=NOW, step_s=60)
    assert len(client.windows) == 3  # 25,001 steps in queries of at most MAX_RANGE_POINTS
    assert all((b - a) / 60 + 1 <= MAX_RANGE_POINTS for a, b in client.windows)
    assert [s.t for s in steps] == [NOW - 60 * 25_000 + 60 * k for k in range(25_001)]
    assert all(s.running == 1.0 for s in steps)
