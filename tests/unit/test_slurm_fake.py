"""FakeSlurm follows the same rules as the real Slurm seen on the sandbox, so the daemon's
tests can use it: the reclaim sequence (hold -> grace -> requeue -> hold runs -> drain), a
drained node blocks the hold, only our drains are lifted, failures are raised."""

from __future__ import annotations

import pytest

from bridge.adapters.protocols import SlurmAdapterProtocol, SlurmReader, SlurmWriter
from bridge.adapters.slurm.cli import NotOursError
from gpu_bridge_lab.fakes.slurm import FakeSlurm, holds_of
from bridge.errors import AdapterError


def cluster() -> FakeSlurm:
    s = FakeSlurm(grace_s=10)
    for i in (1, 2, 3):
        s.add_node(f"gpu-node-0{i}")
    return s


def test_protocols() -> None:
    s = cluster()
    assert isinstance(s, SlurmReader) and isinstance(s, SlurmWriter)
    _: SlurmAdapterProtocol = s


def test_reclaim_sequence() -> None:
    s = cluster()
    jid = s.add_job("gpu-node-02", comment="gpu-bridge:checkpoint=999")
    job = s.jobs(node="gpu-node-02")[0]
    assert job.state == "running" and job.checkpoint_time == 999.0
    hold = s.submit_hold("gpu-node-02")
    assert s.submit_hold("gpu-node-02") == hold
    assert holds_of(s)["gpu-node-02"].state == "pending"
    victim = s.snapshot()[jid]
    assert victim.preempt_time == s.now and victim.end_time == s.now + 10
    s.advance(5)
    assert s.snapshot()[jid].state == "running"  # still in its grace
    s.advance(5)
    after = s.snapshot()[jid]
    assert after.state in ("pending", "running") and after.restart_count == 1
    assert holds_of(s)["gpu-node-02"].state == "running"
    assert "gpu-node-02" not in after.nodes  # restarted elsewhere (or waiting), never on the held node
    assert s.drain("gpu-node-02", "serving") is True
    # lend again: cancel the hold, lift our drain
    assert s.cancel_hold("gpu-node-02") == (hold,)
    assert s.resume("gpu-node-02") is True


def test_early_requeue_and_slurm_lag() -> None:
    s = cluster()
    s.requeue_lag_s = 30
    jid = s.add_job("gpu-node-01")
    s.submit_hold("gpu-node-01")
    s.advance(11)
    assert s.snapshot()[jid].state == "running"  # slurmctld has not noticed yet
    victim = s.snapshot()[jid]
    assert victim.grace_over(s.now)
    assert s.requeue(jid) is True
    assert holds_of(s)["gpu-node-01"].state == "running"


def test_hold_waits_on_a_drained_node() -> None:
    s = cluster()
    s.drain("gpu-node-03", "serving")
    s.submit_hold("gpu-node-03")
    assert holds_of(s)["gpu-node-03"].state == "pending"  # ReqNodeNotAvail, as in real Slurm
    s.resume("gpu-node-03")
    assert holds_of(s)["gpu-node-03"].state == "running"


def test_admin_drain_is_never_ours() -> None:
    s = cluster()
    s.admin_drain("gpu-node-01", "maintenance")
    assert s.drain("gpu-node-01", "serving") is False
    with pytest.raises(NotOursError):
        s.resume("gpu-node-01")
    assert s.node("gpu-node-01").reason == "maintenance"


def test_dead_slurmd_requeues_and_failures() -> None:
    s = cluster()
    jid = s.add_job("gpu-node-01")
    s.set_responding("gpu-node-01", False)
    assert not s.node("gpu-node-01").responding and s.snapshot()[jid].restart_count == 1
    assert s.drain("gpu-node-01", "serving") is True  # a rebooting node is drained too
    s.fail["nodes"] = AdapterError("slurm", "sinfo --json failed (rc 1): Unable to contact slurm controller")
    with pytest.raises(AdapterError, match="Unable to contact"):
        s.nodes()
    with pytest.raises(AdapterError):
        s.drain("gpu-node-02", "x")  # the lookup inside fails: no blind write
    assert [w for w in s.writes if w[1] == "gpu-node-02"] == []
    with pytest.raises(NotOursError):
        s.requeue(s.submit_hold("gpu-node-03"))
