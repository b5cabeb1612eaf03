"""Issue 24 point 6: a mass reclaim requeues with one Slurm read per pass, not one per job.

- ``CliSlurm.requeue_jobs``: every due job re-read in one ``squeue --jobs=A,B,...``; a job that
  ended, was requeued by Slurm or runs another run is skipped, a hold job refused (NotOursError),
  the rest requeued in one ``scontrol requeue A,B``. A list that fails goes again job by job (each
  re-read first), so one bad job never holds back the others and none is requeued twice.
- The actuator: the REQUEUE_JOBS steps of one pass make one ``requeue_jobs`` for all their
  nodes; each node's step still says what was done with its own jobs.

The scripted answers are Slurm 22.05's and 24.11's, as measured on both (the same text)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bridge.actuate import StepRecord
from bridge.adapters.protocols import RequeueOutcome
from bridge.adapters.slurm.cli import CliSlurm, CommandResult, NotOursError
from bridge.adapters.slurm.parse import REQUEUE_CHECK_FORMAT
from bridge.errors import AdapterError
from bridge.lifecycle import Step
from bridge.model import Phase
from tests.unit.test_daemon_loop import HIGH, NODES, World

PREEMPTED = "2026-12-06T03:11:34"


def line(job: str, state: str = "RUNNING", partition: str = "preempt", preempt: str = PREEMPTED, restarts: int = 0) -> str:
    return f"{job}|{state}|{partition}|{preempt}|{restarts}|\n"


class Slurm:
    """``squeue --jobs=...`` answers the next of ``reads`` (the lines of the jobs asked, as squeue
    prints them); ``scontrol requeue`` the next of ``requeues``. Every argv recorded."""

    def __init__(self, reads: Sequence[str], requeues: Sequence[CommandResult] = ()) -> None:
        self.reads, self.requeues = list(reads), list(requeues)
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append(list(argv))
        if argv[:2] == ["squeue", "--noheader"]:
            assert argv[3:] == ["--Format", REQUEUE_CHECK_FORMAT], argv
            asked = argv[2].removeprefix("--jobs=").split(",")
            text = self.reads.pop(0)
            return CommandResult(0, "".join(ln + "\n" for ln in text.splitlines() if ln.split("|")[0] in asked), "")
        if argv[:2] == ["scontrol", "requeue"]:
            return self.requeues.pop(0) if self.requeues else CommandResult(0, "", "")
        raise AssertionError(f"unexpected {argv}")

    def commands(self) -> list[str]:
        return [" ".join(c[:3]) if c[0] == "scontrol" else f"squeue {c[2]}" for c in self.calls]


def test_one_read_and_one_requeue_for_the_whole_batch() -> None:
    # 11 ended (squeue no longer lists it), 12 runs another run (Slurm requeued it, it started
    # again), 13 is a hold job, 14 and 15 still run preempted: only those two are requeued
    slurm = Slurm([line("12", restarts=1) + line("13", partition="gpu-bridge", preempt="N/A") + line("14") + line("15")])
    got = CliSlurm(runner=slurm).requeue_jobs({"11": 0, "12": 0, "13": 0, "14": 0, "15": None})
    assert slurm.commands() == ["squeue --jobs=11,12,13,14,15", "scontrol requeue 14,15"]
    assert {j: o.requeued for j, o in got.items()} == {"11": False, "12": False, "13": False, "14": True, "15": True}
    assert got["11"].skipped == "gone" and got["11"].error is None
    assert got["12"].skipped == "another run (restart 1, preempted run 0)"
    assert isinstance(got["13"].error, NotOursError) and "hold job" in str(got["13"].error)
    assert got["14"] == RequeueOutcome("14", True)


@pytest.mark.parametrize(("reads", "why"), [
    pytest.param([line("14", state="PENDING", preempt="N/A", restarts=1)], "not running (pending)", id="requeued-by-slurm"),
    pytest.param([line("14", preempt="N/A")], "Slurm has not preempted it", id="not-preempted"),
    pytest.param([line("14", partition="other")], "partition other, not preempt", id="other-partition"),
])
def test_nothing_left_to_requeue_writes_nothing(reads: list[str], why: str) -> None:
    slurm = Slurm(reads)
    got = CliSlurm(runner=slurm).requeue_jobs({"14": 0})
    assert slurm.commands() == ["squeue --jobs=14"] and not got["14"].requeued and why in got["14"].skipped


def test_a_failed_list_goes_again_job_by_job_and_each_gets_its_own_outcome() -> None:
    # Slurm requeues 14 and 16 and names 15 (not requeueable), as 22.05 and 24.11 answer it
    disabled = CommandResult(1, "", "Requested operation is presently disabled for job 15\n")
    slurm = Slurm([line("14") + line("15") + line("16"), line("15")],
                  [disabled, CommandResult(1, "", "Requested operation is presently disabled for job 15\n")])
    got = CliSlurm(runner=slurm).requeue_jobs({"14": 0, "15": 0, "16": 0})
    assert slurm.commands() == ["squeue --jobs=14,15,16", "scontrol requeue 14,15,16", "squeue --jobs=15", "scontrol requeue 15"]
    assert got["14"].requeued and got["16"].requeued and not got["15"].requeued
    assert got["15"].error is not None and "presently disabled" in str(got["15"].error)


def test_a_list_that_failed_saying_nothing_is_retried_job_by_job_never_requeuing_twice() -> None:
    # a timeout: nothing is known. Re-read one by one: 14 was requeued by the list after all
    # (pending now): left alone; 15 still runs preempted: requeued alone
    slurm = Slurm([line("14") + line("15"), line("14", state="PENDING", preempt="N/A", restarts=1), line("15")],
                  [CommandResult(2, "", "scontrol: error: Socket timed out on send/recv operation\n")])
    got = CliSlurm(runner=slurm).requeue_jobs({"14": 0, "15": 0})
    assert slurm.commands() == ["squeue --jobs=14,15", "scontrol requeue 14,15", "squeue --jobs=14", "squeue --jobs=15",
                                "scontrol requeue 15"]
    assert not got["14"].requeued and "not running" in got["14"].skipped and got["15"].requeued


def test_one_job_that_cannot_be_requeued_is_its_error() -> None:
    slurm = Slurm([line("15")], [CommandResult(1, "", "Requested operation is presently disabled for job 15\n")])
    got = CliSlurm(runner=slurm).requeue_jobs({"15": 0})
    assert slurm.commands() == ["squeue --jobs=15", "scontrol requeue 15"]
    assert "scontrol requeue failed (rc 1): Requested operation is presently disabled" in str(got["15"].error)


@pytest.mark.parametrize(("answer", "match"), [
    pytest.param(CommandResult(0, "14|RUNNING|preempt\n", ""), r"squeue --jobs: line 1: expected JobID\|State", id="short-line"),
    pytest.param(CommandResult(0, "14|RUNNING|preempt|N/A|x|\n", ""), "job 14: bad RestartCnt 'x'", id="restart-count"),
    pytest.param(CommandResult(0, "14||preempt|N/A|0|\n", ""), "job 14: bad State ''", id="state"),
    pytest.param(CommandResult(0, line("14") * 2, ""), "job 14: listed twice", id="twice"),
    pytest.param(CommandResult(1, "", "slurm_load_jobs error: Unable to contact slurm controller\n"),
                 "squeue --jobs failed .*Unable to contact", id="controller-down"),
])
def test_a_read_not_understood_fails_the_batch_and_writes_nothing(answer: CommandResult, match: str) -> None:
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], timeout_s: float) -> CommandResult:
        calls.append(list(argv))
        return answer

    with pytest.raises(AdapterError, match=match):
        CliSlurm(runner=runner).requeue_jobs({"14": 0, "15": 0})
    assert [c[0] for c in calls] == ["squeue"]


def test_array_siblings_listed_for_an_asked_id_are_left_out() -> None:
    """``--jobs=1`` of an array's first task lists every task of the array (its ArrayJobID is 1)."""
    got = CliSlurm(runner=lambda argv, t: CommandResult(0, line("3") + line("1"), "")).requeue_jobs({"1": 0})
    assert got["1"].requeued


