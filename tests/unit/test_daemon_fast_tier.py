"""The daemon with a fast-grace tier, on the fakes: fast-tier jobs waiting make it lend nodes to
the fast tier (the partition is set in Slurm before the node is marked lending), those nodes run
only fast-tier jobs, and on a load spike they are reclaimed within the fast grace, their jobs
requeued (never cancelled); the reclaim is measured and exported under tier="fast"."""

from __future__ import annotations

from bridge import wellknown as wk
from bridge.config import replace
from bridge.metrics import BridgeMetrics
from bridge.model import Phase, Tier
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from tests.unit.test_daemon_loop import HIGH, NODES, World, config

FAST = "preempt-fast"


def fast_world() -> World:
    w = World()
    c = config()
    w.config = replace(c, slurm=replace(c.slurm, fast_partition=FAST, fast_grace_s=2))
    w.slurm = FakeSlurm(grace_s=5, now=w.t, fast_partition=FAST, fast_grace_s=2)
    for n in NODES:
        w.slurm.add_node(n)
    w.daemon = w.new_daemon()
    w.daemon.ledger.metrics = BridgeMetrics()  # exported, to read the per-tier latencies back
    return w


def test_fast_backlog_is_lent_to_the_fast_tier_and_reclaimed_within_the_fast_grace() -> None:
    w = fast_world()
    w.tick(1)  # adopted: every node drained and held
    jobs = [w.slurm.add_job(name=f"eval-{i}", partition=FAST) for i in range(3)]
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    w.tick(2)
    tiers = {n.name: n.tier for n in w.daemon.ledger.last_observation.view.nodes if n.phase is Phase.LENT}
    fast = sorted(n for n, t in tiers.items() if t is Tier.FAST)
    assert len(tiers) == 3 and fast  # the policy's split: part of the lent nodes go to the fast backlog
    for n, t in tiers.items():  # each lent node in its tier's partition only, as observe read it
        want = FAST if t is Tier.FAST else wk.SLURM_PREEMPT_PARTITION
        assert w.slurm.node(n).partitions == tuple(sorted((wk.SLURM_HOLD_PARTITION, want)))
    running = [j for j in w.slurm.jobs() if j.job_id in jobs and j.state == "running"]
    assert running and all(set(j.nodes) <= set(fast) for j in running)  # fast jobs only on fast-tier nodes

    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 60, "all serving again")
    assert all(w.job(j.job_id).restart_count == 1 for j in running)  # type: ignore[attr-defined]
    sample = w.daemon.ledger.metrics.registry.get_sample_value
    release = {t: (sample("gpu_bridge_reclaim_phase_duration_seconds_count", {"pool": "default", "phase": "slurm_release", "tier": t, "mode": "cold"}) or 0,
                   sample("gpu_bridge_reclaim_phase_duration_seconds_sum", {"pool": "default", "phase": "slurm_release", "tier": t, "mode": "cold"}) or 0)
               for t in ("fast", "normal")}
    assert release["fast"][0] == len(fast) and release["normal"][0] == 3 - len(fast)
    # released in about the fast grace (2 s) plus a tick, not the normal one (5 s)
    assert release["fast"][1] / release["fast"][0] <= 2 + 2
    mem = w.daemon.memory["default"]
    assert len(mem.fast_delays) == len(fast) and len(mem.delays) == 3 - len(fast)
    assert not w.violations
