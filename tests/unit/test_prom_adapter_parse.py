"""Prometheus adapter, pure parts: the query text and the parsing/validation of instant and
range results (V1 preferred over V0 per replica, staleness by sample timestamp, NaN/Inf/
negative/out-of-range values, series of another model, empty results)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.adapters.prom import types as prom
from bridge.adapters.prom.signals import build_query, parse_instant, parse_range
from bridge.adapters.prom.types import PromPool

POOL = PromPool("llama", "llama-70b")
T = 1_800_000_000.0


def series(tag: str, value: float | str, pod: str = "a", model: str = "llama-70b", t: float = T, **extra: str) -> dict[str, Any]:
    metric = {"bridge_q": tag, "model_name": model, "pod": pod, **extra}
    if tag.startswith("value:"):
        metric["__name__"] = tag[len("value:") :]
    return {"metric": metric, "value": [t, str(value)]}


def replica(pod: str, *, running: float = 1, waiting: float = 0, v1: float | None = 0.5, v0: float | None = None, ts: float = T - 1) -> list[dict[str, Any]]:
    out = [series(f"value:{prom.RUNNING}", running, pod), series(f"value:{prom.WAITING}", waiting, pod)]
    out += [series(f"ts:{prom.RUNNING}", ts, pod), series(f"ts:{prom.WAITING}", ts, pod)]
    if v1 is not None:
        out += [series(f"value:{prom.KV_V1}", v1, pod), series(f"ts:{prom.KV_V1}", ts, pod)]
    if v0 is not None:
        out += [series(f"value:{prom.KV_V0}", v0, pod), series(f"ts:{prom.KV_V0}", ts, pod)]
    out += [series("rate:prompt", 10, pod), series("rate:generation", 5, pod)]
    return out


def test_query_text() -> None:
    q = build_query(PromPool("p", 'we"ird', {"namespace": "serving"}), rate_window_s=30)
    assert 'label_replace(vllm:num_requests_running{model_name="we\\"ird",namespace="serving"}, "bridge_q", "value:vllm:num_requests_running", "", "")' in q
    assert 'label_replace(timestamp(vllm:kv_cache_usage_perc{model_name="we\\"ird",namespace="serving"}), "bridge_q", "ts:vllm:kv_cache_usage_perc", "", "")' in q
    assert 'rate(vllm:generation_tokens_total{model_name="we\\"ird",namespace="serving"}[30s])' in q
    assert q.count("\n  or ") == 9
    hist = build_query(POOL, rate_window_s=60, gauge_window_s=60)
    assert "timestamp(" not in hist and 'max_over_time(vllm:num_requests_waiting{model_name="llama-70b"}[60s])' in hist


@pytest.mark.parametrize("key", ["model_name", "bridge_q", "__name__", "bad-label"])
def test_pool_matchers_are_checked(key: str) -> None:
    with pytest.raises(ValueError, match=r"pools\[p\]\.prometheus_matchers"):
        PromPool("p", "m", {key: "x"})


def test_sums_and_prefers_v1_per_replica() -> None:
    result = replica("a", running=3, waiting=1, v1=0.5) + replica("b", running=2, v1=None, v0=0.25) + replica("c", v1=0.125, v0=0.9)
    r = parse_instant(result, pool=POOL, staleness_s=30, at=None)
    assert r.problems == {} and r.ignored == ()
    s = r.signals
    assert (s.t, s.running, s.waiting, s.replicas_reporting) == (T, 6, 1, 3)
    assert s.kv_cache_usage_sum == pytest.approx(0.875)
    assert s.tokens_per_s == pytest.approx(45)


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"running": float("nan")}, "running", 'vllm:num_requests_running{model_name="llama-70b",pod="b"} is NaN'),
        ({"waiting": float("inf")}, "waiting", 'vllm:num_requests_waiting{model_name="llama-70b",pod="b"} is infinite'),
        ({"waiting": -2}, "waiting", 'vllm:num_requests_waiting{model_name="llama-70b",pod="b"} is negative (-2)'),
        ({"v1": 1.5}, "kv_cache_usage_sum", 'vllm:kv_cache_usage_perc{model_name="llama-70b",pod="b"} is above 1 (1.5)'),
        (
            {"ts": T - 90},
            "running",
            'vllm:num_requests_running{model_name="llama-70b",pod="b"} is stale: last sample 90 s old (limit 30 s)',
        ),
    ],
    ids=["nan", "inf", "negative", "kv-above-1", "stale"],
)
def test_one_bad_replica_makes_the_signal_none_never_a_partial_sum(change: dict[str, float], field: str, problem: str) -> None:
    result = replica("a") + replica("b", **change)  # type: ignore[arg-type]
    r = parse_instant(result, pool=POOL, staleness_s=30, at=None)
    assert getattr(r.signals, field) is None
    assert r.problems[field] == problem


def test_missing_timestamp_series_is_not_trusted() -> None:
    result = [s for s in replica("a") if s["metric"]["bridge_q"] != f"ts:{prom.RUNNING}"]
    r = parse_instant(result, pool=POOL, staleness_s=30, at=None)
    assert r.signals.running is None and r.problems["running"].endswith("has no sample timestamp")


def test_series_of_another_model_are_ignored() -> None:
    result = replica("a") + [series(f"value:{prom.RUNNING}", 50, "x", model="other")]
    r = parse_instant(result, pool=POOL, staleness_s=30, at=None)
    assert r.signals.running == 1
    assert r.ignored == ('value:vllm:num_requests_running {model_name="other",pod="x"}: model_name is not \'llama-70b\'',)


def test_empty_result_is_all_none_with_reasons() -> None:
    r = parse_instant([], pool=POOL, staleness_s=30, at=T)
    s = r.signals
    assert (s.running, s.waiting, s.kv_cache_usage_sum, s.tokens_per_s, s.replicas_reporting) == (None, None, None, None, 0)
    assert r.problems == {
        "running": "no series of vllm:num_requests_running",
        "waiting": "no series of vllm:num_requests_waiting",
        "kv_cache_usage_sum": "no series of vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc",
        "tokens_per_s": "no series of vllm:prompt_tokens_total",
    }
    with pytest.raises(ValueError):
        parse_instant([], pool=POOL, staleness_s=30, at=None)


def test_missing_generation_counter_makes_tokens_none() -> None:
    result = [s for s in replica("a") if s["metric"]["bridge_q"] != "rate:generation"]
    r = parse_instant(result, pool=POOL, staleness_s=30, at=None)
    assert r.signals.tokens_per_s is None and r.problems["tokens_per_s"] == "no series of vllm:generation_tokens_total"


def test_range_result_one_signal_per_step_oldest_first() -> None:
    def ranged(tag: str, points: list[tuple[float, float]], pod: str = "a") -> dict[str, Any]:
        metric = {"bridge_q": tag, "model_name": "llama-70b", "pod": pod}
        return {"metric": metric, "values": [[t, str(v)] for t, v in points]}

    start = 1000.0
    result = [
        ranged(f"value:{prom.RUNNING}", [(1000, 1), (1060, 2), (1120, 3)]),
        ranged(f"value:{prom.WAITING}", [(1000, 0), (1060, 0), (1120, 7)]),
        ranged(f"value:{prom.KV_V0}", [(1060, 0.5), (1120, 0.75)]),
        ranged(f"value:{prom.KV_V1}", [(1120, 0.25)]),
        ranged("rate:prompt", [(1120, 4)]),
        ranged("rate:generation", [(1120, 6)]),
    ]
    hist = parse_range(result, pool=POOL, start=start, end=1180, step_s=60)
    assert [h.t for h in hist] == [1000, 1060, 1120, 1180]
    assert [h.running for h in hist] == [1, 2, 3, None]
    assert [h.kv_cache_usage_sum for h in hist] == [None, 0.5, 0.25, None]
    assert [h.tokens_per_s for h in hist] == [None, None, 10, None]


class StandInClient:
    """Stands in for PrometheusConnect (third-party) to feed the adapter bad answers."""

    def __init__(self, answer: object = None, error: Exception | None = None) -> None:
        self.answer, self.error = answer, error

    def custom_query(self, query: str, params: dict[str, str] | None = None, timeout: float | None = None) -> object:
        if self.error is not None:
            raise self.error
        return self.answer


@pytest.mark.parametrize(
    ("client", "message"),
    [
        (StandInClient(error=KeyError("data")), "prometheus: pool llama: query failed: KeyError: 'data'"),
        (StandInClient(answer={"resultType": "vector"}), "prometheus: pool llama: query: expected a list of series, got dict"),
        (StandInClient(answer=[{"metric": {}}]), "prometheus: pool llama: unexpected query result: 'value'"),
    ],
    ids=["key-error", "not-a-list", "no-value"],
)
def test_bad_answers_are_adapter_errors_never_no_load(client: StandInClient, message: str) -> None:
    from bridge.adapters.prom.signals import PromAdapter
    from bridge.errors import AdapterError

    adapter = PromAdapter("http://unused", client=client)  # type: ignore[arg-type]
    with pytest.raises(AdapterError) as info:
        adapter.current(POOL)
    assert str(info.value) == message


@pytest.mark.parametrize(("seconds", "text"), [(60, "60s"), (1, "1s"), (0.5, "500ms"), (2.5, "2500ms")])
def test_durations(seconds: float, text: str) -> None:
    assert prom._window(seconds) == text


def test_engines_of_one_server_are_one_replica() -> None:
    """vLLM V1 with data parallelism: one pod, one series per engine. Requests add up; the
    pod's KV usage is the mean over its engines; it counts as one replica."""
    result = []
    for engine, running, kv in (("0", 2, 0.5), ("1", 3, 0.25)):
        for tag, v in ((f"value:{prom.RUNNING}", running), (f"value:{prom.WAITING}", 0), (f"value:{prom.KV_V1}", kv)):
            result.append(series(tag, v, "a", engine=engine))
            name = tag.split(":", 1)[1]
            result.append(series(f"ts:{name}", T - 1, "a", engine=engine))
    result += [series("rate:prompt", 1, "a", engine="0"), series("rate:generation", 1, "a", engine="0")]
    s = parse_instant(result, pool=POOL, staleness_s=30, at=None).signals
    assert (s.running, s.replicas_reporting) == (5, 1)
    assert s.kv_cache_usage_sum == pytest.approx(0.375)


