"""slurm_conf/examples/train-checkpointing.sbatch on the sandbox's real Slurm, with the shipped
job_submit.lua and cli_filter.lua installed.

Two identical jobs run side by side; one is preempted mid-run by a hold job in the
`gpu-bridge` partition pinned to its node (exactly how gpu-bridge reclaims a node), and
requeued by Slurm itself as soon as it exits after saving (RequeueExit). Checked:
the preempted job got SIGUSR1 and checkpointed, was requeued (Restarts=1) within its grace, resumed from its
checkpoint (not from step 0), published `Comment=gpu-bridge:checkpoint=<t>`, and finished with
the same result as the uninterrupted job and as the workload computed in-process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_fixtures import SlurmOnly, slurm_only

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "slurm_conf" / "examples"
GRACE_S = 5
STEPS, STEP_S, CKPT_EVERY = 60, 0.25, 10  # 15 s of "training"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(150),
]


def lua_with_grace(name: str) -> str:
    text = (ROOT / "slurm_conf" / name).read_text()
    text, n = re.subn(r"^local GRACE_S = \d+", f"local GRACE_S = {GRACE_S}", text, flags=re.M)
    assert n == 1
    return text


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmOnly]:
    lua = tmp_path_factory.mktemp("lua")
    (lua / "job_submit.lua").write_text(lua_with_grace("job_submit.lua"))
    (lua / "cli_filter.lua").write_text(lua_with_grace("cli_filter.lua"))
    with slurm_only(nodes=2, grace_s=GRACE_S, job_submit_lua=lua / "job_submit.lua",
                    cli_filter_lua=lua / "cli_filter.lua") as c:
        yield c


def expected_result() -> str:
    """The workload's answer, computed in-process with its own step function."""
    spec = importlib.util.spec_from_file_location("train_example", EXAMPLES / "train.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    state = 0
    for step in range(STEPS):
        state = mod.step_fn(state, step)
    return f"{state:016x}"


def wait_for(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_preempted_job_resumes_from_checkpoint_with_same_result(cluster: Cluster) -> None:
    for f in ("train.py", "train-checkpointing.sbatch"):
        shutil.copy(EXAMPLES / f, cluster.work / f)
    env_args = f"--export=ALL,TRAIN_STEPS={STEPS},STEP_S={STEP_S},CKPT_EVERY={CKPT_EVERY}"
    t_start = time.time()
    ids = {}
    for name in ("steady", "preempted"):
        r = cluster.run(["sbatch", "--parsable", "--exclusive", env_args, "-J", f"train-{name}",
                         "-o", str(cluster.work / f"{name}.out"), "train-checkpointing.sbatch"])
        assert r.returncode == 0, r.stderr
        ids[name] = r.stdout.strip()
    victim = ids["preempted"]
    log_b = cluster.work / "preempted.out"

    # Let it get a few steps in, then reclaim its node the way gpu-bridge does.
    wait_for(lambda: log_b.exists() and "starting from step 0" in log_b.read_text(), 30, "the victim to start")
    time.sleep(2.0)
    node = cluster.job(victim)["NodeList"]
    r = cluster.run(["sbatch", "--parsable", "-p", "gpu-bridge", "-J", f"gpu-bridge-hold:{node}", "-w", node,
                     "-o", "/dev/null", "--wrap", "sleep 2"])
    assert r.returncode == 0, r.stderr
    t_hold = time.time()
    hold = r.stdout.strip()
    wait_for(lambda: "on SIGUSR1" in log_b.read_text(), 10, "the pre-preemption signal checkpoint")
    # It saved and exited with GPU_BRIDGE_REQUEUE_EXIT: Slurm requeued it by itself (RequeueExit),
    # before its GraceTime was over, with no one running `scontrol requeue`.
    wait_for(lambda: cluster.job(victim).get("Restarts") == "1", GRACE_S, "Slurm to requeue the victim (RequeueExit)")
    assert time.time() - t_hold < GRACE_S
    wait_for(lambda: cluster.job(hold).get("JobState") in ("RUNNING", "COMPLETED"), 30, "the hold job to run")

    def done(job_id: str) -> bool:
        return cluster.job(job_id).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

    wait_for(lambda: done(ids["steady"]) and done(victim), 90, "both jobs to finish")
    elapsed = time.time() - t_start
    print(f"both jobs finished {elapsed:.1f} s after submission")

    steady, preempted = cluster.job(ids["steady"]), cluster.job(victim)
    log_a, text_b = (cluster.work / "steady.out").read_text(), log_b.read_text()
    assert steady["JobState"] == "COMPLETED" and steady["Restarts"] == "0", log_a
    assert preempted["JobState"] == "COMPLETED", text_b
    assert preempted["Restarts"] == "1", text_b

    # The first run got the pre-preemption signal and checkpointed; the second resumed from it.
    assert re.search(r"checkpoint at step \d+ on SIGUSR1", text_b), text_b
    assert "job %s restart 1" % victim in text_b, text_b
    resumed = re.search(r"resumed from step (\d+) \(restart 1\)", text_b)
    assert resumed and 0 < int(resumed.group(1)) < STEPS, text_b
    assert text_b.count("starting from step 0") == 1, text_b

    # The published checkpoint time, for the bridge's victim choice.
    comment = preempted.get("Comment", "")
    assert comment.startswith("gpu-bridge:checkpoint="), preempted
    ckpt, save = comment.split(",")
    assert t_start - 1 <= int(ckpt.split("=", 1)[1]) <= time.time() + 1
    # and how long a checkpoint on the signal takes: one step (STEP_S) + the save + 1 s, rounded up
    assert save.startswith("gpu-bridge:save-on-signal=") and 1 <= int(save.split("=", 1)[1]) <= 5, comment

    result_a = (cluster.work / f"result-{ids['steady']}.txt").read_text().strip()
    result_b = (cluster.work / f"result-{victim}.txt").read_text().strip()
    assert result_a == result_b == expected_result()
    assert os.path.exists(cluster.work / f"ckpt-{victim}" / "checkpoint.json")
