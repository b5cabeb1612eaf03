"""A foreign vLLM series in a real Prometheus (issue 21 point 2): the scrape configuration is
the sandbox's own (``gpu_bridge_lab.sandbox.cluster.prometheus.render_config``: target labels
carry ``namespace`` as Kubernetes service discovery does). The pool's two pods export sane
values; a benchmark pod of the same model in the same namespace and a research copy in
another namespace export NaN. With the default config the pool's reading is complete and
exact; selected by ``model_name`` alone (what the adapter did before) it is blind."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from test_prom_adapter import free_port, serve_text_format

from bridge.adapters.prom.signals import PromAdapter
from bridge.adapters.prom.types import PromPool
from bridge.config import parse_config
from gpu_bridge_lab.sandbox.cluster import prometheus as sandbox_prom

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs /usr/bin/prometheus")]

MODEL = "llama-70b"
OWN = ("vllm-7d4b9c-aaaaa", "vllm-7d4b9c-bbbbb")
CFG = parse_config({"pools": [{"name": "llama", "model_name": MODEL, "namespace": "serving", "deployment": "vllm"}],
                    "prometheus": {"rate_window_s": 5}})


class Replicas(Collector):
    """vLLM-shaped series of ``pods``, every value ``value`` (NaN for the foreign ones)."""

    def __init__(self, pods: tuple[str, ...], value: float) -> None:
        self.pods, self.value = pods, value

    def collect(self) -> Iterator[Any]:
        labels = ["model_name", "pod", "engine"]
        fams = [GaugeMetricFamily(n, n, labels=labels) for n in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                                                   "vllm:kv_cache_usage_perc")]
        fams += [CounterMetricFamily(n, n, labels=labels) for n in ("vllm:prompt_tokens", "vllm:generation_tokens")]
        for pod in self.pods:
            for f in fams:
                f.add_metric([MODEL, pod, "0"], self.value)
        yield from fams


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("prom-foreign")
    servers = []
    targets = []
    for job, ns, pods, value in (("vllm", "serving", (*OWN, "bench-vllm-0"), None), ("research", "research", ("vllm-7d4b9c-aaaaa",), math.nan)):
        reg = CollectorRegistry()
        if value is None:  # the pool's pods sane, the benchmark pod NaN, on one target
            reg.register(Replicas(OWN, 0.25))
            reg.register(Replicas(("bench-vllm-0",), math.nan))
        else:
            reg.register(Replicas(pods, value))
        srv = serve_text_format(reg)
        servers.append(srv)
        targets.append(sandbox_prom.ScrapeTarget(job, (f"127.0.0.1:{srv.server_address[1]}",), labels={"namespace": ns}))
    (tmp / "prometheus.yml").write_text(sandbox_prom.render_config(targets))
    port = free_port()
    argv = sandbox_prom.argv(tmp / "prometheus.yml", tmp / "data", port)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while not sandbox_prom.scraped_once(url, ["vllm", "research"], ["vllm", "research"]):
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"prometheus not ready (exit code {proc.poll()})")
            time.sleep(0.3)
        time.sleep(3)  # scrapes every second: a few samples in the 5 s rate window
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for srv in servers:
            srv.shutdown()
            srv.server_close()


def test_the_foreign_series_are_in_prometheus_and_blind_a_model_name_selection(prometheus: str) -> None:
    r = PromAdapter(prometheus, timeout_s=5, rate_window_s=5).current(PromPool("llama", MODEL), live_pods=set(OWN))
    assert r.signals.running is None and "is NaN" in r.problems["running"]


def test_the_default_config_reads_only_the_pools_own_pods(prometheus: str) -> None:
    pool = PromPool.from_config(CFG.pools[0], CFG.prometheus)
    r = PromAdapter(prometheus, timeout_s=5, rate_window_s=5).current(pool, live_pods=set(OWN))
    assert r.problems == {}
    s = r.signals
    assert (s.running, s.waiting, s.replicas_reporting) == (0.5, 0.5, 2)
    assert s.kv_cache_usage_sum == pytest.approx(0.5)
    assert r.ignored and all("pod 'bench-vllm-0' is not one of the pool's pods" in line for line in r.ignored)
    assert all('namespace="serving"' in line for line in r.ignored)  # the research copy is not even returned