def test_an_invalid_job_id_never_reaches_argv() -> None:
    slurm = Slurm([])
    with pytest.raises(AdapterError, match="job id"):
        CliSlurm(runner=slurm).requeue_jobs({"14": 0, "1,2": 0})
    assert slurm.calls == []


def test_a_mass_reclaim_requeues_every_node_s_jobs_in_one_call_per_pass() -> None:
    """Three lent nodes reclaimed at once, each running a research job Slurm preempted: past the
    grace, one ``requeue_jobs`` for the three (not one per job), each node's step naming its job."""
    w = World()
    w.slurm.requeue_lag_s = 30.0  # Slurm's own sweep comes late: every requeue here is the daemon's
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    jobs = {w.sbatch(f"research-{i}", duration_s=10_000) for i in range(3)}
    w.tick(2)
    on = {j: w.slurm.snapshot()[j].nodes[0] for j in jobs}
    w.load = HIGH
    per_tick = []
    for _ in range(20):
        calls, writes = w.slurm.calls["requeue_jobs"], len(w.slurm.writes)
        w.tick()
        per_tick.append((w.slurm.calls["requeue_jobs"] - calls, [j for k, j in w.slurm.writes[writes:] if k == "requeue"]))
    requeued = [(n, js) for n, js in per_tick if js]
    assert requeued == [(1, sorted(jobs, key=int))], per_tick  # one call, in one pass, for all three
    assert all(w.job(j).restart_count == 1 for j in jobs)  # type: ignore[attr-defined]
    assert sorted(on.values()) == sorted(set(on.values())) and len(on) == 3
    assert w.violations == []


def test_each_node_s_step_says_what_was_done_with_its_own_jobs() -> None:
    """One job of the three cannot be requeued (Slurm refuses it): the other two nodes' steps say
    they requeued theirs; that node's step fails with Slurm's error, retried pass after pass."""
    w = World()
    w.slurm.requeue_lag_s = 30.0
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    jobs = [w.sbatch("research-0", duration_s=10_000), w.slurm.add_job(name="research-1", requeueable=False),
            w.sbatch("research-2", duration_s=10_000)]  # Slurm refuses to requeue the second
    w.tick(2)
    on = {j: w.slurm.snapshot()[j].nodes[0] for j in jobs}
    records: list[StepRecord] = []
    apply = w.daemon.actuator.apply
    w.daemon.actuator.apply = lambda intents: records.extend(got := apply(intents)) or got  # type: ignore[method-assign]
    w.load = HIGH
    w.tick(12)
    requeues = [r for r in records if r.step is Step.REQUEUE_JOBS]
    for j in (jobs[0], jobs[2]):
        (done,) = [r for r in requeues if r.node == on[j] and r.changed]
        assert done.detail == f"GraceTime over: requeued {j}" and done.error is None
    failed = [r for r in requeues if r.node == on[jobs[1]]]
    assert failed and all(r.error is not None and "presently disabled" in str(r.error) for r in failed), failed
    assert w.job(jobs[0]).restart_count == 1 and w.job(jobs[2]).restart_count == 1  # type: ignore[attr-defined]
    assert w.job(jobs[1]).restart_count == 0  # type: ignore[attr-defined]
    assert set(NODES) >= set(on.values())
