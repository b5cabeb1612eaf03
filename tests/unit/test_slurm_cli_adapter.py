"""CliSlurm over a fake command runner serving recorded output: intents map to the right
argv (and only when needed), refusals, client-side filters, errors sanitized, fail closed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from bridge import wellknown
from bridge.adapters.protocols import SlurmAdapterProtocol, SlurmReader, SlurmWriter
from bridge.adapters.slurm.cli import CliSlurm, CommandResult, NotOursError, SubprocessRunner, drain_reason
from bridge.errors import AdapterError
from gpu_bridge_lab.fakes.slurm import holds_of
from tests.slurm_script import ScriptedSlurm
from tests.slurm_text import scontrol_node, sdiag, squeue_filtered

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"


def fixture_runner(version: str = "22.05", *, sinfo: str | None = None, squeue: str | None = None,
                   fail: dict[str, CommandResult] | None = None) -> ScriptedSlurm:
    """Answers sinfo/squeue/sdiag/scontrol ping and the single reads from fixture files (or the
    ``sinfo``/``squeue`` text given), records every argv; writes succeed, a command named in
    ``fail`` answers that."""
    sinfo = (FIX / f"sinfo-{version}.json").read_text() if sinfo is None else sinfo
    squeue = (FIX / f"squeue-{version}.json").read_text() if squeue is None else squeue
    r = (ScriptedSlurm(otherwise=CommandResult(0, "", ""))
         .on(["sbatch"], CommandResult(0, "42\n", ""))
         .on(["squeue", "--noheader"], lambda argv: CommandResult(*squeue_filtered(squeue, argv)))
         .on(["scontrol", "--oneliner", "show", "node"], lambda argv: CommandResult(*scontrol_node(sinfo, argv[4])))
         .on(["scontrol", "ping"], CommandResult(0, (FIX / "ping-22.05.txt").read_text(), ""))
         .on(["sdiag"], CommandResult(*sdiag(1796216801.0)))
         .on(["squeue", "--json"], CommandResult(0, squeue, ""))
         .on(["sinfo", "--json", "--Node"], CommandResult(0, sinfo, "")))
    for command, answer in (fail or {}).items():
        r.on([command], answer)
    return r


def adapter(version: str = "22.05", **kw: object) -> tuple[CliSlurm, ScriptedSlurm]:
    r = fixture_runner(version, **kw)  # type: ignore[arg-type]
    return CliSlurm(runner=r, timeout_s=7.0), r


def test_satisfies_both_protocols() -> None:
    a, _ = adapter()
    assert isinstance(a, SlurmReader) and isinstance(a, SlurmWriter)
    _: SlurmAdapterProtocol = a


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_reads_and_client_side_filters(version: str) -> None:
    a, r = adapter(version)
    a.ping()
    assert [n.name for n in a.nodes(["gpu-node-03", "gpu-node-01"])] == ["gpu-node-01", "gpu-node-03"]
    assert a.node("gpu-node-02").drained_by_us
    running = a.jobs(states=["RUNNING"])
    assert running and all(j.state == "running" for j in running)
    on1 = a.jobs(node="gpu-node-01", partition=wellknown.SLURM_PREEMPT_PARTITION)
    assert on1 and all("gpu-node-01" in j.nodes and j.partition == "preempt" for j in on1)
    holds = holds_of(a)
    assert list(holds) == ["gpu-node-02"] and holds["gpu-node-02"].is_hold
    assert set(r.timeouts) == {7.0}
    assert r.writes() == []


def test_unknown_node_raises_not_empty() -> None:
    a, _ = adapter()
    with pytest.raises(AdapterError, match="unknown node"):
        a.nodes(["gpu-node-09"])


def test_drain_is_idempotent_and_never_overwrites_an_admin() -> None:
    a, r = adapter()
    assert a.drain("gpu-node-01", "serving since 1796215000") is True
    assert r.writes() == [["scontrol", "update", "NodeName=gpu-node-01", "State=DRAIN",
                           "Reason=gpu-bridge: serving since 1796215000"]]
    r.calls.clear()
    assert a.drain("gpu-node-02", "serving since 1796215000") is False  # already exactly so
    assert a.drain("gpu-node-03", "serving") is False  # admin's drain: left alone
    assert a.drain("gpu-node-04", "serving") is False  # admin's DOWN (responding, their reason)
    assert r.writes() == []
    assert a.drain("gpu-node-02", "gpu-bridge: reclaimed") is True  # ours, new reason: updated
    assert r.writes()[-1][-1] == "Reason=gpu-bridge: reclaimed"


def test_drain_a_not_responding_node() -> None:
    """A node that comes back after a reboot must not take research jobs: drain it anyway."""
    r = fixture_runner(sinfo=(FIX / "sinfo-22.05-down.json").read_text())
    a = CliSlurm(runner=r)
    assert a.drain("gpu-node-01", "serving") is True


def test_resume_only_our_drain() -> None:
    a, r = adapter()
    assert a.resume("gpu-node-02") is True
    assert r.writes() == [["scontrol", "update", "NodeName=gpu-node-02", "State=RESUME"]]
    r.calls.clear()
    with pytest.raises(NotOursError, match="drained by someone else"):
        a.resume("gpu-node-03")
    assert a.resume("gpu-node-01") is False  # not drained
    assert a.resume("gpu-node-04") is False  # DOWN: Slurm's or the admin's, not a drain of ours
    assert r.writes() == []


def test_reason_sanitized() -> None:
    assert drain_reason("serving") == "gpu-bridge: serving"
    assert drain_reason("gpu-bridge: serving") == "gpu-bridge: serving"
    assert drain_reason('a\x00b\nc\td "quoted" \x1b[31m') == "gpu-bridge: a b c d quoted [31m"
    assert len(drain_reason("x" * 5000)) <= 200
    assert drain_reason("") == "gpu-bridge:"


def test_submit_hold_argv_and_idempotence() -> None:
    a, r = adapter()
    assert a.submit_hold("gpu-node-02") == "3"  # already held: nothing submitted
    assert r.writes() == []
    assert a.submit_hold("gpu-node-01") == "42"
    (argv,) = r.writes()
    assert argv[0] == "sbatch" and "--parsable" in argv and "--exclusive" in argv
    assert argv[argv.index("--partition") + 1] == "gpu-bridge"
    assert argv[argv.index("--nodelist") + 1] == "gpu-node-01"
    assert argv[argv.index("--job-name") + 1] == "gpu-bridge-hold:gpu-node-01"
    assert argv[-2:] == ["--wrap", "exec sleep infinity"]  # fixed text, nothing from data


def test_submit_hold_bad_answer() -> None:
    r = fixture_runner(fail={"sbatch": CommandResult(0, "Submitted batch job 42\n", "")})
    with pytest.raises(AdapterError, match="unexpected answer"):
        CliSlurm(runner=r).submit_hold("gpu-node-01")


def test_cancel_hold_only_ours_by_name_and_partition() -> None:
    a, r = adapter()
    assert a.cancel_hold("gpu-node-01") == ()
    assert r.writes() == []
    assert a.cancel_hold("gpu-node-02") == ("3",)
    assert r.writes() == [["scancel", "--name=gpu-bridge-hold:gpu-node-02", "--partition=gpu-bridge", "3"]]


def test_requeue_research_job_only() -> None:
    a, r = adapter("24.11")  # job 101 runs in preempt, preempted by Slurm
    assert a.requeue("101") is True
    assert r.writes() == [["scontrol", "requeue", "101"]]
    # that one job re-read right before, by fields no user can forge (never its name or comment)
    assert r.calls[-2] == ["squeue", "--noheader", "--jobs=101", "--Format", "JobID:|,State:|,Partition:|,PreemptTime:|,RestartCnt:|"]
    r.calls.clear()
    assert a.requeue("104") is False  # pending
    assert a.requeue("102") is False  # COMPLETED: requeueing it would run a finished job again
    assert a.requeue("999") is False  # gone
    assert a.requeue("106") is False  # running but not preempted by Slurm: it gets its signal and grace first
    assert a.requeue("101", restart_count=1) is False  # not the run that was preempted
    with pytest.raises(NotOursError, match="hold job"):
        a.requeue("103")
    assert r.writes() == []


def test_requeue_only_in_the_preempt_partition() -> None:
    r = fixture_runner("24.11")
    a = CliSlurm(runner=r, preempt_partition="other")
    assert a.requeue("101") is False and r.writes() == []


def test_slurmctlds_clock_and_grace_time() -> None:
    a, r = adapter()
    assert a.clock() == 1796216801.0
    r.on(["scontrol"], CommandResult(0, "PartitionName=preempt AllowGroups=ALL Default=YES GraceTime=120 Hidden=NO "
                                          "PreemptMode=REQUEUE State=UP\n", ""))
    assert a.grace_time_s("preempt") == 120.0
    assert r.calls[-1] == ["scontrol", "--oneliner", "show", "partition", "preempt"]
    with pytest.raises(AdapterError, match="expected one PartitionName=other line"):
        a.grace_time_s("other")
    with pytest.raises(AdapterError, match="invalid partition"):
        a.grace_time_s("p;reboot")
    r.on(["sdiag"], CommandResult(0, "Server thread count: 3\n", ""))
    with pytest.raises(AdapterError, match="sdiag"):
        a.clock()


@pytest.mark.parametrize("bad", ["gpu node", "n;reboot", "$(id)", "-p", "x" * 100])
def test_bad_names_never_reach_argv(bad: str) -> None:
    a, r = adapter()
    for call in (lambda: a.drain(bad, "x"), lambda: a.resume(bad), lambda: a.submit_hold(bad),
                 lambda: a.cancel_hold(bad), lambda: a.nodes([bad]), lambda: a.jobs(node=bad)):
        with pytest.raises(AdapterError, match="node name"):
            call()
    with pytest.raises(AdapterError, match="job id"):
        a.requeue("1; scancel -u alice")
    assert r.calls == []


def test_command_failure_sanitized_and_capped() -> None:
    err = "slurm_load_node error: Unable to contact slurm controller\x1b[0m\n" + "y" * 2000
    a, _ = adapter(fail={"sinfo": CommandResult(1, "", err)})
    with pytest.raises(AdapterError) as ei:
        a.nodes()
    msg = str(ei.value)
    assert msg.startswith("slurm: sinfo --json failed (rc 1): slurm_load_node error: Unable to contact")
    assert "\x1b" not in msg and "\n" not in msg and len(msg) < 600


def test_garbage_output_fails_closed() -> None:
    a, _ = adapter(fail={"squeue": CommandResult(0, '{"jobs": [', "")})
    with pytest.raises(AdapterError, match="unparseable JSON"):
        a.jobs()
    with pytest.raises(AdapterError, match="unparseable JSON"):
        holds_of(a)


def test_ping_down() -> None:
    a, _ = adapter(fail={"scontrol": CommandResult(1, "Slurmctld(primary) at vm is DOWN\n", "")})
    with pytest.raises(AdapterError, match="scontrol ping failed"):
        a.ping()
    a, _ = adapter(fail={"scontrol": CommandResult(0, "something else\n", "")})
    with pytest.raises(AdapterError, match="not UP"):
        a.ping()


def test_subprocess_runner_timeout_and_missing_binary() -> None:
    run = SubprocessRunner()
    with pytest.raises(AdapterError, match="timed out after 0.2 s"):
        run(["sleep", "5"], 0.2)
    with pytest.raises(AdapterError, match="cannot run"):
        run(["/nonexistent/sinfo"], 1.0)
    assert run(["true"], 5.0).returncode == 0


@pytest.mark.parametrize("partition", [wellknown.SLURM_HOLD_PARTITION, wellknown.SLURM_WARM_PARTITION, "preempt"])
def test_release_frees_a_research_job_slurm_held_never_a_job_of_the_bridges_partitions(partition: str) -> None:
    """A job in the hold or warm partition (a hold, a memory hold, or whatever got there: those
    partitions are the bridge's) is never released as research, whatever its name or user."""
    doc = json.loads((FIX / "squeue-22.05.json").read_text())
    job = doc["jobs"][0]
    job.update(partition=partition, job_state="PENDING", state_reason="launch_failed_requeued_held", name="train")
    a, r = adapter(squeue=json.dumps(doc))
    jid = str(job["job_id"])
    if partition == "preempt":
        assert a.release(jid, "launch_failed_requeued_held") is True
        assert r.writes() == [["scontrol", "release", jid]]
        return
    with pytest.raises(NotOursError, match="hold job"):
        a.release(jid, "launch_failed_requeued_held")
    assert r.writes() == []
