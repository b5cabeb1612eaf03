"""Issue 21 point 5, "admins' state is theirs", and point 8's ``release_launch_failed``:

- a node an administrator marked DOWN keeps their reason once it stops responding too (gpu-bridge
  never writes its drain over it), while a node Slurm itself marked DOWN "Not responding" gets it;
- ``slurm.own_drain_reasons`` takes only Slurm's own reasons, matched whole: "Kill" is refused, and
  an administrator's "Killed GPU 3" is never taken for Slurm's "Kill task failed";
- hold jobs are recognised by user as well as name (``slurm.hold_user``, in ``observe``);
- a job Slurm held after a failed launch is released once, not every time it is held again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from bridge.adapters.slurm.cli import CliSlurm, CommandResult
from bridge.config import parse_config
from bridge.errors import ConfigError
from bridge.model import Phase, SlurmJob
from bridge.observe import LAUNCH_FAILED_HELD, is_hold_job, own_drain_reason
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from tests.unit.test_daemon_loop import World

NODE = "gpu-node-01"


class OneNode:
    """A CommandRunner whose `scontrol show node` prints one set line; records the other argvs."""

    def __init__(self, state: str, reason: str) -> None:
        self.line = f"NodeName={NODE} Arch=x86_64 Gres=gpu:4 State={state} Partitions=preempt Reason={reason}\n"
        self.writes: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        if list(argv[:4]) == ["scontrol", "--oneliner", "show", "node"]:
            return CommandResult(0, self.line, "")
        self.writes.append(list(argv))
        return CommandResult(0, "", "")


@pytest.mark.parametrize(("state", "reason", "drained"), [
    ("DOWN", "PSU swap ticket 4711 [admin@2026-12-04T10:00:00]", False),  # an admin's DOWN, responding
    ("DOWN*", "PSU swap ticket 4711 [admin@2026-12-04T10:00:00]", False),  # ... and then not responding
    ("DOWN*", "Not responding [slurm@2026-12-04T10:00:00]", True),  # Slurm's own DOWN: our drain goes on
    ("IDLE", "", True),
], ids=["admin-down", "admin-down-then-not-responding", "slurm-not-responding", "idle"])
def test_an_admins_down_keeps_their_reason(state: str, reason: str, drained: bool) -> None:
    runner = OneNode(state, reason)
    assert CliSlurm(runner=runner).drain(NODE, "serving (pool default)") is drained
    assert bool(runner.writes) is drained


def test_the_fake_keeps_an_admins_down_reason_when_the_node_stops_responding() -> None:
    s = FakeSlurm()
    s.add_node(NODE)
    s.admin_down(NODE, "PSU swap ticket 4711")
    s.set_responding(NODE, False)
    assert s.node(NODE).reason == "PSU swap ticket 4711"
    assert s.drain(NODE, "serving (pool default)") is False
    assert s.node(NODE).reason == "PSU swap ticket 4711"


def test_own_drain_reasons_only_slurms_own_matched_whole() -> None:
    base = {"pools": [{"name": "default"}]}
    with pytest.raises(ConfigError) as ei:
        parse_config({**base, "slurm": {"own_drain_reasons": ["Duplicate jobid", "Kill"]}}, source="b.yaml")
    assert str(ei.value).splitlines()[-1].strip() == (
        "b.yaml: slurm.own_drain_reasons[1]: expected one of Slurm's own drain reasons (Duplicate jobid, "
        "Kill task failed, Prolog error, Epilog error, batch job complete failure), got \"Kill\"")
    cfg = parse_config({**base, "slurm": {"own_drain_reasons": ["Kill task failed"]}})
    assert own_drain_reason("Kill task failed", cfg) == "Kill task failed"
    assert own_drain_reason("kill task failed: job 12", cfg) == "Kill task failed"
    assert own_drain_reason("Kill task failedX", cfg) is None
    assert own_drain_reason("Killed GPU 3 for burn-in", cfg) is None


def test_the_adapter_lifts_only_slurms_own_reason_whole() -> None:
    s = FakeSlurm()
    s.add_node(NODE)
    s.admin_drain(NODE, "Duplicate jobids seen, investigating", user="admin")
    assert s.clear_own_drain(NODE, "Duplicate jobid") is False
    runner = OneNode("IDLE+DRAIN", "Duplicate jobids seen, investigating [admin@2026-12-04T10:00:00]")
    assert CliSlurm(runner=runner).clear_own_drain(NODE, "Duplicate jobid") is False and runner.writes == []


def test_hold_jobs_are_recognised_by_user_too() -> None:
    cfg = parse_config({"pools": [{"name": "default"}], "slurm": {"hold_user": "gpubridge"}})
    ours = SlurmJob(job_id="7", name=f"gpu-bridge-hold:{NODE}", user="gpubridge", partition="gpu-bridge",
                    state="running", nodes=(NODE,), start_time=None)
    assert is_hold_job(ours, cfg)
    assert not is_hold_job(replace(ours, user="mallory"), cfg)  # a look-alike: a research job, never cancelled as ours
    assert is_hold_job(replace(ours, user="mallory"), parse_config({"pools": [{"name": "default"}]}))  # null: name only
    with pytest.raises(ConfigError, match=r"slurm.hold_user: expected a user name"):
        parse_config({"pools": [{"name": "default"}], "slurm": {"hold_user": "a b"}})


def test_a_held_launch_is_released_once_not_every_time() -> None:
    """A job whose launch fails for its own reason (a broken prolog) is held by Slurm again and
    again: released once (the Duplicate jobid case after a controller crash), then left held."""
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    job = w.sbatch("research-dup", duration_s=10_000)
    w.tick(2)
    w.slurm.duplicate_start(job)
    w.tick(1)
    assert w.slurm.writes.count(("release", job)) == 1
    w.tick(2)
    assert w.job(job).state == "running"  # type: ignore[attr-defined]
    w.slurm.duplicate_start(job)  # held again: its launch fails once more
    assert w.job(job).held_for(LAUNCH_FAILED_HELD)  # type: ignore[attr-defined]
    w.tick(5)
    assert w.slurm.writes.count(("release", job)) == 1
    assert w.job(job).held_for(LAUNCH_FAILED_HELD)  # type: ignore[attr-defined]
