"""The lendable-capacity outlook (bridge.policy.outlook.lendable_outlook), its sentence,
`gpu-bridge forecast`'s bad input, and the daemon's gpu_bridge_pool_*_forecast metric."""

from __future__ import annotations

import math
import socket
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from bridge.config import parse_config
from bridge.daemon import Daemon
from bridge.wiring import policy_memory
from bridge.cli.forecast import sentence
from bridge.metrics import BridgeMetrics
from bridge.model import LoadSignals
from bridge.policy.outlook import HourOutlook, first_free_window, lendable_outlook, outlook_calibration

DAY = 86400.0
T0 = 1_800_000_000.0 - 1_800_000_000.0 % DAY  # a UTC midnight
CFG = parse_config({"pools": [{"name": "llama", "min_serving": 1, "target": {"concurrency_per_replica": 10}}]})
POOL = CFG.pools[0]


def daily(days: int, level: callable, step: float = 300.0) -> list[LoadSignals]:  # type: ignore[valid-type]
    """``days`` days of history before T0 + days * DAY; demand = level(hour of day) replicas."""
    out = []
    t = T0
    while t <= T0 + days * DAY:
        d = level(int((t % DAY) // 3600))
        out.append(LoadSignals(t, d * 10.0, 0.0, None, None, 8))
        t += step
    return out


def night_low(hour: int) -> float:
    return 1.0 if hour < 8 else 5.0


def test_outlook_follows_yesterday_with_the_policys_margin() -> None:
    now = T0 + 8 * DAY - 3 * 3600.0 + 60  # 21:01, seven days of profile behind
    hist = [s for s in daily(8, night_low) if s.t <= now]
    cal, gov = outlook_calibration(hist, now, config=CFG, pool=POOL, nodes=8)
    assert cal is not None and cal.margin is not None and cal.smoothing == 1.0
    assert gov is not None and gov.lend_allowed and gov.spent_min == 0
    out = lendable_outlook(hist, now, config=CFG, pool=POOL, nodes=8, hours=24, calibration=cal)
    assert len(out) == 24 and out[0].start == now - 60  # clock hours, hour 0 holds now
    by_hour = {int((h.start % DAY) // 3600): h for h in out}
    # The margin is calibrated now (headroom defaults 0): the only rise in the history is the
    # 08:00 jump 1 -> 5 replicas, score (4 + 1) / (1 + 1) = 2.5, so every hour's margin lies in
    # (1, 2.5] and the 08:00 hour gets the largest. Night (00-07): 1 replica -> serving keeps
    # ceil(m * (1 + 1) - 1) nodes (the policy's rule), 3 for m in (1.5, 2]; day: 5 replicas ->
    # m * 6 - 1 > 8 for m > 1.5, so all 8 serve and nothing is lent.
    m3 = by_hour[3].margin
    assert m3 is not None and 1.5 < m3 <= 2.0 and by_hour[8].margin == pytest.approx(2.5)
    assert by_hour[3].demand == pytest.approx(1.0)
    assert by_hour[3].serving_nodes == math.ceil(m3 * 2 - 1 - 1e-9) == 3 and by_hour[3].lendable_nodes == 5
    assert by_hour[12].serving_nodes == 8 and by_hour[12].lendable_nodes == 0
    # without a calibration (calibration off) the headroom settings (now 0) alone: 1 node at night
    bare = lendable_outlook(hist, now, config=CFG, pool=POOL, nodes=8, hours=24)
    assert {int((h.start % DAY) // 3600): h for h in bare}[3].serving_nodes == 1
    assert by_hour[3].basis in ("1d", "7d") and out[0].basis == "now"


def test_outlook_peak_of_the_hour_counts_not_its_mean() -> None:
    def spiky(hour: int) -> float:
        return 1.0

    now = T0 + 2 * DAY + 2 * 3600.0  # 02:00 on day 2
    hist = [s for s in daily(3, spiky) if s.t <= now]
    # a 5-minute spike at 03:30 yesterday
    hist = [LoadSignals(s.t, 60.0 if abs(s.t - (T0 + DAY + 3.5 * 3600)) < 1 else s.running, 0.0, None, None, 8) for s in hist]
    out = lendable_outlook(hist, now, config=CFG, pool=POOL, nodes=8, hours=4)
    h3 = next(h for h in out if int((h.start % DAY) // 3600) == 3)
    assert h3.demand == pytest.approx(6.0, rel=0.2)


def test_young_pool_says_unknown_not_zero() -> None:
    hist = [s for s in daily(1, night_low) if s.t >= T0 + DAY - 3 * 3600]  # three hours of history
    now = T0 + DAY
    out = lendable_outlook(hist, now, config=CFG, pool=POOL, nodes=8, hours=24)
    assert out[0].demand is not None  # the policy's forecast now
    assert all(h.demand is None and h.lendable_nodes is None for h in out[1:])
    # 3 h of 5-minute samples: 36 steps of the 180 the calibration needs -> calibrating, and
    # the policy lends nothing then: the outlook says 0 lendable and no margin, not a guess
    cal, _ = outlook_calibration(hist, now, config=CFG, pool=POOL, nodes=8)
    assert cal is not None and cal.margin is None and cal.samples < cal.needed
    out = lendable_outlook(hist, now, config=CFG, pool=POOL, nodes=8, hours=24, calibration=cal)
    assert out[0].lendable_nodes == 0 and out[0].margin is None


def test_outlook_ignores_the_policys_seasonal_lags_setting() -> None:
    """The outlook's own 1 d / 7 d lags: the default config (no seasonal lags) still forecasts every hour."""
    assert CFG.policy.forecast.seasonal_lags_s == ()
    now = T0 + 8 * DAY + 60
    hist = [s for s in daily(8, night_low) if s.t <= now]
    out = lendable_outlook(hist, now, config=CFG, pool=POOL, nodes=8, hours=24)
    assert all(h.demand is not None for h in out)
    assert {int((h.start % DAY) // 3600): h.demand for h in out}[12] == pytest.approx(5.0)


def test_max_lent_and_calendar_floor_limit_the_outlook() -> None:
    cfg = parse_config({
        "pools": [{"name": "llama", "min_serving": 1, "max_lent": 3, "target": {"concurrency_per_replica": 10}}],
        "policy": {"calendar": [{"name": "no-lend-at-4", "effect": "no_lend", "start": "04:00", "end": "05:00"}]},
    })
    now = T0 + 8 * DAY + 60
    hist = [s for s in daily(8, night_low) if s.t <= now]
    cal, _ = outlook_calibration(hist, now, config=cfg, pool=cfg.pools[0], nodes=8)
    out = lendable_outlook(hist, now, config=cfg, pool=cfg.pools[0], nodes=8, hours=8, calibration=cal)
    by_hour = {int((h.start % DAY) // 3600): h for h in out}
    assert by_hour[2].lendable_nodes == 3  # max_lent
    assert by_hour[4].lendable_nodes == 0  # calendar


def _spent(days: int, at: float, minutes: int = 45) -> list[LoadSignals]:
    """``daily(days, night_low)`` with ``minutes`` violation minutes from ``at``: one sample a
    minute, 5 replicas of demand on 4 Ready (four of the 8 nodes lent and not back)."""
    bad = [LoadSignals(at + 60 * k, 50.0, 0.0, None, None, 4) for k in range(minutes)]
    calm = [s for s in daily(days, night_low) if not at <= s.t < at + 60 * minutes]
    return sorted(calm + bad, key=lambda s: s.t)


def test_a_spent_budget_holds_the_outlook_until_the_governor_may_lend_again() -> None:
    """The outlook is the policy's: with the SLO budget spent (45 violation minutes yesterday
    against 40.3 in 28 days) the policy lends nothing, so no hour says it will, and the hours
    say why and until when; no free window is promised to a waiting job."""
    now = T0 + 8 * DAY - 3 * 3600.0 + 60
    hist = [s for s in _spent(8, T0 + 7 * DAY + 12 * 3600) if s.t <= now]
    cal, gov = outlook_calibration(hist, now, config=CFG, pool=POOL, nodes=8)
    assert gov is not None and not gov.lend_allowed and gov.cap(lending=True) == 0
    assert gov.resume_t is not None and gov.resume_t > now + DAY  # the minutes stay 28 days
    out = lendable_outlook(hist, now, config=CFG, pool=POOL, nodes=8, hours=24, calibration=cal, governor=gov)
    night = [h for h in out if int((h.start % DAY) // 3600) < 8]
    assert night and all(h.lendable_nodes == 0 and h.held.startswith("SLO budget spent: lending held until ") for h in night)
    assert first_free_window(out, 1, 1.0) is None
    # the same hours without the governor: the forecast alone would have lent the nights
    free = lendable_outlook(hist, now, config=CFG, pool=POOL, nodes=8, hours=24, calibration=cal)
    assert all(h.held == "" for h in free) and max(h.lendable_nodes or 0 for h in free) > 0


def test_the_outlook_lends_again_from_when_the_spent_minutes_leave_the_window() -> None:
    at = T0 + 12 * 3600  # 45 violation minutes at noon on day 0
    now = T0 + 28 * DAY + 5 * 3600 + 60  # 05:01 on day 28: they leave the 28-day window after noon
    hist = [s for s in _spent(29, at) if s.t <= now]
    cal, gov = outlook_calibration(hist, now, config=CFG, pool=POOL, nodes=8)
    assert gov is not None and gov.cap(lending=True) == 0 and gov.resume_t is not None
    assert at + 28 * DAY < gov.resume_t < at + 28 * DAY + 45 * 60
    out = lendable_outlook(hist, now, config=CFG, pool=POOL, nodes=8, hours=24, calibration=cal, governor=gov)
    before = [h for h in out if h.start < gov.resume_t]
    after = [h for h in out if h.start >= gov.resume_t]
    assert before and all(h.lendable_nodes == 0 and h.held for h in before)
    assert after and all(h.held == "" for h in after)
    tomorrow_night = [h for h in after if int((h.start % DAY) // 3600) < 8]
    assert tomorrow_night and all((h.lendable_nodes or 0) > 0 for h in tomorrow_night)


def _o(lend: list[int | None]) -> list[HourOutlook]:
    return [HourOutlook(T0 + k * 3600, None if v is None else 1.0, None, v, "1d") for k, v in enumerate(lend)]


def test_first_free_window_needs_every_hour_known_and_free() -> None:
    assert first_free_window(_o([4, 4, 2, 4, 4, 4]), 3, 3) is not None
    assert first_free_window(_o([4, 4, 2, 4, 4, 4]), 3, 3).start == T0 + 3 * 3600  # type: ignore[union-attr]
    assert first_free_window(_o([4, None, 4, 4]), 3, 3) is None
    assert first_free_window(_o([4, 4]), 3, 1.5).start == T0  # type: ignore[union-attr]
    s = sentence(_o([1, 1, 5, 5, 5]), 4, 3, T0 + 10)
    assert "4 node(s) are expected free for 3 h from" in s and "in about 2 h" in s and "requeued" in s
    assert sentence(_o([1, 1]), 4, 2, T0).startswith("No window of 2 h with 4 node(s) free")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", "forecast", *args], capture_output=True, text=True, timeout=60)


def test_forecast_cli_unreachable_prometheus_exits_3() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _cli("--prometheus", f"http://127.0.0.1:{port}")
    assert r.returncode == 3 and f"Prometheus at http://127.0.0.1:{port}" in r.stderr


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (("--nodes", "4"), "--nodes and --for: give both"),
        (("--nodes", "4", "--for", "a while"), "--for: expected a duration"),
        (("--hours", "30"), "--hours: must be 1..24"),
        (("--nodes", "2", "--for", "30h"), "longer than the outlook"),
        (("--pool", "nosuch"), "--pool: no pool named 'nosuch'"),
        (("--at", "tomorrow"), "--at: expected ISO 8601"),
        (("--at", "1e30"), "--at: must be between 1970-01-01 and 9999-12-31"),  # was an OverflowError traceback
        (("--at", "nan"), "--at: must be between 1970-01-01 and 9999-12-31"),
        (("--at", "1900-01-01"), "--at: must be between 1970-01-01 and 9999-12-31"),
    ],
)
def test_forecast_cli_bad_input_exits_2(args: tuple[str, ...], msg: str) -> None:
    r = _cli("--prometheus", "http://127.0.0.1:1", *args)
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr


def _daemon(prom: FakeProm, metrics: BridgeMetrics, now: float) -> Daemon:
    cfg = parse_config({"pools": [{"name": "llama", "namespace": "serving", "deployment": "vllm", "min_serving": 1,
                                   "cold_start_s": 3, "target": {"concurrency_per_replica": 10}}]})
    kube = FakeKube(now=now)
    slurm = FakeSlurm(grace_s=5, now=now)
    for n in ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"):
        kube.add_node(n, "llama")
        slurm.add_node(n)
    kube.add_pool(PoolTarget("llama", "serving", "vllm"), replicas=4)
    pools = {"llama": PromPool("llama", "llama")}
    return Daemon(cfg, kube=kube, slurm=slurm, prom=prom, prom_pools=pools, metrics=metrics, clock=lambda: now,
                  memory=policy_memory(cfg, prom, pools, now))


def _gauge(m: BridgeMetrics, name: str, hours_ahead: str) -> float | None:
    v = m.registry.get_sample_value(name, {"pool": "llama", "hours_ahead": hours_ahead})
    return v


def test_daemon_exports_the_outlook_and_nan_when_prometheus_fails() -> None:
    now = T0 + 8 * DAY + 3600.0 + 30
    prom = FakeProm()
    prom.histories["llama"] = tuple(s for s in daily(9, night_low) if s.t <= now)
    prom.set("llama", LoadSignals(now - 5, 10.0, 0.0, None, None, 4))
    m = BridgeMetrics(CollectorRegistry(auto_describe=True))
    d = _daemon(prom, m, now)
    d.iterate()
    # the metric uses the calibration the policy has (the daemon's Calibrator over Prometheus);
    # it is the one the CLI builds from the same history (outlook_calibration)
    cal = d.ledger.last_observation.view.pools["llama"].calibration  # type: ignore[union-attr]
    gov = d.ledger.last_observation.view.pools["llama"].governor  # type: ignore[union-attr]
    assert cal is not None and (cal, gov) == outlook_calibration(prom.histories["llama"], now, config=d.config, pool=d.config.pools[0], nodes=4)
    # 01:00-02:00: 1 replica; with 4 replicas of capacity the night margin comes out higher than
    # with 8 (the 08:00 jump to 5 exceeds the pool, the window differs): in (2, 2.5] -> serving
    # keeps ceil(m * 2 - 1) = 4 of 4 nodes, 0 lendable (a fixed +20 % + 0.5 headroom would keep 2)
    m1 = cal.margin_over(T0 + 8 * DAY + 3600.0, T0 + 8 * DAY + 7200.0)
    assert m1 is not None and 2.0 < m1 <= 2.5
    assert _gauge(m, "gpu_bridge_pool_demand_forecast_replicas", "1") == pytest.approx(1.0)
    assert _gauge(m, "gpu_bridge_pool_lendable_nodes_forecast", "1") == 0
    assert _gauge(m, "gpu_bridge_pool_lendable_nodes_forecast", "11") == 0
    assert _gauge(m, "gpu_bridge_pool_demand_forecast_replicas", "11") == pytest.approx(5.0)
    for fail in (False, True):  # no history for the hours ahead; Prometheus failing
        prom2 = FakeProm(fail=fail)
        prom2.set("llama", LoadSignals(now - 5, 10.0, 0.0, None, None, 4))
        m2 = BridgeMetrics(CollectorRegistry(auto_describe=True))
        _daemon(prom2, m2, now).iterate()
        v = _gauge(m2, "gpu_bridge_pool_lendable_nodes_forecast", "5")
        assert v is not None and math.isnan(v)  # NaN, never 0
