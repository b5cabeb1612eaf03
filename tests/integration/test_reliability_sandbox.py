"""Reliability invariants on the real sandbox (a representative subset; the full matrix is
``scripts/reliability.py``): a SIGKILL right after a write, outages of the Kubernetes API and
slurmctld, two instances. Invariants, checked from both schedulers (never from the daemon):
no node runs research jobs while a serving pod is on it, Ready capacity never below
min_serving, every node ends in exactly one pool, no research job is lost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_bridge_lab.sandbox import outages as out
from gpu_bridge_lab.sandbox import reliability as rel

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def harness() -> Iterator[rel.Harness]:
    with rel.Harness(3) as h:
        yield h


def test_crash_after_release_and_after_unfence_converges(harness: rel.Harness) -> None:
    # resume: the node is released to Slurm but not yet marked lent (the most exposed write of
    # lending); unfence: Kubernetes may place a pod while the node is still "returning".
    out.settle(harness, rel.HIGH)
    rows = rel.crash_matrix(harness, bootstrap=[], lend=["resume"], reclaim=["unfence"], log=lambda _s: None)
    print("\n" + rel.format_matrix(rows))
    crash_rows = [r for r in rows if r.transition != "final"]
    assert [r.crashed for r in crash_rows] == [True, True], rel.format_matrix(rows)
    for r in rows:
        assert r.converged, rel.format_row(r)
        assert r.violations == [], r.violations[:3]
        assert r.jobs_lost == 0
    assert all(r.ticks is not None and r.ticks < 60 for r in crash_rows)


def test_kube_api_500_mid_reclaim_holds_then_recovers(harness: rel.Harness) -> None:
    out.settle(harness, rel.LOW)
    row = out.kube_api(harness, "500", "mid-reclaim", hold_s=8)
    print("\n" + out.format_outages([row]))
    assert row.recovered, out.format_outages([row])
    assert row.violations == [] and row.jobs_lost == 0 and row.nodes_lost == 0
    assert "kubernetes" in row.metrics  # gpu_bridge_adapter_errors_total{system="kubernetes"} -> GpuBridgeAdapterErrors


def test_slurmctld_down_mid_lend_holds_then_recovers(harness: rel.Harness) -> None:
    out.settle(harness, rel.HIGH)
    row = out.slurmctld_down(harness, "mid-lend", hold_s=12)
    print("\n" + out.format_outages([row]))
    assert row.recovered, out.format_outages([row])
    assert row.violations == [] and row.jobs_lost == 0 and row.nodes_lost == 0
    assert 'adapter_errors_total{system="slurm"}' in row.metrics  # -> GpuBridgeAdapterErrors


def test_two_instances_only_the_holder_writes_and_the_standby_takes_over(harness: rel.Harness) -> None:
    out.settle(harness, rel.HIGH)
    r = rel.two_instances(harness)
    print("\n" + rel.format_two_instances(r))
    assert r.standby_writes_before_takeover == 0, rel.format_two_instances(r)
    assert r.takeover_s is not None and r.takeover_s <= r.lease_duration_s + 3
    assert r.finished and r.violations == [] and r.jobs_lost == 0
