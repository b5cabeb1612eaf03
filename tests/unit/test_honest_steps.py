"""Steps say what they did: a requeue step that requeued nothing does not claim
"requeued 11", and a resume Slurm refuses after a controller restart is retried or recognised
as done, with a warning naming the node and Slurm's message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from bridge.actuate import Actuator
from bridge.adapters.protocols import PoolTarget, RequeueOutcome
from bridge.adapters.slurm.cli import CliSlurm, CommandResult
from bridge.errors import AdapterError
from bridge.lifecycle import NodeFacts, PreemptedJob, Step
from bridge.model import Phase

REFUSED = CommandResult(1, "", "slurm_update error: Invalid node state specified\n")


def _node_line(state: str) -> str:
    return (f"NodeName=gpu-node-01 Arch=x86_64 CoresPerSocket=1 Gres=gpu:4 State={state} Partitions=preempt "
            "Reason=gpu-bridge: serving [root@2026-12-02T12:00:00]\n")


class ScriptedRunner:
    """`scontrol show node` answers the next of ``states``; `scontrol update` answers ``update``."""

    def __init__(self, states: Sequence[str], update: CommandResult) -> None:
        self.states = list(states)
        self.update = update
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append(list(argv))
        if list(argv[:4]) == ["scontrol", "--oneliner", "show", "node"]:
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return CommandResult(0, _node_line(state), "")
        if list(argv[:2]) == ["scontrol", "update"]:
            return self.update
        raise AssertionError(f"unexpected {argv}")

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls if c[:2] == ["scontrol", "update"]]


def test_resume_of_a_node_not_registered_since_a_restart_is_deferred_with_a_warning(
        capsys: pytest.CaptureFixture[str]) -> None:
    runner = ScriptedRunner(["UNKNOWN+DRAIN"], CommandResult(0, "", ""))
    with pytest.raises(AdapterError, match=r"resume gpu-node-01: node is UNKNOWN\+DRAIN .*slurmctld restart"):
        CliSlurm(runner=runner).resume("gpu-node-01")
    assert runner.updates() == []  # Slurm would refuse it ("Invalid node state specified")
    err = capsys.readouterr()
    assert "slurm_resume_deferred" in err.out + err.err and "gpu-node-01" in err.out + err.err


def test_refused_resume_that_lifted_the_drain_anyway_counts_as_done(capsys: pytest.CaptureFixture[str]) -> None:
    # measured on 22.05: RESUME refused with "Invalid node state specified", drain gone after
    runner = ScriptedRunner(["IDLE+DRAIN", "IDLE"], REFUSED)
    assert CliSlurm(runner=runner).resume("gpu-node-01") is True
    text = "".join(capsys.readouterr())
    assert "slurm_resume_refused_but_done" in text and "Invalid node state specified" in text


def test_refused_resume_still_drained_is_an_error_with_slurms_message(capsys: pytest.CaptureFixture[str]) -> None:
    runner = ScriptedRunner(["IDLE+DRAIN", "IDLE+DRAIN"], REFUSED)
    with pytest.raises(AdapterError, match="Invalid node state specified"):
        CliSlurm(runner=runner).resume("gpu-node-01")
    text = "".join(capsys.readouterr())
    assert "slurm_resume_refused" in text and "gpu-node-01" in text


class RequeueSlurm:
    def __init__(self, running: set[str]) -> None:
        self.running = running
        self.asked: list[str] = []

    def requeue_jobs(self, jobs: Mapping[str, int | None]) -> dict[str, RequeueOutcome]:
        assert set(jobs.values()) == {0}  # the run Slurm preempted
        self.asked += jobs
        return {j: RequeueOutcome(j, j in self.running, skipped="" if j in self.running else "gone") for j in jobs}


class EventKube:
    def __init__(self) -> None:
        self.events: list[str] = []

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None:
        self.events.append(message)


def _reclaiming(jobs: tuple[str, ...]) -> NodeFacts:
    return NodeFacts(name="gpu-node-02", phase=Phase.RECLAIMING, phase_since=0.0, fenced=True, pods=(),
                     slurm_drained_by_us=False, slurm_drained_by_other=False, slurm_down=False,
                     slurm_allocated=True, hold=None, research_jobs=jobs,
                     research_preempted=tuple(PreemptedJob(j, 100.0, 0) for j in jobs), slurm_now=131.0)


@pytest.mark.parametrize(("running", "changed", "says", "never"), [
    (set(), False, "11 no longer running", "requeued 11"),
    ({"11"}, True, "requeued 11", "no longer running"),
    ({"12"}, True, "requeued 12; 11 no longer running", "requeued 11"),
])
def test_requeue_step_says_what_it_did(running: set[str], changed: bool, says: str, never: str) -> None:
    slurm = RequeueSlurm(running)
    kube = EventKube()
    act = Actuator(kube=kube, slurm=slurm, clock=lambda: 1.0, grace_s=30.0)  # type: ignore[arg-type]
    jobs = ("11",) if running <= {"11"} else ("11", "12")
    got = act.execute(Step.REQUEUE_JOBS, _reclaiming(jobs), PoolTarget("default", "serving", "vllm"), now=1.0)
    assert got.changed is changed
    assert slurm.asked == list(jobs)
    assert says in got.detail and never not in got.detail, got.detail
    assert kube.events == ([got.detail] if changed else [])  # the Event says the same, or nothing
