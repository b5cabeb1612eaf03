"""The soak's end-of-run judgements on synthetic evidence: they can fail."""

from __future__ import annotations

import json
import os
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path

from bridge.adapters.kube.lease import default_identity
from gpu_bridge_lab.sandbox import soak as S
from gpu_bridge_lab.sandbox.e2e import lease_identity


class _H:
    def __init__(self, d: Path) -> None:
        self.dir = d
        self.job_dir = d


def _soak(d: Path) -> S.Soak:
    so = S.Soak.__new__(S.Soak)
    so.h = _H(d)  # type: ignore[assignment]
    so.violations, so.noop_reruns, so.lost, so.ctld_kills, so.slurm_double_starts = [], [], [], [], []
    so.failed_by_slurm = []
    so.lock = threading.Lock()
    so.say = lambda _s: None
    so.t0 = 0.0
    so.daemon_ends = {}
    so.jobs = {}
    return so


def _job(so: S.Soak, d: Path, units: list[str], runs: list[str], n: int = 3) -> None:
    (d / "units-t1").write_text("".join(x + "\n" for x in units))
    (d / "runs-t1").write_text("".join(x + "\n" for x in runs))
    so.jobs["7"] = S.SoakJob("t1", "7", n, "save", states=["RUNNING", "COMPLETED"])


def test_exactly_once_accepts_a_resumed_job_and_a_noop_rerun(tmp_path: Path) -> None:
    so = _soak(tmp_path)
    _job(so, tmp_path, ["unit 0 7 0", "unit 1 7 1", "unit 2 7 1", "done 7 1", "done 7 2"],
         ["start 7 0 0 1", "start 7 1 1 2", "start 7 2 3 3"])
    so.check_jobs()
    assert so.violations == [] and len(so.noop_reruns) == 1


def test_exactly_once_rejects_a_unit_done_twice(tmp_path: Path) -> None:
    so = _soak(tmp_path)
    _job(so, tmp_path, ["unit 0 7 0", "unit 1 7 0", "unit 1 7 1", "unit 2 7 1", "done 7 1"],
         ["start 7 0 0 1", "start 7 1 1 2"])
    so.check_jobs()
    assert [v.kind for v in so.violations] == ["job-work"] and "once each in order" in so.violations[0].evidence


def test_exactly_once_rejects_a_rerun_that_works_after_done_and_a_bad_final_state(tmp_path: Path) -> None:
    so = _soak(tmp_path)
    _job(so, tmp_path, ["unit 0 7 0", "unit 1 7 0", "unit 2 7 0", "done 7 0", "unit 0 7 1"],
         ["start 7 0 0 1", "start 7 1 0 2"])
    so.jobs["7"].states.append("TIMEOUT")
    so.check_jobs()
    text = so.violations[0].evidence
    assert "after the job was done" in text and "final state TIMEOUT" in text


def _log(path: Path, events: list[tuple[float, str, dict[str, object]]]) -> None:
    with open(path, "w") as f:
        for t, ev, extra in events:
            ts = datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")
            f.write(json.dumps({"timestamp": ts, "event": ev, **extra}) + "\n")


def test_lease_writes_flags_a_write_while_another_daemon_led(tmp_path: Path) -> None:
    so = _soak(tmp_path)
    base = 1_796_000_000.0
    # A leads 0..20 (pauses at 10; B takes over at 16); A writes at 18 before it notices
    _log(tmp_path / "daemon-01-soak.log", [
        (base, "lease_acquired", {}), (base + 5, "node_step", {"changed": True, "step": "fence", "node": "n1"}),
        (base + 18, "node_step", {"changed": True, "step": "drain", "node": "n2"}),
        (base + 20, "leadership_lost", {})])
    _log(tmp_path / "daemon-02-soak-second.log", [
        (base + 16, "lease_expired_taking_over", {}), (base + 17, "node_step", {"changed": True, "step": "unfence", "node": "n3"}),
        (base + 30, "lease_released", {})])
    so.check_lease_writes()
    assert len(so.violations) == 1
    assert "daemon-01-soak.log wrote node_step drain on n2" in so.violations[0].evidence
    assert "daemon-02-soak-second.log led" in so.violations[0].evidence


def test_lease_writes_flags_a_write_outside_any_leadership(tmp_path: Path) -> None:
    so = _soak(tmp_path)
    base = 1_796_000_000.0
    _log(tmp_path / "daemon-01-soak.log", [(base, "node_step", {"changed": True, "step": "drain", "node": "n2"})])
    so.check_lease_writes()
    assert len(so.violations) == 1 and "outside its leadership" in so.violations[0].evidence


def test_purged_jobs_reads_slurmctlds_log(tmp_path: Path) -> None:
    log = tmp_path / "slurmctld.log"
    log.write_text("[2026-12-03T10:15:02.586] Purged files for defunct batch JobId=80\n"
                   "[2026-12-03T10:15:03.560] _slurm_rpc_submit_batch_job: JobId=80 InitPrio=1 usec=826\n")
    got = S.purged_jobs(log)
    assert list(got) == ["80"] and len(got["80"]) == 1


