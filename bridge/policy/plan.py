"""The policy's entry point: ``plan(view, config) -> Plan``. Pure: no I/O, no clock.

(First cut: holds every node and reports each pool as steady; the real policy follows.)
"""

from __future__ import annotations

from bridge.config import Config
from bridge.model import ClusterView, Plan, PoolDecision


def plan(view: ClusterView, config: Config) -> Plan:
    """Decide which nodes to lend and reclaim, as of ``view.now``."""
    decisions = []
    for pool in sorted(config.pools, key=lambda p: p.name):
        serving = sum(1 for n in view.nodes if n.pool == pool.name and n.phase in ("serving", "returning", "reclaiming"))
        decisions.append(PoolDecision(pool.name, None, None, 0.0, serving, serving, "steady", "first cut: no decisions yet"))
    return Plan(now=view.now, actions=(), pools=tuple(decisions), held={})
