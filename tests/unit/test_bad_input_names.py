"""Node and job names with shell metacharacters, option-like or of absurd length, whether
they come from Kubernetes (a pool node's name) or from Slurm (sinfo/squeue output): they are
rejected before any argv is built and never reach a subprocess. Checked at the subprocess
boundary itself (``subprocess.run``/``Popen`` replaced by a recorder) with the real CLI
adapter and its real SubprocessRunner, through the daemon's ticks."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from bridge import wellknown as wk
from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from bridge.adapters.slurm.cli import CliSlurm
from bridge.names import validate_job_id, validate_node_name
from bridge.config import default_config
from bridge.daemon import Daemon
from bridge.errors import AdapterError
from bridge.model import LoadSignals
from tests.slurm_text import scontrol_node, sdiag, squeue_filtered

NOW = 1_767_225_600.0
BAD_NAMES = [
    "gpu;reboot", "$(id)", "`id`", "a|b", "a>b", "a&&b", "n\nx", "n\x00x", "-rf", "--partition=gpu-bridge",
    "*", "gpu node", "gpu'01", 'gpu"01', "gpu\\01", "ｇｐｕ-01", "x" * 64, "x" * 10_000, "", ".hidden", "a/b",
]
GOOD = "gpu-node-01"


class SubprocessRecorder:
    """Replaces subprocess.run/Popen: records argv, answers sinfo/squeue from set texts."""

    def __init__(self, sinfo: str, squeue: str) -> None:
        self.sinfo, self.squeue = sinfo, squeue
        self.argvs: list[list[str]] = []

    def run(self, argv: Any, *args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert isinstance(argv, list), f"not an argv list: {argv!r}"
        assert not kwargs.get("shell"), "shell=True"
        self.argvs.append(list(argv))
        if argv[:4] == ["scontrol", "--oneliner", "show", "node"]:
            return subprocess.CompletedProcess(argv, *scontrol_node(self.sinfo, argv[4]))
        if argv[:2] == ["squeue", "--noheader"]:
            return subprocess.CompletedProcess(argv, *squeue_filtered(self.squeue, argv))
        if argv == ["sdiag"]:
            return subprocess.CompletedProcess(argv, *sdiag(1_800_000_000.0))
        out = {"sinfo": self.sinfo, "squeue": self.squeue}.get(argv[0], "902\n" if argv[0] == "sbatch" else "")
        return subprocess.CompletedProcess(argv, 0, out, "")

    def popen(self, argv: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"Popen called with {argv!r}")


def sinfo(names: Sequence[str], *, drained: bool) -> str:
    return json.dumps({"meta": {}, "errors": [], "nodes": [
        {"name": n, "state": "idle", "state_flags": ["DRAIN"] if drained else [],
         "reason": "gpu-bridge: serving (pool default)" if drained else "", "gres": "gpu:4",
         "partitions": ["preempt"]} for n in names]})


def squeue(jobs: Sequence[dict[str, Any]]) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": list(jobs)})


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> SubprocessRecorder:
    rec = SubprocessRecorder(sinfo([], drained=False), squeue([]))
    monkeypatch.setattr(subprocess, "run", rec.run)
    monkeypatch.setattr(subprocess, "Popen", rec.popen)
    return rec


def assert_clean(rec: SubprocessRecorder, bad: Sequence[str]) -> None:
    for argv in rec.argvs:
        for arg in argv:
            for name in bad:
                if name and name not in ("*",):
                    assert name not in arg or name in GOOD, f"{name!r} reached argv {argv!r}"


@pytest.mark.parametrize("bad", BAD_NAMES, ids=[repr(b[:12]) + f"/{len(b)}" for b in BAD_NAMES])
def test_every_write_rejects_the_name_before_argv(recorder: SubprocessRecorder, bad: str) -> None:
    slurm = CliSlurm()  # the real SubprocessRunner, over the recorder
    for call in (lambda: slurm.drain(bad, "serving"), lambda: slurm.resume(bad), lambda: slurm.submit_hold(bad),
                 lambda: slurm.cancel_hold(bad), lambda: slurm.nodes([bad]), lambda: slurm.jobs(node=bad)):
        with pytest.raises(AdapterError) as info:
            call()
        msg = str(info.value)
        assert "node name" in msg and len(msg) < 300, msg
    assert recorder.argvs == []


@pytest.mark.parametrize("bad", ["1;scancel -u alice", "$(id)", "-1", "1 2", "9" * 13, "1\n2", "", "１２"])
def test_requeue_rejects_a_bad_job_id_before_argv(recorder: SubprocessRecorder, bad: str) -> None:
    with pytest.raises(AdapterError, match="job id"):
        CliSlurm().requeue(bad)
    assert recorder.argvs == []


def test_validators_cap_what_they_show() -> None:
    with pytest.raises(AdapterError) as info:
        validate_node_name("y" * 100_000)
    assert len(str(info.value)) < 300
    with pytest.raises(AdapterError) as info:
        validate_job_id("7" * 100_000)
    assert len(str(info.value)) < 200


def daemon_world(names: Sequence[str], *, phase: str | None, load: float, rec: SubprocessRecorder,
                 jobs: Sequence[dict[str, Any]] = (), drained: bool = False) -> tuple[Daemon, FakeKube]:
    kube = FakeKube(now=NOW)
    for n in names:
        labels = {wk.LABEL_PHASE: phase} if phase else {}
        ann = {wk.ANNOTATION_PHASE_SINCE: f"{NOW - 86400:.3f}"} if phase else {}
        kube.add_node(n, "default", labels=labels, annotations=ann)
    kube.add_pool(PoolTarget("default", "default", "vllm"), replicas=0)
    rec.sinfo, rec.squeue = sinfo(names, drained=drained), squeue(jobs)
    prom = FakeProm()
    prom.set("default", LoadSignals(t=NOW, running=load * 24, waiting=0.0, kv_cache_usage_sum=0.1, tokens_per_s=None,
                                    replicas_reporting=1))
    config = default_config(min_serving=0)
    d = Daemon(config, kube=kube, slurm=CliSlurm(), prom=prom, prom_pools={"default": PromPool("default", "default")},
               clock=lambda: NOW)
    return d, kube


BAD_K8S = [b for b in BAD_NAMES if b]


def test_unadopted_pool_nodes_with_bad_names_never_reach_a_subprocess(recorder: SubprocessRecorder) -> None:
    """Unadopted serving nodes not held in Slurm: the daemon wants to hold and drain them
    (sbatch, scontrol update): only the good node's writes reach argv."""
    d, _kube = daemon_world([GOOD, *BAD_K8S], phase=None, load=2.0, rec=recorder)
    for _ in range(3):
        d.iterate()
    assert_clean(recorder, BAD_K8S)
    writes = [a for a in recorder.argvs if a[1:2] != ["--json"] and a != ["sdiag"]]
    assert writes and all(any(GOOD in arg for arg in a) for a in writes)  # hold job / drain of the good node only


