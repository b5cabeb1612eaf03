"""Warm lending, live: the daemon (`gpu-bridge run`, as an operator runs it) on the serving
sandbox (real Slurm 22.05, a real kube-apiserver with kwok's pods, Prometheus, the vLLM
simulator) with its pool's ``warm_lending`` on.

The sandbox's serving side is what docs/warm-lending.md asks of a site: the simulator in sleep
mode, each pod's engine at ``http://<pod IP>:<vllm_port>`` (kwok gives pods loopback IPs; the
simulator's ``--pod-port`` answers there for that pod's replica), the pods declaring the
readiness gate ``gpu-bridge.io/awake`` (kwok keeps a pod not Ready until its gate is True).

Slurm counts memory (``CR_Core_Memory``, a ``DefMemPerCPU`` so a job without ``--mem`` takes its
share, not the whole node) and has the ``gpu-bridge-warm`` partition of the memory holds
(slurm_conf/slurm.conf.snippet's opt-in lines).

Research jobs wait in ``preempt`` -> load falls -> the daemon lends nodes warm: each lent
node's replica sleeps (the same pod, not Ready) and its memory hold (``gpu-bridge-warm:<node>``,
``pools[].warm_hold_mb``) runs beside the research job there -> load rises -> the job is
preempted and requeued (never cancelled), the memory hold cancelled, the replica woken (the
same pod, Ready again, no cold start), and the daemon's log says the reclaim was warm. The cold
start (kwok's pod start delay) is made long, so a cold reclaim would be visibly slower.
"""

from __future__ import annotations

import json
import re
import socket
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge import wellknown as wk
from bridge.config import SlurmConfig
from gpu_bridge_lab.sandbox.daemon_config import daemon_identity, sandbox_config, write_config
from gpu_bridge_lab.sandbox.e2e import (
    Watcher,
    World,
    event_time,
    put_load,
    read_events,
    replica_sleeping,
    submit_backlog,
    wait_until,
)
from gpu_bridge_lab.sandbox.serving import serving_sandbox
from sandbox_fixtures import QUIET_START_RPS, assert_requeued, daemon_run

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

NODES = 3
MIN_SERVING = 1
GRACE_S = 10
POD_START_S = 25.0  # the cold start: a cold reclaim would take grace + this
WAKE_S = 10.0  # the daemon's wake timeout (the simulator's level-1 wake takes ~2.6 s)
STATE_SAVE_S = SlurmConfig().state_save_s  # the daemon's default: a reclaimed node serves once its drain is saved
DRAIN_S = 45.0  # how long a lend retries the sleep while the replica's in-flight requests finish
REAL_MEMORY_MB = 16000  # the sandbox's nodes (8 CPUs)
HOLD_MB = 12000  # pools[].warm_hold_mb: the sleeping weights, scaled down to the sandbox node
DEF_MEM_PER_CPU = REAL_MEMORY_MB // 8  # a research job without --mem (1 CPU) fits beside the hold
# slurm_conf/slurm.conf.snippet's warm lines; DefMemPerCPU cluster-wide here (the snippet puts it on
# preempt's line, which the sandbox writes itself): only preempt's jobs go without --mem
WARM_SLURM_CONF = "\n".join([
    "SelectTypeParameters=CR_Core_Memory",  # replaces the sandbox's CR_Core (the last line wins)
    f"DefMemPerCPU={DEF_MEM_PER_CPU}",
    f"PartitionName={wk.SLURM_WARM_PARTITION} Nodes=gpu-node-[01-{NODES:02d}] PriorityTier=100 PreemptMode=OFF "
    "OverSubscribe=NO MaxTime=INFINITE State=UP",
])


def _free_port() -> int:
    """A port free on every address (each pod IP gets a listener on it)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def warm_world(prefix: str, pod_start_delay_s: float = POD_START_S) -> Iterator[tuple[Any, World, Path, int]]:
    """This module's sandbox, up for a module fixture (``yield from``); ``pod_start_delay_s``:
    the pods' cold start (a test that times none may start them sooner)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    port = _free_port()
    sb = serving_sandbox(d, nodes=NODES, grace_s=GRACE_S, pod_start_delay_s=pod_start_delay_s, pod_grace_s=3,
                         shutdown_timeout_s=2, vllm_extra=("--max-cv", "1.5"), warm_port=port, timeout_s=90.0,
                         extra_slurm_conf=WARM_SLURM_CONF, peak_rps=QUIET_START_RPS)
    sb.up()
    w = World(sb)
    try:
        yield sb, w, d, port
    finally:
        w.close()
        sb.down()


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, World, Path, int]]:
    yield from warm_world("gb-e2e-warm-")


