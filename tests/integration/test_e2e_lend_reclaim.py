"""End to end on the sandbox: real Slurm, the sandbox's Kubernetes API server, real
Prometheus, the vLLM simulator following the Deployment, and the daemon as a subprocess
(`gpu-bridge run --config`), exactly as an operator runs it.

Load falls -> nodes are lent and `sbatch -p preempt --requeue` jobs run on them -> load rises
-> the jobs are requeued (not lost), the nodes go back to serving with Ready replicas -> load
falls again -> the requeued jobs finish. Throughout, a watcher checks that Ready serving
capacity never falls below min_serving and that no node runs a research job while a serving
pod is on it. The reclaim latency breakdown is printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from datetime import datetime
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from bridge import wellknown as wk
from bridge.sandbox.daemon_config import sandbox_config, write_config
from bridge.sandbox.serving import serving_sandbox

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = 4
GRACE_S = 5
POD_START_S = 3.0
MIN_SERVING = 1
JOB_S = 25


def put_load(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url + "/load", data=json.dumps(body).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def wait_until(check: Any, timeout_s: float, what: str, poll_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class World:
    """Read-only views of both schedulers for the test's own checks."""

    def __init__(self, sb: Any) -> None:
        self.sb = sb
        api = k8s_config.new_client_from_config(config_file=str(sb.kubeconfig))
        self.core = k8s.CoreV1Api(api)

    def phases(self) -> dict[str, str | None]:
        return {n.metadata.name: (n.metadata.labels or {}).get(wk.LABEL_PHASE) for n in self.core.list_node().items}

    def ready_pods_by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in self.core.list_namespaced_pod("serving", label_selector="app=vllm").items:
            ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
            if p.spec.node_name and p.metadata.deletion_timestamp is None and ready:
                out.setdefault(p.spec.node_name, []).append(p.metadata.name)
        return out

    def pods_by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in self.core.list_namespaced_pod("serving", label_selector="app=vllm").items:
            if p.spec.node_name:
                out.setdefault(p.spec.node_name, []).append(p.metadata.name)
        return out

    def jobs(self) -> list[dict[str, Any]]:
        out = self.sb.run_slurm(["squeue", "--json"]).stdout
        return json.loads(out)["jobs"]

    def research_running_by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for j in self.jobs():
            if j["partition"] != wk.SLURM_PREEMPT_PARTITION or j["job_state"] != "RUNNING":
                continue
            node = j.get("nodes") or ""
            out.setdefault(node, []).append(str(j["job_id"]))
        return out


class Watcher(threading.Thread):
    """Samples both schedulers every 0.5 s and records invariant violations."""

    def __init__(self, world: World) -> None:
        super().__init__(daemon=True)
        self.world = world
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.min_ready = 10**9
        self.samples = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                ready = self.world.ready_pods_by_node()
                pods = self.world.pods_by_node()
                research = self.world.research_running_by_node()
            except Exception:  # a transient read error is not a violation
                time.sleep(0.5)
                continue
            self.samples += 1
            n_ready = sum(len(v) for v in ready.values())
            self.min_ready = min(self.min_ready, n_ready)
            if n_ready < MIN_SERVING:
                self.violations.append(f"{time.time():.1f}: only {n_ready} Ready serving pods")
            for node, jobs in research.items():
                if node in pods:
                    self.violations.append(f"{time.time():.1f}: {node} runs jobs {jobs} and serving pods {pods[node]}")
            time.sleep(0.5)


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, World, Path]]:
    d = Path(tempfile.mkdtemp(prefix="gb-e2e-", dir="/tmp"))
    sb = serving_sandbox(d, nodes=NODES, grace_s=GRACE_S, pod_start_delay_s=POD_START_S, pod_grace_s=3,
                         shutdown_timeout_s=2, vllm_extra=("--max-cv", "1.5"))
    sb.up()
    try:
        yield sb, World(sb), d
    finally:
        sb.down()


def read_events(log_path: Path, event: str) -> list[dict[str, Any]]:
    out = []
    for line in log_path.read_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("event") == event:
            out.append(doc)
    return out