def test_a_stale_series_of_a_deleted_pod_is_dropped_not_fatal() -> None:
    # pod b was deleted while Prometheus was down: no staleness marker, its last sample lingers
    result = replica("a", running=3) + replica("b", running=7, ts=T - 200)
    kept = parse_instant(result, pool=POOL, staleness_s=30, at=None, live_pods={"a"})
    assert kept.problems == {}
    assert kept.signals.running == 3 and kept.signals.replicas_reporting == 1
    assert any('pod="b"' in x and "no longer exists" in x for x in kept.ignored)
    # b still exists in Kubernetes (a scrape failing): fail closed, as without the pod list
    for live in ({"a", "b"}, None):
        r = parse_instant(result, pool=POOL, staleness_s=30, at=None, live_pods=live)
        assert r.signals.running is None and "is stale" in r.problems["running"]


def test_a_stale_series_without_a_pod_label_still_fails_closed() -> None:
    result = replica("a")
    for s in result:
        s["metric"].pop("pod")
        if s["metric"]["bridge_q"].startswith("ts:"):
            s["value"][1] = str(T - 200)
    r = parse_instant(result, pool=POOL, staleness_s=30, at=None, live_pods={"a"})
    assert r.signals.running is None and "is stale" in r.problems["running"]


def test_inflight_per_pod_is_running_plus_waiting_over_its_engines() -> None:
    result = replica("a", running=3, waiting=2) + replica("b", running=1, waiting=0)
    for engine in ("0", "1"):  # pod c: data parallel, two engines
        result += [series(f"value:{prom.RUNNING}", 4, "c", engine=engine), series(f"ts:{prom.RUNNING}", T - 1, "c", engine=engine)]
        result += [series(f"value:{prom.WAITING}", 1, "c", engine=engine), series(f"ts:{prom.WAITING}", T - 1, "c", engine=engine)]
    r = parse_instant(result, pool=POOL, staleness_s=30, at=None)
    assert dict(r.inflight_by_pod) == {"a": 5, "b": 1, "c": 10}


def test_no_inflight_when_a_gauge_cannot_be_trusted() -> None:
    # waiting is NaN on pod b: per-pod numbers would understate b's work, so none are given
    result = replica("a", running=3) + replica("b", running=1, waiting=float("nan"))
    r = parse_instant(result, pool=POOL, staleness_s=30, at=None)
    assert r.signals.waiting is None and dict(r.inflight_by_pod) == {}
