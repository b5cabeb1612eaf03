"""The fast-grace tier on a real slurmctld (Slurm 22.05): slurm_conf's `preempt-fast` partition
line (uncommented, as an administrator enables it), job_submit.lua's rule that keeps a job's
tier honest, and cli_filter.lua's default signal for it.

The cluster runs with JobRequeue=0, so a fast-tier job that ends up requeueable proves the
script set it. Covered: a job in the fast tier must be short (--time <= 60 min) or declare
saving on the signal within the fast grace (--comment=gpu-bridge:save-on-signal=<s>), on
submission and on every update (a longer time limit, a comment that drops the declaration, a
move in from `preempt`); --no-requeue refused there too; the default --signal=B:URG@<fast
grace> (the shorter grace for a list naming both tiers) and GPU_BRIDGE_GRACE_S.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_fixtures import SlurmOnly, slurm_only

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 20
FAST_GRACE_S = 4
FAST = "preempt-fast"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
]


def script(name: str) -> str:
    """The shipped script with only its grace site settings changed to this cluster's."""
    text = (ROOT / "slurm_conf" / name).read_text()
    for key, value in (("GRACE_S", GRACE_S), ("FAST_GRACE_S", FAST_GRACE_S)):
        text, n = re.subn(rf"^local {key} = \d+", f"local {key} = {value}", text, flags=re.M)
        assert n == 1, f"{name}: {key} setting not found"
    assert re.search(rf'^local FAST_PARTITION = "{FAST}"', text, flags=re.M), name
    return text


def fast_partition_line() -> str:
    """The snippet's commented `preempt-fast` line, enabled for this one-node cluster."""
    snippet = (ROOT / "slurm_conf" / "slurm.conf.snippet").read_text()
    m = re.search(rf"^#(PartitionName={FAST} .*)$", snippet, flags=re.M)
    assert m, "slurm.conf.snippet: no commented preempt-fast partition line"
    line = m.group(1).replace("gpu-node-[01-16]", "gpu-node-01")
    line, n = re.subn(r"GraceTime=\d+", f"GraceTime={FAST_GRACE_S}", line)
    assert n == 1
    return line


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmOnly]:
    lua = tmp_path_factory.mktemp("lua")
    (lua / "job_submit.lua").write_text(script("job_submit.lua"))
    (lua / "cli_filter.lua").write_text(script("cli_filter.lua"))
    with slurm_only(nodes=1, grace_s=GRACE_S, job_requeue=0, job_submit_lua=lua / "job_submit.lua",
                    cli_filter_lua=lua / "cli_filter.lua", extra_slurm_conf=fast_partition_line()) as c:
        yield c


def submit(c: SlurmOnly, *args: str) -> tuple[int, str, str]:
    r = c.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", *args, "--wrap", "sleep 30"], user="nobody")
    return r.returncode, r.stdout.strip(), r.stderr.strip()


def update(c: SlurmOnly, job: str, *fields: str) -> tuple[int, str]:
    r = c.run(["scontrol", "update", f"JobId={job}", *fields])  # as root: may also lengthen a time limit
    return r.returncode, r.stderr.strip()


def test_the_partition_is_what_the_snippet_says(cluster: SlurmOnly) -> None:
    got = dict(re.findall(r"(\w+)=(\S*)", cluster.run(["scontrol", "-o", "show", "partition", FAST]).stdout))
    assert (got["PreemptMode"], got["GraceTime"], got["PriorityTier"], got["Nodes"]) == (
        "REQUEUE", str(FAST_GRACE_S), "1", "gpu-node-01")


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([], "it is neither short nor declares saving on the signal"),
        (["--time=61"], "it is neither short nor declares saving on the signal"),
        (["--time=120", "--comment=gpu-bridge:checkpoint=1796000000"], "neither short"),
        (["--comment=gpu-bridge:save-on-signal=30"], f"it declares saving in 30 s, more than the tier's {FAST_GRACE_S} s"),
        (["--comment=gpu-bridge:save-on-signal=soon"], "neither short"),  # malformed: no declaration
    ],
    ids=["no-time", "too-long", "checkpoint-only", "slow-save", "malformed-save"],
)
def test_a_job_neither_short_nor_saving_is_refused(cluster: SlurmOnly, args: list[str], why: str) -> None:
    rc, out, err = submit(cluster, "-p", FAST, *args)
    assert rc != 0, out
    assert f"gpu-bridge: partition '{FAST}' is the fast-grace tier" in err, err
    assert why in err and "submit with -p preempt" in err, err


@pytest.mark.parametrize(
    "args",
    [
        ["-p", FAST, "--time=60"],
        ["-p", FAST, "--time=5"],
        ["-p", FAST, f"--comment=gpu-bridge:save-on-signal={FAST_GRACE_S}"],
        ["-p", FAST, "--comment=gpu-bridge:checkpoint=1796000000,gpu-bridge:save-on-signal=2.5"],
        ["-p", f"preempt,{FAST}", "--time=30"],
    ],
    ids=["time-60", "time-5", "save-at-grace", "checkpoint-and-save", "both-tiers"],
)
def test_a_short_or_saving_job_is_accepted_and_made_requeueable(cluster: SlurmOnly, args: list[str]) -> None:
    rc, job, err = submit(cluster, *args)
    assert rc == 0, err
    assert cluster.job(job)["Requeue"] == "1"  # JobRequeue=0 here: the script set it
    cluster.run(["scancel", job])


