"""A preempted job that exits on its own around the end of its GraceTime is never lost.

On the sandbox's real slurmctld/slurmd, with no gpu-bridge daemon running (the worst case: no one
but Slurm can requeue): research jobs on one node are preempted by a hold job (exactly how
gpu-bridge reclaims a node). Each job reads its own preemption end time (EndTime = PreemptTime +
GraceTime) from ``scontrol show job`` when the signal arrives and exits at a chosen offset from it:

- ``finish``: its work is done, it exits 0 (2 s before, 0.5 s after and 3 s after the deadline);
- ``save``: it saved its work on the signal and exits with ``SLURM_REQUEUE_EXIT`` (before and
  after the deadline), and resumes from what it saved when it runs again.

Without OverTimeLimit slurmctld marks a job exiting 0 after its shortened end time TIMEOUT,
and without RequeueExit a job exiting after saving FAILED; with both every job ends COMPLETED, a saving job after exactly one requeue, its work done exactly once. A second scenario
SIGKILLs slurmctld right after the preemption and restarts it after every job has exited past
its deadline: slurmd delivers the exits to the restarted controller, with the same outcome.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bridge import wellknown as wk
from gpu_bridge_lab.sandbox.cluster import Sandbox
from gpu_bridge_lab.sandbox.cluster import slurm as sandbox_slurm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NODE = "gpu-node-01"
BAD_STATES = {"TIMEOUT", "FAILED", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}

# A job that takes the signal, reads its EndTime, and exits at EndTime + OFFSET. On a restart it
# resumes: a "save" job finds its saved marker and finishes the rest of its work.
JOB = r"""#!/bin/bash
mode=$1; offset=$2; out=$3; grace=$4
got=0
trap 'got=1' URG
echo "run ${SLURM_RESTART_COUNT:-0} start" >> "$out"
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
    if grep -q '^done$' "$out"; then exit 0; fi  # a requeue raced the exit of a finished run
    if grep -q '^saved$' "$out"; then echo "resumed" >> "$out"; fi
    echo "work-2" >> "$out"  # the work not saved (Slurm ended the run at its grace): done again
    echo "done" >> "$out"
    exit 0
fi
echo "work-1" >> "$out"
while [ $got = 0 ]; do sleep 0.05; done
end_s=""; err=""
for try in $(seq 50); do  # a busy slurmctld may time out: ask again
    info=$(scontrol -o show job "$SLURM_JOB_ID" 2>&1)
    end=$(printf '%s\n' "$info" | sed -n 's/.* EndTime=\([^ ]*\) .*/\1/p')
    [ -n "$end" ] && end_s=$(date -d "$end" +%s 2>/dev/null) && [ -n "$end_s" ] && break
    # EndTime reads "Unknown" for a job without a time limit while it is in the future (seen
    # under load): the deadline is then PreemptTime + the partition's GraceTime
    pre=$(printf '%s\n' "$info" | sed -n 's/.* PreemptTime=\([^ ]*\) .*/\1/p')
    [ -n "$pre" ] && pre_s=$(date -d "$pre" +%s 2>/dev/null) && [ -n "$pre_s" ] && end_s=$((pre_s + grace)) && break
    err=$(printf '%s' "$info" | tr '\n' ' ' | cut -c1-3000)
    sleep 0.1
done
echo "signal $(date +%s.%N) endtime $end_s" >> "$out"
[ -n "$end_s" ] || echo "no-endtime $err" >> "$out"  # the evidence says why
now=$(date +%s.%N)
delay=$(awk -v e="$end_s" -v o="$offset" -v n="$now" 'BEGIN { d = e + o - n; printf "%.3f", (d > 0 ? d : 0) }')
sleep "$delay"
echo "exit $(date +%s.%N)" >> "$out"
if [ "$mode" = finish ]; then
    echo "work-2" >> "$out"; echo "done" >> "$out"; exit 0
