"""The measured reclaim delays outlive a restart: the daemon exports each one in
``gpu_bridge_reclaim_measured_delay_seconds`` (the value ``PoolMemory.add_delay`` got) and
``bridge.wiring.policy_memory`` rebuilds them from that histogram's buckets, each at its
bucket's upper bound; a garbled answer is refused, logged, and the configured delays apply."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from bridge.adapters.prom.history import build_delay_query, parse_delay_buckets
from bridge.adapters.prom.signals import PromAdapter
from bridge.adapters.prom.types import DelayCount, PromPool
from bridge.config import default_config
from bridge.daemon import Daemon
from bridge.errors import AdapterError
from bridge.metrics import MEASURED_DELAY_BUCKETS_S, BridgeMetrics
from bridge.model import Phase, ReclaimMode, Tier
from bridge.policy.forecast import measured_horizon
from bridge.policy.memory import PoolMemory
from bridge.wiring import policy_memory, rebuild_delays
from tests.unit.test_daemon_loop import HIGH, World, config

NOW = 1_800_000_000.0
POOL = PromPool("default", "m")
NAME = "gpu_bridge_reclaim_measured_delay_seconds"
QUICK = config(calibration={"enabled": False})  # no calibration history to read


class Client:
    """Stands in for PrometheusConnect: ``answer`` to every instant query, no history."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.queries: list[str] = []

    def custom_query(self, query: str, params: Mapping[str, Any] | None = None, timeout: float | None = None) -> Any:
        self.queries.append(query)
        return self.answer

    def custom_query_range(self, query: str, **kw: Any) -> Any:
        return []


def adapter(answer: Any) -> PromAdapter:
    return PromAdapter("http://prometheus:9090", client=Client(answer))  # type: ignore[arg-type]


def bucket(le: str, count: Any, tier: str = "normal", mode: str = "cold") -> dict[str, Any]:
    return {"metric": {"tier": tier, "mode": mode, "le": le}, "value": [NOW, count]}


def answer_from(metrics: BridgeMetrics, pool: str) -> list[dict[str, Any]]:
    """What Prometheus answers ``build_delay_query`` after scraping ``metrics`` since it began."""
    out = []
    for family in metrics.registry.collect():
        for s in family.samples if family.name == NAME else ():
            if s.name == f"{NAME}_bucket" and s.labels["pool"] == pool:
                out.append(bucket(s.labels["le"], str(s.value), s.labels["tier"], s.labels["mode"]))
    return out


def up(delay: float) -> float:
    return min(b for b in MEASURED_DELAY_BUCKETS_S if b >= delay)


def test_a_restart_rebuilds_the_measured_delays_from_the_histogram_never_shorter() -> None:
    cfg = config(calibration={"enabled": False, "delay_min_samples": 3})
    metrics = BridgeMetrics()
    metrics.record_settings(pool="default", min_serving=1, reclaim_budget_s=60)
    w = World()
    w.config = cfg
    pools = {"default": POOL}

    def daemon(prom: Any) -> Daemon:
        return Daemon(cfg, kube=w.kube, slurm=w.slurm, prom=w.prom, prom_pools=pools, clock=lambda: w.t,
                      metrics=metrics, memory=policy_memory(cfg, prom, pools, w.t))

    w.daemon = daemon(w.prom)
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 60, "all serving again")
    measured = list(w.daemon.memory["default"].delays)
    assert len(measured) == 3
    # the histogram holds exactly what the memory got
    labels = {"pool": "default", "tier": "normal", "mode": "cold"}
    assert metrics.registry.get_sample_value(f"{NAME}_count", labels) == 3
    assert metrics.registry.get_sample_value(f"{NAME}_sum", labels) == pytest.approx(sum(measured))

    prom = adapter(answer_from(metrics, "default"))
    w.daemon = daemon(prom)  # a fresh process: only Prometheus remembers
    rebuilt = w.daemon.memory["default"].delays
    assert sorted(rebuilt) == sorted(up(d) for d in measured)
    pool = cfg.pools[0]
    before, after = measured_horizon(cfg, pool, measured), measured_horizon(cfg, pool, rebuilt)
    assert before is not None and after is not None and before <= after <= before + 30  # one bucket, one tick
    w.tick(1)
    assert w.daemon.ledger.last_observation.view.pools["default"].horizon_s == after


