#!/usr/bin/env python3
"""Print gpu-bridge's reliability figures, measured on the real sandbox (docs/reliability.md).

    .venv/bin/python scripts/reliability.py            # everything (~20-25 min on 2 cores)
    .venv/bin/python scripts/reliability.py --only crash --points fence,drain

1. the crash matrix: SIGKILL at every write of bootstrap, lending and reclaiming, restart,
   time to converge, invariant violations, research jobs lost;
2. the outage table: Prometheus down / stale, Kubernetes API 500/429/timeouts/refused,
   slurmctld down, a lent node's slurmd dying, a pod that never becomes Ready, a PDB that
   blocks eviction: what the daemon did, logged and exported, and that nothing was lost;
3. the two-instance run: only the Lease holder writes; after a SIGKILL the standby takes over
   within the lease duration and finishes the half-done transition;
4. scripts/bench_scale.py (another engineer's) if it exists, last.
Exit status 1 if any invariant did not hold.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bridge import logs  # noqa: E402
from gpu_bridge_lab.sandbox import outages as out  # noqa: E402
from gpu_bridge_lab.sandbox import reliability as rel  # noqa: E402


def say(text: str) -> None:
    print(text, flush=True)


def crash(points: list[str] | None) -> tuple[list[rel.Row], bool]:
    with rel.Harness(3) as h:
        if points:
            rows = rel.crash_matrix(
                h, bootstrap=[p for p in points if p in rel.BOOTSTRAP_POINTS],
                lend=[p for p in points if p in rel.LEND_POINTS], reclaim=[p for p in points if p in rel.RECLAIM_POINTS],
                log=say)
        else:
            rows = rel.crash_matrix(h, log=say)
    ok = all(r.converged and not r.violations and not r.jobs_lost for r in rows)
    return rows, ok


def outage_table(only: list[str] | None) -> tuple[list[out.OutageRow], bool]:
    rows: list[out.OutageRow] = []
    with rel.Harness(3) as h:
        out.settle(h, rel.HIGH)
        # Prometheus last: after a Prometheus restart the series of a pod deleted during the
        # outage linger (no staleness marker) for the 5 min lookback and block lending.
        plan: list[tuple[str, Any]] = [
            *[(f"kube-{m}", (lambda m=m, w=w: out.kube_api(h, m, w)))
              for m in ("500", "429", "hang", "refuse") for w in ("mid-lend", "mid-reclaim")],
            ("slurmctld", lambda: out.slurmctld_down(h, "mid-lend")),
            ("slurmctld", lambda: out.slurmctld_down(h, "mid-reclaim")),
            ("slurmd", lambda: (out.settle(h, rel.LOW), out.slurmd_dies_on_lent(h))[1]),
            ("pdb", lambda: (out.settle(h, rel.HIGH), out.pdb_blocks_eviction(h))[1]),
            ("notready", lambda: (out.settle(h, rel.LOW), out.pod_never_ready(h, hold_s=135))[1]),
            ("prometheus", lambda: out.prometheus_down(h, "mid-reclaim")),
            ("stale", lambda: out.signals_stale(h, "mid-lend")),
            ("prometheus", lambda: out.prometheus_down(h, "mid-lend")),
        ]
        for key, run in plan:
            if only and not any(key.startswith(o) for o in only):
                continue
            t0 = time.monotonic()
            row = run()
            rows.append(row)
            say(out.format_outages([row]) + f"   ({time.monotonic() - t0:.0f} s)")
    ok = all(r.recovered and not r.violations and not r.jobs_lost for r in rows
             if "never Ready" not in r.fault and "PDB" not in r.fault)
    return rows, ok


def two() -> tuple[rel.TwoInstanceResult, bool]:
    with rel.Harness(3) as h:
        out.settle(h, rel.HIGH)
        r = rel.two_instances(h)
    ok = (r.takeover_s is not None and r.takeover_s <= r.lease_duration_s + 3 and r.finished
          and r.standby_writes_before_takeover == 0 and not r.violations and not r.jobs_lost)
    return r, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="crash,outages,two,scale", help="comma list of crash,outages,two,scale")
    ap.add_argument("--points", default="", help="crash: only these injection points (comma list)")
    ap.add_argument("--faults", default="", help="outages: only these (prometheus,stale,kube-500,...,slurmctld,slurmd,pdb,notready)")
    args = ap.parse_args(argv)
    logs.configure(json=True, level="error")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups (sandbox down)
    parts = set(args.only.split(","))
    t_start = time.monotonic()
    ok = True
    if "crash" in parts:
        t0 = time.monotonic()
        say("== 1. crash at every step (SIGKILL right after the write, restart, converge) ==")
        say(rel.HEADER)
        rows, good = crash([p for p in args.points.split(",") if p] or None)
        say("\n" + rel.format_matrix(rows))
        say(f"crash matrix: {len(rows)} rows, {sum(r.crashed for r in rows)} crashes injected, "
            f"all converged: {all(r.converged for r in rows)}, violations: {sum(len(r.violations) for r in rows)}, "
            f"jobs lost: {max((r.jobs_lost for r in rows), default=0)}  ({time.monotonic() - t0:.0f} s)\n")
        ok &= good
    if "outages" in parts:
        t0 = time.monotonic()
        say("== 2. outages and faults ==")
        orows, good = outage_table([f for f in args.faults.split(",") if f] or None)
        say("\n" + out.format_outages(orows) + f"\n({time.monotonic() - t0:.0f} s)\n")
        ok &= good
    if "two" in parts:
        t0 = time.monotonic()
        say("== 3. two instances against the same clusters ==")
        r, good = two()
        say(rel.format_two_instances(r) + f"\n({time.monotonic() - t0:.0f} s)\n")
        ok &= good
    bench = ROOT / "scripts" / "bench_scale.py"
    if "scale" in parts and bench.exists():
        say("== 4. scale (scripts/bench_scale.py) ==")
        res = subprocess.run([sys.executable, str(bench)], timeout=3600, check=False)
        ok &= res.returncode == 0
    say(f"reliability: {'ALL INVARIANTS HELD' if ok else 'SOME INVARIANT FAILED'} (total {time.monotonic() - t_start:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
