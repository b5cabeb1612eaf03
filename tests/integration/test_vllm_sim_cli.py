"""The simulator as the sandbox runs it: `python -m bridge sandbox vllm` in a subprocess,
scraped over HTTP and driven through its control API."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_bridge_lab.sandbox.vllm.metrics import V0_FAMILIES, V1_FAMILIES

pytestmark = pytest.mark.integration

# Small, fast replicas so queues build and drain within seconds of wall time:
# 8 sequences at 200 tok/s, ~60 token-units per request -> ~26 req/s per replica.
FAST = ["--max-num-seqs", "8", "--seq-tokens-per-s", "200", "--gen-tokens-mean", "40", "--gen-tokens-sigma", "0.3",
        "--prompt-tokens-mean", "1000", "--prompt-tokens-sigma", "0.3"]


@contextmanager
def simulator(*args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "sandbox", "vllm", "--host", "127.0.0.1", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.match(r"vllm-sim listening on (http://127\.0\.0\.1:\d+)", line)
        if not m:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise AssertionError(f"simulator did not start: {line!r}\n{err}")
        yield m.group(1), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def send(url: str, method: str, body: Any) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def families(base: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(get(base + "/metrics"))}


def gauge_sum(base: str, name: str) -> float:
    return sum(s.value for s in families(base)[name].samples)


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_metrics_names_labels_and_types_and_clean_sigterm() -> None:
    with simulator("--model", "llama", "--replicas", "2", "--node", "gpu-node-01", "--node", "gpu-node-02",
                   "--speed", "288", "--trace-start-s", "18:00", "--peak-rps", "30") as (base, proc):
        wait_for(lambda: gauge_sum(base, "vllm:num_requests_running") > 0, 10, "requests running")
        fams = families(base)
        for name, typ in V1_FAMILIES.items():
            assert fams[name].type == typ, name
        labels = {s.labels["pod"]: s.labels for s in fams["vllm:num_requests_waiting"].samples}
        assert labels == {
            "llama-0": {"model_name": "llama", "engine": "0", "pod": "llama-0", "node": "gpu-node-01"},
            "llama-1": {"model_name": "llama", "engine": "0", "pod": "llama-1", "node": "gpu-node-02"},
        }
        t0 = fams["vllm_sim_trace_time_seconds"].samples[0].value
        assert 18 * 3600 <= t0 < 18 * 3600 + 288 * 20
        time.sleep(1.0)
        t1 = families(base)["vllm_sim_trace_time_seconds"].samples[0].value
        assert t1 - t0 == pytest.approx(288, rel=0.5)  # about a trace-time day in 5 minutes
        load = json.loads(get(base + "/load"))
        assert load["trace_clock"].startswith("day 0 18:")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_v0_metric_names() -> None:
    with simulator("--replicas", "1", "--metrics-version", "v0") as (base, _):
        fams = families(base)
        for name, typ in V0_FAMILIES.items():
            assert fams[name].type == typ, name
        assert "vllm:kv_cache_usage_perc" not in fams


def test_queue_grows_above_capacity_and_drains_below() -> None:
    with simulator("--model", "m", "--replicas", "1", *FAST) as (base, _):
        send(base + "/load", "PUT", {"rate": 0})
        capacity = 26.0
        send(base + "/load", "PUT", {"rate": 4 * capacity, "cv": 1.0})
        samples: list[float] = []
        for _ in range(4):
            time.sleep(0.5)
            samples.append(gauge_sum(base, "vllm:num_requests_waiting"))
        assert samples[-1] > samples[0] and samples[-1] > 50, samples
        assert gauge_sum(base, "vllm:num_requests_running") == 8
        send(base + "/load", "PUT", {"rate": 0.25 * capacity})
        wait_for(lambda: gauge_sum(base, "vllm:num_requests_waiting") == 0, 30, "the queue to drain")


def test_replicas_come_and_go_through_the_api() -> None:
    with simulator("--model", "m", "--shutdown-timeout", "1", *FAST) as (base, _):
        send(base + "/load", "PUT", {"rate": 20, "cv": 1.0})
        send(base + "/replicas", "POST", {"name": "vllm-a", "node": "gpu-node-03"})
        send(base + "/replicas", "POST", {"name": "vllm-b", "warmup_s": 1.0})
        pods = lambda: {s.labels["pod"] for s in families(base)["vllm:num_requests_running"].samples}  # noqa: E731
        assert pods() == {"vllm-a"}
        wait_for(lambda: pods() == {"vllm-a", "vllm-b"}, 5, "vllm-b warmed up")
        send(base + "/load", "PUT", {"rate": 200})  # keep vllm-a busy past its deadline
        time.sleep(1.0)
        req = urllib.request.Request(base + "/replicas/vllm-a", method="DELETE")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.loads(resp.read())["state"] == "draining"
        wait_for(lambda: pods() == {"vllm-b"}, 5, "vllm-a gone")
        aborted = {s.labels["model_name"]: s.value for s in families(base)["vllm_sim_requests_aborted"].samples}
        assert aborted["m"] > 0


def test_bad_flags_fail_with_a_clear_message(tmp_path: Any) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("window_start_s,rate_req_per_s\n0,abc\n600,1\n")
    out = subprocess.run([sys.executable, "-m", "bridge", "sandbox", "vllm", "--trace", str(bad)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "rate_req_per_s" in out.stderr
    out = subprocess.run([sys.executable, "-m", "bridge", "sandbox", "vllm", "--trace-start-s", "25:99"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--trace-start-s" in out.stderr
