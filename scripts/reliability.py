#!/usr/bin/env python3
"""Print gpu-bridge's reliability figures, measured on the real sandbox (docs/reliability.md).

    .venv/bin/python scripts/reliability.py            # everything (~45-50 min on 2 cores)
    .venv/bin/python scripts/reliability.py --only crash --points fence,drain
    .venv/bin/python scripts/reliability.py --warm      # the crash matrix of warm lending only
    .venv/bin/python scripts/reliability.py --warm-fallback   # warm lending's cold-fallback rows only
    .venv/bin/python scripts/reliability.py --fast-tier --warm --points set_tier,wake_replica

1. the crash matrix: SIGKILL at every write of bootstrap, lending and reclaiming, restart,
   time to converge, invariant violations, research jobs lost; its warm variant (`--warm`,
   `--only crash-warm`: a pool lending warm, every write of the warm path) and its fast-tier
   variant (`--fast-tier`, `--only crash-fast`: the lend's partition write, set_tier), each
   on a sandbox of its own; a row whose point was never written fails (except the points
   that happen only in some runs: requeue_jobs, evict_pod); and the warm cold fallback's rows
   (`--warm-fallback`, `--only crash-warm-fallback`: sleep_replica, mem_hold_lost, check_asleep,
   warm_lost, mark_pod (the fallback pod marked for the scale), gpu_held (the free-GPU check's give-up, the
   lab's fake dcgm-exporter scraped), wake_replica, each after its failure is caused for real, check_asleep
   three ways; a row fails too if the fallback did not happen for that failure's own reason);
2. the outage table: Prometheus down / stale, Kubernetes API 500/429/timeouts/refused,
   slurmctld down, a lent node's slurmd dying, a pod that never becomes Ready, a PDB that
   blocks eviction: what the daemon did, logged and exported, and that nothing was lost;
3. the two-instance run: only the Lease holder writes; after a SIGKILL the standby takes over
   within the lease duration and finishes the half-done transition;
4. scripts/bench_scale.py (another engineer's) if it exists, last.
Exit status 1 if any invariant did not hold.

Soak mode (lab/gpu_bridge_lab/sandbox/soak.py): random load flips and faults from a seed, research jobs in
flight, invariants checked every second through the real CLIs; prints the seed, every fault
and every violation with its evidence; exit status 1 on any violation:

    .venv/bin/python scripts/reliability.py --soak --seed 7 --duration 120
    .venv/bin/python scripts/reliability.py --soak --seed 1,2,3,4,5,6 --duration 1200   # 2 h
"""

from __future__ import annotations

import argparse
import os
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


# the crash matrix' variants: --only part -> (warm, fast_tier) of its Harness
CRASH_VARIANTS = {"crash": (False, False), "crash-warm": (True, False), "crash-fast": (False, True),
                  "crash-warm-fallback": (True, False)}
FALLBACK_VARIANT = "crash-warm-fallback"  # rel.fallback_matrix: each row causes its failure first


def variant_rows(variant: str) -> tuple[tuple[str, str], ...]:
    if variant == FALLBACK_VARIANT:
        return rel.WARM_FALLBACK_ROWS
    warm, fast_tier = CRASH_VARIANTS[variant]
    return rel.matrix_rows(warm=warm, fast_tier=fast_tier)


def variant_names(variant: str) -> set[str]:
    """What ``--points`` may name for a variant: its points (and the warm fallback's failures)."""
    names = {p for _, p in variant_rows(variant)}
    if variant == FALLBACK_VARIANT:
        names |= {f for _, _, f in rel.fallback_rows()}
    return names


