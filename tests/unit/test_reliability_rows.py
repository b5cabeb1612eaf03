"""The crash matrix' rows (lab/gpu_bridge_lab/sandbox/reliability.py), without a sandbox: every
injection point is a write the actuator reports (a misspelt point would never fire), the warm
rows cover the warm path's writes in order, the warm fallback's rows exactly the cold fallback's
writes (each with the failure that causes it), and a row whose point was never written, or whose
fallback did not happen, fails."""

from __future__ import annotations

import pytest

from bridge import actuate
from bridge.lifecycle import WAITS, Step
from gpu_bridge_lab.sandbox import dcgm
from gpu_bridge_lab.sandbox import reliability as rel
from gpu_bridge_lab.sandbox.vllm.sleep import SleepParams

WRITE_POINTS = ({str(s) for s in Step if s not in WAITS}
                | {actuate.SCALE_POINT, actuate.TIER_POINT, *actuate.START_POINTS.values()})


def test_every_injection_point_is_a_write_the_actuator_reports() -> None:
    rows = [*rel.WARM_ROWS, *rel.FAST_TIER_ROWS,
            *(("bootstrap", p) for p in rel.BOOTSTRAP_POINTS), *(("lend", p) for p in rel.LEND_POINTS),
            *(("reclaim", p) for p in rel.RECLAIM_POINTS)]
    assert {p for _, p in rows} - WRITE_POINTS == set()
    assert {t for t, _ in rows} == {"bootstrap", "lend", "reclaim"}


def test_the_warm_rows_cover_the_warm_path_in_order() -> None:
    lend, reclaim = rel.rows_of(rel.WARM_ROWS, "lend"), rel.rows_of(rel.WARM_ROWS, "reclaim")
    assert lend.index("fence") < lend.index("close_gate") < lend.index("sleep_replica") < lend.index("resume") \
        < lend.index("mark_lent")
    assert reclaim.index("drain") < reclaim.index("mark_returning") < reclaim.index("wake_replica") \
        < reclaim.index("open_gate") < reclaim.index("unfence") < reclaim.index("mark_serving") < reclaim.index("clear_warm")
    assert rel.rows_of(rel.WARM_ROWS, "bootstrap") == ("open_gate",)
    # a node lent warm keeps its replica counted: no scale and no deletion cost on the warm path
    assert "scale" not in lend + reclaim and "mark_pod" not in lend
    assert rel.rows_of(rel.FAST_TIER_ROWS, "lend") == ("set_tier",)


def test_a_row_whose_point_was_never_written_fails_and_says_so() -> None:
    missed = rel.Row("reclaim", "wake_replica", crashed=False, converged=True)
    assert missed.must_crash and not missed.ok
    assert " NO " in rel.format_row(missed)
    optional = rel.Row("reclaim", "requeue_jobs", crashed=False, converged=True)
    assert not optional.must_crash and optional.ok
    assert rel.Row("lend", "none", converged=True).ok
    assert rel.Row("final", "jobs finish", converged=True).ok
    assert rel.Row("lend", "close_gate", crashed=True, converged=True).ok
    assert not rel.Row("lend", "close_gate", crashed=True, converged=True, jobs_lost=1).ok
    assert not rel.Row("lend", "close_gate", crashed=True, converged=True, violations=["x"]).ok


# the fallback's pod goes by the scale (MARK_POD); DELETE_ASLEEP, its eviction if it outlives the
# scale, is crashed over the fakes only (tests/unit/test_daemon_warm.py); GPU_HELD (the free-GPU
# check's give-up, opt-in) on the sandbox with its fake dcgm-exporter (Harness(gpu_check=True))
FALLBACK_STEPS = {Step.WARM_LOST, Step.CHECK_ASLEEP, Step.MARK_POD, Step.MEM_HOLD_LOST, Step.GPU_HELD}
# the warm path's own writes that also write the fallback's record when their vLLM call fails
FAILING_WARM_STEPS = {Step.SLEEP_REPLICA, Step.WAKE_REPLICA}


