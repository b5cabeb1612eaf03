"""The sandbox's real Prometheus answers through prometheus-api-client: its own `up` series
and the vLLM simulator's series (when the simulator is available)."""

from __future__ import annotations

import time

import pytest
from prometheus_api_client import PrometheusConnect

from gpu_bridge_lab.sandbox.cluster import Sandbox

pytestmark = pytest.mark.integration


def test_prometheus_scrapes_itself_and_the_simulator(slurm_sandbox: Sandbox) -> None:
    sb = slurm_sandbox
    assert sb.env["PROMETHEUS_URL"] == sb.prometheus_url
    pc = PrometheusConnect(url=sb.prometheus_url, disable_ssl=True)
    assert pc.check_prometheus_connection()
    up = {r["metric"]["job"]: r["value"][1] for r in pc.custom_query("up")}
    assert up.get("prometheus") == "1"
    assert sb.vllm_url is not None, "the session sandbox runs the vLLM simulator"
    assert up.get("vllm") == "1"
    assert sb.env["VLLM_SIM_URL"] == sb.vllm_url
    deadline = time.monotonic() + 10
    while True:
        res = pc.custom_query('vllm:num_requests_running')
        if res or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert res, "no vllm:num_requests_running series"
    assert all("model_name" in r["metric"] for r in res)
    names = set(pc.all_metrics())
    for m in ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:request_success_total"):
        assert m in names


def test_added_scrape_target_is_scraped(slurm_sandbox: Sandbox) -> None:
    """The daemon's metrics endpoint is added this way later (config rewrite + /-/reload)."""
    sb = slurm_sandbox
    port = sb.ports["prometheus"]
    sb.add_scrape_target(f"selfcopy=127.0.0.1:{port}")
    pc = PrometheusConnect(url=sb.prometheus_url, disable_ssl=True)
    deadline = time.monotonic() + 20
    res: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        res = pc.custom_query('up{job="selfcopy"}')
        if res:
            break
        time.sleep(0.5)
    assert res and res[0]["value"][1] == "1"  # type: ignore[index]
