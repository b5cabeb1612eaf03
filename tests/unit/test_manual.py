"""Operators' manual moves are checked against the same safety rules as the policy's."""

from __future__ import annotations

import pytest

from bridge.config import default_config
from bridge.manual import check_request
from bridge.model import Action, ActionKind, ClusterView, NodeState, Phase, PoolState

NOW = 1_800_000_000.0
CONFIG = default_config(min_serving=2)


def view(*nodes: NodeState) -> ClusterView:
    return ClusterView(now=NOW, nodes=nodes, pools={"default": PoolState("default", None)})


def node(name: str, phase: Phase = Phase.SERVING, *, ready: bool = True, problem: str | None = None,
         jobs: tuple[str, ...] = ()) -> NodeState:
    return NodeState(name=name, pool="default", phase=phase, phase_since=NOW - 60, serving_ready=ready,
                     problem=problem, jobs=jobs)


THREE_SERVING = (node("n1"), node("n2"), node("n3"))

CASES = [
    ("lend-ok", THREE_SERVING, "n1", "lend", ActionKind.LEND),
    ("lend-below-min-serving", THREE_SERVING[:2], "n1",
     "lend", "lending n1 would leave 1 Ready serving nodes < min_serving 2"),
    ("lend-not-serving", (node("n1", Phase.LENT, ready=False), *THREE_SERVING[1:]), "n1",
     "lend", "n1 is lent, only a serving node can be lent"),
    ("held-node", (node("n1", problem="drained in Slurm by someone else"), *THREE_SERVING[1:]), "n1",
     "lend", "n1 is held: drained in Slurm by someone else"),
    ("unknown-node", THREE_SERVING, "n9", "lend", "n9 is not a node of any configured pool"),
    ("reclaim-ok", (node("n1", Phase.LENT, ready=False, jobs=("41",)), *THREE_SERVING[1:]), "n1",
     "reclaim", ActionKind.RECLAIM),
    ("reclaim-not-lent", THREE_SERVING, "n1", "reclaim", "n1 is serving, only a lent node can be reclaimed"),
    ("unknown-request", THREE_SERVING, "n1", "drain", "unknown request 'drain': expected lend or reclaim"),
]


@pytest.mark.parametrize(("nodes", "name", "request_", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_request(nodes: tuple[NodeState, ...], name: str, request_: str, expected: object) -> None:
    outcome = check_request(view(*nodes), CONFIG, name, request_)
    if isinstance(expected, ActionKind):
        assert isinstance(outcome, Action)
        assert outcome.kind is expected and outcome.node == name and outcome.reason == "manual"
    else:
        assert outcome == expected


def test_reclaim_names_the_jobs_it_preempts() -> None:
    outcome = check_request(view(node("n1", Phase.LENT, ready=False, jobs=("41", "42")), *THREE_SERVING[1:]),
                            CONFIG, "n1", "reclaim")
    assert isinstance(outcome, Action) and outcome.jobs == ("41", "42")
