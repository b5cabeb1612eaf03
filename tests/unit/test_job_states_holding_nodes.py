"""The Slurm job states in which a job holds its nodes are listed once
(``bridge.model.JOB_STATES_HOLDING_NODES``) and the Slurm parser and the join agree on them:
a job in such a state keeps its nodes and counts on its node, any other state does neither."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bridge import wellknown as wk
from bridge.adapters.slurm.parse import parse_jobs
from bridge.adapters.slurm.types import ACTIVE_JOB_STATES, SlurmJobInfo
from bridge.config import default_config
from bridge.model import JOB_STATES_HOLDING_NODES, holds_nodes
from bridge.observe import Readings, join
from gpu_bridge_lab.fakes.kube import FakeKube

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "slurm" / "squeue-22.05.json"


def test_every_state_holding_nodes_is_an_active_state() -> None:
    """Else the parser would drop a job that still holds its nodes, and the node would look free."""
    assert JOB_STATES_HOLDING_NODES <= ACTIVE_JOB_STATES
    assert "pending" not in JOB_STATES_HOLDING_NODES and "running" in JOB_STATES_HOLDING_NODES


def _parsed_as(state: str) -> tuple[SlurmJobInfo, ...]:
    """The fixture's running job, its state replaced by ``state``, through the parser."""
    doc = json.loads(FIXTURE.read_text())
    rec = next(j for j in doc["jobs"] if j["job_state"] == "RUNNING")
    rec["job_state"] = state.upper()
    doc["jobs"] = [rec]
    return parse_jobs(json.dumps(doc))


def _counted_on(job: SlurmJobInfo, node: str) -> bool:
    """Whether the join counts ``job`` on ``node`` (a lent node of the default pool)."""
    kube = FakeKube()
    kube.add_node(node, "default", labels={wk.LABEL_PHASE: "lent"}, annotations={wk.ANNOTATION_PHASE_SINCE: "1"})
    obs = join(now=2e9, config=default_config(), kube_nodes=kube.nodes(), pods={"default": ()},
               desired_replicas={"default": 0}, slurm_nodes=None, slurm_jobs=[job], readings={"default": Readings(None)})
    (n,) = obs.view.nodes
    return job.job_id in n.jobs


@pytest.mark.parametrize("state", sorted(ACTIVE_JOB_STATES))
def test_parser_and_join_agree_on_which_states_hold_a_node(state: str) -> None:
    (job,) = _parsed_as(state)
    holds = state in JOB_STATES_HOLDING_NODES
    assert job.state == state and bool(job.nodes) is holds

    # the join decides by the state itself, whatever nodes a job names
    node = "gpu-node-01"
    assert _counted_on(replace(job, nodes=(node,)), node) is holds


@pytest.mark.parametrize(("state", "holds"), [("launch_boot_future", True), ("timeout", False), ("special_exit", False)])
def test_a_state_slurm_adds_later_is_kept_and_holds_its_nodes(state: str, holds: bool) -> None:
    """A state none of the lists knows (a later Slurm's) is read as holding the nodes the job
    names, so the node never looks free; an ended one is dropped, a waiting one holds none."""
    jobs = _parsed_as(state)
    if state == "timeout":
        assert jobs == ()
        return
    (job,) = jobs
    assert job.state == state and bool(job.nodes) is holds and holds_nodes(state) is holds
    assert _counted_on(job, job.nodes[0] if holds else "gpu-node-01") is holds
