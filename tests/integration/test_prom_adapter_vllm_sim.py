"""Prometheus adapter on the series of the sandbox's vLLM simulator (``gpu-bridge sandbox
vllm``), V1 and V0 metric generations, scraped by a real Prometheus: the names, labels and
value ranges the adapter expects are the ones the simulator (and vLLM) export."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.adapters.prom.signals import PromAdapter
from bridge.adapters.prom.types import PromPool

from test_prom_adapter import RunningPrometheus

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs /usr/bin/prometheus")]


def start_sim(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "sandbox", "vllm", "--port", "0", "--speed", "288", "--trace-start-s", "12:00", "--peak-rps", "30", *args],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on http://([\d.]+:\d+)", line)
    if m is None:
        proc.kill()
        proc.wait(5)
        raise RuntimeError(f"vllm simulator did not start: {line!r}")
    return proc, m.group(1)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    procs: list[subprocess.Popen[str]] = []
    prom = None
    try:
        p1, t1 = start_sim("--model", "llama-v1", "--replicas", "3")
        procs.append(p1)
        p0, t0 = start_sim("--model", "llama-v0", "--replicas", "2", "--metrics-version", "v0")
        procs.append(p0)
        tmp: Path = tmp_path_factory.mktemp("prom-sim")
        prom = RunningPrometheus(tmp, [t1, t0])
        adapter = PromAdapter(prom.url, timeout_s=2, rate_window_s=5)
        prom.wait_until(
            lambda: all(adapter.current(PromPool(m, m)).signals.tokens_per_s for m in ("llama-v1", "llama-v0")), timeout=40
        )
        yield prom.url
    finally:
        if prom is not None:
            prom.stop()
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            if p.stdout is not None:
                p.stdout.close()


@pytest.mark.parametrize(("model", "replicas"), [("llama-v1", 3), ("llama-v0", 2)], ids=["v1", "v0"])
def test_signals_from_the_simulator(prom: str, model: str, replicas: int) -> None:
    reading = PromAdapter(prom, timeout_s=2, rate_window_s=5).current(PromPool(model, model))
    s = reading.signals
    assert reading.problems == {}, reading.problems
    assert s.replicas_reporting == replicas
    assert s.running is not None and s.waiting is not None and s.running >= 0 and s.waiting >= 0
    assert s.kv_cache_usage_sum is not None and 0 <= s.kv_cache_usage_sum <= replicas
    assert s.tokens_per_s is not None and s.tokens_per_s > 0


def test_history_from_the_simulator(prom: str) -> None:
    import time

    end = time.time()
    hist = PromAdapter(prom, timeout_s=2, rate_window_s=5).history(PromPool("llama-v1", "llama-v1"), start=end - 3, end=end, step_s=1)
    assert len(hist) == 4 and hist[-1].replicas_reporting == 3 and hist[-1].running is not None