def test_a_run_started_twice_around_a_slurmctld_sigkill_is_slurms(tmp_path: Path) -> None:
    # seed 201: job 45 started on node 03, slurmctld SIGKILLed before saving that, restarted
    # it on node 01 with the same restart count while the first still ran: unit 6 twice
    units = ["unit 0 7 0", "unit 1 7 0", "unit 2 7 0", "done 7 0", "unit 2 7 0", "done 7 0"]
    runs = ["start 7 0 0 100.0", "start 7 0 2 117.0"]
    so = _soak(tmp_path)
    _job(so, tmp_path, units, runs)
    so.ctld_kills = [110.0]
    so.check_jobs()
    assert so.violations == [] and "again at 117.0 s after a slurmctld SIGKILL at 110.0 s" in so.slurm_double_starts[0]
    so = _soak(tmp_path)  # the same without a SIGKILL between the starts: a violation
    _job(so, tmp_path, units, runs)
    so.ctld_kills = [90.0]
    so.check_jobs()
    assert [v.kind for v in so.violations] == ["job-work"] and so.slurm_double_starts == []


class _Slurm:
    def __init__(self, log: Path) -> None:
        self.log = log

    def ctld_log(self) -> Path:
        return self.log


def _failed_job(tmp_path: Path, kills: list[float], log_line: str) -> S.Soak:
    """Seed 306's job 60: run started at 100.0 s, slurmctld SIGKILLed (kills), Slurm failed it."""
    so = _soak(tmp_path)
    log = tmp_path / "slurmctld.log"
    log.write_text(log_line)
    so.h.sb = type("SB", (), {"slurm": _Slurm(log)})()  # type: ignore[attr-defined]
    _job(so, tmp_path, ["unit 0 7 0", "unit 1 7 0"], [f"start 7 0 0 {BASE + 100.0}"], n=4)
    so.jobs["7"].states = ["PENDING", "FAILED"]
    so.jobs["7"].ended_badly = "job 7 (t1, save) FAILED on gpu-node-02"
    so.ctld_kills = [BASE + k for k in kills]
    return so


BASE = datetime(2026, 12, 3, 14, 14, 0).timestamp()  # local time, as slurmctld stamps its log
REVOKED = "[2026-12-03T14:15:50.120] Killing non-startable batch JobId=7: Job credential revoked\n"


def test_a_run_whose_start_a_sigkill_lost_and_slurm_then_failed_is_reported_apart(tmp_path: Path) -> None:
    so = _failed_job(tmp_path, [103.0], REVOKED)
    so.judge_bad_ends()
    so.check_jobs()
    assert so.violations == [] and "failed by slurmctld on restart" in so.failed_by_slurm[0]


def test_a_failed_run_without_that_evidence_is_a_violation(tmp_path: Path) -> None:
    for kills, line in (([120.0], REVOKED),  # SIGKILL long after the start: the start was saved
                        ([103.0], "[2026-12-03T14:15:50.120] _job_complete: JobId=7 WEXITSTATUS 1\n"),
                        ([], REVOKED)):
        so = _failed_job(tmp_path, kills, line)
        so.judge_bad_ends()
        so.check_jobs()
        assert [v.kind for v in so.violations] == ["job-ended-badly", "job-work"], (kills, line)
        assert so.failed_by_slurm == []


def test_lease_identity_reads_the_daemons_lease_identity() -> None:
    assert lease_identity(default_identity()) == (socket.gethostname(), os.getpid())
    assert lease_identity("gpu-host-a-1234-9fdd5f") == ("gpu-host-a", 1234)
    assert lease_identity("vm-1234") is None and lease_identity("") is None


def _reliability_script():  # type: ignore[no-untyped-def]
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "reliability.py"
    spec = importlib.util.spec_from_file_location("reliability_script", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_soak_arguments_are_checked_before_anything_starts(capsys) -> None:  # type: ignore[no-untyped-def]
    mod = _reliability_script()
    assert mod.main(["--soak", "--seed", "7,x"]) == 2
    assert "--seed: expected an integer or a comma list of integers, got '7,x'" in capsys.readouterr().out
    assert mod.main(["--soak", "--seed", "7", "--duration", "0"]) == 2
    assert "--duration: must be > 0 seconds, got 0" in capsys.readouterr().out
    assert mod.main(["--soak", "--seed", "7", "--faults", "apiserver_pause,kubelet_kill"]) == 2
    assert "--faults: no such soak fault kubelet_kill (the soak's: daemon_kill, " in capsys.readouterr().out
    assert mod.main(["--soak", "--seed", "7", "--faults", ","]) == 2
    assert "--faults: no fault named (the soak's: daemon_kill, " in capsys.readouterr().out


def test_the_soak_draws_only_the_faults_it_is_given() -> None:
    import argparse

    from gpu_bridge_lab.sandbox.soak import FAULTS

    mod = _reliability_script()
    assert mod.soak_faults(argparse.Namespace(faults="")) == FAULTS
    assert mod.soak_faults(argparse.Namespace(faults=" etcd_pause, slurmd_kill ")) == ("etcd_pause", "slurmd_kill")
    assert mod.soak_args_problem(argparse.Namespace(seed="3", duration=60.0, faults="etcd_pause,apiserver_pause")) == ""
    assert {"apiserver_pause", "etcd_pause", "slurmd_kill", "slurmctld_pause"} <= set(FAULTS)