def crash(points: list[str] | None, variant: str = "crash") -> tuple[list[rel.Row], bool]:
    warm, fast_tier = CRASH_VARIANTS[variant]
    # the fallback's rows with the free-GPU check before a wake on (the gpu_held row needs it)
    with rel.Harness(3, warm=warm, fast_tier=fast_tier, gpu_check=variant == FALLBACK_VARIANT) as h:
        if variant == FALLBACK_VARIANT:
            rows = rel.fallback_matrix(h, points=points, log=say)
        elif points:
            whole = rel.default_rows(h)
            rows = rel.crash_matrix(
                h, bootstrap=[p for p in points if p in rel.rows_of(whole, "bootstrap")],
                lend=[p for p in points if p in rel.rows_of(whole, "lend")],
                reclaim=[p for p in points if p in rel.rows_of(whole, "reclaim")], log=say)
        else:
            rows = rel.crash_matrix(h, log=say)
    return rows, all(r.ok for r in rows)


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


def soak_args_problem(args: argparse.Namespace) -> str:
    """What is wrong with the soak's arguments ("" if nothing), before anything starts."""
    try:
        seeds = [int(x) for x in str(args.seed).split(",") if x.strip()]
    except ValueError:
        return f"--seed: expected an integer or a comma list of integers, got {args.seed!r}"
    if not seeds:
        return f"--seed: expected an integer or a comma list of integers, got {args.seed!r}"
    if args.duration <= 0:
        return f"--duration: must be > 0 seconds, got {args.duration:g}"
    from gpu_bridge_lab.sandbox.soak import FAULTS

    faults = soak_faults(args)
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or not faults:
        return (f"--faults: {'no such soak fault ' + ', '.join(unknown) if unknown else 'no fault named'} "
                f"(the soak's: {', '.join(FAULTS)}); got {args.faults!r}")
    return ""


def soak_faults(args: argparse.Namespace) -> tuple[str, ...]:
    """The soak's fault kinds from ``--faults`` (every kind when it is not given)."""
    from gpu_bridge_lab.sandbox.soak import FAULTS

    return tuple(x.strip() for x in args.faults.split(",") if x.strip()) if args.faults else FAULTS