def _pods(w: World) -> dict[str, tuple[str, str, str, bool]]:
    """node -> (pod name, uid, pod IP, Ready) of its one live serving pod."""
    out = {}
    for p in w._pods():
        if p.spec.node_name and p.metadata.deletion_timestamp is None:
            ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
            out[p.spec.node_name] = (p.metadata.name, p.metadata.uid, p.status.pod_ip or "", ready)
    return out


def _mem_holds(w: World) -> dict[str, tuple[str, str]]:
    """node -> (job id, state) of each memory hold in squeue (any state)."""
    return {str(j["name"])[len(wk.SLURM_WARM_HOLD_JOB_PREFIX):]: (str(j["job_id"]), str(j["job_state"]))
            for j in w.jobs() if j["partition"] == wk.SLURM_WARM_PARTITION
            and str(j["name"]).startswith(wk.SLURM_WARM_HOLD_JOB_PREFIX)}


def _alloc_mem_mb(sb: Any, node: str) -> int:
    out = sb.run_slurm(["scontrol", "--oneliner", "show", "node", node]).stdout
    return int(re.search(r"AllocMem=(\d+)", out).group(1))  # type: ignore[union-attr]


def _is_sleeping_at(ip: str, port: int) -> bool:
    """What the daemon asks: ``GET http://<pod IP>:<vllm_port>/is_sleeping``."""
    with urllib.request.urlopen(f"http://{ip}:{port}/is_sleeping", timeout=5) as resp:  # noqa: S310 - loopback only
        return bool(json.loads(resp.read())["is_sleeping"])


def warm_config(sb: Any, d: Path, port: int, **pool: Any) -> Path:
    """The daemon's config for this sandbox, its pool lending warm (``pool``: more of its keys)."""
    doc = sandbox_config(prometheus_url=sb.prometheus_url, **daemon_identity(sb), slurm_conf=sb.slurm.slurm_conf,
                         grace_s=GRACE_S, cold_start_s=POD_START_S, min_serving=MIN_SERVING, scale_down_window_s=6,
                         min_lend_s=5)
    doc["pools"][0].update(warm_lending=True, wake_s=WAKE_S, vllm_port=port, drain_s=DRAIN_S, warm_hold_mb=HOLD_MB, **pool)
    return write_config(d / "gpu-bridge.yaml", doc)


def warm_watcher(sb: Any, w: World) -> Watcher:
    """The watcher of a warm run: a sleeping replica beside research jobs is no violation, the
    memory holds are the warm partition's."""
    return Watcher(w, min_serving=MIN_SERVING, asleep=lambda pod: replica_sleeping(sb.vllm_url, pod),
                   mem_hold_partition=wk.SLURM_WARM_PARTITION)


def lent_warm(w: World, watcher: Watcher, jobs: int) -> list[str]:
    """Once the daemon runs: it opens every pod's gate (Ready), the watcher starts, and all
    ``jobs`` research jobs run on lent nodes; those nodes, sorted."""
    wait_until(lambda: all(r for *_, r in _pods(w).values()), 60, "the daemon to open every pod's gate (Ready)")
    watcher.start()
    wait_until(lambda: sum(len(v) for v in w.research_running_by_node().values()) == jobs, 150,
               "the research jobs to run on lent nodes")
    return sorted(w.research_running_by_node())


