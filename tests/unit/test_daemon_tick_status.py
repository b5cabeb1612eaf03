"""The STATUS= line the daemon sends with READY=1 and on changes (``systemctl status``)."""

from __future__ import annotations

from bridge.ledger import TickResult
from bridge.cli.daemon import tick_status


def test_tick_status_says_leading_standby_or_why() -> None:
    leader = object()
    assert tick_status(TickResult(observed=True), leader) == "leading"
    assert tick_status(TickResult(observed=False), leader) == "standby: another instance holds the Lease"
    assert tick_status(TickResult(observed=False, error="slurm: sinfo --json failed (rc 1): x"), leader) == (
        "tick failed: slurm: sinfo --json failed (rc 1): x"
    )
    assert tick_status(TickResult(observed=True), None) == "acting (no leader election)"
    assert tick_status(TickResult(observed=True), None, dry_run=True) == (
        "dry run: deciding and logging, writing nothing (never takes the Lease)")
