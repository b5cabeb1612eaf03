"""The simulator's queueing arithmetic, driven by an explicit clock (no sleeping)."""

from __future__ import annotations

import statistics

import pytest

from gpu_bridge_lab.sandbox.vllm.model import (
    DRAINING,
    REQUEST_LATENCY_BUCKETS_S,
    SERVING,
    STARTING,
    TTFT_BUCKETS_S,
    Hist,
    Replica,
    ReplicaParams,
    Request,
)
from gpu_bridge_lab.sandbox.vllm.sim import SimError, Simulation
from bridge.trace import Trace

FLAT = Trace((0.0, 600.0), (10.0, 10.0), (1.0, 1.0), 600.0, "flat")


def sim_with(rate: float, replicas: int = 1, params: ReplicaParams | None = None, seed: int = 7, cv: float = 1.0) -> Simulation:
    sim = Simulation(FLAT, ["m"], params or ReplicaParams(), seed=seed)
    for i in range(replicas):
        sim.add_replica(f"r{i}", "m", f"node-{i}")
    sim.set_load({"rate": rate, "cv": cv})
    return sim


def total(sim: Simulation, key: str) -> int:
    return sum(r[key] for r in sim.replica_list())


def test_littles_law_holds_below_capacity() -> None:
    sim = sim_with(rate=12.0)
    rep = sim.replicas["r0"]
    sim.advance(120)  # warm up
    n0, sum0 = rep.e2e.count, rep.e2e.sum
    arrived0 = sim.models["m"].arrived_total
    samples = []
    for _ in range(3000):
        sim.advance(0.2)
        samples.append(rep.load)
    n, s = rep.e2e.count - n0, rep.e2e.sum - sum0
    lam = (sim.models["m"].arrived_total - arrived0) / 600.0
    w = s / n
    L = statistics.fmean(samples)
    assert lam == pytest.approx(12.0, rel=0.08)
    assert L == pytest.approx(lam * w, rel=0.1)


def test_running_never_exceeds_max_num_seqs_and_throughput_is_capped() -> None:
    params = ReplicaParams(max_num_seqs=64)
    sim = sim_with(rate=3 * params.capacity_rps(), params=params)
    rep = sim.replicas["r0"]
    sim.advance(60)
    done0 = sum(rep.success.values())
    gen0 = rep.generation_tokens_total()
    for _ in range(300):
        sim.advance(1.0)
        assert len(rep.running) <= 64
    done = sum(rep.success.values()) - done0
    # budget is shared by at most 64 sequences at 40 tok/s each: 2560 tokens/s < tokens_per_s
    gen_rate = (rep.generation_tokens_total() - gen0) / 300
    assert gen_rate <= 64 * params.seq_tokens_per_s * 1.001
    assert done / 300 < params.capacity_rps()
    assert len(rep.waiting) > 1000


def test_saturated_throughput_matches_capacity() -> None:
    params = ReplicaParams(max_num_seqs=1024, kv_cache_tokens=10_000_000)
    sim = sim_with(rate=2 * params.capacity_rps(), params=params)
    rep = sim.replicas["r0"]
    sim.advance(120)
    done0 = sum(rep.success.values())
    sim.advance(600)
    rate = (sum(rep.success.values()) - done0) / 600
    assert rate == pytest.approx(params.capacity_rps(), rel=0.1)


def test_queue_grows_above_capacity_and_drains_below() -> None:
    sim = sim_with(rate=0.0, replicas=2)
    cap = 2 * sim.params.capacity_rps()
    sim.set_load({"rate": 1.6 * cap})
    waits = []
    for _ in range(6):
        sim.advance(20)
        waits.append(total(sim, "waiting"))
    assert waits[0] >= 0 and waits[-1] > waits[2] > 0
    assert waits[-1] > 200
    sim.set_load({"rate": 0.3 * cap})
    for _ in range(120):
        sim.advance(5)
        if total(sim, "waiting") == 0:
            break
    assert total(sim, "waiting") == 0


def test_kv_usage_stays_in_bounds_and_overflow_preempts() -> None:
    params = ReplicaParams(kv_cache_tokens=40_000, max_num_seqs=512)
    sim = sim_with(rate=40.0, params=params)
    rep = sim.replicas["r0"]
    seen = []
    for _ in range(400):
        sim.advance(0.5)
        u = rep.kv_usage()
        assert 0.0 <= u <= 1.0
        assert rep.kv_tokens() <= params.kv_cache_tokens or len(rep.running) <= 1
        seen.append(u)
    assert max(seen) > 0.9
    assert rep.preemptions_total > 0
    assert sum(rep.success.values()) > 0