def test_the_daemon_lends_warm_and_reclaims_by_waking_the_same_replica(world: tuple[Any, World, Path, int]) -> None:
    sb, w, d, port = world
    out = d / "jobs"
    out.mkdir()
    out.chmod(0o777)
    job_ids = submit_backlog(sb, NODES, wk.SLURM_PREEMPT_PARTITION, NODES - MIN_SERVING, out, "train")
    before = _pods(w)
    assert len(before) == NODES and not any(r for *_, r in before.values()), before  # gated: not Ready yet
    assert all(ip.startswith("127.") for _, _, ip, _ in before.values()), before
    put_load(sb.vllm_url, {"rate": 2.0, "cv": 1.0})
    cfg = warm_config(sb, d, port)
    log_path = d / "daemon.log"
    watcher = warm_watcher(sb, w)
    with daemon_run(cfg, log_path, sb.env, watcher=watcher, saw_warm=True):
        # the daemon opens the gates of the pods it serves with: Ready, the same pods
        wait_until(lambda: all(r for *_, r in _pods(w).values()), 60, "the daemon to open every pod's gate (Ready)")
        assert {n: p[:2] for n, p in _pods(w).items()} == {n: p[:2] for n, p in before.items()}
        watcher.start()

        def jobs_running() -> bool:
            return sum(len(v) for v in w.research_running_by_node().values()) == len(job_ids)

        wait_until(jobs_running, 150, "the research jobs to run on nodes lent warm")
        lent = sorted(w.research_running_by_node())
        lent_pods = _pods(w)
        phases = w.phases()
        for node in lent:
            name, uid, ip, ready = lent_pods[node]
            assert (name, uid) == before[node][:2], (node, lent_pods[node], before[node])  # kept, not deleted
            assert not ready and phases[node] == "lent", (node, ready, phases[node])
            assert _is_sleeping_at(ip, port) is True and replica_sleeping(sb.vllm_url, name) is True
            record = (w.nodes()[node].metadata.annotations or {}).get(wk.ANNOTATION_WARM)
            assert record == f"asleep/{name}", record
        holds = _mem_holds(w)
        assert sorted(holds) == lent and all(state == "RUNNING" for _, state in holds.values()), holds
        for node in lent:  # the hold's memory plus the research job's DefMemPerCPU share: the rest is free
            assert _alloc_mem_mb(sb, node) == HOLD_MB + DEF_MEM_PER_CPU, (node, _alloc_mem_mb(sb, node))
        time.sleep(2)

        spike_at = time.time()
        put_load(sb.vllm_url, {"rate": 75.0, "cv": 1.0})
        wait_until(lambda: all(w.phases().get(n) == "serving" for n in lent)
                   and all(_pods(w).get(n, ("", "", "", False))[3] for n in lent), 90, "the warm nodes back to serving")
        after = _pods(w)
        # cancelled (squeue keeps ended jobs for MinJobAge) before the wakes, none left behind
        assert all(state in ("CANCELLED", "COMPLETING") for _, state in _mem_holds(w).values()), _mem_holds(w)
        for node in lent:
            name, uid, ip, ready = after[node]
            assert (name, uid) == before[node][:2] and ready, (node, after[node], before[node])  # woken, not cold-started
            assert _is_sleeping_at(ip, port) is False
        assert_requeued(w, job_ids, ("PENDING", "REQUEUED", "CONFIGURING", "RUNNING"))  # requeued, never cancelled

    ts = event_time
    submitted = {e["node"]: ts(e) for e in read_events(log_path, "node_step") if e.get("step") == "submit_mem_hold"}
    released = {e["node"]: ts(e) for e in read_events(log_path, "node_step") if e.get("step") == "resume"}
    cancelled = {e["node"]: ts(e) for e in read_events(log_path, "node_step") if e.get("step") == "cancel_mem_hold"}
    woken = {e["node"]: ts(e) for e in read_events(log_path, "node_step") if e.get("step") == "wake_replica"}
    for node in lent:  # the order at lend and at reclaim (docs/warm-lending.md)
        assert submitted[node] <= released[node] and cancelled[node] <= woken[node], (submitted, released, cancelled, woken)
    decisions = [e for e in read_events(log_path, "decision") if e["action"] == "reclaim" and ts(e) >= spike_at]
    reclaimed = {e["node"]: e for e in read_events(log_path, "node_reclaimed") if ts(e) >= spike_at}
    fallbacks = read_events(log_path, "warm_fallback")
    assert not fallbacks, fallbacks
    print(f"\nwarm reclaim (GraceTime {GRACE_S} s, state save {STATE_SAVE_S:g} s, cold start {POD_START_S:g} s): "
          "load spike at t=0")
    for node in lent:
        decided = min(ts(e) for e in decisions if e["node"] == node)
        ev = reclaimed[node]
        total = ts(ev) - decided
        release, back = ev["slurm_release_s"], ev["kubernetes_ready_s"]
        print(f"{node}: decided {decided - spike_at:.1f} s; Slurm released it {release:.1f} s after, serving (woken, "
              f"Ready) {back:.1f} s later: {total:.1f} s from decision to serving, mode={ev.get('mode')}")
        assert ev.get("mode") == "warm", ev
        # Slurm's part, as in a cold reclaim: the grace, then the daemon's requeue and drain
        assert GRACE_S - 1 <= release <= GRACE_S + 8, release
        # the vLLM part: the drain saved (the wait every reclaim has before its node serves
        # again), the wake (~2.6 s; the wakes of one pass run one after the other), the gate;
        # a cold start alone would be longer than all of it
        assert back <= STATE_SAVE_S + 10, back
        assert back < POD_START_S, back
        assert total <= GRACE_S + STATE_SAVE_S + 16, total
        assert total < GRACE_S + STATE_SAVE_S + POD_START_S - 8, total
