"""Lending a node to a tier: the actuator puts it in that tier's partition only (``scontrol
update PartitionName=P Nodes=...``, into the new one first), the tier then lives in Slurm and is
read back by observe; the normal tier's jobs cannot start on a fast-tier node; a fast-tier job
preempted by a reclaim is requeued after the fast grace, not the normal one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from bridge import wellknown as wk
from bridge.actuate import Actuator
from bridge.adapters.slurm.cli import CliSlurm, CommandResult
from bridge.errors import AdapterError
from bridge.model import Action, ActionKind, Reason, Tier
from gpu_bridge_lab.fakes.kube import FakeKube
from gpu_bridge_lab.fakes.slurm import FakeSlurm

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
FAST = "preempt-fast"


class PartitionRunner:
    """``scontrol --oneliner show partition`` from the 22.05 recording plus a preempt-fast line
    with ``fast_nodes``; every update recorded."""

    def __init__(self, preempt_nodes: str = "gpu-node-[01-02]", fast_nodes: str = "gpu-node-[01-02]") -> None:
        lines = (FIX / "show-partition-22.05.txt").read_text().splitlines()
        preempt = next(line for line in lines if line.startswith("PartitionName=preempt "))
        rest = [line for line in lines if not line.startswith("PartitionName=preempt ")]
        old = next(w for w in preempt.split() if w.startswith("Nodes="))
        self.text = "\n".join([preempt.replace(old, f"Nodes={preempt_nodes}"),
                               preempt.replace("PartitionName=preempt ", f"PartitionName={FAST} ")
                               .replace(old, f"Nodes={fast_nodes}").replace("Default=YES", "Default=NO"), *rest]) + "\n"
        self.updates: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        if list(argv) == ["scontrol", "--oneliner", "show", "partition"]:
            return CommandResult(0, self.text, "")
        self.updates.append(list(argv))
        return CommandResult(0, "", "")


def test_cli_moves_a_node_into_its_tier_partition_first_then_out_of_the_other() -> None:
    r = PartitionRunner()
    a = CliSlurm(runner=r, fast_partition=FAST)
    assert a.set_tier("gpu-node-01", FAST) is True
    # both partitions had both nodes: only the way out of preempt is written
    assert r.updates == [["scontrol", "update", "PartitionName=preempt", "Nodes=gpu-node-02"]]

    r = PartitionRunner(preempt_nodes="gpu-node-02", fast_nodes="gpu-node-01")
    a = CliSlurm(runner=r, fast_partition=FAST)
    assert a.set_tier("gpu-node-01", "preempt") is True
    assert r.updates == [["scontrol", "update", "PartitionName=preempt", "Nodes=gpu-node-02,gpu-node-01"],
                         ["scontrol", "update", f"PartitionName={FAST}", "Nodes="]]
    r.updates.clear()
    r2 = PartitionRunner(preempt_nodes="gpu-node-02", fast_nodes="gpu-node-01")
    assert CliSlurm(runner=r2, fast_partition=FAST).set_tier("gpu-node-01", FAST) is False  # already so
    assert r2.updates == []


@pytest.mark.parametrize(("fast", "partition", "nodes", "match"), [
    (None, FAST, "gpu-node-01", "not a tier partition"),  # no fast tier configured
    (FAST, "gpu-bridge", "gpu-node-01", "not a tier partition"),  # never the hold partition
    (FAST, FAST, "ALL", "Nodes=ALL"),  # a list it cannot edit without rewriting the site's intent
])
def test_cli_refuses_what_it_cannot_do_honestly(fast: str | None, partition: str, nodes: str, match: str) -> None:
    r = PartitionRunner(preempt_nodes=nodes)
    with pytest.raises(AdapterError, match=match):
        CliSlurm(runner=r, fast_partition=fast).set_tier("gpu-node-01", partition)
    assert r.updates == []


def _lend(slurm: FakeSlurm, node: str, tier: Tier) -> None:
    kube = FakeKube()
    kube.add_node(node, "default", labels={wk.LABEL_PHASE: "serving"})
    act = Actuator(kube=kube, slurm=slurm, clock=lambda: slurm.now,
                   tiers={Tier.NORMAL: wk.SLURM_PREEMPT_PARTITION, Tier.FAST: FAST})
    act.start(Action(ActionKind.LEND, node, "default", Reason.LOW_FORECAST, "lend", tier=tier), now=slurm.now)


def test_a_node_lent_to_the_fast_tier_takes_only_fast_jobs_and_releases_them_in_the_fast_grace() -> None:
    slurm = FakeSlurm(grace_s=30, fast_partition=FAST, fast_grace_s=4)
    slurm.add_node("gpu-node-01")
    _lend(slurm, "gpu-node-01", Tier.FAST)
    assert slurm.node("gpu-node-01").partitions == (wk.SLURM_HOLD_PARTITION, FAST)
    normal = slurm.add_job("gpu-node-01")
    fast = slurm.add_job("gpu-node-01", partition=FAST)
    states = {j.job_id: j.state for j in slurm.jobs()}
    assert (states[normal], states[fast]) == ("pending", "running")
    # lent back to the normal tier later: in preempt only
    _lend(slurm, "gpu-node-01", Tier.NORMAL)
    assert slurm.node("gpu-node-01").partitions == (wk.SLURM_HOLD_PARTITION, wk.SLURM_PREEMPT_PARTITION)
    # a reclaim: the fast job gets the fast grace
    slurm.submit_hold("gpu-node-01")
    (job,) = [j for j in slurm.jobs() if j.job_id == fast]
    assert job.end_time is not None and job.preempt_time is not None and job.end_time - job.preempt_time == 4
    assert slurm.requeue(fast) is True  # the daemon may requeue a fast-tier victim


def test_without_a_fast_tier_the_actuator_writes_no_partition() -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-node-01")
    kube = FakeKube()
    kube.add_node("gpu-node-01", "default", labels={wk.LABEL_PHASE: "serving"})
    Actuator(kube=kube, slurm=slurm, clock=lambda: slurm.now).start(
        Action(ActionKind.LEND, "gpu-node-01", "default", Reason.LOW_FORECAST, "lend", tier=Tier.FAST), now=slurm.now)
    assert ("set_tier", "gpu-node-01") not in slurm.writes


def test_fast_tier_reclaims_measured_feed_the_fast_horizon_only() -> None:
    """Each tier plans with its own measured release: fast-tier delays move ``fast_horizon_s``
    (never below the configured fast horizon), the normal horizon stays configured."""
    from bridge.config import default_config, replace
    from bridge.model import PoolState
    from bridge.policy.forecast import horizon_s
    from bridge.policy.memory import PoolMemory

    c = default_config()
    c = replace(c, slurm=replace(c.slurm, fast_partition=FAST, fast_grace_s=15))
    pool = c.pools[0]
    mem = PoolMemory(c, pool)
    before = mem.pool_state(PoolState(name=pool.name, signals=None), 0.0, 4)
    assert before.fast_horizon_s is None and before.horizon_s is None  # too few samples: the configured ones
    for _ in range(c.policy.calibration.delay_min_samples):
        mem.add_delay(horizon_s(c, pool, fast=True) + 200.0, Tier.FAST)  # fast reclaims slower than configured
    after = mem.pool_state(PoolState(name=pool.name, signals=None), 0.0, 4)
    assert after.horizon_s is None
    assert after.fast_horizon_s is not None and after.fast_horizon_s > horizon_s(c, pool, fast=True) + 200.0
    assert mem.delays == [] and len(mem.fast_delays) == c.policy.calibration.delay_min_samples
