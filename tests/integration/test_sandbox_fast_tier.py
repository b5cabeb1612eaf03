"""The fast-grace tier end to end on the sandbox's real Slurm (`Sandbox(fast_grace_s=...)`,
`gpu-bridge sandbox up --fast-grace-s`), reclaimed the way gpu-bridge reclaims, driven with
Slurm's own commands (not the daemon): a hold job in partition `gpu-bridge` pinned to the lent
node, then `scontrol requeue` of victims still running once their grace has passed.

Two lent nodes, one fast-tier job on each, both reclaimed at once:
- a job that saves on the signal (`--comment=gpu-bridge:save-on-signal=1`, traps the default
  URG, exits $GPU_BRIDGE_REQUEUE_EXIT): requeued by Slurm as soon as it exits, its node held
  within about a second or two;
- a short job (`--time=5`) that ignores the signal: runs on to the end of the fast grace, is
  requeued then, its node held after ~the fast grace instead of the normal tier's.
Neither is cancelled: both are PENDING again with Restarts=1, same job id.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_fixtures import SlurmOnly, slurm_only

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 30
FAST_GRACE_S = 4
FAST = "preempt-fast"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _script(name: str) -> str:
    text = (ROOT / "slurm_conf" / name).read_text()
    for key, value in (("GRACE_S", GRACE_S), ("FAST_GRACE_S", FAST_GRACE_S)):
        text, n = re.subn(rf"^local {key} = \d+", f"local {key} = {value}", text, flags=re.M)
        assert n == 1
    return text


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmOnly]:
    lua = tmp_path_factory.mktemp("lua")
    (lua / "job_submit.lua").write_text(_script("job_submit.lua"))
    (lua / "cli_filter.lua").write_text(_script("cli_filter.lua"))
    with slurm_only(nodes=2, grace_s=GRACE_S, fast_grace_s=FAST_GRACE_S, job_submit_lua=lua / "job_submit.lua",
                    cli_filter_lua=lua / "cli_filter.lua") as c:
        yield c


def _wait(cond: Callable[[], bool], timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if cond():
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout_s} s")


def test_the_sandbox_made_the_fast_partition(cluster: SlurmOnly) -> None:
    got = dict(re.findall(r"(\w+)=(\S*)", cluster.run(["scontrol", "-o", "show", "partition", FAST]).stdout))
    assert (got["GraceTime"], got["PreemptMode"], got["Nodes"]) == (str(FAST_GRACE_S), "REQUEUE", "gpu-node-[01-02]")
    assert cluster.sb.state("up")["fast_grace_s"] == FAST_GRACE_S


def test_a_reclaimed_fast_tier_node_requeues_its_job_within_the_fast_grace(cluster: SlurmOnly) -> None:
    loop = "for i in $(seq 600); do sleep 0.1; done"
    saver_out, short_out = cluster.work / "saver.out", cluster.work / "short.out"
    saver_script = (f'echo "start $SLURM_RESTART_COUNT grace=$GPU_BRIDGE_GRACE_S"; '
                    f'trap \'echo "URG $(date +%s.%N)"; sleep 0.5; echo saved; exit $GPU_BRIDGE_REQUEUE_EXIT\' URG; {loop}')
    jobs = {}
    for node, out, extra, script in (
        ("gpu-node-01", saver_out, ["--comment=gpu-bridge:save-on-signal=1"], saver_script),
        ("gpu-node-02", short_out, ["--time=5"], f'echo "start $SLURM_RESTART_COUNT"; {loop}'),
    ):
        r = cluster.run(["sbatch", "--parsable", "-p", FAST, "-w", node, "-o", str(out), "--open-mode=append",
                         *extra, "--wrap", script], user="nobody")
        assert r.returncode == 0, r.stderr
        jobs[node] = r.stdout.strip()
    _wait(lambda: all(cluster.job(j).get("JobState") == "RUNNING" for j in jobs.values())
          and saver_out.exists() and short_out.exists() and "start" in saver_out.read_text(), 30)
    assert f"grace={FAST_GRACE_S}" in saver_out.read_text()
    time.sleep(0.5)

    # reclaim both nodes as gpu-bridge does: a hold job pinned to each
    t0 = time.monotonic()
    holds = {}
    for node in jobs:
        r = cluster.run(["sbatch", "--parsable", "-p", "gpu-bridge", "-J", f"gpu-bridge-hold:{node}", "-w", node,
                         "-o", "/dev/null", "--wrap", "exec sleep 600"])
        assert r.returncode == 0, r.stderr
        holds[node] = r.stdout.strip()

    def held(node: str) -> bool:
        return cluster.job(holds[node]).get("JobState") == "RUNNING"

    # the saver heard the signal at once, saved, exited 75: Slurm requeued it and the node is held
    t_saver = _wait(lambda: held("gpu-node-01"), FAST_GRACE_S + 10) - t0
    assert "URG" in saver_out.read_text() and "saved" in saver_out.read_text()
    # the short job ignores URG: still running until its grace is over, then requeued (the
    # daemon's step: `scontrol requeue` once EndTime has passed; Slurm's own sweep may be later)
    victim = cluster.job(jobs["gpu-node-02"])
    assert victim["JobState"] == "RUNNING", victim
    _wait(lambda: time.monotonic() - t0 > FAST_GRACE_S + 1, FAST_GRACE_S + 5)
    r = cluster.run(["scontrol", "requeue", jobs["gpu-node-02"]])
    assert r.returncode == 0 or cluster.job(jobs["gpu-node-02"]).get("Restarts") == "1", r.stderr  # or the sweep did
    t_short = _wait(lambda: held("gpu-node-02"), 15) - t0

    for node, job in jobs.items():
        got = cluster.job(job)
        assert got["Restarts"] == "1" and got["JobState"] == "PENDING", (node, got)  # requeued, never cancelled
    print(f"fast tier (GraceTime {FAST_GRACE_S} s, normal {GRACE_S} s): node held after {t_saver:.1f} s "
          f"(job saved on the signal and exited 75), {t_short:.1f} s (job ignoring the signal)")
    assert t_saver < FAST_GRACE_S
    assert FAST_GRACE_S <= t_short < GRACE_S