def test_idle_replica_has_zero_kv_and_counters_are_monotone() -> None:
    sim = sim_with(rate=15.0)
    rep = sim.replicas["r0"]
    last_gen = last_prompt = 0.0
    for _ in range(200):
        sim.advance(0.3)
        g, p = rep.generation_tokens_total(), rep.prompt_tokens_total
        assert g >= last_gen and p >= last_prompt
        last_gen, last_prompt = g, p
    sim.set_load({"rate": 0})
    sim.advance(600)
    assert rep.load == 0 and rep.kv_usage() == 0.0
    assert rep.generation_tokens_total() == pytest.approx(last_gen, rel=0.5)


def test_drain_finishes_in_flight_within_a_generous_timeout() -> None:
    sim = sim_with(rate=15.0, replicas=2)
    sim.advance(30)
    rep = sim.replicas["r0"]
    in_flight = rep.load
    finished_before = sum(rep.success.values())
    assert in_flight > 0
    sim.remove_replica("r0", shutdown_timeout_s=600)
    assert rep.state == DRAINING
    seen_load = rep.load
    sim.advance(0.1)
    assert rep.load <= seen_load  # no new requests routed to it
    for _ in range(6000):
        if "r0" not in sim.replicas:
            break
        sim.advance(0.1)
    assert "r0" not in sim.replicas
    assert rep.aborted_total == 0
    assert sum(rep.success.values()) - finished_before == in_flight
    assert sim.models["m"].aborted_total == 0
    assert sim.replicas["r1"].state == SERVING


def test_drain_aborts_what_is_left_at_the_deadline() -> None:
    sim = sim_with(rate=30.0, replicas=1)
    sim.advance(30)
    rep = sim.replicas["r0"]
    in_flight = rep.load
    sim.remove_replica("r0", shutdown_timeout_s=2.0)
    sim.advance(1.9)
    assert "r0" in sim.replicas
    sim.advance(0.2)
    assert "r0" not in sim.replicas
    assert rep.aborted_total > 0
    assert rep.success["abort"] == rep.aborted_total
    assert sim.models["m"].aborted_total == rep.aborted_total
    assert rep.aborted_total + rep.success["stop"] + rep.success["length"] >= in_flight
    # with no replica left, arrivals are rejected, not lost silently
    before = sim.models["m"].rejected_total
    sim.advance(2)
    assert sim.models["m"].rejected_total > before


def test_zero_shutdown_timeout_aborts_at_once() -> None:
    sim = sim_with(rate=20.0)
    sim.advance(10)
    n = sim.replicas["r0"].load
    rep = sim.remove_replica("r0", shutdown_timeout_s=0)
    assert "r0" not in sim.replicas and rep.aborted_total == n


def test_re_adding_a_draining_replica_resumes_it() -> None:
    sim = sim_with(rate=10.0)
    sim.advance(5)
    sim.remove_replica("r0", shutdown_timeout_s=100)
    rep = sim.add_replica("r0", "m")
    assert rep.state == SERVING and rep.drain_deadline is None
    with pytest.raises(SimError, match="already exists"):
        sim.add_replica("r0", "m")


def test_warmup_delays_serving() -> None:
    sim = sim_with(rate=10.0, replicas=0)
    rep = sim.add_replica("w", "m", warmup_s=5.0)
    assert rep.state == STARTING and not rep.exposed
    sim.advance(4.8)
    assert rep.state == STARTING and rep.load == 0
    assert sim.models["m"].rejected_total > 0
    sim.advance(0.5)
    assert rep.state == SERVING
    sim.advance(2)
    assert rep.load > 0


def test_same_seed_same_run_other_seed_other_run() -> None:
    def run(seed: int) -> list[dict]:
        sim = Simulation(FLAT.scaled(3), ["m"], seed=seed)
        for i in range(3):
            sim.add_replica(f"r{i}", "m")
        sim.advance(120)
        return sim.replica_list()

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_least_loaded_balancing_spreads_requests() -> None:
    sim = sim_with(rate=40.0, replicas=4)
    sim.advance(100)
    loads = [r.load for r in sim.replicas.values()]
    done = [sum(r.success.values()) for r in sim.replicas.values()]
    assert max(loads) - min(loads) <= max(3, 0.2 * max(loads))
    assert min(done) > 0.8 * max(done)


