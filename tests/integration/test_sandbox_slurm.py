"""The sandbox's real Slurm: GPU jobs run, drain + requeue restarts a job elsewhere, and a hold
job in the `gpu-bridge` partition preempts (requeues, never cancels) a research job after its
GraceTime, delivering its --signal first. This validates the reclaim design (README)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge import wellknown
from gpu_bridge_lab.sandbox.cluster import Sandbox

pytestmark = pytest.mark.integration

JOB_SCRIPT = """#!/bin/bash
# appends one line per start: node restart_count cuda_devices start_time
out="$1"
trap 'echo "signal USR1 $(date +%s.%N)" >> "$out"' USR1
trap 'echo "signal TERM $(date +%s.%N)" >> "$out"; exit 143' TERM
echo "start $SLURMD_NODENAME ${SLURM_RESTART_COUNT:-0} ${CUDA_VISIBLE_DEVICES:-none} $(date +%s.%N)" >> "$out"
end=$(( $(date +%s) + ${2:-300} ))
while [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done
echo "done $SLURMD_NODENAME" >> "$out"
"""


def wait_until(check: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.1) -> object:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = check()
        if v:
            return v
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def show_job(sb: Sandbox, job_id: str) -> dict[str, str]:
    out = sb.run_slurm(["scontrol", "-o", "show", "job", job_id]).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def show_node(sb: Sandbox, node: str) -> str:
    return sb.run_slurm(["scontrol", "-o", "show", "node", node]).stdout


def submit(sb: Sandbox, *args: str) -> str:
    return sb.run_slurm(["sbatch", "--parsable", *args]).stdout.strip().split(";")[0]


@pytest.fixture
def job_files(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "job.sh"
    script.write_text(JOB_SCRIPT)
    script.chmod(0o755)
    return script, tmp_path / "job.out"


def lines(path: Path, prefix: str) -> list[list[str]]:
    if not path.exists():
        return []
    return [ln.split() for ln in path.read_text().splitlines() if ln.startswith(prefix)]


def test_four_idle_nodes_with_four_gpus_and_both_partitions(slurm_sandbox: Sandbox) -> None:
    sb = slurm_sandbox
    out = sb.run_slurm(["sinfo", "-h", "-N", "-o", "%N %T %G %P"]).stdout.split("\n")
    rows = {tuple(r.split()) for r in out if r.strip()}
    for n in ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"):
        assert (n, "idle", "gpu:4", "preempt*") in rows
        assert (n, "idle", "gpu:4", wellknown.SLURM_HOLD_PARTITION) in rows
    part = sb.run_slurm(["scontrol", "-o", "show", "partition", "preempt"]).stdout
    assert "PreemptMode=REQUEUE" in part and "GraceTime=10" in part and "PriorityTier=1 " in part
    hold = sb.run_slurm(["scontrol", "-o", "show", "partition", wellknown.SLURM_HOLD_PARTITION]).stdout
    assert "PriorityTier=100" in hold and "PreemptMode=OFF" in hold and "AllowGroups=root" in hold
    assert "OverSubscribe=EXCLUSIVE" in hold


def test_gpu_job_runs(slurm_clean: Sandbox, job_files: tuple[Path, Path]) -> None:
    sb = slurm_clean
    script, out = job_files
    jid = submit(sb, "-p", "preempt", "--requeue", "--gres=gpu:4", "-o", "/dev/null", str(script), str(out), "1")
    wait_until(lambda: lines(out, "done"), 30, "the job to finish")
    start = lines(out, "start")
    assert len(start) == 1
    _, node, restarts, cuda, _ = start[0]
    assert node.startswith("gpu-node-") and restarts == "0" and cuda == "0,1,2,3"
    wait_until(lambda: show_job(sb, jid).get("JobState") == "COMPLETED", 15, "COMPLETED")


def test_drain_and_requeue_restarts_job_on_another_node(slurm_clean: Sandbox, job_files: tuple[Path, Path]) -> None:
    sb = slurm_clean
    script, out = job_files
    jid = submit(sb, "-p", "preempt", "--requeue", "--gres=gpu:4", "-o", "/dev/null", str(script), str(out))
    first = wait_until(lambda: lines(out, "start"), 30, "the job to start")
    node = first[0][1]  # type: ignore[index]
    sb.run_slurm(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={wellknown.SLURM_REASON_PREFIX}test"])
    assert "DRAIN" in show_node(sb, node)  # running job continues: MIXED+DRAIN / ALLOCATED+DRAIN
    sb.run_slurm(["scontrol", "requeue", jid])
    wait_until(lambda: show_job(sb, jid).get("JobState") == "PENDING", 15, "PENDING after requeue")
    starts = wait_until(lambda: len(lines(out, "start")) >= 2 and lines(out, "start"), 40, "the second start")
    _, node2, restarts, _, _ = starts[1]  # type: ignore[index]
    assert node2 != node
    assert restarts == "1"
    info = show_job(sb, jid)
    assert info["JobState"] == "RUNNING" and info["Restarts"] == "1"
    assert "drained" in sb.run_slurm(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout


def test_hold_job_preempts_research_job_with_requeue_after_grace(
    slurm_clean: Sandbox, job_files: tuple[Path, Path]
) -> None:
    """The reclaim design: a hold job pinned to a busy node; Slurm sends the job's signal,
    waits GraceTime, requeues (never cancels) the job, then runs the hold job there."""
    sb = slurm_clean
    script, out = job_files
    jid = submit(sb, "-p", "preempt", "--requeue", "--gres=gpu:4", "--signal=B:USR1@5",
                 "-o", "/dev/null", str(script), str(out))
    first = wait_until(lambda: lines(out, "start"), 30, "the research job to start")
    node = first[0][1]  # type: ignore[index]
    hold_name = wellknown.SLURM_HOLD_JOB_PREFIX + node
    t_submit = time.time()
    hold = submit(sb, "-p", wellknown.SLURM_HOLD_PARTITION, "-w", node, "--exclusive", "-J", hold_name,
                  "-o", "/dev/null", "--wrap", "sleep 600")
    usr1 = wait_until(lambda: lines(out, "signal USR1"), 15, "USR1 at preemption")
    t_usr1 = float(usr1[0][2])  # type: ignore[index]
    # Slurm requeues at the end of GraceTime, noticed by slurmctld's periodic check (observed
    # 0-10 s late on 22.05): the daemon can shorten this by `scontrol requeue` at grace end.
    wait_until(lambda: show_job(sb, jid).get("JobState") in ("PENDING", "REQUEUED"), 60, "the research job requeued")
    t_requeued = time.time()
    wait_until(lambda: show_job(sb, hold).get("JobState") == "RUNNING", 30, "the hold job running")
    t_hold = time.time()
    info = show_job(sb, jid)
    assert info["Restarts"] == "1", info  # requeued, not cancelled
    assert info["JobState"] in ("PENDING", "RUNNING")
    held = show_job(sb, hold)
    assert held["NodeList"] == node and held["Partition"] == wellknown.SLURM_HOLD_PARTITION
    squeue = sb.run_slurm(["squeue", "-h", "-w", node, "-t", "R", "-o", "%j"]).stdout.split()
    assert squeue == [hold_name]  # squeue shows who holds the node
    grace = t_requeued - t_submit
    print(f"\nhold preemption: signal after {t_usr1 - t_submit:.2f} s, research job requeued after "
          f"{grace:.2f} s (GraceTime {sb.grace_s} s), hold job running after {t_hold - t_submit:.2f} s")
    assert t_usr1 - t_submit < 3.0
    assert sb.grace_s - 1 <= grace < sb.grace_s + 35
    # the research job is not lost: it restarts on another node after cred_expire
    starts = wait_until(lambda: len(lines(out, "start")) >= 2 and lines(out, "start"), 40, "the research job's restart")
    assert starts[1][1] != node and starts[1][2] == "1"  # type: ignore[index]


def test_drain_survives_slurmctld_and_slurmd_restart(slurm_clean: Sandbox) -> None:
    """Why the daemon also drains a serving node: the drain lives in slurmctld's state."""
    sb = slurm_clean
    node = "gpu-node-04"
    reason = wellknown.SLURM_REASON_PREFIX + "serving"
    sb.run_slurm(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
    sb.stop_process("slurmctld")
    sb.stop_process(f"slurmd:{node}")
    sb.ensure_daemons()
    wait_until(lambda: "Reason=" + reason in show_node(sb, node), 20, "the drain reason back")
    wait_until(lambda: sb.run_slurm(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout.strip() == "drained", 30,
               "the node drained (not idle) after the restarts")
