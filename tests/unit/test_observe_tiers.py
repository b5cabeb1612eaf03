"""Which tier each lent node serves and how much of the backlog is fast-tier, read from Slurm
as it reports them (``sinfo --json`` partitions per node, ``squeue --json`` partitions per job),
recorded on the sandbox's Slurm 22.05 with ``preempt-fast`` (tests/fixtures/slurm/README.md):
gpu-node-01 only in ``preempt-fast`` running a fast job, gpu-node-02 only in ``preempt``,
gpu-node-03 in both (as after a reconfigure); pending: one fast, one ``preempt,preempt-fast``,
one normal job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge import wellknown as wk
from bridge.adapters.slurm.parse import parse_jobs, parse_nodes
from bridge.config import Config, default_config, replace
from bridge.errors import AdapterError
from bridge.lifecycle import past_grace
from bridge.model import Tier
from bridge.observe import Observation, Readings, join, node_tier
from gpu_bridge_lab.fakes.kube import FakeKube

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")


def _config(fast: str | None = "preempt-fast") -> Config:
    c = default_config()
    return replace(c, slurm=replace(c.slurm, fast_partition=fast, fast_grace_s=4, grace_s=30)) if fast else c


def _join(config: Config, squeue: str | None = None, *, phase: str = "lent", slurm_now: float | None = None) -> Observation:
    kube = FakeKube()
    for n in NODES:
        kube.add_node(n, "default", labels={wk.LABEL_PHASE: phase}, annotations={wk.ANNOTATION_PHASE_SINCE: "1"})
    return join(now=2e9, config=config, kube_nodes=kube.nodes(), pods={"default": ()}, desired_replicas={"default": 0},
                slurm_nodes=parse_nodes((FIXTURES / "sinfo-22.05-tiers.json").read_text()),
                slurm_jobs=parse_jobs(squeue or (FIXTURES / "squeue-22.05-tiers.json").read_text()),
                readings={"default": Readings(None)}, slurm_now=slurm_now)


def test_each_lent_node_has_the_tier_slurm_gives_it() -> None:
    obs = _join(_config())
    assert {n.name: n.tier for n in obs.view.nodes} == {
        "gpu-node-01": Tier.FAST,  # preempt-fast only, a fast job
        "gpu-node-02": Tier.NORMAL,  # preempt only
        "gpu-node-03": Tier.NORMAL,  # both partitions: a normal job may land (and one runs)
    }


def test_pending_work_per_tier() -> None:
    view = _join(_config()).view
    # pending-fast, pending-either (may run in the fast tier) and pending-normal
    assert (view.pending_research_nodes, view.pending_fast_nodes) == (3, 2)


def test_without_a_fast_partition_every_node_is_normal_and_no_backlog_is_fast() -> None:
    view = _join(_config(None)).view
    assert {n.tier for n in view.nodes} == {Tier.NORMAL}
    assert view.pending_fast_nodes == 0
    assert view.pending_research_nodes == 2  # pending-either may run in preempt; pending-fast is not ours


@pytest.mark.parametrize(("partitions", "running", "tier"), [
    (("preempt-fast", "gpu-bridge"), (), Tier.FAST),
    (("preempt-fast",), ("preempt-fast",), Tier.FAST),
    (("preempt-fast",), ("preempt",), Tier.NORMAL),  # moved while a normal job ran: its grace is normal
    (("preempt", "preempt-fast"), (), Tier.NORMAL),
    ((), (), Tier.NORMAL),  # in neither (unknown): never read as the faster one
])
def test_node_tier(partitions: tuple[str, ...], running: tuple[str, ...], tier: Tier) -> None:
    assert node_tier(partitions, running, _config()) is tier


def test_a_preempted_fast_tier_job_is_requeued_after_the_fast_grace() -> None:
    """The fast tier's victims carry their partition's grace: past it (not the normal one),
    the daemon requeues them as it does normal-tier ones."""
    config = _config()
    doc = json.loads((FIXTURES / "squeue-22.05-tiers.json").read_text())
    for j in doc["jobs"]:
        if j["job_id"] in (1, 2):  # the fast job on gpu-node-01, the normal one on gpu-node-02
            j["preempt_time"] = 1_000
    obs = _join(config, json.dumps(doc), phase="reclaiming", slurm_now=1_000 + 4 + 1.5)
    assert [j.job_id for j in past_grace(obs.facts["gpu-node-01"], grace_s=30)] == ["1"]
    assert past_grace(obs.facts["gpu-node-02"], grace_s=30) == ()  # its grace is 30 s


def test_a_node_entry_without_partitions_is_named() -> None:
    with pytest.raises(AdapterError, match="partition"):
        parse_nodes('{"nodes": [{"name": "gpu-node-01", "state": "idle", "state_flags": [], "reason": "", '
                    '"gres": "gpu:4", "gres_used": "", "partitions": "preempt"}]}')
