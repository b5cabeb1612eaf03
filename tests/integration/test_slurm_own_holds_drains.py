"""Slurm's own holds and drains on the real sandbox (issue 16, seed 203), with the daemon as
a subprocess.

After a slurmctld SIGKILL that lost a job's start, slurmctld started the job again on the node
where the first run still went on: it drained the node itself ("Duplicate jobid") and requeued
the job *held* by Slurm (22.05: state_desc "launch failed requeued held", reason JobHeldUser,
priority 0). That race could not be forced reliably here (restarting slurmctld from a state
saved before the start made slurmd re-register first: "Registered PENDING JobId=1", the orphan
killed, the job simply started again), so the two halves are produced apart, by real Slurm:

- the hold: a Prolog that fails once. Slurm's launch-failure path is the same as for the
  duplicate start: the job is requeued held ("launch failed requeued held") and the node
  drained ("Prolog error"). gpu-bridge releases the job; "Prolog error" is not one of
  ``slurm.own_drain_reasons``, so the lent node is reported (status problem, never lifted);
- the drain: ``scontrol update State=DRAIN Reason="Duplicate jobid"`` on an empty lent node,
  exactly the drain slurmctld leaves: gpu-bridge lifts it and the node is lent and usable again.

Invariants from outside all along (the Watcher): no research job next to a serving pod, Ready
serving never below min_serving; and the released job completes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import wellknown as wk
from gpu_bridge_lab.sandbox import outages as out
from gpu_bridge_lab.sandbox import reliability as rel
from gpu_bridge_lab.sandbox.e2e import poll, read_events
from gpu_bridge_lab.sandbox.serving import serving_sandbox

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROLOG = """#!/bin/sh
# fails once for the job whose flag file exists (removed on the way: the next launch succeeds)
f="{dir}/fail-$SLURM_JOB_ID"
if [ -e "$f" ]; then rm -f "$f"; exit 1; fi
exit 0
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rel.Harness]:
    h = rel.Harness(2)
    flags = h.dir / "prolog"
    flags.mkdir(parents=True)
    flags.chmod(0o755)
    prolog = flags / "prolog.sh"
    prolog.write_text(PROLOG.format(dir=flags))
    prolog.chmod(0o755)
    h.sb = serving_sandbox(h.dir / "sb", nodes=2, grace_s=rel.GRACE_S, pod_start_delay_s=rel.POD_START_S,
                           pod_grace_s=2, shutdown_timeout_s=1, vllm_extra=("--max-cv", "1.5"),
                           extra_slurm_conf=f"Prolog={prolog}\n")
    with h:
        yield h


def _node_line(h: rel.Harness, node: str) -> str:
    return h.sb.run_slurm(["scontrol", "--oneliner", "show", "node", node]).stdout


def _job(h: rel.Harness, job_id: str) -> dict | None:
    return next((j for j in h.w.jobs() if str(j["job_id"]) == job_id), None)


def _status(h: rel.Harness) -> dict[str, dict]:
    res = subprocess.run([sys.executable, "-m", "bridge", "status", "--config", str(h.config_path), "--json"],
                         capture_output=True, text=True, timeout=60, env={**__import__("os").environ, **h.sb.env})
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    rows = doc["nodes"] if isinstance(doc, dict) else doc
    return {r["node"]: r for r in rows}


def test_slurm_held_job_released_and_slurm_drain_cleared(harness: rel.Harness) -> None:
    h = harness
    out.settle(h, rel.LOW)
    lent = [n for n, v in h.owners().items() if v == "lent"]
    assert len(lent) == 1, h.owners()
    node = lent[0]
    d = h.daemon("repairs")

    # 1. the hold: a job whose launch fails once on the lent node
    progress = h.job_dir / "runs-held"
    job = h.sb.run_slurm([
        "sbatch", "--parsable", "--hold", "-p", wk.SLURM_PREEMPT_PARTITION, "--requeue", "--gres=gpu:4",
        "-J", "research-held", "-o", str(h.job_dir / "job-held-%j.out"),
        "--wrap", f"echo start $SLURM_RESTART_COUNT >> {progress}; sleep 3; echo done >> {progress}",
    ]).stdout.strip().split(";")[0]
    (h.dir / "prolog" / f"fail-{job}").write_text("")
    h.sb.run_slurm(["scontrol", "release", job])  # the user's own hold (--hold), lifted by the user
    # Slurm: launch failed -> the node drained "Prolog error", the job requeued held by Slurm
    poll(lambda: "Prolog error" in _node_line(h, node), 60, 0.5)
    # gpu-bridge: released (its failed run is gone) -> it waits for a usable node again
    released = poll(lambda: [e for e in read_events(d.log_path, "slurm_job_released") if e.get("job") == job], 60, 0.5)
    assert released, "the daemon never released the job Slurm held"
    j = _job(h, job)
    assert j is not None and j["priority"] != 0 and "held" not in str(j.get("state_description") or ""), j
    # "Prolog error" is not Slurm's to clear for us: the lent node is reported, never lifted
    row = _status(h)[node]
    assert row["phase"] == "lent" and "drained in Slurm by someone else" in (row["problem"] or ""), row
    assert "Prolog error" in _node_line(h, node)
    # the operator looks, fixes the node and resumes it: the job runs and completes
    h.sb.run_slurm(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
    poll(lambda: progress.exists() and "done" in progress.read_text(), 90, 0.5)

    # 2. the drain slurmctld leaves after a duplicate start, on the now empty lent node
    poll(lambda: _job(h, job) is None and "State=IDLE" in _node_line(h, node), 60, 0.5)
    h.sb.run_slurm(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=Duplicate jobid"])
    lifted = poll(lambda: "DRAIN" not in _node_line(h, node).split("State=")[1].split()[0], 60, 0.5)
    assert lifted, f"the drain stays: {_node_line(h, node)}"
    # the daemon logs the step once the pass's records are in (after scontrol returned): slurmctld
    # may show the node undrained a moment before the log line is written
    steps = poll(lambda: [e for e in read_events(d.log_path, "node_step")
                          if e.get("step") == "clear_slurm_drain" and e.get("changed") and e.get("node") == node], 15, 0.25)
    assert steps, "the drain was not lifted by gpu-bridge"
    poll(lambda: h.owners().get(node) == "lent", 30, 0.5)
    d.stop()
    assert h.watcher is not None and h.watcher.violations == [], h.watcher.violations[:5]
    assert h.lost_jobs() == []
