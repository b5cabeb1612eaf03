"""``gpu-bridge check-slurm`` against a real slurmctld (Slurm 22.05): the sandbox's Slurm, set
up as slurm_conf/ says, fits (exit 0); then settings made deliberately wrong on the running
controller (a GraceTime other than the config's, a partition sharing the lendable node, a hold
partition that can be preempted) are each named with the key and why (exit 1); a cluster
without the Lua plugins is told so. The command only reads: its Slurm calls are argv lists
through the adapter (``scontrol show config``, ``scontrol --oneliner show partition``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import cli
from bridge.config import default_config, to_dict
from gpu_bridge_lab.sandbox.daemon_config import write_config
from sandbox_fixtures import SlurmOnly, slurm_only

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 7

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmOnly]:
    with slurm_only(nodes=1, grace_s=GRACE_S, job_submit_lua=ROOT / "slurm_conf" / "job_submit.lua",
                    cli_filter_lua=ROOT / "slurm_conf" / "cli_filter.lua") as c:
        yield c


def _config(c: SlurmOnly, tmp_path: Path, **slurm: object) -> Path:
    doc = to_dict(default_config())
    doc["slurm"]["grace_s"] = GRACE_S
    doc["slurm"].update(slurm)
    doc["slurm"]["slurm_conf"] = c.sb.slurm_env()["SLURM_CONF"]
    return write_config(tmp_path / "gpu-bridge.yaml", doc)


def _check(c: SlurmOnly, tmp_path: Path, capsys: pytest.CaptureFixture[str], **slurm: object) -> tuple[int, list[str]]:
    rc = cli.main(["check-slurm", "--config", str(_config(c, tmp_path, **slurm))])
    out = capsys.readouterr().out
    return rc, [ln for ln in out.splitlines() if ln.startswith("PROBLEM ")]


def test_the_sandbox_slurm_fits(cluster: SlurmOnly, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, problems = _check(cluster, tmp_path, capsys)
    assert (rc, problems) == (0, [])


def test_wrong_settings_on_the_running_controller_are_each_named(
    cluster: SlurmOnly, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def scontrol(*args: str) -> None:
        r = cluster.run(["scontrol", *args])
        assert r.returncode == 0, r.stderr

    scontrol("update", "PartitionName=preempt", f"GraceTime={GRACE_S + 30}")
    scontrol("update", "PartitionName=gpu-bridge", "PreemptMode=REQUEUE")
    scontrol("create", "PartitionName=batch", "Nodes=gpu-node-01", "PriorityTier=1", "State=UP")
    try:
        rc, problems = _check(cluster, tmp_path, capsys)
    finally:
        scontrol("delete", "PartitionName=batch")
        scontrol("update", "PartitionName=gpu-bridge", "PreemptMode=OFF")
        scontrol("update", "PartitionName=preempt", f"GraceTime={GRACE_S}")
    assert rc == 1
    assert problems == [
        f"PROBLEM PartitionName=preempt GraceTime = {GRACE_S + 30}: differs from slurm.grace_s ({GRACE_S} s in the "
        "config): gpu-bridge would requeue jobs before their checkpoint time is over, or wait for nothing",
        "PROBLEM PartitionName=gpu-bridge PreemptMode = REQUEUE: needs OFF: a hold job is never preempted",
        "PROBLEM PartitionName=batch Nodes = gpu-node-01: shares gpu-node-01 with preempt: a job of partition batch "
        "on a lent node could not be preempted, and the node could not be reclaimed",
    ]
    rc, problems = _check(cluster, tmp_path, capsys)  # put back: fits again
    assert (rc, problems) == (0, [])


def test_a_cluster_without_the_lua_plugins_is_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with slurm_only(nodes=1, grace_s=GRACE_S) as c:
        rc, problems = _check(c, tmp_path, capsys)
    assert rc == 1
    assert [p.split(":")[0] for p in problems] == ["PROBLEM JobSubmitPlugins = (not set)", "PROBLEM CliFilterPlugins = (not set)"]


def test_the_fast_tier_partition_is_checked_when_configured(
    cluster: SlurmOnly, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """slurm.fast_partition set: missing -> named; created as the snippet says -> fits; a
    GraceTime other than slurm.fast_grace_s on the running controller -> named."""
    fast = {"fast_partition": "preempt-fast", "fast_grace_s": 3}
    rc, problems = _check(cluster, tmp_path, capsys, **fast)
    assert rc == 1 and [p.split(" = ")[0] for p in problems] == ["PROBLEM PartitionName=preempt-fast"]
    r = cluster.run(["scontrol", "create", "PartitionName=preempt-fast", "Nodes=gpu-node-01", "PriorityTier=1",
                     "PreemptMode=REQUEUE", "GraceTime=3", "OverTimeLimit=2", "State=UP"])
    assert r.returncode == 0, r.stderr
    try:
        rc, problems = _check(cluster, tmp_path, capsys, **fast)
        assert (rc, problems) == (0, [])
        rc, problems = _check(cluster, tmp_path, capsys)  # not configured: an unknown partition on the node
        assert rc == 1 and [p.split(" = ")[0] for p in problems] == ["PROBLEM PartitionName=preempt-fast Nodes"]
        assert cluster.run(["scontrol", "update", "PartitionName=preempt-fast", "GraceTime=5"]).returncode == 0
        rc, problems = _check(cluster, tmp_path, capsys, **fast)
    finally:
        cluster.run(["scontrol", "delete", "PartitionName=preempt-fast"])
    assert rc == 1
    assert problems == [
        "PROBLEM PartitionName=preempt-fast GraceTime = 5: differs from slurm.fast_grace_s (3 s in the config): "
        "gpu-bridge would plan the tier's nodes as released sooner or later than Slurm releases them",
    ]
