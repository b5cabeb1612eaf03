"""Exposition: vLLM's names, types and labels; a removed replica's series disappear."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpu_bridge_lab.sandbox.vllm.metrics import CACHE_CONFIG_LABELS, LABELS, V0_FAMILIES, V1_FAMILIES, make_registry
from gpu_bridge_lab.sandbox.vllm.model import REQUEST_LATENCY_BUCKETS_S, TTFT_BUCKETS_S
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from gpu_bridge_lab.sandbox.vllm.sleep import SleepParams
from bridge.trace import Trace

FLAT = Trace((0.0, 600.0), (20.0, 20.0), (1.0, 1.0), 600.0, "flat")


def scrape(sim: Simulation, version: str = "v1") -> dict:
    text = generate_latest(make_registry(sim, version)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def make_sim() -> Simulation:
    sim = Simulation(FLAT, ["llama", "qwen"], seed=1)
    sim.add_replica("llama-a", "llama", "gpu-node-01")
    sim.add_replica("llama-b", "llama")
    sim.add_replica("qwen-a", "qwen", "gpu-node-03")
    sim.advance(30)
    return sim


def test_v1_families_types_and_labels() -> None:
    fams = scrape(make_sim())
    for name, typ in V1_FAMILIES.items():
        assert name in fams, name
        assert fams[name].type == typ, name
    assert "vllm:gpu_cache_usage_perc" not in fams and "vllm:num_requests_swapped" not in fams
    running = fams["vllm:num_requests_running"]
    pods = {s.labels["pod"]: s.labels for s in running.samples}
    assert set(pods) == {"llama-a", "llama-b", "qwen-a"}
    assert pods["llama-a"] == {"model_name": "llama", "engine": "0", "pod": "llama-a", "node": "gpu-node-01"}
    assert pods["qwen-a"]["model_name"] == "qwen"
    for s in fams["vllm:kv_cache_usage_perc"].samples:
        assert 0.0 <= s.value <= 1.0
        assert set(s.labels) == set(LABELS)
    sample_names = {s.name for s in fams["vllm:prompt_tokens"].samples}
    assert sample_names == {"vllm:prompt_tokens_total"}
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort"}
    assert sum(s.value for s in fams["vllm:request_success"].samples) > 0


def test_cache_config_info_carries_vllms_labels_and_the_engines_gpu_memory_utilization() -> None:
    sim = Simulation(FLAT, ["llama"], seed=1, sleep_params=SleepParams(gpu_memory_utilization=0.85))
    sim.add_replica("llama-a", "llama", "gpu-node-01")
    sim.add_replica("warming", "llama", warmup_s=60)
    fam = scrape(sim)["vllm:cache_config_info"]
    assert [s.labels["pod"] for s in fam.samples] == ["llama-a"] and fam.samples[0].value == 1.0
    labels = fam.samples[0].labels
    assert set(labels) == {*CACHE_CONFIG_LABELS, "engine", "pod", "node"} and "model_name" not in labels
    assert labels["gpu_memory_utilization"] == "0.85" and labels["kv_cache_memory_bytes"] == "None"
    assert labels["engine"] == "0" and labels["block_size"] == "16" and labels["num_gpu_blocks"] == str(250_000 // 16)
    assert scrape(make_sim())["vllm:cache_config_info"].samples[0].labels["gpu_memory_utilization"] == "0.9"  # no sleep mode


def test_histograms_use_vllms_buckets() -> None:
    fams = scrape(make_sim())
    for name, bounds in (
        ("vllm:time_to_first_token_seconds", TTFT_BUCKETS_S),
        ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS_S),
        ("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS_S),
    ):
        les = [float(s.labels["le"]) for s in fams[name].samples
               if s.name == name + "_bucket" and s.labels["pod"] == "llama-a"]
        assert les == [*bounds, float("inf")], name
        counts = [s.value for s in fams[name].samples if s.name == name + "_bucket" and s.labels["pod"] == "llama-a"]
        assert counts == sorted(counts)
        total = [s.value for s in fams[name].samples if s.name == name + "_count" and s.labels["pod"] == "llama-a"]
        assert total == [counts[-1]]


def test_v0_names() -> None:
    fams = scrape(make_sim(), "v0")
    for name, typ in V0_FAMILIES.items():
        assert fams[name].type == typ, name
    assert "vllm:kv_cache_usage_perc" not in fams


def test_removed_replica_series_disappear_and_starting_ones_are_not_shown() -> None:
    sim = make_sim()
    sim.add_replica("warming", "llama", warmup_s=60)
    sim.remove_replica("llama-b", shutdown_timeout_s=0)
    fams = scrape(sim)
    for name in V1_FAMILIES:
        pods = {s.labels.get("pod") for s in fams[name].samples}
        assert "llama-b" not in pods and "warming" not in pods, name
    aborted = {s.labels["model_name"]: s.value for s in fams["vllm_sim_requests_aborted"].samples}
    assert aborted["llama"] > 0 and aborted["qwen"] == 0
    states = {(s.labels["model_name"], s.labels["state"]): s.value for s in fams["vllm_sim_replicas"].samples}
    assert states[("llama", "serving")] == 1 and states[("llama", "starting")] == 1


def test_sim_families() -> None:
    fams = scrape(make_sim())
    rate = {s.labels["model_name"]: s.value for s in fams["vllm_sim_arrival_rate"].samples}
    assert rate == {"llama": 20.0, "qwen": 20.0}
    assert fams["vllm_sim_trace_time_seconds"].samples[0].value == 30.0