def test_lend_then_reclaim_requeues_jobs_and_restores_serving(world: tuple[Any, World, Path]) -> None:
    sb, w, d = world
    vllm = sb.vllm_url
    assert vllm
    put_load(vllm, {"rate": 2.0, "cv": 1.0})  # ~0.2 replicas of demand: lend down to min_serving
    cfg = write_config(
        d / "gpu-bridge.yaml",
        sandbox_config(prometheus_url=sb.prometheus_url, kubeconfig=sb.kubeconfig, slurm_conf=sb.slurm.slurm_conf, grace_s=GRACE_S,
                       cold_start_s=POD_START_S, min_serving=MIN_SERVING, scale_down_window_s=6, min_lend_s=5),
    )
    log_path = d / "daemon.log"
    env = {**os.environ, **sb.env}
    with open(log_path, "w") as log_file:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "bridge", "run", "--config", str(cfg), "--log-format", "json"],
            stdout=log_file, stderr=subprocess.STDOUT, env=env,
        )
    watcher = Watcher(w)
    watcher.start()
    try:
        # 1. load is low: all but min_serving nodes are lent
        wait_until(lambda: list(w.phases().values()).count("lent") == NODES - MIN_SERVING, 90, "nodes to be lent")
        lent = sorted(n for n, p in w.phases().items() if p == "lent")
        out = d / "jobs"
        out.mkdir()
        job_ids = []
        for i in range(NODES - MIN_SERVING):
            res = sb.run_slurm([
                "sbatch", "--parsable", "-p", "preempt", "--requeue", "--gres=gpu:4", "-J", f"research-{i}",
                "-o", str(out / f"job-{i}-%j.out"),
                "--wrap", f"echo start $SLURM_JOB_ID $SLURM_RESTART_COUNT $(hostname) >> {out}/runs-{i}; "
                          f"sleep {JOB_S}; echo done $SLURM_RESTART_COUNT >> {out}/runs-{i}",
            ])
            job_ids.append(res.stdout.strip().split(";")[0])

        def all_running_on_lent() -> bool:
            running = w.research_running_by_node()
            return sum(len(v) for v in running.values()) == len(job_ids) and set(running) <= set(lent)

        wait_until(all_running_on_lent, 30, "research jobs to run on the lent nodes")
        time.sleep(3)

        # 2. load rises: every node is needed; the jobs are requeued, nodes return to serving
        spike_at = time.time()
        put_load(vllm, {"rate": 75.0, "cv": 1.0})
        wait_until(
            lambda: all(p == "serving" for p in w.phases().values()) and len(w.ready_pods_by_node()) == NODES,
            120, "every node back to serving with a Ready replica",
        )
        back_at = time.time()
        jobs = {str(j["job_id"]): j for j in w.jobs()}
        for jid in job_ids:
            assert jid in jobs, f"job {jid} vanished from squeue (lost?)"
            assert jobs[jid]["job_state"] in ("PENDING", "REQUEUED", "CONFIGURING"), jobs[jid]["job_state"]
            assert jobs[jid]["restart_cnt"] >= 1

        # 3. load falls again: nodes are lent again and the requeued jobs finish
        put_load(vllm, {"rate": 2.0, "cv": 1.0})

        def finished() -> bool:
            runs = [(out / f"runs-{i}") for i in range(len(job_ids))]
            return all(r.exists() and "done 1" in r.read_text() for r in runs)

        wait_until(finished, 150, "requeued jobs to run again and finish", poll_s=1.0)
    finally:
        watcher.stop.set()
        watcher.join(5)
        daemon.terminate()
        try:
            rc = daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            rc = daemon.wait()
        print(log_path.read_text()[-3000:] if rc else "")
    assert rc == 0, "the daemon must exit 0 on SIGTERM"
    for i in range(len(job_ids)):
        text = (out / f"runs-{i}").read_text()
        assert "done 0" not in text  # preempted in the first run, never cancelled
        assert "done 1" in text
    assert watcher.samples > 20
    assert watcher.violations == [], watcher.violations[:5]
    assert watcher.min_ready >= MIN_SERVING

    reclaims = read_events(log_path, "node_reclaimed")
    assert len(reclaims) >= NODES - MIN_SERVING

    def ts(doc: dict[str, Any]) -> float:
        return datetime.fromisoformat(doc["timestamp"].replace("Z", "+00:00")).timestamp()

    decisions = [e for e in read_events(log_path, "decision") if e["action"] == "reclaim" and ts(e) >= spike_at]
    steps = [e for e in read_events(log_path, "node_step") if ts(e) >= spike_at]
    print(f"\nload spike at t=0; every node serving again at {back_at - spike_at:.1f} s "
          f"(GraceTime {GRACE_S} s, pod start {POD_START_S} s)")
    print(f"{'node':<13}{'detect':>8}{'slurm release':>15}{'k8s ready':>11}{'total':>8}{'daemon share':>14}")
    for node in lent:
        decided = min(ts(e) for e in decisions if e["node"] == node)
        drained = min(ts(e) for e in steps if e["node"] == node and e["step"] == "drain")
        served = min(ts(e) for e in steps if e["node"] == node and e["step"] == "mark_serving")
        detect, release, ready = decided - spike_at, drained - decided, served - drained
        # The daemon's own share: what is left after the job grace and the pod start delay,
        # less the scrape interval (1 s) and the Slurm scheduler's own pass (sched_interval 2 s).
        share = (served - spike_at) - GRACE_S - POD_START_S
        print(f"{node:<13}{detect:>8.2f}{release:>15.2f}{ready:>11.2f}{served - spike_at:>8.2f}{share:>14.2f}")
        assert detect <= 1.0 + 2.0 + 1.5, "a spike is detected within one scrape interval plus one tick"
