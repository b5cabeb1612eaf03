"""Warm lending's memory hold (docs/warm-lending.md) on a real slurmctld (Slurm 22.05): with
memory a consumable resource (CR_Core_Memory), a job in a dedicated never-preempted partition
that asks for the sleeping weights' memory keeps it from research jobs on that node.

Shown: the hold submitted while the node is drained is the first job it takes when resumed; a
research job asking for more than RealMemory - hold stays PENDING (Resources), one within it
runs beside the hold; a job without --mem is given the whole node's memory, so it cannot run
beside the hold (hence DefMemPerCPU on `preempt`); a hold submitted to a node whose research
job leaves too little memory preempts that job with REQUEUE (never cancels it); and while a
memory hold runs, the serving hold (the whole node, same tier) neither starts nor preempts the
research jobs for it, so a reclaim cancels the memory hold right after submitting the serving
hold, not once the research jobs are gone (bridge/lifecycle.py). Only Slurm's commands: the
daemon's use of them is tests/integration/test_e2e_warm.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import pytest

from sandbox_fixtures import SlurmOnly, slurm_only

REAL_MEMORY_MB = 16000
HOLD_MB = 12000  # the sleeping weights (scaled down to the sandbox node) + margin
WARM = "gpu-bridge-warm"
NODE = "gpu-node-01"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmOnly]:
    extra = "\n".join([
        "SelectTypeParameters=CR_Core_Memory",  # replaces the sandbox's CR_Core (the last line wins)
        f"PartitionName={WARM} Nodes={NODE} PriorityTier=100 PreemptMode=OFF OverSubscribe=NO MaxTime=INFINITE State=UP",
    ])
    with slurm_only(nodes=1, grace_s=3, real_memory_mb=REAL_MEMORY_MB, extra_slurm_conf=extra) as c:
        yield c


def _wait(cond: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout_s} s")


def _submit(c: SlurmOnly, *args: str, user: str | None = None) -> str:
    r = c.run(["sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", "exec sleep 300"], user=user)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _hold(c: SlurmOnly) -> str:
    return _submit(c, "-p", WARM, "-J", f"gpu-bridge-warm:{NODE}", "-w", NODE, "-c", "1", f"--mem={HOLD_MB}")


def _state(c: SlurmOnly, job: str) -> tuple[str, str]:
    got = c.job(job)
    return got.get("JobState", ""), got.get("Reason", "")


def _clean(c: SlurmOnly) -> None:
    c.run(["scancel", "--user=root"])
    c.run(["scancel", "--user=nobody"])
    _wait(lambda: not c.run(["squeue", "-h", "-o", "%i"]).stdout.split(), 30)


def test_the_hold_keeps_its_memory_from_research_jobs(cluster: SlurmOnly) -> None:
    _clean(cluster)
    conf = cluster.run(["scontrol", "show", "config"]).stdout
    assert re.search(r"SelectTypeParameters\s+= CR_CORE_MEMORY", conf, flags=re.I), "memory is not consumable"
    # lend warm: the hold is queued while the node is still drained, then the drain is lifted
    assert cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=gpu-bridge: serving"]).returncode == 0
    small = _submit(cluster, "-p", "preempt", "-c", "1", "--mem=3000", user="nobody")
    hold = _hold(cluster)
    time.sleep(1.0)
    assert cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"]).returncode == 0
    _wait(lambda: _state(cluster, hold)[0] == "RUNNING" and _state(cluster, small)[0] == "RUNNING", 30)
    node = dict(re.findall(r"(\w+)=(\S*)", cluster.run(["scontrol", "-o", "show", "node", NODE]).stdout))
    assert int(node["AllocMem"]) == HOLD_MB + 3000

    big = _submit(cluster, "-p", "preempt", "-c", "1", f"--mem={REAL_MEMORY_MB - HOLD_MB - 3000 + 1}", user="nobody")
    nomem = _submit(cluster, "-p", "preempt", "-c", "1", user="nobody")  # no --mem: the whole node's memory
    fits = _submit(cluster, "-p", "preempt", "-c", "1", f"--mem={REAL_MEMORY_MB - HOLD_MB - 3000}", user="nobody")
    _wait(lambda: _state(cluster, fits)[0] == "RUNNING", 30)
    time.sleep(3.0)  # a few scheduler passes (sched_interval=2)
    # `fits` (1 MB less than `big`, submitted after it) runs: memory, not the queue, holds the others
    for job in (big, nomem):
        state, reason = _state(cluster, job)
        assert state == "PENDING" and reason in ("Resources", "Priority"), (job, state, reason)
    assert _state(cluster, hold)[0] == "RUNNING"
    _clean(cluster)


def test_a_hold_preempts_a_research_job_that_leaves_too_little_memory(cluster: SlurmOnly) -> None:
    _clean(cluster)
    research = _submit(cluster, "-p", "preempt", "-c", "1", f"--mem={REAL_MEMORY_MB - HOLD_MB + 1000}", user="nobody")
    _wait(lambda: _state(cluster, research)[0] == "RUNNING", 30)
    hold = _hold(cluster)
    _wait(lambda: _state(cluster, hold)[0] == "RUNNING", 30)  # grace 3 s, then Slurm's own requeue
    got = cluster.job(research)
    assert got["Restarts"] == "1" and got["JobState"] == "PENDING", got  # requeued, not cancelled
    _clean(cluster)


def test_the_serving_hold_preempts_nothing_while_the_memory_hold_runs(cluster: SlurmOnly) -> None:
    _clean(cluster)
    mem = _hold(cluster)
    research = _submit(cluster, "-p", "preempt", "-c", "1", "--mem=3000", user="nobody")
    _wait(lambda: _state(cluster, mem)[0] == "RUNNING" and _state(cluster, research)[0] == "RUNNING", 30)
    serving = _submit(cluster, "-p", "gpu-bridge", "-J", f"gpu-bridge-hold:{NODE}", "-w", NODE, "--exclusive")
    time.sleep(8.0)  # grace 3 s, several scheduler passes (sched_interval=2)
    assert _state(cluster, serving) == ("PENDING", "Resources"), _state(cluster, serving)
    got = cluster.job(research)
    assert got["JobState"] == "RUNNING" and got["Restarts"] == "0" and got.get("PreemptTime", "None") == "None", got
    assert cluster.run(["scancel", mem]).returncode == 0  # what the daemon does right after submitting it
    _wait(lambda: _state(cluster, serving)[0] == "RUNNING", 30)  # the research job's grace, then Slurm's requeue
    got = cluster.job(research)
    assert got["Restarts"] == "1" and got["JobState"] == "PENDING", got  # requeued, not cancelled
    _clean(cluster)
