"""slurm_conf/job_submit.lua and cli_filter.lua on a real slurmctld (Slurm 22.05).

The cluster runs with JobRequeue=0, so a job that ends up requeueable proves the script set it.
Covered: --no-requeue rejected in `preempt` (and allowed elsewhere), requeue forced, the
`gpu-bridge` partition and hold job names (and warm lending's `gpu-bridge-warm` and memory-hold
names) refused to other users with a clear message, the
bridge (root, and the uid BRIDGE_UIDS names: `daemon` here) may use them and rename its jobs,
`scontrol update Requeue=0` refused, a move into `preempt` refused unless it sets Requeue=1
(a --no-requeue job would be lost at the reclaim), GPU_BRIDGE_GRACE_S
exported, and the default --signal=B:URG@<grace> (cli_filter): it reaches a batch shell that
traps it as soon as a hold job preempts the job, and does not kill one that does not (SIGUSR1
would: the job would end FAILED during GraceTime and never be requeued).
"""

from __future__ import annotations

import pwd
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import wellknown as wk

from sandbox_fixtures import SlurmOnly, slurm_only

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 4
BRIDGE_USER = "daemon"  # a non-root user standing for gpu-bridge's own (BRIDGE_UIDS)
VIEW_USER = "sys"  # a user (not the other tests' "nobody") standing for gpu-bridge web's (READ_ONLY_UIDS)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
]


def lua_with_grace(name: str, grace_s: int) -> str:
    """The shipped script with only its GRACE_S site setting changed to the test partition's."""
    text = (ROOT / "slurm_conf" / name).read_text()
    text, n = re.subn(r"^local GRACE_S = \d+", f"local GRACE_S = {grace_s}", text, flags=re.M)
    assert n == 1, f"{name}: GRACE_S setting not found"
    if name == "job_submit.lua":
        uid = pwd.getpwnam(BRIDGE_USER).pw_uid
        text, n = re.subn(r"^local BRIDGE_UIDS = \{ \}", f"local BRIDGE_UIDS = {{ [{uid}] = true }}", text, flags=re.M)
        assert n == 1, f"{name}: BRIDGE_UIDS setting not found"
        view = pwd.getpwnam(VIEW_USER).pw_uid
        text, n = re.subn(r"^local READ_ONLY_UIDS = \{ \}", f"local READ_ONLY_UIDS = {{ [{view}] = true }}", text, flags=re.M)
        assert n == 1, f"{name}: READ_ONLY_UIDS setting not found"
    return text


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmOnly]:
    lua = tmp_path_factory.mktemp("lua")
    (lua / "job_submit.lua").write_text(lua_with_grace("job_submit.lua", GRACE_S))
    (lua / "cli_filter.lua").write_text(lua_with_grace("cli_filter.lua", GRACE_S))
    with slurm_only(
        nodes=1,
        grace_s=GRACE_S,
        job_requeue=0,  # so a requeueable job proves the script set it
        job_submit_lua=lua / "job_submit.lua",
        cli_filter_lua=lua / "cli_filter.lua",
        extra_slurm_conf="PartitionName=batch Nodes=gpu-node-01 PriorityTier=1 PreemptMode=OFF MaxTime=INFINITE State=UP",
    ) as c:
        yield c


def submit(c: SlurmOnly, *args: str, user: str | None = None) -> tuple[int, str, str]:
    r = c.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", *args, "--wrap", "sleep 30"], user=user)
    return r.returncode, r.stdout.strip(), r.stderr.strip()


def show_job(c: SlurmOnly, job_id: str) -> dict[str, str]:
    return c.job(job_id)


def test_the_web_views_uid_cannot_submit_a_job_but_reads(cluster: SlurmOnly) -> None:
    """gpu-bridge web's Slurm identity only reads: slurmctld refuses any job it submits (and it
    owns none to change: the script refuses its updates too, and Slurm others' jobs)."""
    for part in ("preempt", "batch"):
        rc, out, err = submit(cluster, "-p", part, user=VIEW_USER)
        assert rc != 0 and "read-only (gpu-bridge web)" in err, (part, out, err)
    rc, job, err = submit(cluster, "-p", "preempt")  # someone's job
    assert rc == 0, err
    r = cluster.run(["squeue", "--noheader", "-j", job, "-o", "%i"], user=VIEW_USER)  # reading works
    assert r.returncode == 0 and r.stdout.strip() == job, r.stderr
    cluster.run(["scancel", job])


def test_no_requeue_rejected_in_preempt(cluster: SlurmOnly) -> None:
    rc, _, err = submit(cluster, "-p", "preempt", "--no-requeue")
    assert rc != 0
    assert "gpu-bridge: jobs in partition 'preempt' must be requeueable" in err
    assert "Drop --no-requeue" in err


def test_no_requeue_rejected_in_default_partition(cluster: SlurmOnly) -> None:
    rc, _, err = submit(cluster, "--no-requeue")  # preempt is Default=YES
    assert rc != 0 and "must be requeueable" in err


