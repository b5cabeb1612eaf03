#!/usr/bin/env python3
"""CPU cost of the vLLM simulator: CPU seconds per simulated second with N replicas at a
given arrival rate (default: 20 replicas at the shipped trace's peak rate and at 90 % of
the pool's capacity), with and without a /metrics render every simulated second (what a
1 s Prometheus scrape costs), plus the size of one scrape.

    .venv/bin/python scripts/bench_vllm_sim.py [--replicas 20] [--seconds 120] [--rate R ...]
"""

from __future__ import annotations

import argparse
import time

from prometheus_client import generate_latest

from gpu_bridge_lab.sandbox.vllm.metrics import make_registry
from gpu_bridge_lab.sandbox.vllm.model import ReplicaParams
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from bridge.trace import load_trace


def run(replicas: int, rate: float, cv: float | None, seconds: float, scrape: bool) -> dict[str, float]:
    trace = load_trace()
    sim = Simulation(trace, ["meta-llama/Llama-3.1-70B-Instruct"], ReplicaParams(), seed=1)
    for i in range(replicas):
        sim.add_replica(f"vllm-{i}", node=f"gpu-node-{i + 1:02d}")
    sim.set_load({"rate": rate, "cv": cv})
    reg = make_registry(sim)
    sim.advance(30)  # warm up: queues and batches filled
    arrived0 = sim.models[next(iter(sim.models))].arrived_total
    done0 = sum(sum(r.success.values()) for r in sim.replicas.values())
    size = 0
    t0 = time.process_time()
    for _ in range(int(seconds)):
        sim.advance(1.0)
        if scrape:
            size = len(generate_latest(reg))
    cpu = time.process_time() - t0
    arrived = sim.models[next(iter(sim.models))].arrived_total - arrived0
    done = sum(sum(r.success.values()) for r in sim.replicas.values()) - done0
    reps = sim.replica_list()
    return {
        "cpu_ms_per_sim_s": 1000 * cpu / seconds,
        "req_per_s": arrived / seconds,
        "done_per_s": done / seconds,
        "running": sum(r["running"] for r in reps),
        "waiting": sum(r["waiting"] for r in reps),
        "scrape_bytes": size,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--rate", type=float, action="append", help="arrival rate(s), req/s (default: trace peak, 90%% of capacity)")
    ap.add_argument("--cv", type=float, default=None, help="fixed burstiness (default: cv 3, about the trace's median)")
    args = ap.parse_args()
    trace = load_trace()
    capacity = ReplicaParams().capacity_rps() * args.replicas
    rates = args.rate or [trace.peak_rate, 0.9 * capacity]
    cv = args.cv if args.cv is not None else 3.0
    print(f"vLLM simulator: {args.replicas} replicas, capacity {capacity:.0f} req/s, cv {cv}, "
          f"{args.seconds:.0f} simulated s per run (step 0.1 s)")
    print(f"{'rate req/s':>10} {'done/s':>7} {'scrape/s':>8} {'CPU ms per sim s':>17} {'CPU %':>6} {'running':>8} {'waiting':>8} {'scrape KB':>9}")
    for rate in rates:
        for scrape in (False, True):
            r = run(args.replicas, rate, cv, args.seconds, scrape)
            print(f"{r['req_per_s']:10.0f} {r['done_per_s']:7.0f} {('1' if scrape else '0'):>8} {r['cpu_ms_per_sim_s']:17.1f} "
                  f"{r['cpu_ms_per_sim_s'] / 10:6.1f} {r['running']:8.0f} {r['waiting']:8.0f} "
                  f"{(r['scrape_bytes'] / 1024 if scrape else 0):9.0f}")
    print("CPU % = share of one core when the simulator runs in real time (speed only moves the trace clock).")


if __name__ == "__main__":
    main()
