"""Property: whatever the sequence of load changes, replica additions and removals, no
request is lost or double counted, and every gauge stays within its bounds."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_bridge_lab.sandbox.vllm.model import Replica, ReplicaParams
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from bridge.trace import Trace

FLAT = Trace((0.0, 600.0), (10.0, 30.0), (2.0, 4.0), 600.0, "flat")
SMALL = ReplicaParams(max_num_seqs=16, kv_cache_tokens=20_000, shutdown_timeout_s=3.0)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("advance"), st.floats(0.05, 5.0)),
        st.tuples(st.just("rate"), st.floats(0.0, 120.0)),
        st.tuples(st.just("add"), st.integers(0, 4), st.floats(0.0, 2.0)),
        st.tuples(st.just("remove"), st.integers(0, 4), st.sampled_from([None, 0.0, 1.0, 10.0])),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, seed=st.integers(0, 2**16))
def test_requests_are_conserved_and_gauges_bounded(ops: list[tuple], seed: int) -> None:
    sim = Simulation(FLAT, ["m"], SMALL, seed=seed, speed=100.0)
    every: list[Replica] = []
    for op in ops:
        if op[0] == "advance":
            sim.advance(op[1])
        elif op[0] == "rate":
            sim.set_load({"rate": op[1]})
        elif op[0] == "add":
            name = f"r{op[1]}"
            rep = sim.replicas.get(name)
            new = sim.add_replica(name, "m", warmup_s=op[2]) if rep is None or rep.state == "draining" else rep
            if all(new is not r for r in every):
                every.append(new)
        elif op[0] == "remove" and f"r{op[1]}" in sim.replicas:
            sim.remove_replica(f"r{op[1]}", op[2])
        m = sim.models["m"]
        accounted = m.rejected_total + sum(sum(r.success.values()) + r.load for r in every)
        assert accounted == m.arrived_total
        assert m.aborted_total + sum(r.aborted_total for r in sim.replicas.values()) == sum(r.aborted_total for r in every)
        for r in sim.replicas.values():
            assert 0.0 <= r.kv_usage() <= 1.0
            assert len(r.running) <= SMALL.max_num_seqs
            assert r.state in ("starting", "serving", "draining")
            if r.state == "draining":
                assert r.drain_deadline is not None and sim.t <= r.drain_deadline + sim.step_s + 1e-9
