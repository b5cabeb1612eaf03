"""CliSlurm against the real sandbox Slurm, 22.05 (Debian 12, the host's) and 24.11 (Debian 13's,
in a cached trixie tree run through ``slurm.command_prefix``; marker ``slurm2411``): reads, drain/resume only ours, the hold job
preempts and requeues a research job (Slurm's way, and with the daemon's early requeue at the
end of GraceTime), cancel_hold touches only our holds, lookups fail closed."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from bridge import wellknown
from bridge.adapters.slurm.cli import CliSlurm, CommandResult, NotOursError, SubprocessRunner
from bridge.adapters.slurm.types import SlurmJobInfo
from bridge.errors import AdapterError
from gpu_bridge_lab.sandbox.cluster import Sandbox
from gpu_bridge_lab.fakes.slurm import holds_of

pytestmark = pytest.mark.integration


def wait_until(check: Callable[[], object], timeout_s: float, what: str) -> object:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = check()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(params=["22.05", pytest.param("24.11", marks=[pytest.mark.slurm2411, pytest.mark.timeout(600)])])
def slurm_clean(request: pytest.FixtureRequest) -> Sandbox:
    """The clean sandbox of each Slurm release (tests/sandbox_fixtures.py)."""
    sb: Sandbox = request.getfixturevalue("slurm_clean" if request.param == "22.05" else "slurm2411_clean")
    return sb


def slurm_for(sb: Sandbox, timeout_s: float = 10, conf: str | None = None) -> CliSlurm:
    return CliSlurm(env={"SLURM_CONF": conf or str(sb.slurm.slurm_conf)}, timeout_s=timeout_s,
                    command_prefix=sb.slurm.command_prefix)


def research_job(sb: Sandbox, tmp_path: Path, *extra: str) -> str:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrap 'echo usr1 >> \"$1\"' USR1\necho start $SLURMD_NODENAME ${SLURM_RESTART_COUNT:-0} >> \"$1\"\n"
                      "while true; do sleep 0.2; done\n")
    script.chmod(0o755)
    out = sb.run_slurm(["sbatch", "--parsable", "-p", "preempt", "--requeue", "--gres=gpu:4", "-o", "/dev/null",
                        *extra, str(script), str(tmp_path / "out")]).stdout
    return out.strip().split(";")[0]


def job(slurm: CliSlurm, jid: str) -> SlurmJobInfo | None:
    return next((j for j in slurm.jobs() if j.job_id == jid), None)


def test_reads(slurm_clean: Sandbox) -> None:
    slurm = slurm_for(slurm_clean)
    slurm.ping()
    nodes = slurm.nodes()
    assert [n.name for n in nodes] == list(slurm_clean.node_names)
    assert all(n.state == "idle" and n.gpus == 4 and n.responding and not n.drained for n in nodes)
    assert slurm.jobs() == () and holds_of(slurm) == {}


def test_drain_resume_only_ours(slurm_clean: Sandbox) -> None:
    sb, slurm = slurm_clean, slurm_for(slurm_clean)
    assert slurm.drain("gpu-node-01", "serving\nsince now") is True
    assert slurm.drain("gpu-node-01", "serving since now") is False
    n = slurm.node("gpu-node-01")
    assert n.drained_by_us and n.reason == "gpu-bridge: serving since now" and n.state == "idle"
    sb.run_slurm(["scontrol", "update", "NodeName=gpu-node-02", "State=DRAIN", "Reason=maintenance: disk"])
    assert slurm.drain("gpu-node-02", "serving") is False
    assert slurm.node("gpu-node-02").reason == "maintenance: disk"
    with pytest.raises(NotOursError):
        slurm.resume("gpu-node-02")
    assert slurm.node("gpu-node-02").drained_by_other
    assert slurm.resume("gpu-node-01") is True
    assert slurm.resume("gpu-node-01") is False
    assert not slurm.node("gpu-node-01").drained


def test_hold_preempts_research_job_and_daemon_requeues_at_grace_end(slurm_clean: Sandbox, tmp_path: Path) -> None:
    """The reclaim path as the daemon will drive it: submit_hold, then at preempt_time + GraceTime
    requeue the victims itself (Slurm would only notice at its next 30 s time-limit check)."""
    sb, slurm = slurm_clean, slurm_for(slurm_clean)
    jid = research_job(sb, tmp_path, "--signal=B:USR1@5")
    running = wait_until(lambda: (j := job(slurm, jid)) is not None and j.state == "running" and j, 30, "running")
    node = running.nodes[0]  # type: ignore[union-attr]
    t0 = time.time()
    hold = slurm.submit_hold(node)
    assert slurm.submit_hold(node) == hold  # idempotent
    preempted = wait_until(lambda: (j := job(slurm, jid)) is not None and j.preempt_time and j, 10, "preempt_time set")
    t_preempt = time.time()
    assert preempted.end_time is not None and abs(preempted.end_time - preempted.preempt_time - sb.grace_s) <= 1  # type: ignore[union-attr,operator]
    assert holds_of(slurm)[node].job_id == hold and holds_of(slurm)[node].state == "pending"
    # the daemon's early requeue, right when GraceTime is over
    assert not preempted.grace_over(time.time())  # type: ignore[union-attr]
    while not preempted.grace_over(time.time()):  # type: ignore[union-attr]
        time.sleep(0.1)
    # Slurm may requeue it itself at the same moment (seen once on 24.11, in a full suite run):
    # then ours finds it no longer running and does nothing. Either way the job must be requeued
    # at the grace end, never cancelled (checked below: restart count 1).
    by_us = slurm.requeue(jid)
    t_requeue = time.time()
    if not by_us:
        now = job(slurm, jid)
        assert now is not None and now.state in ("pending", "requeued", "completing"), now
    wait_until(lambda: (h := holds_of(slurm).get(node)) is not None and h.state == "running", 20, "hold running")
    t_hold = time.time()
    victim = job(slurm, jid)
    assert victim is not None and victim.restart_count == 1 and victim.state in ("pending", "running")
    assert (tmp_path / "out").read_text().count("usr1") >= 1
    print(f"\nadapter reclaim: preempt decided {t_preempt - t0:.2f} s, requeued by {'us' if by_us else 'Slurm'} "
          f"{t_requeue - t0:.2f} s, "
          f"hold running {t_hold - t0:.2f} s after submit_hold (GraceTime {sb.grace_s} s)")
    assert sb.grace_s <= t_hold - t0 < sb.grace_s + 6
    # lending the node again: drop the hold, research jobs may come back
    assert slurm.cancel_hold(node) == (hold,)
    wait_until(lambda: node not in holds_of(slurm), 15, "hold gone")


def test_cancel_hold_touches_only_our_holds(slurm_clean: Sandbox) -> None:
    sb, slurm = slurm_clean, slurm_for(slurm_clean)
    fake = sb.run_slurm(["sbatch", "--parsable", "-p", "preempt", "-w", "gpu-node-03", "-o", "/dev/null",
                         "-J", wellknown.SLURM_HOLD_JOB_PREFIX + "gpu-node-03", "--wrap", "sleep 300"]).stdout.strip()
    hold = slurm.submit_hold("gpu-node-04")
    wait_until(lambda: (h := holds_of(slurm).get("gpu-node-04")) is not None and h.state == "running",
               20, "hold running")
    assert "gpu-node-03" not in holds_of(slurm)  # same name, research partition: not ours
    assert slurm.cancel_hold("gpu-node-03") == ()
    assert slurm.cancel_hold("gpu-node-04") == (hold,)
    wait_until(lambda: "gpu-node-04" not in holds_of(slurm), 15, "hold gone")
    j = job(slurm, fake)
    assert j is not None and j.state in ("running", "pending")
    with pytest.raises(NotOursError):
        slurm.requeue(slurm.submit_hold("gpu-node-04"))  # a hold is never "requeued" as a research job
    slurm.cancel_hold("gpu-node-04")


def test_lookups_fail_closed_when_slurmctld_is_gone(slurm_clean: Sandbox) -> None:
    sb = slurm_clean
    slurm = slurm_for(sb, timeout_s=3)
    sb.stop_process("slurmctld")
    for call in (slurm.ping, slurm.nodes, slurm.jobs, lambda: holds_of(slurm), lambda: slurm.drain("gpu-node-01", "x")):
        with pytest.raises(AdapterError) as ei:
            call()
        assert re.search(r"failed \(rc \d+\)|timed out|not UP", str(ei.value)), str(ei.value)
    broken = slurm_for(sb, timeout_s=3, conf="/nonexistent/slurm.conf")
    with pytest.raises(AdapterError):
        broken.nodes()


def test_drain_nodes_reads_them_in_one_call_and_decides_each_as_drain_does(slurm_clean: Sandbox) -> None:
    """A pass's drains (``drain_nodes``): the nodes read in one ``scontrol show node A,B,C,D`` (one
    line each on 22.05 and 24.11), an administrator's drain and DOWN left alone, our own drain not
    written again, the rest drained in one write; an unknown node fails the read, nothing written."""
    sb, slurm = slurm_clean, slurm_for(slurm_clean)
    assert slurm.drain("gpu-node-04", "serving (pool default)") is True
    sb.run_slurm(["scontrol", "update", "NodeName=gpu-node-02", "State=DRAIN", "Reason=maintenance: disk"])
    sb.run_slurm(["scontrol", "update", "NodeName=gpu-node-03", "State=DOWN", "Reason=rma: bad dimm"])
    calls: list[list[str]] = []
    run = slurm.run_cmd

    def recording(argv: Sequence[str], timeout_s: float) -> CommandResult:
        calls.append(list(argv))
        return run(argv, timeout_s)

    slurm.run_cmd = recording
    names = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    got = slurm.drain_nodes(dict.fromkeys(names, "serving (pool default)"))
    assert [c[:5] for c in calls] == [["scontrol", "--oneliner", "show", "node", ",".join(names)],
                                      ["scontrol", "update", "NodeName=gpu-node-01", "State=DRAIN",
                                       "Reason=gpu-bridge: serving (pool default)"]]
    assert got == {"gpu-node-01": True, "gpu-node-02": False, "gpu-node-03": False, "gpu-node-04": False}
    now = slurm.nodes_now(names)
    assert now["gpu-node-01"].drained_by_us and now["gpu-node-01"].reason == "gpu-bridge: serving (pool default)"
    assert now["gpu-node-02"].drained_by_other and now["gpu-node-02"].reason == "maintenance: disk"
    assert now["gpu-node-03"].state == "down" and now["gpu-node-03"].reason == "rma: bad dimm"
    assert now == {n.name: n for n in (slurm.node_now(x) for x in names)}  # the list read is the single reads
    calls.clear()
    with pytest.raises(AdapterError, match="scontrol show node failed .*Node gpu-node-99 not found"):
        slurm.drain_nodes({"gpu-node-01": "serving (pool b)", "gpu-node-99": "serving (pool b)"})
    assert [c[:4] for c in calls] == [["scontrol", "--oneliner", "show", "node"]]
    assert slurm.node_now("gpu-node-01").reason == "gpu-bridge: serving (pool default)"


def test_full_lend_reclaim_cycle(slurm_clean: Sandbox, tmp_path: Path) -> None:
    """One node through the adapter calls of a whole cycle, as the lifecycle makes them: lend
    (our serving drain lifted), a research job publishing its checkpoint runs on it, reclaim (the
    hold job preempts it, its signal, GraceTime, our requeue, the hold runs, our drain with its
    reason), lend again (hold cancelled, drain lifted) and the requeued job resumes there. The
    other nodes carry an administrator's drain (each its own reason) that is never touched."""
    sb, slurm = slurm_clean, slurm_for(slurm_clean)
    node, others = sb.node_names[0], sb.node_names[1:]
    for i, other in enumerate(others):
        sb.run_slurm(["scontrol", "update", f"NodeName={other}", "State=DRAIN", f"Reason=maintenance {i}: fan"])
    assert slurm.drain(node, "serving (pool default)") is True
    reasons = {n.name: n.reason for n in slurm.nodes()}
    assert reasons == {node: "gpu-bridge: serving (pool default)"} | {o: f"maintenance {i}: fan" for i, o in enumerate(others)}

    # lend: our drain lifted, research jobs may land
    assert slurm.resume(node) is True
    ckpt = int(time.time()) - 100
    jid = research_job(sb, tmp_path, "--signal=B:USR1@5", f"--comment=gpu-bridge:checkpoint={ckpt}")
    running = wait_until(lambda: (j := job(slurm, jid)) is not None and j.state == "running" and j, 30, "running")
    assert running.nodes == (node,) and running.checkpoint_time == ckpt and running.requeueable  # type: ignore[union-attr]
    assert running.gpus_per_node == 4 and running.restart_count == 0  # type: ignore[union-attr]
    assert slurm.node(node).gpus_used == 4

    # reclaim: hold job -> Slurm preempts (signal now, GraceTime) -> our requeue at its end
    hold = slurm.submit_hold(node)
    victim = wait_until(lambda: (j := job(slurm, jid)) is not None and j.preempt_time and j, 10, "preempt_time set")
    assert abs(victim.end_time - victim.preempt_time - sb.grace_s) <= 1  # type: ignore[union-attr,operator]
    wait_until(lambda: "usr1" in (tmp_path / "out").read_text(), sb.grace_s, "the pre-preemption signal")
    while not victim.grace_over(time.time()):  # type: ignore[union-attr]
        time.sleep(0.1)
    if slurm.requeue(jid) is False:  # Slurm may have requeued it itself at the same moment
        assert job(slurm, jid).state != "running"  # type: ignore[union-attr]
    wait_until(lambda: (h := holds_of(slurm).get(node)) is not None and h.state == "running", 20, "hold running")
    assert slurm.drain(node, "serving: reclaimed for pool default") is True
    n = slurm.node(node)
    assert n.drained_by_us and n.reason == "gpu-bridge: serving: reclaimed for pool default" and n.allocated
    requeued = job(slurm, jid)
    assert requeued is not None and requeued.state == "pending" and requeued.restart_count == 1
    assert requeued.checkpoint_time == ckpt and requeued.nodes == ()
    assert {n.name: n.reason for n in slurm.nodes() if n.name != node} == {o: f"maintenance {i}: fan" for i, o in enumerate(others)}

    # lend again: the hold goes, the drain is lifted, the requeued job resumes on the node
    assert slurm.cancel_hold(node) == (hold,)
    wait_until(lambda: node not in holds_of(slurm), 15, "hold gone")
    assert slurm.resume(node) is True
    again = wait_until(lambda: (j := job(slurm, jid)) is not None and j.state == "running" and j, 40, "the job to run again")
    assert again.nodes == (node,) and again.restart_count == 1  # type: ignore[union-attr]
    wait_until(lambda: f"start {node} 1" in (tmp_path / "out").read_text(), 15, "the restarted job's first line")
    assert all(slurm.node(o).drained_by_other for o in others)


