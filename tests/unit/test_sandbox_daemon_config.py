"""The sandbox's daemon config: the keys it compresses, the product's defaults for the rest
(read from bridge.config, not copied), validated by the product's loader before it is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import DEFAULT_POOL, PoolConfig, TargetConfig, default_config, load_config
from bridge.errors import ConfigError
from gpu_bridge_lab.sandbox import serving
from gpu_bridge_lab.sandbox.daemon_config import sandbox_config, write_config

ARGS = {"prometheus_url": "http://127.0.0.1:9090", "kubeconfig": "/tmp/kubeconfig", "grace_s": 5, "cold_start_s": 2}


def test_sandbox_config_takes_the_products_defaults(tmp_path: Path) -> None:
    doc = sandbox_config(**ARGS)
    product = default_config()
    pool = doc["pools"][0]
    assert pool["name"] == DEFAULT_POOL == serving.POOL
    assert pool["deployment"] == PoolConfig(name="x").deployment == serving.DEPLOYMENT
    assert pool["target"]["kv_cache_usage"] == TargetConfig().kv_cache_usage
    assert pool["min_serving"] == product.pools[0].min_serving
    assert doc["policy"]["forecast"]["enabled"] is product.policy.forecast.enabled
    assert doc["policy"]["lend_timeout_s"] == product.policy.lend_timeout_s
    # what the sandbox compresses is its own
    assert doc["policy"]["tick_s"] == 2.0 and pool["cold_start_s"] == 2.0
    # every forecast window in compressed time, the lend lookback too (the product's hour would
    # still hold the sandbox's start-up backlog when the tests want their first lend)
    f = doc["policy"]["forecast"]
    assert f["lend_lookback_s"] == 30.0 < product.policy.forecast.lend_lookback_s
    assert max(f["burst_window_s"], f["trend_window_s"], f["compare_window_s"]) <= f["lend_lookback_s"]
    cfg = load_config(write_config(tmp_path / "gpu-bridge.yaml", doc))
    assert cfg.pools[0].drain_s == 5.0 and cfg.kubernetes.kubeconfig == "/tmp/kubeconfig"


def test_sandbox_config_refuses_what_the_daemon_would() -> None:
    with pytest.raises(ConfigError) as info:
        sandbox_config(**ARGS, min_serving=-1, tick_s=0)
    assert info.value.problems == [
        "sandbox_config: pools[0].min_serving: must be >= 0, got -1",
        "sandbox_config: policy.tick_s: must be > 0, got 0",
    ]