def soak(args: argparse.Namespace) -> int:
    from gpu_bridge_lab.sandbox.soak import Soak, SoakConfig

    seeds = [int(x) for x in str(args.seed).split(",") if x.strip()]
    results = []
    for seed in seeds:
        r = Soak(SoakConfig(seed=seed, duration_s=args.duration, faults=soak_faults(args)), log=say, keep_dir=Path(args.keep)).run()
        results.append(r)
        say(r.summary())
        for v in r.violations:
            say(f"  {v}")
        for twice in r.slurm_double_starts:
            say(f"  started twice by slurmctld after its SIGKILL (Slurm's, not gpu-bridge's): {twice}")
        for lost in r.lost_by_slurmctld:
            say(f"  lost by slurmctld's SIGKILL before it saved the submission (Slurm's, not gpu-bridge's): {lost}")
        for failed in r.failed_by_slurmctld:
            say(f"  failed by slurmctld after its SIGKILL lost the run's start (Slurm's, not gpu-bridge's): {failed}")
    total = sum(r.duration_s for r in results)
    bad = sum(len(r.violations) for r in results)
    say(f"soak total: {len(results)} seed(s) {','.join(str(r.seed) for r in results)}, {total / 60:.1f} min of faults, "
        f"{sum(len(r.faults) for r in results)} faults, {sum(r.jobs for r in results)} jobs "
        f"({sum(r.completed for r in results)} completed, {sum(r.requeues for r in results)} requeues, "
        f"{sum(len(r.lost_by_slurmctld) for r in results)} lost and "
        f"{sum(len(r.failed_by_slurmctld) for r in results)} failed by slurmctld after its SIGKILLs), "
        f"violations: {bad}")
    return 0 if bad == 0 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None,
                    help="comma list of crash,crash-warm,crash-fast,crash-warm-fallback,outages,two,scale (default: all; "
                         "with --warm, --fast-tier or --warm-fallback only those)")
    ap.add_argument("--warm", action="store_true", help="the crash matrix of a pool lending warm (= --only crash-warm)")
    ap.add_argument("--fast-tier", action="store_true", help="the crash matrix with the fast tier (= --only crash-fast)")
    ap.add_argument("--warm-fallback", action="store_true",
                    help="warm lending's cold-fallback rows (= --only crash-warm-fallback)")
    ap.add_argument("--points", default="", help="crash: only these injection points (comma list; --warm-fallback: "
                    "or these failures, e.g. wake_hangs,unreachable)")
    ap.add_argument("--faults", default="", help="outages: only these (prometheus,stale,kube-500,...,slurmctld,slurmd,pdb,notready); "
                         "soak: draw only these (daemon_kill,...,apiserver_pause,etcd_pause,slurmd_kill,slurmctld_pause)")
    ap.add_argument("--soak", action="store_true", help="the randomized soak instead of the tables")
    ap.add_argument("--seed", default="1", help="soak: seed, or a comma list of seeds run one after another")
    ap.add_argument("--duration", type=float, default=120.0, help="soak: seconds of faults per seed")
    ap.add_argument("--keep", default="/tmp/gpu-bridge-soak", help="soak: where a failed run's logs are copied")
    args = ap.parse_args(argv)
    if args.soak:
        problem = soak_args_problem(args)
        if problem:
            say(problem)
            return 2
    # the sandbox starts its own processes (the vLLM simulator, ...) in its own directory: a
    # relative PYTHONPATH (`.:lab`) would give them another checkout's code (the venv's install)
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = os.pathsep.join(str(Path(x).resolve()) for x in os.environ["PYTHONPATH"].split(os.pathsep) if x)
    logs.configure(json=True, level="error")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups (sandbox down)
    if args.soak:
        return soak(args)
    chosen = {"crash-warm"} if args.warm else set()
    chosen |= {"crash-fast"} if args.fast_tier else set()
    chosen |= {FALLBACK_VARIANT} if args.warm_fallback else set()
    if args.only is not None:
        parts = set(args.only.split(",")) | chosen
    else:
        parts = chosen or {"crash", "crash-warm", "crash-fast", FALLBACK_VARIANT, "outages", "two", "scale"}
    unknown = parts - {*CRASH_VARIANTS, "outages", "two", "scale"}
    if unknown:
        say(f"--only: unknown part(s) {', '.join(sorted(unknown))}")
        return 2
    t_start = time.monotonic()
    ok = True
    titles = {"crash": "", "crash-warm": " -- warm lending", "crash-fast": " -- the fast tier",
              FALLBACK_VARIANT: " -- warm lending's cold fallback (each failure caused first)"}
    points = [p for p in args.points.split(",") if p]
    for variant in (v for v in CRASH_VARIANTS if v in parts):
        if points and not set(points) & variant_names(variant):
            say(f"({variant}: none of --points {args.points} is one of its rows: skipped)")
            continue
        t0 = time.monotonic()
        say(f"== 1. crash at every step (SIGKILL right after the write, restart, converge){titles[variant]} ==")
        say(rel.HEADER)
        rows, good = crash(points or None, variant)
        say("\n" + rel.format_matrix(rows))
        for fr in rows:  # the warm fallback's rows: what the watcher saw of the failure itself
            if fr.fault_window:
                say(f"  {fr.point}{f' ({fr.failure})' if fr.failure else ''}: the failure's own {len(fr.fault_window)} watcher samples, first [{fr.fault_window[0]}]"
                    + (f", last [{fr.fault_window[-1]}]" if len(fr.fault_window) > 1 else ""))
        unreached = [r.point for r in rows if r.must_crash and not r.crashed]
        say(f"crash matrix{titles[variant]}: {len(rows)} rows, {sum(r.crashed for r in rows)} crashes injected, "
            f"all converged: {all(r.converged for r in rows)}, violations: {sum(len(r.violations) for r in rows)}, "
            f"jobs lost: {max((r.jobs_lost for r in rows), default=0)}"
            + (f", NEVER WRITTEN: {', '.join(unreached)}" if unreached else "")
            + (f", fell back: {sum(bool(r.fell_back) for r in fb)} of {len(fb)}, the failures' own watcher samples: "
               f"{sum(len(r.fault_window) for r in fb)}" if (fb := [r for r in rows if r.fell_back is not None]) else "")
            + f"  ({time.monotonic() - t0:.0f} s)\n")
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