def test_grace_time_and_slurmctlds_clock(slurm_clean: Sandbox) -> None:
    """Issue 21: the partition's GraceTime and slurmctld's clock, as the daemon reads them."""
    slurm = slurm_for(slurm_clean)
    assert slurm.grace_time_s(wellknown.SLURM_PREEMPT_PARTITION) == slurm_clean.grace_s
    before = time.time()
    t = slurm.clock()
    assert int(before) - 1 <= t <= time.time() + 1  # one host: the same clock, whole seconds
    with pytest.raises(AdapterError, match="Partition no-such-partition not found"):
        slurm.grace_time_s("no-such-partition")


def test_requeue_only_a_preempted_job_past_its_grace_rereading_it(slurm_clean: Sandbox, tmp_path: Path) -> None:
    """Issue 21 point 1 on the real Slurm: a running job Slurm has not preempted is never requeued
    (it would get no signal and no grace); a preempted one only in the run that was preempted; a
    job that completed is never run again."""
    sb, slurm = slurm_clean, slurm_for(slurm_clean)
    jid = research_job(sb, tmp_path, "--signal=B:USR1@5")
    running = wait_until(lambda: (j := job(slurm, jid)) is not None and j.state == "running" and j, 30, "running")
    assert slurm.requeue(jid) is False  # running, not preempted
    j = job(slurm, jid)
    assert j is not None and j.state == "running" and j.restart_count == 0
    node = running.nodes[0]  # type: ignore[union-attr]
    slurm.submit_hold(node)
    preempted = wait_until(lambda: (j := job(slurm, jid)) is not None and j.preempt_time and j, 10, "preempt_time set")
    assert slurm.requeue(jid, restart_count=1) is False  # not the run that was preempted
    grace_end = preempted.preempt_time + slurm.grace_time_s(wellknown.SLURM_PREEMPT_PARTITION) + 1  # type: ignore[union-attr,operator]
    wait_until(lambda: slurm.clock() >= grace_end, sb.grace_s + 5, "the grace over by slurmctld's clock")
    by_us = slurm.requeue(jid, restart_count=0)
    after = job(slurm, jid)
    assert after is not None and after.restart_count == 1, (by_us, after)
    slurm.cancel_hold(node)
    wait_until(lambda: node not in holds_of(slurm), 15, "hold gone")
    # a job that completed: squeue still lists it (MinJobAge), scontrol requeue would run it again
    done = sb.run_slurm(["sbatch", "--parsable", "-p", "preempt", "--requeue", "-o", "/dev/null", "--wrap", "true"]
                        ).stdout.strip().split(";")[0]
    wait_until(lambda: "COMPLETED" in sb.run_slurm(["squeue", "-h", "-t", "all", "-j", done, "-o", "%T"], check=False).stdout,
               30, "the short job completed")
    assert slurm.requeue(done) is False
    assert "COMPLETED" in sb.run_slurm(["squeue", "-h", "-t", "all", "-j", done, "-o", "%T"], check=False).stdout