def test_node_weight_keeps_that_replica_busier() -> None:
    """A node of weight 4 holds about 4x the in-flight requests of its peer (uneven routing,
    as sticky sessions make it); clearing the weights evens them out again."""
    sim = sim_with(rate=40.0, replicas=2)
    sim.set_load({"node_weights": {"node-0": 4}})
    heavy, light = [], []
    for _ in range(50):
        sim.advance(2)
        heavy.append(sim.replicas["r0"].load)
        light.append(sim.replicas["r1"].load)
    assert statistics.mean(heavy) > 3 * statistics.mean(light) > 0
    assert sim.load_status()["models"]["m"]["node_weights"] == {"node-0": 4.0}
    sim.set_load({"reset": True, "rate": 40.0})
    sim.advance(100)
    loads = [r.load for r in sim.replicas.values()]
    assert max(loads) - min(loads) <= max(3, 0.2 * max(loads))


def test_trace_clock_speed_and_scaling() -> None:
    trace = Trace((0.0, 600.0, 1200.0), (1.0, 2.0, 3.0), (1.0, 1.5, 2.0), 600.0, "t")
    sim = Simulation(trace, ["m"], speed=60.0, trace_start_s=600.0)
    assert sim.rate_and_cv("m") == (2.0, 1.5)
    sim.advance(10)  # 600 trace seconds later
    assert sim.trace_time() == pytest.approx(1200.0)
    assert sim.rate_and_cv("m") == (3.0, 2.0)
    sim.set_load({"multiplier": 2})
    assert sim.rate_and_cv("m") == (6.0, 2.0)
    sim.set_load({"rate": 5, "cv": 1})
    assert sim.rate_and_cv("m") == (10.0, 1.0)
    sim.set_load({"reset": True})
    assert sim.rate_and_cv("m") == (3.0, 2.0)
    capped = Simulation(trace, ["m"], max_cv=1.2)
    assert capped.rate_and_cv("m", t=1300) == (3.0, 1.2)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"rate": -1}, "load.rate"),
        ({"rate": "fast"}, "load.rate"),
        ({"cv": 0}, "load.cv"),
        ({"multiplier": True}, "load.multiplier"),
        ({"model": "nope"}, "unknown model"),
        ({"speed": 2}, "unknown key"),
        ({"node_weights": ["node-0"]}, "load.node_weights"),
        ({"node_weights": {"node-0": 0}}, "load.node_weights.node-0"),
        ({"node_weights": {"node-0": None}}, "load.node_weights.node-0"),
    ],
)
def test_bad_load_overrides_name_the_field(body: dict, match: str) -> None:
    sim = sim_with(rate=1.0)
    with pytest.raises(SimError, match=match):
        sim.set_load(body)


def test_bad_params_name_the_field() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        ReplicaParams(max_num_seqs=0)
    with pytest.raises(ValueError, match="shutdown_timeout_s"):
        ReplicaParams(shutdown_timeout_s=-1)


def test_unknown_replica_and_model_errors() -> None:
    sim = sim_with(rate=1.0)
    with pytest.raises(SimError, match="not found") as exc:
        sim.remove_replica("ghost")
    assert exc.value.status == 404
    with pytest.raises(SimError, match="unknown model"):
        sim.add_replica("x", "other")


def test_histogram_buckets_are_vllms_and_cumulative() -> None:
    assert TTFT_BUCKETS_S[0] == 0.001 and TTFT_BUCKETS_S[-1] == 2560.0 and len(TTFT_BUCKETS_S) == 22
    assert REQUEST_LATENCY_BUCKETS_S[0] == 0.3 and REQUEST_LATENCY_BUCKETS_S[-1] == 7680.0
    h = Hist((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 5.0):
        h.observe(v)
    assert h.cumulative() == [("1.0", 2), ("2.0", 3), ("+Inf", 4)]
    assert h.sum == 8.0


def test_single_request_timing_is_exact() -> None:
    params = ReplicaParams(seq_tokens_per_s=50.0, prefill_cost=0.1)
    rep = Replica("r", "m", params)
    rep.enqueue(Request(1, 0.0, prompt=100, gen=200, reason="stop"))
    for i in range(100):
        rep.step(i * 0.1, 0.1)
    # prefill 100*0.1 = 10 units at 50/s = 0.2 s; then 200 tokens = 4 s
    assert rep.ttft.count == 1 and rep.ttft.sum == pytest.approx(0.2)
    assert rep.e2e.count == 1 and rep.e2e.sum == pytest.approx(4.2)
    assert rep.prompt_tokens_total == 100 and rep.generation_tokens_total() == 200
    assert rep.success["stop"] == 1 and rep.kv_tokens() == 0
