"""The fast-grace tier, live: the daemon (`gpu-bridge run`, as an operator runs it) on the
serving sandbox with `preempt-fast` (`serving_sandbox(fast_grace_s=...)`, real Slurm 22.05).

Fast-tier jobs wait (`sbatch -p preempt-fast --requeue --time=5`) -> load falls -> the daemon
lends nodes to the fast tier: each such node is in `preempt-fast` only (sinfo), so only
fast-tier jobs start there -> load rises -> those nodes are reclaimed, their jobs preempted and
requeued (never cancelled) after the fast grace, not the normal one (`GRACE_S`, 10x longer),
and the daemon logs the reclaim with tier=fast. The jobs ignore the signal: each runs on to
the end of its grace, so the release measures the grace itself.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_bridge_lab.sandbox.daemon_config import daemon_identity, sandbox_config, write_config
from gpu_bridge_lab.sandbox.e2e import (
    Watcher,
    World,
    event_time,
    put_load,
    read_events,
    submit_backlog,
    wait_until,
)
from gpu_bridge_lab.sandbox.serving import serving_sandbox
from sandbox_fixtures import QUIET_START_RPS, assert_requeued, daemon_run

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

NODES = 3
GRACE_S = 40
FAST_GRACE_S = 4
FAST = "preempt-fast"
POD_START_S = 3.0
MIN_SERVING = 1


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, World, Path]]:
    d = Path(tempfile.mkdtemp(prefix="gb-e2e-fast-", dir="/tmp"))
    sb = serving_sandbox(d, nodes=NODES, grace_s=GRACE_S, fast_grace_s=FAST_GRACE_S, pod_start_delay_s=POD_START_S,
                         pod_grace_s=3, shutdown_timeout_s=2, vllm_extra=("--max-cv", "1.5"), peak_rps=QUIET_START_RPS)
    sb.up()
    w = World(sb)
    try:
        yield sb, w, d
    finally:
        w.close()
        sb.down()


def _partitions(sb: Any) -> dict[str, set[str]]:
    doc = json.loads(sb.run_slurm(["sinfo", "--json"]).stdout)
    return {n["name"]: set(n.get("partitions") or ()) for n in doc["nodes"]}


def test_the_daemon_lends_to_the_fast_tier_and_reclaims_within_the_fast_grace(world: tuple[Any, World, Path]) -> None:
    sb, w, d = world
    out = d / "jobs"
    out.mkdir()
    out.chmod(0o777)
    # fast-tier backlog only: the lends go to the fast tier
    job_ids = submit_backlog(sb, NODES, FAST, NODES - MIN_SERVING, out, "eval", "--time=5")
    put_load(sb.vllm_url, {"rate": 2.0, "cv": 1.0})
    doc = sandbox_config(prometheus_url=sb.prometheus_url, **daemon_identity(sb), slurm_conf=sb.slurm.slurm_conf,
                         grace_s=GRACE_S, cold_start_s=POD_START_S, min_serving=MIN_SERVING, scale_down_window_s=6,
                         min_lend_s=5)
    doc["slurm"].update(fast_partition=FAST, fast_grace_s=FAST_GRACE_S)
    cfg = write_config(d / "gpu-bridge.yaml", doc)
    log_path = d / "daemon.log"
    watcher = Watcher(w, min_serving=MIN_SERVING)
    with daemon_run(cfg, log_path, sb.env, watcher=watcher):
        watcher.start()

        def fast_jobs_running() -> bool:
            running = w.research_running_by_node()
            return sum(len(v) for v in running.values()) == len(job_ids)

        wait_until(fast_jobs_running, 120, "fast-tier jobs to run on nodes lent to the fast tier")
        running = w.research_running_by_node()
        parts = _partitions(sb)
        for node in running:  # in the fast partition only: a normal-tier job cannot start there
            assert FAST in parts[node] and "preempt" not in parts[node], (node, parts[node])
        lends = [e for e in read_events(log_path, "decision") if e["action"] == "lend"]
        assert all("to the fast tier" in e["detail"] for e in lends if e["node"] in running), lends
        time.sleep(2)

        spike_at = time.time()
        put_load(sb.vllm_url, {"rate": 75.0, "cv": 1.0})
        wait_until(lambda: all(w.phases().get(n) == "serving" for n in running)
                   and all(n in w.ready_pods_by_node() for n in running), 90, "the fast-tier nodes back to serving")
        assert_requeued(w, job_ids, ("PENDING", "REQUEUED", "CONFIGURING"))  # requeued, never cancelled

    ts = event_time
    decisions = [e for e in read_events(log_path, "decision") if e["action"] == "reclaim" and ts(e) >= spike_at]
    steps = [e for e in read_events(log_path, "node_step") if ts(e) >= spike_at]
    reclaimed = {e["node"]: e for e in read_events(log_path, "node_reclaimed")}
    print(f"\nfast tier (GraceTime {FAST_GRACE_S} s; normal {GRACE_S} s): load spike at t=0")
    for node in sorted(running):
        decided = min(ts(e) for e in decisions if e["node"] == node)
        drained = min(ts(e) for e in steps if e["node"] == node and e["step"] == "drain")
        requeued = [ts(e) for e in steps if e["node"] == node and e["step"] == "requeue_jobs"]
        release = drained - decided
        print(f"{node}: decided {decided - spike_at:.1f} s, requeued {min(requeued) - decided if requeued else float('nan'):.1f} s "
              f"after, Slurm released {release:.1f} s after, tier={reclaimed[node].get('tier')}")
        assert reclaimed[node].get("tier") == "fast"
        # the fast grace, the daemon's requeue a tick later and the hold's start; far from the normal grace
        assert FAST_GRACE_S - 1 <= release <= FAST_GRACE_S + 8, release