def test_requeue_jobs_one_read_one_requeue_and_a_failed_list_job_by_job(slurm_clean: Sandbox, tmp_path: Path) -> None:
    """Issue 24 point 6 on the real Slurm: the due jobs re-read in one ``squeue --jobs=A,B,...``
    and requeued in one ``scontrol requeue A,B``. Slurm requeues one of them itself in between
    (its own sweep, provoked here): the list fails naming it ("... for job B"), the other is
    requeued all the same, and it alone goes again (re-read: not the run preempted, left alone).
    A job not preempted, a hold job (refused) and a job gone are never requeued."""
    sb = slurm_clean
    jobs = [research_job(sb, tmp_path) for _ in range(3)]
    on = {j: wait_until(lambda j=j: (x := job(slurm_for(sb), j)) is not None and x.state == "running" and x.nodes[0],
                        30, "running") for j in jobs}
    a, b, c = jobs
    slurm = slurm_for(sb)
    hold = slurm.submit_hold(str(on[a]))
    slurm.submit_hold(str(on[b]))
    wait_until(lambda: all((x := job(slurm, j)) is not None and x.preempt_time for j in (a, b)), 10, "both preempted")
    inner = SubprocessRunner({**os.environ, "SLURM_CONF": str(sb.slurm.slurm_conf)}, prefix=sb.slurm.command_prefix)
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], timeout_s: float) -> CommandResult:
        calls.append(list(argv))
        if list(argv) == ["scontrol", "requeue", f"{a},{b}"]:  # Slurm is first for b
            assert inner(["scontrol", "requeue", b], timeout_s).returncode == 0
        return inner(argv, timeout_s)

    got = CliSlurm(runner=runner, timeout_s=10).requeue_jobs({a: 0, b: 0, c: 0, hold: 0, "999999": 0})
    assert [c_[:3] for c_ in calls] == [["squeue", "--noheader", f"--jobs={a},{b},{c},{hold},999999"],
                                       ["scontrol", "requeue", f"{a},{b}"], ["squeue", "--noheader", f"--jobs={b}"]]
    assert got[a].requeued and got[a].error is None
    assert not got[b].requeued and got[b].error is None and got[b].skipped, got[b]  # pending, or running again
    assert got[c].skipped.startswith("Slurm has not preempted it") and got["999999"].skipped == "gone"
    assert isinstance(got[hold].error, NotOursError)
    restarts = {j: job(slurm, j).restart_count for j in jobs}  # type: ignore[union-attr]
    assert restarts == {a: 1, b: 1, c: 0}  # each requeued once, never twice


def test_an_admins_down_node_that_stops_responding_keeps_their_reason(slurm_clean: Sandbox) -> None:
    """Issue 21 point 5 on the real Slurm: DOWN by an administrator, then its slurmd dies: Slurm
    keeps their reason (DOWN*), and gpu-bridge's drain never replaces it."""
    sb, slurm = slurm_clean, slurm_for(slurm_clean)
    node = "gpu-node-03"
    sb.run_slurm(["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=PSU swap ticket 4711"])
    sb.kill_process(f"slurmd:{node}")
    n = wait_until(lambda: (x := slurm.node(node)) and not x.responding and x, 60, "node not responding")
    assert n.state == "down" and n.reason == "PSU swap ticket 4711", n  # type: ignore[union-attr]
    assert slurm.drain(node, "serving (pool default)") is False
    assert slurm.node(node).reason == "PSU swap ticket 4711"
