"""Operators' manual moves (`gpu-bridge lend|reclaim|pin NODE`) checked as pure code.

A manual move is written on the node as a request; the leader checks it here against the
same safety rules as its own decisions (never below ``min_serving``, never a node that is
held for a problem, only from the phase at rest on the other side) and then runs it through
the same lifecycle.
"""

from __future__ import annotations

from bridge.config import Config
from bridge.model import Action, ActionKind, ClusterView, Phase, Reason


def check_request(view: ClusterView, config: Config, node: str, request: str) -> Action | str:
    """The Action for a valid request, or a sentence saying why it is refused."""
    states = {n.name: n for n in view.nodes}
    n = states.get(node)
    if n is None:
        return f"{node} is not a node of any configured pool"
    if n.problem:
        return f"{node} is held: {n.problem}"
    if request == "lend":
        if n.phase is not Phase.SERVING:
            return f"{node} is {n.phase}, only a serving node can be lent"
        pool = config.pool(n.pool)
        ready_after = sum(1 for m in view.nodes if m.pool == n.pool and m.serving_ready and m.name != node)
        if ready_after < pool.min_serving:
            return f"lending {node} would leave {ready_after} Ready serving nodes < min_serving {pool.min_serving}"
        return Action(ActionKind.LEND, node, n.pool, Reason.MANUAL, f"lend {node}: requested by an operator")
    if request == "reclaim":
        if n.phase is not Phase.LENT:
            return f"{node} is {n.phase}, only a lent node can be reclaimed"
        return Action(
            ActionKind.RECLAIM, node, n.pool, Reason.MANUAL, f"reclaim {node}: requested by an operator", jobs=n.jobs
        )
    return f"unknown request {request!r}: expected lend or reclaim"