def test_bucket_counts_become_samples_at_each_upper_bound() -> None:
    answer = [bucket("5.0", "0"), bucket("10.0", "2.2"), bucket("15.0", "1.9"), bucket("20.0", "3.4"), bucket("+Inf", "4"),
              bucket("1.0", "0", mode="warm"), bucket("3.0", "2", mode="warm"), bucket("+Inf", "2", mode="warm")]
    got = parse_delay_buckets(answer)
    cold = [(b.le, b.count) for b in got if b.mode is ReclaimMode.COLD]
    # rounded; a cumulative count that fell (extrapolation) adds nothing; +Inf at the largest bound
    assert cold == [(10.0, 2), (20.0, 1), (20.0, 1)]
    assert [(b.le, b.count) for b in got if b.mode is ReclaimMode.WARM] == [(3.0, 2)]
    cfg = default_config()
    mem = PoolMemory(cfg, cfg.pools[0])
    assert rebuild_delays(mem, got) == 6
    assert mem.delays == [10.0, 10.0, 20.0, 20.0]  # a cold pool: the warm ones are not its delays
    assert measured_horizon(cfg, cfg.pools[0], mem.delays) is None  # 4 < delay_min_samples
    mem.add_delay(20.0)
    assert measured_horizon(cfg, cfg.pools[0], mem.delays) == measured_horizon(cfg, cfg.pools[0], [10, 10, 20, 20, 20])


def test_more_than_512_keep_their_distribution_and_the_tiers_stay_apart() -> None:
    cfg = default_config()
    mem = PoolMemory(cfg, cfg.pools[0])
    rebuild_delays(mem, [DelayCount(Tier.NORMAL, ReclaimMode.COLD, 300.0, 2000), DelayCount(Tier.NORMAL, ReclaimMode.COLD, 600.0, 48),
                         DelayCount(Tier.FAST, ReclaimMode.COLD, 60.0, 7)])
    assert len(mem.delays) == 512 and mem.delays.count(600.0) == 12  # 48 of 2048, scaled by 1/4
    assert mem.fast_delays == [60.0] * 7


def test_the_query_is_one_instant_query_per_pool_with_the_name_escaped() -> None:
    q = build_delay_query(PromPool('a"b\\c', "m"), window_s=1_209_600)
    assert q == f'sum by (tier, mode, le) (increase({NAME}_bucket{{pool="a\\"b\\\\c"}}[1209600s]))'
    p = adapter([])
    assert policy_memory(QUICK, p, {"default": POOL}, NOW)["default"].delays == []
    assert [q for q in p._client.queries if NAME in q] == [build_delay_query(POOL, window_s=QUICK.policy.calibration.window_s)]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "answer, error",
    [
        ([{"metric": {"tier": "normal", "mode": "cold"}, "value": [NOW, "1"]}], "has no 'le' label"),
        ([bucket("10.0", "NaN")], "count is NaN"),
        ([bucket("10.0", "-2")], "count is negative"),
        ([bucket("10.0", "many")], "count is NaN ('many')"),
        ([bucket("ten", "1")], "le is not a bucket bound"),
        ([bucket("10.0", "1", tier="slow")], "'slow' is not a valid Tier"),
        ([bucket("+Inf", "1")], "no finite le bucket"),
        ([{"metric": {"tier": "normal", "mode": "cold", "le": "5"}}], "unexpected query result: 'value'"),
        ({"status": "error"}, "expected a list of series"),
    ],
    ids=["no-le", "nan", "negative", "not-a-number", "bad-le", "bad-tier", "only-inf", "no-value", "not-a-list"],
)
def test_a_garbled_answer_is_refused_and_the_start_goes_on_with_the_configured_delays(
        answer: Any, error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(AdapterError, match=f"pool default: .*{re.escape(error)}"):
        adapter(answer).reclaim_delays(POOL, window_s=3600)
    good = [bucket("10.0", "9", tier="fast"), bucket("+Inf", "9", tier="fast")]
    mem = policy_memory(QUICK, adapter(answer + good if isinstance(answer, list) else answer), {"default": POOL}, NOW)["default"]
    assert mem.delays == mem.fast_delays == []  # nothing half-read: the whole answer is refused
    text = "".join(capsys.readouterr())
    assert "reclaim_delays_unavailable" in text and error in text.replace('\\"', '"')


def test_pools_that_plan_with_configured_delays_ask_nothing() -> None:
    cfg = replace(QUICK, pools=(replace(QUICK.pools[0], measured_delays=False),))
    p = adapter([bucket("10.0", "9")])
    assert policy_memory(cfg, p, {"default": POOL}, NOW)["default"].delays == []
    assert not [q for q in p._client.queries if NAME in q]  # type: ignore[attr-defined]


def test_the_first_reclaim_of_a_series_is_seen_by_increase() -> None:
    m = BridgeMetrics()
    m.record_settings(pool="default", min_serving=1, reclaim_budget_s=60)
    for tier in Tier:
        for mode in ReclaimMode:
            labels = {"pool": "default", "tier": str(tier), "mode": str(mode), "le": "+Inf"}
            assert m.registry.get_sample_value(f"{NAME}_bucket", labels) == 0  # exported before the first
    b = (0.0, *MEASURED_DELAY_BUCKETS_S)
    assert max(hi - lo for lo, hi in zip(b, b[1:]) if hi <= 600) <= 30 and b[-1] == 3600  # within a tick to 10 min
