"""The lending policy: pure functions over ``bridge.model`` values (no I/O, no logging, no clock).

Entry point: ``bridge.policy.plan(view, config) -> Plan``.
"""

from bridge.policy.plan import plan

__all__ = ["plan"]
