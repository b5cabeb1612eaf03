"""The lending policy: pure functions over ``bridge.model`` values (no I/O, no logging, no clock).

Entry point: ``plan(view, config) -> Plan``. Callers keep the load history with
``HistoryRecorder(history_windows(config))`` (only the windows the policy reads). See
docs/policy.md.
"""

from bridge.policy.forecast import history_windows, horizon_s, lend_horizon_s
from bridge.policy.history import HistoryRecorder
from bridge.policy.plan import plan
from bridge.policy.victims import choose_victims

__all__ = ["HistoryRecorder", "choose_victims", "history_windows", "horizon_s", "lend_horizon_s", "plan"]
