#!/usr/bin/env python3
"""Prints sandbox start-up/teardown times over N cold runs and the hold-job preemption latency.

    .venv/bin/python scripts/bench_sandbox.py [--runs 5] [--nodes 4] [--preemptions 2]

Each run: `Sandbox(...).up()` in a fresh /tmp dir (4 idle nodes, Prometheus scraped once,
vLLM simulator when available), then `down()`. Preemption: a research job (--signal=B:USR1@5)
on a node, then a hold job in the gpu-bridge partition pinned to it; prints the time to the
signal, to the requeue (GraceTime + slurmctld's periodic time-limit check) and to the hold job
running.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bridge import logs
from bridge.adapters.slurm.cli import CliSlurm
from gpu_bridge_lab.sandbox.cluster import Sandbox

SCRIPT = """#!/bin/bash
trap 'echo usr1 $(date +%s.%N) >> "$1"' USR1
echo start $SLURMD_NODENAME >> "$1"
while true; do sleep 0.1; done
"""


def job(sb: Sandbox, jid: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", sb.run_slurm(["scontrol", "-o", "show", "job", jid]).stdout))


def poll(cond, timeout: float = 90.0) -> float:  # type: ignore[no-untyped-def]
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return time.time()
        time.sleep(0.05)
    raise TimeoutError


def preemption(sb: Sandbox, work: Path, early: bool) -> tuple[float, float, float]:
    """Seconds from hold submission to: the victim's signal, its requeue, the hold running.
    ``early``: requeue the victim ourselves (CliSlurm.requeue) once its GraceTime is over, as
    the daemon does, instead of waiting for slurmctld's periodic time-limit check."""
    script = work / "job.sh"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    out = work / f"out-{time.time_ns()}"
    jid = sb.run_slurm(["sbatch", "--parsable", "-p", "preempt", "--requeue", "--gres=gpu:4", "--signal=B:USR1@5",
                        "-o", "/dev/null", str(script), str(out)]).stdout.strip()
    poll(lambda: out.exists() and "start" in out.read_text())
    node = out.read_text().split()[1]
    t0 = time.time()
    hold = sb.run_slurm(["sbatch", "--parsable", "-p", "gpu-bridge", "-w", node, "--exclusive",
                         "-J", f"gpu-bridge-hold:{node}", "-o", "/dev/null", "--wrap", "sleep 600"]).stdout.strip()
    poll(lambda: "usr1" in out.read_text())
    t_sig = float(out.read_text().split("usr1")[1].split()[0])
    if early:
        slurm = CliSlurm(env=sb.slurm_env())
        victim = poll_job(slurm, jid)
        while not victim.grace_over(time.time()):
            time.sleep(0.05)
        slurm.requeue(jid)
    t_req = poll(lambda: job(sb, jid).get("JobState") in ("PENDING", "REQUEUED"))
    t_hold = poll(lambda: job(sb, hold).get("JobState") == "RUNNING")
    sb.reset()
    return t_sig - t0, t_req - t0, t_hold - t0


def poll_job(slurm: CliSlurm, jid: str):  # type: ignore[no-untyped-def]
    t0 = time.time()
    while time.time() - t0 < 30:
        j = next((j for j in slurm.jobs() if j.job_id == jid), None)
        if j is not None and j.preempt_time:
            return j
        time.sleep(0.05)
    raise TimeoutError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--preemptions", type=int, default=2)
    args = ap.parse_args()
    logs.configure(level="warning")
    ups, downs = [], []
    for i in range(args.runs):
        d = Path(tempfile.mkdtemp(prefix="gbbench-", dir="/tmp"))
        sb = Sandbox(d, nodes=args.nodes)
        sb.up()
        ups.append(sb.startup_s or 0.0)
        if i == args.runs - 1 and args.preemptions:
            work = d / "work"
            work.mkdir()
            for early in (False, True):
                for _ in range(args.preemptions):
                    sig, req, hold = preemption(sb, work, early)
                    how = "daemon requeues at grace end" if early else "Slurm requeues by itself"
                    print(f"hold-job preemption (GraceTime {sb.grace_s} s, {how}): signal {sig:.2f} s, "
                          f"requeued {req:.2f} s, hold running {hold:.2f} s", flush=True)
        t0 = time.monotonic()
        sb.down()
        downs.append(time.monotonic() - t0)
        shutil.rmtree(d, ignore_errors=True)
        print(f"run {i + 1}: up {ups[-1]:.2f} s, down {downs[-1]:.2f} s", flush=True)
    for name, xs in (("up", ups), ("down", downs)):
        print(f"{name}: n={len(xs)} min {min(xs):.2f} s  median {statistics.median(xs):.2f} s  max {max(xs):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
