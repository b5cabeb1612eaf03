"""A short seeded soak in the default suite: random load flips and faults (the daemon
SIGKILLed, slurmctld SIGKILLed and restarted, Prometheus paused, a second daemon, the Lease
holder paused, kube-apiserver or etcd paused, a slurmd SIGKILLed), research jobs in flight, invariants checked every second through the real CLIs.
The long run across seeds is ``scripts/reliability.py --soak`` (docs/reliability.md)."""

from __future__ import annotations

import pytest

from gpu_bridge_lab.sandbox.soak import FAULTS, Soak, SoakConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def test_short_seeded_soak_holds_every_invariant() -> None:
    # faults and flips more often than the long soak, so a minute sees several of each
    cfg = SoakConfig(seed=5, duration_s=75.0, fault_gap_s=(6.0, 14.0), flip_s=(20.0, 40.0))
    lines: list[str] = []
    result = Soak(cfg, log=lines.append).run()
    print("\n".join(lines) + "\n" + result.summary())
    injected = [k for _, k, _ in result.faults if k in FAULTS]
    assert len(injected) >= 3 and len(set(injected)) >= 2, result.faults  # the run really was faulty
    assert result.samples >= 40, result.summary()  # the invariants really were checked
    assert result.completed + len(result.lost_by_slurmctld) + len(result.failed_by_slurmctld) == result.jobs >= 3, \
        result.summary()
    assert result.violations == [], "\n".join(str(v) for v in result.violations)
