"""A daemon config for the sandbox: the real schema, with timings compressed to seconds.

The demo and the end-to-end tests write it to ``DIR/gpu-bridge.yaml`` and run the daemon
with it, exactly as an operator would with theirs. Only what the sandbox changes is written
here; every other key is the product's default, read from its config models (``bridge.config``),
and the document is validated by the product's loader before anyone writes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from bridge.config import default_config, parse_config, to_dict
from gpu_bridge_lab.sandbox import serving

_PRODUCT = default_config(serving.POOL)
"""The product's defaults, for the keys the sandbox does not compress."""


def sandbox_config(
    *,
    prometheus_url: str,
    kubeconfig: str | Path,
    grace_s: float,
    cold_start_s: float,
    slurm_conf: str | Path | None = None,
    metrics_port: int = 0,
    tick_s: float = 2.0,
    scale_down_window_s: float = 20.0,
    min_lend_s: float = 10.0,
    lend_lookback_s: float = 30.0,
    min_serving: int = _PRODUCT.pools[0].min_serving,
    concurrency_per_replica: float = 60.0,
    headroom: float = 0.15,
    headroom_replicas: float = 0.2,
    min_runtime_s: float = 0.0,
    lease_duration_s: float = 6.0,
    forecast: bool = _PRODUCT.policy.forecast.enabled,
    lease_namespace: str = serving.NAMESPACE,
    pool_b: bool = False,
) -> dict[str, Any]:
    """The YAML document (a dict, every key resolved) for a daemon run against the sandbox;
    ``pool_b``: the second pool of ``serving.split_pool`` too, with the same settings.
    ``lend_lookback_s``: a lend must fit under the peak of this window; the product's hour would
    hold the sandbox's start-up backlog (its size depends on how busy the machine was while the
    pods started) long after it is served. Raises ``ConfigError`` if an argument is out of the
    product's bounds."""

    def pool(name: str, deployment: str, model: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": serving.NAMESPACE,
            "deployment": deployment,
            "model_name": model,
            "min_serving": min_serving,
            "cold_start_s": cold_start_s,
            "drain_s": 5.0,
            # a 4-node sandbox without a calibrated margin: the loads the demo and the
            # end-to-end test drive assume this headroom
            "headroom": headroom,
            "headroom_replicas": headroom_replicas,
            "target": {"concurrency_per_replica": concurrency_per_replica},
        }

    pools = [pool(serving.POOL, serving.DEPLOYMENT, serving.MODEL)]
    if pool_b:
        pools.append(pool(serving.POOL_B, serving.DEPLOYMENT_B, serving.MODEL_B))
    doc: dict[str, Any] = {
        "pools": pools,
        "slurm": {
            "grace_s": grace_s,
            "min_runtime_s": min_runtime_s,
            "command_timeout_s": 3.0,  # well below the 6 s Lease
            "slurm_conf": str(slurm_conf) if slurm_conf else None,
        },
        "policy": {
            "tick_s": tick_s,
            "scale_down_window_s": scale_down_window_s,
            "min_lend_s": min_lend_s,
            "max_lends_per_tick": 1,
            "signal_max_age_s": 10.0,
            "blind_after_s": 30.0,
            "forecast": {
                "enabled": forecast,
                "margin_s": 2.0,
                "burst_window_s": 10.0,
                "trend_window_s": 20.0,
                "compare_window_s": 30.0,
                "lend_lookback_s": lend_lookback_s,
                "burst_history_s": 86400.0,
                "seasonal_lags_s": [86400.0, 604800.0],
            },
            # compressed time (a day in minutes): a margin calibrated on a week of 60 s steps
            # means nothing here, the sandbox keeps its explicit headroom
            "calibration": {"enabled": False},
        },
        "prometheus": {"url": prometheus_url, "timeout_s": 5.0, "step_s": 2.0, "scrape_interval_s": 1.0, "rate_window_s": 10.0},
        "kubernetes": {"kubeconfig": str(kubeconfig), "timeout_s": 5.0},
        "daemon": {
            "metrics_host": "127.0.0.1",
            "metrics_port": metrics_port,
            "lease_namespace": lease_namespace,
            "lease_duration_s": lease_duration_s,
        },
    }
    return dict(to_dict(parse_config(doc, source="sandbox_config")))


def daemon_identity(sb: Any) -> dict[str, Any]:
    """``sandbox_config`` arguments for the daemon's own identity on ``sb``: its ServiceAccount's
    kubeconfig (bound token, exactly deploy/kubernetes/rbac.yaml) and the Lease namespace that
    manifest grants."""
    return {"kubeconfig": sb.daemon_kubeconfig, "lease_namespace": "gpu-bridge"}


def write_config(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write with mode 0600: the daemon refuses a config others can write."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    os.chmod(p, 0o600)
    return p
