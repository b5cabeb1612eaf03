"""The Slurm side of the fenced wrapper (the Kubernetes side is in test_kube_adapter_fake.py):
same Protocols as what it wraps, reads through, writes refused once the Lease is lost; and,
for both, every write of the Protocols fenced (the wrappers are made from them)."""

from __future__ import annotations

import pytest

from bridge.adapters.protocols import (
    KubeAdapterProtocol, KubeReader, KubeWriter, SlurmAdapterProtocol, SlurmReader, SlurmWriter,
)
from bridge.adapters.wrappers import FencedKube, FencedSlurm, NotLeaderError
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


class _Recorder:
    """An adapter that records every method called on it (by name) and returns None."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def __getattr__(self, name: str) -> object:
        return lambda *a, **k: self.called.append(name)


def _public_methods(protocol: type) -> list[str]:
    """Every method a Protocol declares, its bases' too (``dir``, not the wrapper's own enumeration)."""
    return sorted(n for n in dir(protocol) if not n.startswith("_") and callable(getattr(protocol, n)))


@pytest.mark.parametrize(("wrapper", "reader", "writer", "whole"), [
    (FencedKube, KubeReader, KubeWriter, KubeAdapterProtocol),
    (FencedSlurm, SlurmReader, SlurmWriter, SlurmAdapterProtocol),
], ids=["kubernetes", "slurm"])
def test_every_write_of_the_protocol_is_fenced_and_every_read_passes(
    wrapper: type, reader: type, writer: type, whole: type,
) -> None:
    """Made from the Protocols, the wrapper has every method of the adapter's Protocol; with the
    Lease lost each write raises before the adapter sees it, each read still reaches it."""
    writes, reads = _public_methods(writer), _public_methods(reader)
    assert writes and reads
    missing = [n for n in _public_methods(whole) if not callable(getattr(wrapper, n, None))]
    assert missing == [], f"{wrapper.__name__} lacks {missing}"
    inner, leader = _Recorder(), FakeLeader()
    fenced = wrapper(inner, leader)
    leader.leader = False
    for name in writes:
        with pytest.raises(NotLeaderError, match=f"{name} refused: not the leader"):
            getattr(fenced, name)("x")
    assert inner.called == []
    for name in reads:
        getattr(fenced, name)()
    assert inner.called == reads
    leader.leader = True
    for name in writes:
        getattr(fenced, name)("x")
    assert inner.called == reads + writes
