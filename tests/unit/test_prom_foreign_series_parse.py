"""Only the pool's own series count (issue 21 point 2): with the product's defaults
(``prometheus.namespace_label: namespace``, ``own_pods_only: true``) a series of the pool's
model from another namespace, from a pod that is not the pool's, or without a pod label is
ignored (named in ``ignored``) and cannot blind the pool with a NaN. Before, any workload
exporting ``vllm:*{model_name=...}`` was summed: one NaN made the signal missing."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.adapters.prom import types as prom
from bridge.adapters.prom.signals import build_query, parse_instant
from bridge.adapters.prom.types import PromPool, selector
from bridge.config import parse_config
from bridge.errors import ConfigError

T = 1_800_000_000.0
MODEL = "llama-70b"
CFG = parse_config({"pools": [{"name": "llama", "model_name": MODEL, "namespace": "serving", "deployment": "vllm"}]})
POOL = PromPool.from_config(CFG.pools[0], CFG.prometheus)
OWN = {"vllm-7d4b9c-aaaaa", "vllm-7d4b9c-bbbbb"}


def _series(tag: str, value: float | str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metric": {"bridge_q": tag, "model_name": MODEL, **labels}, "value": [T, str(value)]}


def replica(value: float | str, **labels: str) -> list[dict[str, Any]]:
    """Every signal of one replica at ``value`` (fresh timestamps)."""
    out = []
    for g in prom.GAUGES:
        out += [_series(f"value:{g}", value, labels), _series(f"ts:{g}", T - 1, labels)]
    out += [_series("rate:prompt", value, labels), _series("rate:generation", value, labels)]
    return out


OWN_SERIES = [s for pod in sorted(OWN) for s in replica(0.25, namespace="serving", pod=pod)]
FOREIGN = {
    "another namespace": replica("NaN", namespace="research", pod="vllm-7d4b9c-aaaaa"),
    "another pod of the namespace": replica("NaN", namespace="serving", pod="bench-vllm-0"),
    "no pod label": replica("NaN", namespace="serving"),
}


def test_the_default_config_selects_by_namespace_and_own_pods() -> None:
    assert (POOL.namespace, POOL.namespace_label, POOL.own_pods_only) == ("serving", "namespace", True)
    assert selector(POOL) == f'model_name="{MODEL}",namespace="serving"'
    assert f'vllm:num_requests_running{{model_name="{MODEL}",namespace="serving"}}' in build_query(POOL, rate_window_s=60)


@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_a_foreign_nan_series_is_ignored_not_blinding(kind: str) -> None:
    r = parse_instant(OWN_SERIES + FOREIGN[kind], pool=POOL, staleness_s=60, at=T, live_pods=OWN)
    assert r.problems == {}
    s = r.signals
    assert (s.running, s.waiting, s.replicas_reporting) == (0.5, 0.5, 2)
    assert s.kv_cache_usage_sum == pytest.approx(0.5) and s.tokens_per_s == pytest.approx(1.0)
    assert r.ignored and all(("NaN" not in line) for line in r.ignored)
    why = {"another namespace": "namespace is not 'serving'", "another pod of the namespace": "pod 'bench-vllm-0' is not one of the pool's pods",
           "no pod label": "no pod label"}[kind]
    assert all(line.endswith(why) for line in r.ignored), r.ignored
    assert set(r.inflight_by_pod) == OWN


def test_without_the_selection_the_same_series_blinds_the_pool() -> None:
    # what the model_name-only selection did (PromPool without the prometheus section)
    bare = PromPool.from_config(CFG.pools[0])
    r = parse_instant(OWN_SERIES + FOREIGN["another pod of the namespace"], pool=bare, staleness_s=60, at=T, live_pods=OWN)
    assert r.signals.running is None and "is NaN" in r.problems["running"]


def test_selection_can_be_switched_off_per_label() -> None:
    cfg = parse_config({"pools": [{"name": "llama", "model_name": MODEL, "namespace": "serving"}],
                        "prometheus": {"namespace_label": None, "own_pods_only": False}})
    pool = PromPool.from_config(cfg.pools[0], cfg.prometheus)
    assert (pool.namespace, pool.own_pods_only) == (None, False)
    assert selector(pool) == f'model_name="{MODEL}"'


def test_a_matcher_on_the_namespace_label_is_refused() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"pools": [{"name": "llama", "namespace": "serving", "prometheus_matchers": {"namespace": "x"}}]})
    assert ei.value.problems == [
        'bridge.yaml: pools[0].prometheus_matchers: "namespace" is prometheus.namespace_label, matched on pools[0].namespace already'
    ]
    with pytest.raises(ValueError, match=r"pools\[llama\]\.prometheus_matchers: 'namespace' is set by gpu-bridge itself"):
        PromPool("llama", MODEL, {"namespace": "x"}, namespace="serving")
