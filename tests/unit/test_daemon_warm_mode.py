"""Reclaim delays per mode over the lab's fakes (test_daemon_warm's world): a reclaim that woke
the sleeping replica is logged and exported mode="warm" and its measured delay reaches the
plan's horizon; one whose wake failed (the cold fallback) is mode="cold"."""

from __future__ import annotations

import math

from bridge.adapters.protocols import SleepControl
from bridge.config import replace
from bridge.metrics import BridgeMetrics
from bridge.model import Phase, ReclaimMode
from bridge.policy.forecast import horizon_s
from bridge.policy.memory import PoolMemory
from tests.unit.test_daemon_loop import HIGH
from tests.unit.test_daemon_warm import Engine, World

WAKE_S = 8.0  # the fake engines' real wake, far above the configured wake_s (1 s)


class SlowWakes(World):
    """Each wake takes ``WAKE_S`` of the daemon's clock (vLLM's POST /wake_up blocks the pass)."""

    def control(self, pool: str, ip: str | None) -> SleepControl:
        engine = super().control(pool, ip)
        assert isinstance(engine, Engine)
        if getattr(engine, "slow", False):
            return engine
        wake, engine.slow = engine.wake_up, True  # type: ignore[attr-defined]

        def slow(tags: object = ()) -> None:
            self.t += WAKE_S
            wake(tags)

        engine.wake_up = slow  # type: ignore[method-assign]
        return engine


def world(*, fail_wakes: bool) -> World:
    """Measured delays count from the first reclaim; the exported histograms read back."""
    w = SlowWakes()
    c = w.config
    w.config = replace(c, policy=replace(c.policy, calibration=replace(c.policy.calibration, delay_min_samples=1)))
    w.daemon = w.new_daemon()
    w.daemon.ledger.metrics = BridgeMetrics()
    w.fail_wakes = fail_wakes
    return w


def reclaims(w: World, mode: str) -> float:
    sample = w.daemon.ledger.metrics.registry.get_sample_value  # type: ignore[union-attr]
    return sample("gpu_bridge_reclaim_duration_seconds_count", {"pool": "default", "tier": "normal", "mode": mode}) or 0


def reclaim_all(w: World) -> None:
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=60) for i in range(3)]
    w.run_until(lambda: all(w.slurm.snapshot()[j].state == "running" for j in jobs), 10, "research running")
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 120, "all serving again")
    assert not w.violations and not w.lost_jobs(jobs)


def test_a_woken_reclaim_is_measured_warm_and_its_delay_reaches_the_plan() -> None:
    w = world(fail_wakes=False)
    reclaim_all(w)
    assert reclaims(w, "warm") == 3 and reclaims(w, "cold") == 0
    delays = w.daemon.memory["default"].delays
    assert len(delays) == 3 and len(set(delays)) == 1
    c, pool = w.config, w.config.pools[0]
    extra = c.policy.forecast.margin_s + c.policy.tick_s + c.prometheus.scrape_interval_s
    measured = math.ceil(max(delays) + extra - 1e-9)  # their 0.95 quantile (the three wakes ran in one pass: one delay), whole ticks
    assert measured > horizon_s(c, pool)  # grace + wake_s + extras: the wake measured is slower
    w.tick()
    (d,) = w.daemon.ledger.last_plan.pools  # type: ignore[union-attr]
    assert d.horizon_s == measured  # the measured wake replaced the configured one


def test_a_failed_wake_is_measured_cold() -> None:
    w = world(fail_wakes=True)
    reclaim_all(w)
    assert reclaims(w, "cold") == 3 and reclaims(w, "warm") == 0
    assert len(w.daemon.memory["default"].delays) == 3  # a warm pool plans with its fallbacks too


def test_a_pool_that_does_not_lend_warm_never_plans_with_a_wake() -> None:
    w = World()
    cold = replace(w.config.pools[0], warm_lending=False)
    mem = PoolMemory(replace(w.config, pools=[cold]), cold)
    mem.add_delay(2.0, mode=ReclaimMode.WARM)
    mem.add_delay(300.0, mode=ReclaimMode.COLD)
    assert mem.delays == [300.0]
