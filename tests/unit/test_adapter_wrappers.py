"""The Slurm side of the fenced wrapper (the Kubernetes side is in test_kube_adapter_fake.py):
same Protocols as what it wraps, reads through, writes refused once the Lease is lost."""

from __future__ import annotations

import pytest

from bridge.adapters.protocols import SlurmAdapterProtocol
from bridge.adapters.wrappers import FencedSlurm, NotLeaderError
from gpu_bridge_lab.fakes.kube import FakeLeader
from gpu_bridge_lab.fakes.slurm import FakeSlurm, holds_of


def _slurm() -> FakeSlurm:
    s = FakeSlurm()
    for n in ("gpu-node-01", "gpu-node-02"):
        s.add_node(n)
    return s


def test_fenced_slurm_writes_only_while_leader() -> None:
    s, leader = _slurm(), FakeLeader()
    fenced = FencedSlurm(s, leader)
    assert isinstance(fenced, SlurmAdapterProtocol)
    assert fenced.drain("gpu-node-01", "serving") is True
    hold = fenced.submit_hold("gpu-node-02")
    leader.leader = False  # the Lease lapsed mid-step
    with pytest.raises(NotLeaderError, match=r"^slurm: resume refused: not the leader"):
        fenced.resume("gpu-node-01")
    with pytest.raises(NotLeaderError):
        fenced.cancel_hold("gpu-node-02")
    assert fenced.node("gpu-node-01").drained_by_us  # reads still work
    assert holds_of(fenced)["gpu-node-02"].job_id == hold
    leader.leader = True
    assert fenced.cancel_hold("gpu-node-02") == (hold,)
    assert s.writes == [("drain", "gpu-node-01"), ("submit_hold", "gpu-node-02"), ("cancel_hold", "gpu-node-02")]


def test_fenced_slurm_drains_a_pass_s_nodes_only_while_leader() -> None:
    s, leader = _slurm(), FakeLeader()
    fenced = FencedSlurm(s, leader)
    leader.leader = False
    with pytest.raises(NotLeaderError, match=r"^slurm: drain_nodes refused: not the leader"):
        fenced.drain_nodes({"gpu-node-01": "serving", "gpu-node-02": "serving"})
    assert s.writes == [] and s.calls["drain_nodes"] == 0
    leader.leader = True
    assert fenced.drain_nodes({"gpu-node-01": "serving", "gpu-node-02": "serving"}) == {"gpu-node-01": True, "gpu-node-02": True}
    assert s.writes == [("drain", "gpu-node-01"), ("drain", "gpu-node-02")] and s.calls["drain_nodes"] == 1
