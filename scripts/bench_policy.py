#!/usr/bin/env python3
"""Speed and sanity of the policy alone: run ``plan()`` over the shipped 14-day trace with a
deliberately crude cluster model (not ``gpu-bridge simulate``, whose model is the real one).

Prints microseconds per ``plan()`` call and a rough lent/violation summary, so a policy
change that is slow or obviously unsafe shows up at once:

    .venv/bin/python scripts/bench_policy.py [--days 14] [--nodes 24] [--peak 20] [--tick 30]
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import replace

from bridge.config import default_config
from bridge.model import ActionKind, ClusterView, LoadSignals, NodeState, Phase, PoolState, SlurmJob
from bridge.policy import plan
from bridge.policy.forecast import history_span_s, history_windows, horizon_s
from bridge.policy.history import HistoryRecorder
from bridge.trace import load_trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=float, default=14)
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--peak", type=float, default=20.0, help="replicas needed by the busiest 10-min window")
    ap.add_argument("--tick", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--headroom", type=float, default=None)
    ap.add_argument("--set", action="append", default=[], help="override a numeric config key, e.g. policy.min_lend_s=900")
    ap.add_argument("--noise", type=float, default=0.05, help="per-sample noise = cv x this")
    args = ap.parse_args()

    cfg = default_config(headroom=args.headroom) if args.headroom is not None else default_config()
    cfg = replace(cfg, policy=replace(cfg.policy, tick_s=args.tick))
    for kv in args.set:  # e.g. policy.forecast.burst_quantile=0.95
        key, _, raw = kv.partition("=")
        *path, leaf = key.split(".")

        def put(obj: object, path: list[str]) -> object:
            if not path:
                old = getattr(obj, leaf)
                return replace(obj, **{leaf: type(old)(float(raw)) if old is not None else float(raw)})  # type: ignore[type-var]
            head, *rest = path
            if head == "pool":
                return replace(obj, pools=(put(obj.pools[0], rest),))  # type: ignore[attr-defined]
            return replace(obj, **{head: put(getattr(obj, head), rest)})  # type: ignore[type-var]

        cfg = put(cfg, path)  # type: ignore[assignment]
    pool = cfg.pools[0]
    trace = load_trace()
    scale = args.peak / trace.peak_rate
    rng = random.Random(args.seed)
    target = pool.target.concurrency_per_replica or 24.0
    t0 = 1_700_000_000.0 - (1_700_000_000.0 % 86400)
    dur = min(args.days * 86400, trace.duration_s)
    grace, cold, drain = cfg.slurm.grace_s, pool.cold_start_s, pool.drain_s

    # node state: phase, since, ready_at
    nodes = {f"gpu-node-{i:02d}": [Phase.SERVING, t0 - 86400, True] for i in range(args.nodes)}
    span = history_span_s(cfg)
    rec = HistoryRecorder(history_windows(cfg))
    print("history windows:", [(w.start_s, w.end_s, w.step_s) for w in history_windows(cfg)])
    print(f"horizon {horizon_s(cfg, pool):.0f} s, history span {span / 86400:.1f} d")
    lent_s = viol_s = 0.0
    lends = reclaims = 0
    plan_s = hist_s = 0.0
    reasons: dict[str, int] = {}
    calls = 0
    # true demand in replicas per tick: the trace's rate, with burst noise per sample
    demand: list[float] = []
    t = t0
    while t < t0 + dur:
        cv = min(trace.cv_at(t - t0), 3.0)
        k = max(0.01, cv * args.noise)
        demand.append(trace.rate_at(t - t0) * scale * rng.gammavariate(1 / k**2, k**2))
        t += args.tick
    # rough upper bound ("oracle"): serve exactly the peak of the next grace + cold start + tick
    look = math.ceil((grace + cold + args.tick) / args.tick)
    oracle_s = sum(
        args.tick * max(0, args.nodes - math.ceil(max(demand[i : i + look + 1]) - 1e-9)) for i in range(len(demand))
    )
    t = t0
    for d in demand:
        ready = sum(1 for p, _, r in nodes.values() if p is Phase.SERVING and r)
        sig = LoadSignals(t, d * target, 0.0, min(d, ready) * 0.8, None, ready)
        rec.add(sig)
        h0 = time.perf_counter()
        hist = rec.history(t)
        hist_s += time.perf_counter() - h0
        if d > ready:
            viol_s += args.tick
        # phase progress
        for name, st in nodes.items():
            ph, since, _ = st
            if ph is Phase.LENDING and t - since >= drain:
                nodes[name] = [Phase.LENT, t, False]
            elif ph is Phase.RECLAIMING and t - since >= grace:
                nodes[name] = [Phase.RETURNING, t, False]
            elif ph is Phase.RETURNING and t - since >= cold:
                nodes[name] = [Phase.SERVING, t, True]
        lent_s += args.tick * sum(1 for p, _, _ in nodes.values() if p is Phase.LENT)
        view = ClusterView(
            now=t,
            nodes=tuple(
                NodeState(n, pool.name, ph, since, serving_pods=1 if ph is Phase.SERVING else 0, serving_ready=r,
                          slurm_state="allocated" if ph is Phase.LENT else "drained",
                          jobs=(f"job-{n}",) if ph is Phase.LENT else ())
                for n, (ph, since, r) in nodes.items()
            ),
            pools={pool.name: PoolState(pool.name, sig, hist, ready, ready)},
            jobs={
                f"job-{n}": SlurmJob(f"job-{n}", "train", "alice", "preempt", "running", (n,), since)
                for n, (ph, since, _) in nodes.items()
                if ph is Phase.LENT
            },
        )
        c0 = time.perf_counter()
        p = plan(view, cfg)
        plan_s += time.perf_counter() - c0
        calls += 1
        for a in p.actions:
            reasons[a.reason] = reasons.get(a.reason, 0) + 1
            if a.kind is ActionKind.LEND:
                nodes[a.node] = [Phase.LENDING, t, False]
                lends += 1
            else:
                nodes[a.node] = [Phase.RECLAIMING, t, False]
                reclaims += 1
        t += args.tick
    total_h = dur / 3600
    print(f"rough oracle bound: {oracle_s / 3600 * 4:.0f} GPU-h lent")
    print("actions by reason:", dict(sorted(reasons.items())))
    print(
        f"plan(): {calls} calls, {plan_s / calls * 1e6:.0f} us per call; "
        f"HistoryRecorder.history(): {hist_s / calls * 1e6:.0f} us per call ({len(hist)} samples)"
    )
    print(
        f"lent {lent_s / 3600 * 4:.0f} GPU-h of {args.nodes * 4 * total_h:.0f}; lends {lends}, reclaims {reclaims}; "
        f"violation minutes {viol_s / 60:.0f} of {dur / 60:.0f} ({viol_s / dur:.3%})"
    )


if __name__ == "__main__":
    main()