def test_the_warm_fallback_rows_are_the_cold_fallbacks_writes_each_with_its_failure() -> None:
    rows = rel.WARM_FALLBACK_ROWS
    points = {p for _, p in rows}
    assert points == {str(s) for s in FALLBACK_STEPS | FAILING_WARM_STEPS} and len(rows) == len(set(rows))
    assert points <= WRITE_POINTS
    # the warm rows without a failure stay as they were; the failed sleep and wake are new rows of theirs
    assert points & {p for _, p in rel.WARM_ROWS} == {str(s) for s in FAILING_WARM_STEPS}
    assert set(rel.FALLBACK_FAILURES) == set(rows)
    failures = [f for t, p in rows for f in rel.FALLBACK_FAILURES[(t, p)]]
    assert set(failures) == set(rel.FALLBACK_FAULTS) == set(rel.FALLBACK_EVENTS) == set(rel.FALLBACK_REASONS)
    assert set(rel.FALLBACK_EVENTS.values()) == {"warm_lost", "warm_fallback"}
    assert all(rel.FALLBACK_REASONS[f] for f in failures)
    # the failed sleep only in a lend; a lent node's failures are noticed while lent; the failed wake only in a reclaim
    assert rel.rows_of(rows, "lend") == ("sleep_replica",)
    assert rel.rows_of(rows, "lent") == ("mem_hold_lost", "check_asleep", "warm_lost", "mark_pod")
    assert rel.rows_of(rows, "reclaim") == ("gpu_held", "wake_replica", "mark_pod")
    # each way a check, a sleep or a wake fails (docs/warm-lending.md), caused for real
    assert rel.FALLBACK_FAILURES[("lent", "check_asleep")] == ("engine_woken", "unreachable", "no_sleep_mode")
    assert "engine_woken" in rel.FALLBACK_FAILURES[("lent", "mark_pod")]
    assert rel.FALLBACK_FAILURES[("lend", "sleep_replica")] == ("sleep_fails",)
    assert rel.FALLBACK_FAILURES[("reclaim", "wake_replica")] == ("wake_hangs",)
    assert rel.FALLBACK_FAILURES[("reclaim", "mark_pod")] == ("wake_fails",)
    assert rel.FALLBACK_FAILURES[("reclaim", "gpu_held")] == ("gpu_memory_held",)
    # wake_gpu_free_mib: auto: free enough at rest, short of the engine's need while held
    need = SleepParams().gpu_memory_utilization * dcgm.FB_TOTAL_MIB
    assert dcgm.FB_TOTAL_MIB - dcgm.FB_BASE_USED_MIB >= need > dcgm.FB_TOTAL_MIB - dcgm.FB_BASE_USED_MIB - rel.GPU_HELD_MIB
    assert all(rel.Row(t, p).must_crash for t, p in rows)
    assert rel.WAKE_HANG_S > rel.WAKE_S  # a hung wake outlasts the daemon's wake timeout


def test_the_fallback_rows_run_each_failure_once_and_select_by_point_or_failure() -> None:
    every = rel.fallback_rows()
    assert len(every) == sum(len(v) for v in rel.FALLBACK_FAILURES.values()) == len(set(every)) == 10
    assert rel.fallback_rows(["check_asleep"]) == [("lent", "check_asleep", f)
                                                   for f in ("engine_woken", "unreachable", "no_sleep_mode")]
    assert rel.fallback_rows(["wake_hangs", "mem_hold_lost"]) == [("lent", "mem_hold_lost", "mem_hold_cancelled"),
                                                                  ("reclaim", "wake_replica", "wake_hangs")]
    assert rel.fallback_rows(["fence"]) == []


def test_a_fallback_row_fails_unless_the_fallback_happened() -> None:
    good = rel.Row("lent", "warm_lost", crashed=True, converged=True, fell_back=True, fault_window=["1.0: x"])
    assert good.ok  # the failure's own two-pool samples are reported apart, not violations
    assert not rel.Row("lent", "warm_lost", crashed=True, converged=True, fell_back=False).ok
    assert not rel.Row("lent", "warm_lost", crashed=False, converged=True, fell_back=True).ok


def test_a_harness_asked_for_the_free_gpu_check_without_warm_lending_refuses() -> None:
    """The check guards a warm wake only: asked for without warm lending it would silently test nothing."""
    with pytest.raises(ValueError, match="gpu_check: .* needs warm=True"):
        rel.Harness(3, gpu_check=True)
