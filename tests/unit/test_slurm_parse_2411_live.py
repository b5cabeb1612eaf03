"""Output recorded from a live Slurm 24.11.5 (Debian 13, the sandbox run from its tree; see
tests/fixtures/slurm/README.md): gpu-node-01 runs research job 1 publishing its checkpoint and
save-on-signal time, gpu-node-02 drained by gpu-bridge with our hold job 3 pending on it,
gpu-node-03 drained by an administrator, gpu-node-04 DOWN by an administrator, job 4 pending
for two nodes with a malformed checkpoint comment."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.adapters.slurm.parse import parse_jobs, parse_nodes
from bridge.adapters.slurm.parse import parse_scontrol_node
from bridge.errors import AdapterError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def text(name: str) -> str:
    return (FIX / name).read_text()


def test_per_node_sinfo_keeps_each_nodes_drain_reason() -> None:
    nodes = {n.name: n for n in parse_nodes(text("sinfo-24.11-live.json"))}
    assert list(nodes) == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    n1, n2, n3, n4 = nodes.values()
    assert n1.state == "mixed" and n1.gpus == 4 and n1.gpus_used == 4 and not n1.drained and n1.allocated
    assert n2.drained_by_us and n2.reason == "gpu-bridge: serving (pool default)" and n2.reason_user == "root"
    assert n2.reason_time is not None and n2.gpus_used == 0
    assert n3.drained_by_other and n3.reason == "maintenance: bad fan"
    assert n4.state == "down" and n4.down and n4.responding and n4.reason == "admin: power"
    assert all(set(n.partitions) == {"preempt", "gpu-bridge"} for n in nodes.values())


def test_grouped_sinfo_of_the_same_cluster_is_refused() -> None:
    # without --Node, 24.11 put gpu-node-02 (ours) and gpu-node-03 (the admin's) in one entry
    # with a single reason: reading it would take the admin's drain for ours
    with pytest.raises(AdapterError, match=r"2 nodes in one entry \(\['gpu-node-02', 'gpu-node-03'\]\)"):
        parse_nodes(text("sinfo-24.11-live-grouped.json"))


def test_squeue_live() -> None:
    jobs = {j.job_id: j for j in parse_jobs(text("squeue-24.11-live.json"))}
    assert list(jobs) == ["1", "3", "4"]
    j1, hold, j4 = jobs["1"], jobs["3"], jobs["4"]
    assert j1.state == "running" and j1.nodes == ("gpu-node-01",) and j1.gpus_per_node == 4
    assert j1.checkpoint_time == 1796290000.0 and j1.signal_save_s == 30.0 and j1.requeueable
    assert j1.preempt_time is None and j1.start_time is not None and j1.batch_host == "gpu-node-01"
    assert hold.is_hold and hold.hold_node == "gpu-node-02" and hold.state == "pending" and hold.nodes == ()
    assert j4.state == "pending" and j4.checkpoint_time is None and j4.gpus_per_node == 4


def test_scontrol_oneliner_live() -> None:
    n = parse_scontrol_node(text("scontrol-node-24.11-live.txt"))
    assert n.name == "gpu-node-02" and n.state == "idle" and n.drained_by_us and n.gpus == 4
    assert n.reason == "gpu-bridge: serving (pool default)" and n.reason_user == "root"
