"""The fast-grace tier's Slurm writes, FakeSlurm against CliSlurm on the sandbox's real Slurm
with ``preempt-fast`` (``slurm_only(fast_grace_s=...)``): ``set_tier`` makes a node a member of
one tier partition only (read back in ``nodes()``'s partitions), a fast-tier job lands only on
such a node, a hold preempts it with the fast GraceTime, and ``requeue`` requeues it (the
adapter's refusal allows the fast partition) once that grace is over."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from bridge import wellknown as wk
from bridge.adapters.protocols import SlurmAdapterProtocol
from bridge.adapters.slurm.cli import CliSlurm
from gpu_bridge_lab.fakes.slurm import FakeSlurm, holds_of
from sandbox_fixtures import SlurmOnly, slurm_only

T = TypeVar("T")
FAST, GRACE_S, FAST_GRACE_S = "preempt-fast", 30, 4
NODES = ("gpu-node-01", "gpu-node-02")


class Backend:
    def __init__(self, slurm: SlurmAdapterProtocol, submit: Callable[[str], str], now: Callable[[], float],
                 sleep: Callable[[float], None]) -> None:
        self.slurm, self.submit, self.now, self.sleep = slurm, submit, now, sleep

    def eventually(self, check: Callable[[], T], timeout_s: float, what: str) -> T:
        deadline = self.now() + timeout_s
        while not (value := check()):
            assert self.now() < deadline, f"timed out waiting for {what}"
            self.sleep(0.2)
        return value


@pytest.fixture(scope="module")
def real_cluster() -> Iterator[SlurmOnly]:
    with slurm_only(nodes=len(NODES), grace_s=GRACE_S, fast_grace_s=FAST_GRACE_S) as c:
        yield c


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "fake":
        fake = FakeSlurm(grace_s=GRACE_S, fast_partition=FAST, fast_grace_s=FAST_GRACE_S)
        for n in NODES:
            fake.add_node(n)
        return Backend(fake, lambda partition: fake.add_job(partition=partition), lambda: fake.now, fake.advance)
    c: SlurmOnly = request.getfixturevalue("real_cluster")
    import time

    def submit(partition: str) -> str:
        r = c.run(["sbatch", "--parsable", "-p", partition, "--requeue", "--time=5", "--gres=gpu:4", "-o", "/dev/null",
                   "--wrap", "while true; do sleep 0.2; done"], user="nobody")
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().split(";")[0]

    cli = CliSlurm(env=c.sb.slurm_env(), timeout_s=10, fast_partition=FAST)
    return Backend(cli, submit, time.time, time.sleep)


def test_set_tier_and_a_fast_tier_reclaim(backend: Backend) -> None:
    s = backend.slurm
    node, other = NODES
    assert s.set_tier(node, FAST) is True
    assert s.set_tier(node, FAST) is False  # already so
    assert s.set_tier(other, wk.SLURM_PREEMPT_PARTITION) is True
    parts = {n.name: set(n.partitions) - {wk.SLURM_HOLD_PARTITION} for n in s.nodes(NODES)}
    assert parts == {node: {FAST}, other: {wk.SLURM_PREEMPT_PARTITION}}
    jid = backend.submit(FAST)
    job = backend.eventually(lambda: next((j for j in s.jobs() if j.job_id == jid and j.state == "running"), None), 30,
                             "the fast job running")
    assert job.nodes == (node,) and job.partition == FAST  # only the fast-tier node takes it
    s.submit_hold(node)
    victim = backend.eventually(lambda: next((j for j in s.jobs() if j.job_id == jid and j.preempt_time), None), 10,
                                "preempted")
    assert victim.end_time is not None and victim.preempt_time is not None
    assert abs(victim.end_time - victim.preempt_time - FAST_GRACE_S) <= 1  # the fast grace, not the normal one
    while not victim.grace_over(backend.now()):
        backend.sleep(0.2)
    if s.requeue(jid, restart_count=0) is False:  # Slurm's own sweep may have been first
        assert next(j for j in s.jobs() if j.job_id == jid).state != "running"
    backend.eventually(lambda: (h := holds_of(s).get(node)) is not None and h.state == "running", 20, "hold running")
    requeued = next(j for j in s.jobs() if j.job_id == jid)
    assert requeued.state == "pending" and requeued.restart_count == 1  # requeued, never cancelled
    s.cancel_hold(node)
    assert s.set_tier(node, wk.SLURM_PREEMPT_PARTITION) is True  # back to the normal tier: out of the fast one
    assert set(s.node(node).partitions) - {wk.SLURM_HOLD_PARTITION} == {wk.SLURM_PREEMPT_PARTITION}