fi
echo "saved" >> "$out"
exit "$REQUEUE_EXIT"
"""

CASES = {  # name: (mode, offset from EndTime in seconds)
    "finish_before": ("finish", -2.0),
    "finish_at": ("finish", 0.5),
    "finish_after": ("finish", 3.0),
    "save_before": ("save", -2.0),
    "save_after": ("save", 3.0),
}


@dataclass
class Outcome:
    job_id: str
    out: Path
    states: list[str] = field(default_factory=list)  # every distinct state seen, in order
    restarts: int = 0

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def evidence(self) -> str:
        return f"job {self.job_id}: states {self.states}, restarts {self.restarts}, output {self.lines()}"


def _job_fields(sb: Sandbox, job_id: str) -> dict[str, str]:
    res = sb.run_slurm(["scontrol", "-o", "show", "job", job_id], check=False)
    return dict(re.findall(r"(\w+)=(\S*)", res.stdout)) if res.returncode == 0 else {}


def _run(sb: Sandbox, work: Path, *, kill_ctld: bool) -> dict[str, Outcome]:
    script = work / "job.sh"
    script.write_text(JOB)
    script.chmod(0o755)
    outcomes: dict[str, Outcome] = {}
    for name, (mode, offset) in CASES.items():
        out = work / f"{name}.out"
        res = sb.run_slurm([
            "sbatch", "--parsable", "-p", wk.SLURM_PREEMPT_PARTITION, "-w", NODE, "-n1", "-c1", "--requeue", "--time=30",
            "--signal=B:URG@10", "-J", name, "-o", str(work / f"{name}.log"),
            f"--export=ALL,REQUEUE_EXIT={wk.SLURM_REQUEUE_EXIT}", str(script), mode, str(offset), str(out), str(sb.grace_s),
        ])
        outcomes[name] = Outcome(res.stdout.strip().split(";")[0], out)
    deadline = time.monotonic() + 30
    while not all(o.out.exists() and "work-1" in o.lines() for o in outcomes.values()):
        assert time.monotonic() < deadline, [o.evidence() for o in outcomes.values()]
        time.sleep(0.2)
    hold = sb.run_slurm([
        "sbatch", "--parsable", "-p", wk.SLURM_HOLD_PARTITION, "-w", NODE, "--exclusive",
        "-J", wk.SLURM_HOLD_JOB_PREFIX + NODE, "-o", "/dev/null", "--wrap", "sleep 600",
    ]).stdout.strip().split(";")[0]

    def observe() -> None:
        for o in outcomes.values():
            f = _job_fields(sb, o.job_id)
            st = f.get("JobState", "")
            if st and (not o.states or o.states[-1] != st):
                o.states.append(st)
            if f.get("Restarts"):
                o.restarts = int(f["Restarts"])

    def exited(o: Outcome) -> bool:
        return any(line.startswith("exit ") for line in o.lines())

    if kill_ctld:
        # preempted (every job got its signal): the controller dies and misses every exit
        deadline = time.monotonic() + 30
        while not all(any(x.startswith("signal") for x in o.lines()) for o in outcomes.values()):
            assert time.monotonic() < deadline, [o.evidence() for o in outcomes.values()]
            time.sleep(0.1)
        # a controller's SIGKILL loses its last seconds of unsaved state (jobs, the preemption):
        # it dies once the preemption is on disk, before the jobs' exits. A job update after
        # the preemption makes slurmctld save within its 5 s cadence.
        since = time.time()
        sb.run_slurm(["scontrol", "update", f"JobId={hold}", "Comment=preempted-saved"])
        sb.wait_job_state_saved(since)
        sb.kill_process("slurmctld")
        deadline = time.monotonic() + 40
        while not all(exited(o) for o in outcomes.values()):
            assert time.monotonic() < deadline, [o.evidence() for o in outcomes.values()]
            time.sleep(0.2)
        time.sleep(2.0)
        sb.ensure_daemons()  # restarts slurmctld from its saved state
    deadline = time.monotonic() + 60
    while True:
        observe()
        savers_requeued = all(
            o.restarts >= 1 for n, o in outcomes.items() if CASES[n][0] == "save")
        finishers_done = all(o.states and o.states[-1] in BAD_STATES | {"COMPLETED"}
                             for n, o in outcomes.items() if CASES[n][0] == "finish")
        if (savers_requeued and finishers_done) or time.monotonic() > deadline:
            break  # (on a timeout the tests below say which job went wrong, with its evidence)
        time.sleep(0.2)
    # the node is given back: the requeued jobs run there again and finish
    sb.run_slurm(["scancel", hold], check=False)
    deadline = time.monotonic() + 90
    while not all(o.states and o.states[-1] in BAD_STATES | {"COMPLETED"} for o in outcomes.values()):
        if time.monotonic() > deadline:
            break
        observe()
        time.sleep(0.2)
    return outcomes


@pytest.fixture(scope="module")
def grace_run(slurm_sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    assert slurm_sandbox.grace_s == 10
    work = tmp_path_factory.mktemp("grace")
    work.chmod(0o755)
    try:
        yield _run(slurm_sandbox, work, kill_ctld=False)
    finally:
        slurm_sandbox.reset()


@pytest.fixture(scope="module")
def grace_run_ctld_restart(slurm_sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    work = tmp_path_factory.mktemp("grace-ctld")
    work.chmod(0o755)
    try:
        yield _run(slurm_sandbox, work, kill_ctld=True)
    finally:
        slurm_sandbox.reset()


def _check(o: Outcome, mode: str) -> None:
    bad = [s for s in o.states if s in BAD_STATES]
    assert not bad, f"ended {bad}: {o.evidence()}"
    assert o.states and o.states[-1] == "COMPLETED", o.evidence()
    lines = o.lines()
    assert lines.count("done") == 1 and lines.count("work-1") == 1 and lines.count("work-2") == 1, o.evidence()
    if not any(x.startswith("exit ") for x in lines):
        # Slurm ended the run at its grace before the job's own exit (22.05 ends a grace on a
        # 30 s sweep, so an exit a few seconds after the deadline may or may not come first):
        # then it was requeued, never lost, and the next run did the work exactly once
        assert o.restarts == 1 and "saved" not in lines and lines.index("work-2") > lines.index("run 1 start"), o.evidence()
    elif mode == "finish":
        # a job that finished its own work is COMPLETED by that run (a requeue that raced its
        # exit may run it once more: it then finds its work done and exits)
        assert lines.index("work-2") < next(i for i, x in enumerate(lines) if x.startswith("exit ")) + 2, o.evidence()
    else:
        assert o.restarts == 1 and "resumed" in lines and lines.index("saved") < lines.index("resumed"), o.evidence()


@pytest.mark.parametrize("case", list(CASES))
def test_preempted_job_exiting_around_its_deadline_is_never_lost(grace_run: dict[str, Outcome], case: str) -> None:
    _check(grace_run[case], CASES[case][0])


def test_the_exits_really_straddle_the_deadline(grace_run: dict[str, Outcome]) -> None:
    """The reproduction is only worth something if the jobs exited where they were meant to."""
    for name, (_, offset) in CASES.items():
        o = grace_run[name]
        lines = o.lines()
        sig = next((x.split() for x in lines if x.startswith("signal")), [])
        exits = [x.split() for x in lines if x.startswith("exit ")]
        assert len(sig) == 4, (name, o.evidence())
        if not exits and offset > 0:
            continue  # Slurm's sweep ended it at the deadline first (see _check): nothing to time
        assert len(exits) == 1, (name, o.evidence())
        end_s, exit_t = float(sig[3]), float(exits[0][1])
        assert offset - 0.05 <= exit_t - end_s <= offset + 1.0, (name, exit_t - end_s, o.evidence())


@pytest.mark.parametrize("case", ["finish_after", "save_before", "save_after"])
def test_exits_while_slurmctld_is_down_are_never_lost(grace_run_ctld_restart: dict[str, Outcome], case: str) -> None:
    _check(grace_run_ctld_restart[case], CASES[case][0])


def test_sandbox_slurm_conf_carries_the_settings() -> None:
    """The sandbox runs the settings slurm_conf/slurm.conf.snippet tells administrators to add."""
    snippet = (Path(__file__).resolve().parents[2] / "slurm_conf" / "slurm.conf.snippet").read_text()
    assert f"RequeueExit={wk.SLURM_REQUEUE_EXIT}" in snippet
    assert f"OverTimeLimit={wk.SLURM_PREEMPT_OVER_TIME_LIMIT_MIN}" in snippet
    lay = sandbox_slurm.SlurmLayout(dir=Path("/tmp/x"), nodes=("gpu-node-01",), ctld_port=1,
                                    node_ports={"gpu-node-01": 2}, munge_socket=Path("/tmp/x/m"))
    conf = sandbox_slurm.render_slurm_conf(lay)
    assert f"RequeueExit={wk.SLURM_REQUEUE_EXIT}" in conf
    assert f"OverTimeLimit={wk.SLURM_PREEMPT_OVER_TIME_LIMIT_MIN}" in conf
