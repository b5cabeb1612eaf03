"""The measured reclaim delays against a real Prometheus (/usr/bin/prometheus, the sandbox's
scrape configuration, 1 s interval) scraping a real ``BridgeMetrics`` registry served by the
daemon's own ``bridge.metrics.serve``: ``record_settings`` exports each tier and mode at 0, a
few ``record_measured_delay`` follow, and ``PromAdapter.reclaim_delays`` (``build_delay_query``,
``parse_delay_buckets``) must give back exactly those reclaims, each at its bucket's upper
bound; ``policy_memory`` (``rebuild_delays``) then rebuilds a ``PoolMemory`` from that answer,
its horizon never below the one of the true delays. A pool name needing PromQL escaping (a
double quote, a backslash) reads only its own series."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_prom_adapter import RunningPrometheus

from bridge.adapters.prom.signals import PromAdapter
from bridge.adapters.prom.types import DelayCount, PromPool
from bridge.config import Config, parse_config
from bridge.metrics import MEASURED_DELAY_BUCKETS_S, BridgeMetrics, serve
from bridge.model import ReclaimMode, Tier
from bridge.policy.forecast import horizon_s, measured_horizon
from bridge.wiring import policy_memory, prom_pools
from gpu_bridge_lab.sandbox.cluster import prometheus as sandbox_prom

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs /usr/bin/prometheus")]

NAME = "gpu_bridge_reclaim_measured_delay_seconds"
POOL = "llama"
WEIRD = 'we"ird\\pool'  # PromPool takes any name; the config's names cannot hold these (label values)
N, F, C, W = Tier.NORMAL, Tier.FAST, ReclaimMode.COLD, ReclaimMode.WARM
# (tier, mode, seconds) as the ledger records them
OBSERVED = ((N, C, 95.0), (N, C, 130.0), (N, C, 410.0), (N, W, 4.0), (F, C, 40.0), (F, C, 70.0), (F, C, 100.0))
WEIRD_OBSERVED = ((N, C, 200.0),)
# increase() of a counter whose first sample is 0 extrapolates only at the end, by at most about
# one scrape interval (1 s here): count x (sampled + <=1.1 s) / sampled. The largest cumulative
# count is 3, so 3 x 1.1 / sampled stays under the 0.5 the adapter's rounding absorbs once the
# series span >= 7 s; wait for SPAN_S of samples.
SPAN_S = 12.0


def cfg(*, warm: bool = False) -> Config:
    """A pool whose configured horizons are below the measured ones (so the comparison bites)."""
    pool = {"name": POOL, "model_name": POOL, "namespace": "serving", "cold_start_s": 60}
    if warm:
        pool |= {"warm_lending": True, "warm_hold_mb": 1000}
    return parse_config({
        "pools": [pool],
        "slurm": {"grace_s": 30, "fast_partition": "preempt-fast", "fast_grace_s": 10},
        "policy": {"calibration": {"enabled": False, "delay_min_samples": 3}},
    })


def up(seconds: float) -> float:
    return min(b for b in MEASURED_DELAY_BUCKETS_S if b >= seconds)


def instant(url: str, query: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}), timeout=5) as resp:  # noqa: S310 - loopback
        doc = json.loads(resp.read())
    assert doc["status"] == "success", doc
    return doc["data"]["result"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("prom-delays")
    metrics = BridgeMetrics()
    for pool in (POOL, WEIRD):
        metrics.record_settings(pool=pool, min_serving=1, reclaim_budget_s=600)
    exporter = serve(metrics.registry, port=0)
    target = sandbox_prom.ScrapeTarget("bridge", (f"127.0.0.1:{exporter.port}",))
    prom = RunningPrometheus(tmp, [], config=sandbox_prom.render_config([target], interval_s=1.0))
    url = prom.url
    try:
        prom.wait_until(lambda: sandbox_prom.scraped_once(url, ["bridge"], ["bridge"]), timeout=60)
        zero = f'{NAME}_count{{pool="{POOL}"}}'
        # the zero series are in Prometheus before anything is observed: increase() sees each first reclaim
        assert sorted((s["metric"]["tier"], s["metric"]["mode"], s["value"][1]) for s in instant(url, zero)) == [
            ("fast", "cold", "0"), ("fast", "warm", "0"), ("normal", "cold", "0"), ("normal", "warm", "0")]
        first_scrape = time.time()
        time.sleep(2)  # a few zero samples
        for pool, observed in ((POOL, OBSERVED), (WEIRD, WEIRD_OBSERVED)):
            for tier, mode, seconds in observed:
                metrics.record_measured_delay(pool=pool, seconds=seconds, tier=str(tier), mode=str(mode))
        prom.wait_until(lambda: [s["value"][1] for s in instant(url, f'{NAME}_count{{pool="{POOL}",tier="normal",mode="cold"}}')]
                        == ["3"], timeout=60)
        time.sleep(max(0.0, first_scrape + SPAN_S - time.time()))
        yield url
    finally:
        prom.stop()
        exporter.close()


def test_the_real_answer_is_each_observed_reclaim_at_its_bucket_upper_bound(prometheus: str) -> None:
    adapter = PromAdapter(prometheus, timeout_s=5)
    got = adapter.reclaim_delays(PromPool(POOL, POOL, namespace="serving"), window_s=3600)
    expected = [DelayCount(N, C, 105.0, 1), DelayCount(N, C, 150.0, 1), DelayCount(N, C, 420.0, 1),
                DelayCount(N, W, 5.0, 1), DelayCount(F, C, 45.0, 1), DelayCount(F, C, 75.0, 1), DelayCount(F, C, 105.0, 1)]
    assert sorted((t, m, up(s)) for t, m, s in OBSERVED) == sorted((d.tier, d.mode, d.le) for d in expected)
    assert sorted(got, key=lambda d: (d.tier, d.mode, d.le)) == sorted(expected, key=lambda d: (d.tier, d.mode, d.le))
    assert adapter.calls() == {"query": 1} and adapter.failures() == {}


def test_a_pool_name_needing_escaping_reads_only_its_own_series(prometheus: str) -> None:
    got = PromAdapter(prometheus, timeout_s=5).reclaim_delays(PromPool(WEIRD, "m"), window_s=3600)
    assert got == (DelayCount(N, C, 210.0, 1),)


def test_policy_memory_rebuilds_the_delays_and_never_a_shorter_horizon(prometheus: str) -> None:
    """End to end at the production window (calibration.window_s, 14 days): a cold pool drops
    the warm delay (it never plans with a wake); one that lends warm keeps it."""
    true_normal = sorted(s for t, m, s in OBSERVED if t is N and m is C)
    true_fast = sorted(s for t, m, s in OBSERVED if t is F)
    for warm in (False, True):
        config = cfg(warm=warm)
        pool = config.pools[0]
        mem = policy_memory(config, PromAdapter(prometheus, timeout_s=5), prom_pools(config), time.time())[POOL]
        assert sorted(mem.delays) == sorted([up(s) for s in true_normal] + ([up(4.0)] if warm else []))
        assert sorted(mem.fast_delays) == [up(s) for s in true_fast]
        truth = true_normal + ([4.0] if warm else [])
        for delays, rebuilt, fast in ((truth, mem.delays, False), (true_fast, mem.fast_delays, True)):
            before = measured_horizon(config, pool, delays, fast=fast)
            after = measured_horizon(config, pool, rebuilt, fast=fast)
            assert before is not None and after is not None
            assert before > horizon_s(config, pool, fast=fast)  # the measured delays decide, not the configured floor
            assert before <= after <= before + config.policy.tick_s  # one bucket is at most one tick wide here
