"""``set_tier`` is a crash point (``bridge.actuate.TIER_POINT``): the daemon killed right after a
lend put a node in the fast partition, before the lend's first mark (the node still serving,
drained and held by us in Slurm), restarts from nothing but the nodes and converges: the
nodes lent, each in exactly its tier's partition as observe reads it, fast jobs only on
fast-tier nodes, never a research job beside a serving pod, no job lost."""

from __future__ import annotations

from bridge import wellknown as wk
from bridge.actuate import TIER_POINT
from bridge.daemon import Daemon
from bridge.model import Phase, Tier
from tests.unit.test_daemon_fast_tier import FAST, fast_world
from tests.unit.test_daemon_loop import HIGH, LOW, NODES


class Crash(BaseException):
    """The injected SIGKILL: not an AdapterError, nothing of the process survives it."""


def test_a_crash_right_after_set_tier_converges_with_the_tier_consistent() -> None:
    w = fast_world()
    crashes: list[str] = []
    seen: list[str] = []
    armed = False

    def hook(point: str) -> None:
        seen.append(point)
        if armed and point == TIER_POINT and not crashes:
            crashes.append(point)
            raise Crash(point)

    def daemon() -> Daemon:
        d = w.new_daemon()
        d.actuator.after_write = hook
        return d

    def tick(n: int = 1) -> None:
        for _ in range(n):
            try:
                w.tick()
            except Crash:
                w.daemon = daemon()  # restarted from what is on the nodes only
            pods = {p.node for p in w.kube.pods("default") if p.node}
            for job in w.slurm.snapshot().values():  # both research tiers, every node
                if job.state == "running" and job.partition in (wk.SLURM_PREEMPT_PARTITION, FAST):
                    assert not pods & set(job.nodes), f"{job.job_id} beside a serving pod on {job.nodes}"

    def until(cond: object, limit: int, what: str) -> None:
        for _ in range(limit):
            if cond():  # type: ignore[operator]
                return
            tick()
        raise AssertionError(f"not {what} after {limit} ticks: {w.phases()}")

    w.daemon = daemon()
    w.load = HIGH  # adopted first, every node drained in Slurm: nothing runs beside a pod
    until(lambda: all(w.slurm._nodes[n].drained for n in NODES) and w.count(Phase.SERVING) == 4, 10, "adopted")
    w.load, armed = LOW, True
    jobs = [w.slurm.add_job(name=f"eval-{i}", partition=FAST) for i in range(3)]
    until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    tick(3)
    assert crashes == [TIER_POINT] and seen.count(TIER_POINT) >= 2  # crashed once, written again after
    lent = {n.name: n.tier for n in w.daemon.ledger.last_observation.view.nodes if n.phase is Phase.LENT}  # type: ignore[union-attr]
    assert len(lent) == 3 and Tier.FAST in lent.values()
    for node, tier in lent.items():  # exactly one tier partition, the one observe read
        want = FAST if tier is Tier.FAST else wk.SLURM_PREEMPT_PARTITION
        assert w.slurm.node(node).partitions == tuple(sorted((wk.SLURM_HOLD_PARTITION, want)))
    running = [j for j in w.slurm.jobs() if j.job_id in jobs and j.state == "running"]
    assert running and all(lent.get(n) is Tier.FAST for j in running for n in j.nodes)

    w.load = HIGH
    until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 60, "all serving again")
    snap = w.slurm.snapshot()
    assert all(snap[j].state in ("pending", "running", "completed") for j in jobs)  # requeued, none lost
    assert all(snap[j.job_id].restart_count == 1 for j in running)  # type: ignore[attr-defined]
