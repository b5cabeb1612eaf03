#!/usr/bin/env python3
"""`simulate --prometheus` on history in a real Prometheus, next to `simulate --trace`, and a
`gpu-bridge forecast` from it. Prints the numbers; exit 0 regardless.

1. The vLLM simulator replays the shipped trace (scaled to --peak-rps at its busiest window,
   cv capped at --max-cv, --replicas replicas) from 10 minutes before the UTC midnight
   --days days ago until now, with real timestamps (scraped every 15 s at past times, backfilled with promtool);
   the sandbox's Prometheus binary serves it.
2. `gpu-bridge simulate --prometheus` over the whole days (midnight to midnight), with
   --export-trace and a PNG; the recovered 10-minute load against what really arrived and
   against the trace.
3. `gpu-bridge simulate --trace` on the same span (the trace as replayed) with the measured
   per-replica capacity.
4. `gpu-bridge forecast --nodes 2 --for 6h` as of now.

    .venv/bin/python scripts/bench_history_replay.py [--days 3] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gpu_bridge_lab.sandbox.vllm import backfill as bf
from gpu_bridge_lab.sandbox.vllm.model import ReplicaParams
from bridge.trace import load_trace


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=1800)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=3, help="whole UTC days of history before today (default 3)")
    ap.add_argument("--replicas", type=int, default=6)
    ap.add_argument("--peak-rps", type=float, default=10.0)
    ap.add_argument("--max-cv", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="leave Prometheus running (prints its URL)")
    a = ap.parse_args()

    root = a.dir or bf.tempdir()
    root.mkdir(parents=True, exist_ok=True)
    base = load_trace()
    trace = base.scaled(a.peak_rps / base.peak_rate)
    now = math.floor(time.time() / 60.0) * 60.0
    midnight = math.floor(now / 86400.0) * 86400.0
    start = midnight - a.days * 86400.0
    t0 = time.perf_counter()
    b = bf.build(
        root, trace, start_unix=start - 600, end_unix=now, trace_zero_unix=start, replicas=a.replicas, model="llama",
        params=ReplicaParams(tokens_per_s=600.0), seed=a.seed, max_cv=a.max_cv,
    )
    print(f"history: {(now - start + 600) / 3600:.1f} h, {b.samples} samples, {b.total_arrived} requests, "
          f"{a.replicas} replicas; built and backfilled in {time.perf_counter() - t0:.1f} s ({root})")
    prom = bf.HistoryPrometheus(root / "data", bf.free_port())
    try:
        prom.wait_ready()
        cfg = root / "bridge.yaml"
        cfg.write_text("pools:\n  - name: llama\n")
        exp, png = root / "exported.csv", root / "replay.png"
        cmd = ["simulate", "--prometheus", prom.url, "--config", str(cfg), "--start", f"{start:.0f}",
               "--end", f"{midnight:.0f}", "--export-trace", str(exp), "--plot", str(png)]
        print("\n$ gpu-bridge " + " ".join(cmd))
        t1 = time.perf_counter()
        r = cli(*cmd)
        print(r.stdout + r.stderr + f"({time.perf_counter() - t1:.1f} s, exit {r.returncode})")
        if r.returncode != 0:
            return 0
        rps = float(re.search(r"per-replica capacity ([\d.]+) req/s", r.stdout).group(1))  # type: ignore[union-attr]

        rec = load_trace(exp)
        errs, clock, zs = [], [], []
        for t, rate in zip(rec.starts_s, rec.rates):
            u = start + t
            real = b.arrivals_between(u, u + 600, scraped=True) / 600.0
            errs.append((rate - real) / real)
            on_clock = b.arrivals_between(u, u + 600) / 600.0
            clock.append(abs(rate - on_clock) / on_clock)
            tt = u - start + 1
            want, cv = trace.rate_at(tt), min(a.max_cv, trace.cv_at(tt))
            zs.append((rate - want) / (want * cv / math.sqrt(want * 600)))
        e, z = np.abs(np.array(errs)), np.abs(np.array(zs))
        c = np.array(clock)
        print(f"\nrecovered 10-min load, {len(errs)} windows: against what arrived between the samples at the "
              f"window's ends |error| median {100 * np.median(e):.3f} %, max {100 * e.max():.3f} %, mean error "
              f"{100 * np.mean(errs):+.4f} %;")
        print(f"  on the clock's boundaries (samples 8 s earlier, bursty traffic) median {100 * np.median(c):.2f} %, "
              f"p95 {100 * np.percentile(c, 95):.2f} %, max {100 * c.max():.2f} %")
        print(f"  against the trace (in sd of the stream's own count noise, cv/sqrt(rate x 600)): median "
              f"{np.median(z):.2f}, p95 {np.percentile(z, 95):.2f}, max {z.max():.2f}")

        csv = root / "replayed-trace.csv"
        bf.scaled_trace_csv(trace, csv, a.max_cv)
        cmd = ["simulate", "--trace", str(csv), "--config", str(cfg), "--days", str(a.days), "--nodes",
               str(a.replicas), "--replica-rps", f"{rps}", "--peak-replicas", f"{a.peak_rps / rps:.6g}",
               "--plot", str(root / "trace.png")]
        print("\n$ gpu-bridge " + " ".join(cmd))
        r = cli(*cmd)
        print(r.stdout + r.stderr + f"(exit {r.returncode})")

        cmd = ["forecast", "--prometheus", prom.url, "--config", str(cfg), "--pool-nodes", str(a.replicas),
               "--nodes", "2", "--for", "6h"]
        print("\n$ gpu-bridge " + " ".join(cmd))
        r = cli(*cmd)
        print(r.stdout + r.stderr + f"(exit {r.returncode})")
        r = cli(*cmd, "--json")
        doc = json.loads(r.stdout) if r.returncode == 0 else None
        if doc:
            print(f"(--json: {len(doc['hours'])} hours, answer: {doc['answer']!r})")
        if a.keep:
            print(f"\nPrometheus left running at {prom.url} (pid {prom.proc.pid}); data in {root}")
            return 0
    finally:
        if not a.keep:
            prom.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