def test_no_requeue_refused_in_the_fast_tier(cluster: SlurmOnly) -> None:
    rc, _, err = submit(cluster, "-p", FAST, "--time=10", "--no-requeue")
    assert rc != 0 and f"jobs in partition '{FAST}' must be requeueable" in err, err


def test_preempt_is_unchanged(cluster: SlurmOnly) -> None:
    rc, job, err = submit(cluster, "-p", "preempt")  # no --time, no comment: fine in the normal tier
    assert rc == 0, err
    cluster.run(["scancel", job])


def test_an_update_may_not_make_a_short_job_long(cluster: SlurmOnly) -> None:
    rc, job, err = submit(cluster, "-p", FAST, "--time=30")
    assert rc == 0, err
    rc, err = update(cluster, job, "TimeLimit=180")
    assert rc != 0
    assert cluster.job(job)["TimeLimit"] == "00:30:00"
    rc, err = update(cluster, job, "TimeLimit=45")
    assert rc == 0, err
    assert cluster.job(job)["TimeLimit"] == "00:45:00"
    # long again, but saving within the grace, in the same update: fine
    rc, err = update(cluster, job, "TimeLimit=180", f"Comment=gpu-bridge:save-on-signal={FAST_GRACE_S}")
    assert rc == 0, err
    cluster.run(["scancel", job])


def test_a_comment_update_may_not_drop_the_declaration(cluster: SlurmOnly) -> None:
    """What a checkpointing job does when it publishes a checkpoint: it must keep its
    save-on-signal token in the fast tier unless it is short."""
    rc, job, err = submit(cluster, "-p", FAST, "--comment=gpu-bridge:save-on-signal=2")
    assert rc == 0, err
    rc, err = update(cluster, job, "Comment=gpu-bridge:checkpoint=1796000000")
    assert rc != 0
    assert cluster.job(job)["Comment"] == "gpu-bridge:save-on-signal=2"
    rc, err = update(cluster, job, "Comment=gpu-bridge:checkpoint=1796000000,gpu-bridge:save-on-signal=2")
    assert rc == 0, err
    rc, err = update(cluster, job, "Comment=gpu-bridge:save-on-signal=60")  # slower than the grace
    assert rc != 0
    cluster.run(["scancel", job])


def test_a_move_into_the_fast_tier_is_checked(cluster: SlurmOnly) -> None:
    rc, job, err = submit(cluster, "-p", "preempt")
    assert rc == 0, err
    rc, err = update(cluster, job, f"Partition={FAST}", "Requeue=1")  # no time limit, no declaration
    assert rc != 0
    assert cluster.job(job)["Partition"] == "preempt"
    rc, err = update(cluster, job, f"Partition={FAST}", "TimeLimit=20")  # short, but Requeue=1 missing
    assert rc != 0
    rc, err = update(cluster, job, f"Partition={FAST}", "TimeLimit=20", "Requeue=1")
    assert rc == 0, err
    got = cluster.job(job)
    assert (got["Partition"], got["TimeLimit"], got["Requeue"]) == (FAST, "00:20:00", "1")
    cluster.run(["scancel", job])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-p", FAST, "--time=5"], f"B:URG@{FAST_GRACE_S}"),
        (["-p", f"preempt,{FAST}", "--time=5"], f"B:URG@{FAST_GRACE_S}"),  # the shorter grace
        (["-p", "preempt"], f"B:URG@{GRACE_S}"),
        (["-p", FAST, "--time=5", "--signal=B:USR1@3"], "B:USR1@3"),  # the user's own signal is kept
    ],
    ids=["fast", "both-tiers", "normal", "explicit-kept"],
)
def test_cli_filter_default_signal(cluster: SlurmOnly, args: list[str], expected: str) -> None:
    r = cluster.run(["sbatch", "-v", "--parsable", "--hold", "-o", "/dev/null", *args, "--wrap", "true"])
    assert r.returncode == 0, r.stderr
    assert re.search(r"signal\s+:\s+" + re.escape(expected), r.stderr), r.stderr
    cluster.run(["scancel", r.stdout.strip()])


def test_a_fast_job_knows_its_grace(cluster: SlurmOnly) -> None:
    out = cluster.work / "fast-env.out"
    r = cluster.run(["sbatch", "--parsable", "-p", FAST, "--time=1", "-o", str(out), "--wrap",
                     'echo "grace=$GPU_BRIDGE_GRACE_S"'])
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (out.exists() and "grace=" in out.read_text()):
        time.sleep(0.2)
    assert f"grace={FAST_GRACE_S}" in out.read_text()