def test_preempt_jobs_are_made_requeueable(cluster: SlurmOnly) -> None:
    rc, job, err = submit(cluster, "-p", "preempt")
    assert rc == 0, err
    assert show_job(cluster, job)["Requeue"] == "1"  # JobRequeue=0 here: the script set it
    rc, job, err = submit(cluster, "-p", "batch")
    assert rc == 0, err
    assert show_job(cluster, job)["Requeue"] == "0"  # other partitions untouched


def test_no_requeue_allowed_outside_preempt(cluster: SlurmOnly) -> None:
    rc, _, err = submit(cluster, "-p", "batch", "--no-requeue")
    assert rc == 0, err


def test_requeue_cannot_be_switched_off_later(cluster: SlurmOnly) -> None:
    rc, job, err = submit(cluster, "-p", "preempt")
    assert rc == 0, err
    r = cluster.run(["scontrol", "update", f"JobId={job}", "Requeue=0"])
    assert r.returncode != 0
    assert show_job(cluster, job)["Requeue"] == "1"


def test_hold_partition_refused_to_other_users(cluster: SlurmOnly) -> None:
    rc, _, err = submit(cluster, "-p", "gpu-bridge", user="nobody")
    assert rc != 0
    assert "gpu-bridge: partition 'gpu-bridge' is reserved for gpu-bridge's placeholder jobs" in err


def test_hold_job_name_refused_to_other_users(cluster: SlurmOnly) -> None:
    rc, _, err = submit(cluster, "-p", "preempt", "-J", "gpu-bridge-hold:gpu-node-01", user="nobody")
    assert rc != 0
    assert "job names starting with 'gpu-bridge-hold:' are reserved for gpu-bridge" in err


@pytest.mark.parametrize(("args", "problem"), [
    (["-p", wk.SLURM_WARM_PARTITION], f"partition '{wk.SLURM_WARM_PARTITION}' is reserved for gpu-bridge's memory holds"),
    (["-p", "preempt", "-J", wk.SLURM_WARM_HOLD_JOB_PREFIX + "gpu-node-01"],
     f"job names starting with '{wk.SLURM_WARM_HOLD_JOB_PREFIX}' are reserved for gpu-bridge"),
], ids=["partition", "job-name"])
def test_warm_lendings_memory_holds_are_the_bridges_too(cluster: SlurmOnly, args: list[str], problem: str) -> None:
    """A fake memory hold would keep a node counted as lent warm: refused to others, by name and
    partition, on submission and on a rename; the bridge's uid may use them."""
    rc, _, err = submit(cluster, *args, user="nobody")
    assert rc != 0 and problem in err, err
    rc, job, err = submit(cluster, "-p", "preempt", user="nobody")
    assert rc == 0, err
    r = cluster.run(["scontrol", "update", f"JobId={job}", f"Name={wk.SLURM_WARM_HOLD_JOB_PREFIX}gpu-node-01"], user="nobody")
    assert r.returncode != 0 and show_job(cluster, job)["JobName"] == "wrap"
    rc, _, err = submit(cluster, "-p", "preempt", "-J", wk.SLURM_WARM_HOLD_JOB_PREFIX + "gpu-node-01", user=BRIDGE_USER)
    assert rc == 0, err


@pytest.mark.parametrize("flag", ["--no-requeue", "--requeue"])
def test_a_move_into_preempt_must_make_the_job_requeueable(cluster: SlurmOnly, flag: str) -> None:
    """job_rec does not show a job's requeue flag: a move into preempt must set Requeue=1."""
    rc, job, err = submit(cluster, "-p", "batch", flag, user="nobody")
    assert rc == 0, err
    r = cluster.run(["scontrol", "update", f"JobId={job}", "Partition=preempt"], user="nobody")
    assert r.returncode != 0
    assert show_job(cluster, job)["Partition"] == "batch"
    r = cluster.run(["scontrol", "update", f"JobId={job}", "Partition=preempt", "Requeue=1"], user="nobody")
    assert r.returncode == 0, r.stderr
    got = show_job(cluster, job)
    assert (got["Partition"], got["Requeue"]) == ("preempt", "1")


def test_the_bridge_is_known_by_its_uid_when_it_modifies_too(cluster: SlurmOnly) -> None:
    """The bridge's (non-root) uid may name its own jobs as holds; the same rename by another
    user is refused (identity: the uid slurmctld authenticated, modify_uid)."""
    rc, job, err = submit(cluster, "-p", "preempt", user=BRIDGE_USER)
    assert rc == 0, err
    r = cluster.run(["scontrol", "update", f"JobId={job}", "Name=gpu-bridge-hold:gpu-node-01"], user=BRIDGE_USER)
    assert r.returncode == 0, r.stderr
    assert show_job(cluster, job)["JobName"] == "gpu-bridge-hold:gpu-node-01"
    rc, _, err = submit(cluster, "-p", "preempt", "-J", "gpu-bridge-hold:gpu-node-01", user=BRIDGE_USER)
    assert rc == 0, err


def test_hold_job_name_refused_on_modify(cluster: SlurmOnly) -> None:
    rc, job, err = submit(cluster, "-p", "preempt", user="nobody")
    assert rc == 0, err
    r = cluster.run(["scontrol", "update", f"JobId={job}", "Name=gpu-bridge-hold:gpu-node-01"], user="nobody")
    assert r.returncode != 0
    assert show_job(cluster, job)["JobName"] == "wrap"


