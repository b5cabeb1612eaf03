"""Prometheus adapter against a real Prometheus (/usr/bin/prometheus, scrape_interval 1 s)
scraping a tiny exporter: V1 and V0 KV-cache names (and both at once), token counters, a
stale series (explicit old timestamp), NaN, a negative value, a model with no series, a
history range query, and a Prometheus that is down (AdapterError, never "no load")."""

from __future__ import annotations

import math
import re
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bridge.adapters.prom.signals import PromAdapter
from bridge.adapters.prom.types import PromPool
from bridge.errors import AdapterError

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs /usr/bin/prometheus")]

T0 = time.time()
STALE_AT = T0 - 120.0


class VllmLike(Collector):
    """Series shaped like vLLM's /metrics, for several pods of several models."""

    def collect(self) -> Iterator[Any]:
        labels = ["model_name", "pod", "engine"]
        running = GaugeMetricFamily("vllm:num_requests_running", "running", labels=labels)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "waiting", labels=labels)
        kv1 = GaugeMetricFamily("vllm:kv_cache_usage_perc", "kv v1", labels=labels)
        kv0 = GaugeMetricFamily("vllm:gpu_cache_usage_perc", "kv v0", labels=labels)
        prompt = CounterMetricFamily("vllm:prompt_tokens", "prompt", labels=labels)
        gen = CounterMetricFamily("vllm:generation_tokens", "gen", labels=labels)
        elapsed = time.time() - T0
        # llama: pod a is V1, pod b V0 only, pod c exports both (V1 wins).
        for pod, r, w, v1, v0 in (("a", 3, 1, 0.5, None), ("b", 2, 0, None, 0.25), ("c", 1, 4, 0.125, 0.9)):
            lab = ["llama", pod, "0"]
            running.add_metric(lab, r)
            waiting.add_metric(lab, w)
            if v1 is not None:
                kv1.add_metric(lab, v1)
            if v0 is not None:
                kv0.add_metric(lab, v0)
            prompt.add_metric(lab, 60.0 * elapsed)
            gen.add_metric(lab, 40.0 * elapsed)
        # stale: running carries an explicit timestamp two minutes old.
        running.add_metric(["stale", "s", "0"], 5, timestamp=STALE_AT)
        waiting.add_metric(["stale", "s", "0"], 0)
        # nan: kv usage NaN; neg: waiting negative.
        running.add_metric(["nan", "n", "0"], 1)
        kv1.add_metric(["nan", "n", "0"], math.nan)
        waiting.add_metric(["neg", "g", "0"], -1)
        yield from (running, waiting, kv1, kv0, prompt, gen)


