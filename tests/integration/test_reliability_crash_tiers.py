"""The crash matrix' rows for warm lending and the fast tier, on the real sandbox: a
representative subset on one sandbox whose pool lends warm with the fast tier on (all the rows,
each feature on a sandbox of its own: ``scripts/reliability.py --warm`` and ``--fast-tier``,
docs/reliability.md). The daemon is SIGKILLed right after the write, restarted, and it converges
with no invariant broken and no research job lost:

- right after ``set_tier`` (a lend's partition, written before its phase mark): the restarted
  daemon lends the nodes warm, each in ``preempt-fast`` only, its one pod asleep, not Ready,
  ``GET http://<pod IP>:<port>/is_sleeping`` true;
- right after ``wake_replica`` (the engine awake, its record written, the pod not Ready yet):
  each reclaimed node serves again with the same pod, woken, Ready, its gate open, its
  warm record cleared; never a research job beside an awake or Ready pod.
"""

from __future__ import annotations

import pytest

from gpu_bridge_lab.sandbox import reliability as rel

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(330)]


def test_a_crash_after_set_tier_and_after_a_wake_converges_warm_on_the_fast_tier() -> None:
    with rel.Harness(3, warm=True, fast_tier=True) as h:
        rows = rel.crash_matrix(h, bootstrap=[], lend=["set_tier"], reclaim=["wake_replica"], log=lambda _s: None)
    print("\n" + rel.format_matrix(rows))
    crash_rows = [r for r in rows if r.transition != "final"]
    assert [r.crashed for r in crash_rows] == [True, True], rel.format_matrix(rows)  # each point was reached
    for r in rows:
        assert r.ok, rel.format_row(r)
        assert r.violations == [] and r.jobs_lost == 0, r.violations[:3]
    assert all(r.ticks is not None and r.ticks < 120 for r in crash_rows)
    lend, reclaim, final = rows
    assert "lent warm 2" in lend.note and "cold" not in lend.note, lend.note
    assert f"lent to {rel.FAST_PARTITION} only 2 of 2" in lend.note, lend.note
    assert "woken 2" in reclaim.note and "cold" not in reclaim.note, reclaim.note
    assert "research beside a sleeping pod in 0 " not in final.note, final.note  # the warm case was seen