def test_lent_nodes_with_bad_names_are_never_reclaimed_through_argv(recorder: SubprocessRecorder) -> None:
    """Lent nodes under a load spike: a reclaim submits a hold job (sbatch --nodelist NODE
    --job-name gpu-bridge-hold:NODE): never for a bad name."""
    jobs = [{"job_id": 10 + i, "name": "train; rm -rf ~ $(id)", "user_name": "alice", "partition": "preempt",
             "job_state": "RUNNING", "nodes": n, "start_time": int(NOW - 7200)} for i, n in enumerate([GOOD, *BAD_K8S])]
    d, _kube = daemon_world([GOOD, *BAD_K8S], phase="lent", load=50.0, rec=recorder, jobs=jobs)
    for _ in range(3):
        d.iterate()
    assert_clean(recorder, BAD_K8S)
    for argv in recorder.argvs:
        assert "train; rm -rf ~ $(id)" not in argv  # a job's name is data, never an argument
    assert any(a[0] == "sbatch" and GOOD in a for a in recorder.argvs), "the good node is reclaimed"
    plan = d.ledger.last_plan
    assert plan is not None and all(plan.hold_reasons.get(b) == "problem" for b in BAD_K8S)
    assert all(_kube.node(b).phase == "lent" for b in BAD_K8S)  # no transition started on them  # type: ignore[union-attr]


def test_hold_jobs_named_for_bad_nodes_are_never_cancelled_through_argv(recorder: SubprocessRecorder) -> None:
    """squeue lists hold jobs named for nodes with bad names (a hostile or broken Slurm):
    lending those nodes would scancel --name=gpu-bridge-hold:NODE: never built."""
    names = [GOOD, "gpu;reboot", "$(id)", "x" * 500]
    jobs = [{"job_id": 20 + i, "name": wk.SLURM_HOLD_JOB_PREFIX + n, "user_name": "root", "partition": "gpu-bridge",
             "job_state": "RUNNING", "nodes": n, "start_time": int(NOW - 3600)} for i, n in enumerate(names)]
    d, kube = daemon_world(names, phase="lending", load=0.0, rec=recorder, jobs=jobs, drained=True)
    for n in names:
        kube.fence(n)
    for _ in range(3):
        d.iterate()
    assert_clean(recorder, names[1:])
    assert any(a[0] == "scancel" and f"--name={wk.SLURM_HOLD_JOB_PREFIX}{GOOD}" in a for a in recorder.argvs)