def test_owner_may_publish_checkpoint_comment(cluster: SlurmOnly) -> None:
    """What the example job does as its (non-root) owner; job_submit.lua's modify hook allows it."""
    rc, job, err = submit(cluster, "-p", "preempt", user="nobody")
    assert rc == 0, err
    r = cluster.run(["scontrol", "update", f"JobId={job}", "Comment=gpu-bridge:checkpoint=1796000000"], user="nobody")
    assert r.returncode == 0, r.stderr
    assert show_job(cluster, job)["Comment"] == "gpu-bridge:checkpoint=1796000000"


def test_interactive_srun_in_preempt_works(cluster: SlurmOnly) -> None:
    """srun/salloc jobs carry no batch environment: the script must not trip over that."""
    r = cluster.run(["srun", "-p", "preempt", "-t", "1", "true"], timeout=60)
    assert r.returncode == 0, r.stderr


def test_bridge_may_submit_hold_jobs(cluster: SlurmOnly) -> None:
    rc, job, err = submit(cluster, "-p", "gpu-bridge", "-J", "gpu-bridge-hold:gpu-node-01", "-w", "gpu-node-01")
    assert rc == 0, err
    assert show_job(cluster, job)["Partition"] == "gpu-bridge"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-p", "preempt"], f"B:URG@{GRACE_S}"),
        ([], f"B:URG@{GRACE_S}"),  # default partition is preempt
        (["-p", "preempt", "--signal=B:TERM@30"], "B:TERM@30"),  # the user's own signal is kept
    ],
    ids=["preempt", "default-partition", "explicit-signal-kept"],
)
def test_cli_filter_default_signal(cluster: SlurmOnly, args: list[str], expected: str) -> None:
    r = cluster.run(["sbatch", "-v", "--parsable", "--hold", "-o", "/dev/null", *args, "--wrap", "true"])
    assert r.returncode == 0, r.stderr
    assert re.search(r"signal\s+:\s+" + re.escape(expected), r.stderr), r.stderr


def test_cli_filter_leaves_other_partitions_alone(cluster: SlurmOnly) -> None:
    r = cluster.run(["sbatch", "-v", "--parsable", "--hold", "-o", "/dev/null", "-p", "batch", "--wrap", "true"])
    assert r.returncode == 0, r.stderr
    assert "signal" not in r.stderr


def test_default_signal_on_preemption(cluster: SlurmOnly) -> None:
    """End to end, no --signal given: a hold job preempts two jobs; the one that traps URG hears
    it at once (and knows its grace from GPU_BRIDGE_GRACE_S), the one that does not keeps
    running; both are requeued, not lost."""
    cluster.run(["scancel", "-u", "root"])
    loop = "for i in $(seq 240); do sleep 0.25; done"
    aware_out, plain_out = cluster.work / "aware.out", cluster.work / "plain.out"
    aware_script = f'echo "grace=$GPU_BRIDGE_GRACE_S requeue_exit=$GPU_BRIDGE_REQUEUE_EXIT"; trap \'echo "URG $(date +%s)"\' URG; {loop}'
    jobs = []
    for out, script in ((aware_out, aware_script), (plain_out, f"echo start; {loop}")):
        r = cluster.run(["sbatch", "--parsable", "-p", "preempt", "-n1", "-o", str(out), "--wrap", script])
        assert r.returncode == 0, r.stderr
        jobs.append(r.stdout.strip())
    aware, plain = jobs
    _wait(lambda: all(show_job(cluster, j).get("JobState") == "RUNNING" for j in jobs) and plain_out.exists()
          and aware_out.exists(), 20)
    time.sleep(0.5)
    t0 = time.time()
    r = cluster.run(["sbatch", "--parsable", "-p", "gpu-bridge", "-J", "gpu-bridge-hold:gpu-node-01", "-w",
                     "gpu-node-01", "-o", "/dev/null", "--wrap", "sleep 1"])
    assert r.returncode == 0, r.stderr
    _wait(lambda: "URG" in aware_out.read_text(), 10)
    text = aware_out.read_text()
    assert "grace=%d" % GRACE_S in text
    assert "requeue_exit=%d" % wk.SLURM_REQUEUE_EXIT in text
    got = int(re.search(r"URG (\d+)", text).group(1))  # type: ignore[union-attr]
    assert got - t0 < GRACE_S  # at the start of GraceTime, not at its end
    time.sleep(1.0)
    assert show_job(cluster, plain)["JobState"] == "RUNNING"  # the default signal did not kill it
    # slurmctld enforces the end of GraceTime only on its 30 s time-limit sweep; requeue now,
    # as gpu-bridge does once the grace has passed.
    time.sleep(max(0.0, t0 + GRACE_S - time.time()))
    cluster.run(["scontrol", "requeue", f"{aware},{plain}"])
    for j in jobs:
        _wait(lambda j=j: show_job(cluster, j).get("Restarts") == "1", 20)


def _wait(cond, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout_s} s")
