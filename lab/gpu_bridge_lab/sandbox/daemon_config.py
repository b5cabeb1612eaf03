"""A daemon config for the sandbox: the real schema, with timings compressed to seconds.

The demo and the end-to-end tests write it to ``DIR/gpu-bridge.yaml`` and run the daemon
with it, exactly as an operator would with theirs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from gpu_bridge_lab.sandbox import serving


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
    min_serving: int = 1,
    concurrency_per_replica: float = 60.0,
    headroom: float = 0.15,
    headroom_replicas: float = 0.2,
    min_runtime_s: float = 0.0,
    lease_duration_s: float = 6.0,
    forecast: bool = True,
    lease_namespace: str = serving.NAMESPACE,
) -> dict[str, Any]:
    """The YAML document (a dict) for a daemon run against the sandbox."""
    return {
        "pools": [
            {
                "name": serving.POOL,
                "namespace": serving.NAMESPACE,
                "deployment": serving.DEPLOYMENT,
                "model_name": serving.MODEL,
                "min_serving": min_serving,
                "cold_start_s": cold_start_s,
                "drain_s": 5.0,
                # a 4-node sandbox: the loads the demo and the end-to-end test drive assume
                # this headroom (the production default, 0.2, is set for 24-node pools)
                "headroom": headroom,
                "headroom_replicas": headroom_replicas,
                "target": {"concurrency_per_replica": concurrency_per_replica, "kv_cache_usage": 0.8},
            }
        ],
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