def serve_text_format(registry: CollectorRegistry) -> ThreadingHTTPServer:
    """Serve /metrics always in the classic text format. prometheus_client 0.26's own server
    negotiates OpenMetrics with Prometheus, and its OpenMetrics writer turns the ':' of
    vLLM's names into '_' (vllm:num_requests_running -> vllm_num_requests_running)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence access logs
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningPrometheus:
    """A real Prometheus in ``tmp`` scraping ``targets`` (host:port) every second as job
    ``vllm``, or as ``config`` (a whole prometheus.yml) says."""

    def __init__(self, tmp: Path, targets: list[str], *, config: str | None = None) -> None:
        port = free_port()
        (tmp / "prometheus.yml").write_text(
            config if config is not None else
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: vllm\n    honor_labels: true\n"
            f"    static_configs:\n      - targets: {targets!r}\n"
        )
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{port}"

    def wait_until(self, ready: Any, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if ready():
                    return
            except AdapterError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"prometheus not ready in {timeout} s (exit code {self.proc.poll()})")
            time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The clock starts with the fixture, not at import: in a full run this module's tests may
    # start minutes after collection, and a "2 min old" sample must not fall out of
    # Prometheus' 5 min lookback by then.
    global T0, STALE_AT
    T0 = time.time()
    STALE_AT = T0 - 120.0
    tmp: Path = tmp_path_factory.mktemp("prom")
    registry = CollectorRegistry()
    registry.register(VllmLike())
    server = serve_text_format(registry)
    prom = RunningPrometheus(tmp, [f"127.0.0.1:{server.server_address[1]}"])
    try:
        adapter = PromAdapter(prom.url, timeout_s=2, rate_window_s=3)
        # until the token rates exist (two scrapes), then long enough to span the rate window
        prom.wait_until(lambda: adapter.current(PromPool("llama", "llama")).signals.tokens_per_s is not None)
        time.sleep(4)
        yield prom.url
    finally:
        prom.stop()
        server.shutdown()
        server.server_close()


def test_sums_over_replicas_with_v1_preferred_and_v0_fallback(prom_url: str) -> None:
    reading = PromAdapter(prom_url, timeout_s=2, rate_window_s=3).current(PromPool("llama", "llama"))
    s = reading.signals
    assert reading.problems == {}
    assert s.running == 6 and s.waiting == 5
    assert s.kv_cache_usage_sum == pytest.approx(0.5 + 0.25 + 0.125)  # pod c: V1 0.125, not V0 0.9
    assert s.replicas_reporting == 3
    assert s.tokens_per_s == pytest.approx(3 * 100.0, rel=0.1)
    assert abs(s.t - time.time()) < 5


def test_stale_series_makes_the_signal_none_with_a_reason(prom_url: str) -> None:
    reading = PromAdapter(prom_url, timeout_s=2, staleness_s=30).current(PromPool("stale", "stale"))
    assert reading.signals.running is None
    m = re.fullmatch(
        r'vllm:num_requests_running\{engine="0",instance="[^"]+",job="vllm",model_name="stale",pod="s"\} is stale: last sample (\d+) s old \(limit 30 s\)',
        reading.problems["running"],
    )
    assert m is not None, reading.problems["running"]
    assert 120 <= int(m.group(1)) <= time.time() - STALE_AT + 1
    assert reading.signals.waiting == 0  # the other gauge of that replica is fresh


def test_nan_and_negative_values_are_not_used(prom_url: str) -> None:
    adapter = PromAdapter(prom_url, timeout_s=2)
    nan = adapter.current(PromPool("nan", "nan"))
    assert nan.signals.kv_cache_usage_sum is None
    assert re.fullmatch(r'vllm:kv_cache_usage_perc\{engine="0",instance="[^"]+",job="vllm",model_name="nan",pod="n"\} is NaN', nan.problems["kv_cache_usage_sum"])
    assert nan.signals.running == 1
    neg = adapter.current(PromPool("neg", "neg"))
    assert neg.signals.waiting is None and "is negative (-1)" in neg.problems["waiting"]


def test_a_model_without_series_has_every_signal_none(prom_url: str) -> None:
    reading = PromAdapter(prom_url, timeout_s=2).current(PromPool("ghost", "ghost"))
    s = reading.signals
    assert (s.running, s.waiting, s.kv_cache_usage_sum, s.tokens_per_s, s.replicas_reporting) == (None, None, None, None, 0)
    assert reading.problems["running"] == "no series of vllm:num_requests_running"


def test_extra_matchers_narrow_the_series(prom_url: str) -> None:
    reading = PromAdapter(prom_url, timeout_s=2, rate_window_s=3).current(PromPool("llama", "llama", {"pod": "a"}))
    assert reading.signals.running == 3 and reading.signals.replicas_reporting == 1


def test_history_is_oldest_first_one_per_step(prom_url: str) -> None:
    end = time.time()
    hist = PromAdapter(prom_url, timeout_s=2, rate_window_s=3).history(PromPool("llama", "llama"), start=end - 4, end=end, step_s=1)
    assert len(hist) == 5
    assert [round(h.t - hist[0].t) for h in hist] == [0, 1, 2, 3, 4]
    assert hist[-1].running == 6 and hist[-1].kv_cache_usage_sum == pytest.approx(0.875)


def test_evaluation_time_can_be_given(prom_url: str) -> None:
    at = round(time.time() - 2, 3)
    reading = PromAdapter(prom_url, timeout_s=2, rate_window_s=3).current(PromPool("llama", "llama"), at=at)
    assert reading.signals.t == at and reading.signals.running == 6


def test_history_with_a_sub_second_step(prom_url: str) -> None:
    end = time.time()
    adapter = PromAdapter(prom_url, timeout_s=2, rate_window_s=3, scrape_interval_s=1)
    hist = adapter.history(PromPool("llama", "llama"), start=end - 2, end=end, step_s=0.5)
    assert len(hist) == 5 and [h.t - hist[0].t for h in hist] == [0, 0.5, 1.0, 1.5, 2.0]
    assert hist[-1].running == 6


def test_query_counter(prom_url: str) -> None:
    adapter = PromAdapter(prom_url, timeout_s=2)
    adapter.current(PromPool("llama", "llama"))
    adapter.current(PromPool("llama", "llama"))
    assert adapter.calls() == {"query": 2} and adapter.failures() == {}


def test_prometheus_down_raises_never_no_load() -> None:
    adapter = PromAdapter(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    with pytest.raises(AdapterError, match=r"^prometheus: pool llama: query failed: ConnectionError"):
        adapter.current(PromPool("llama", "llama"))
    assert adapter.failures() == {"query": 1}
