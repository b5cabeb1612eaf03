"""Helpers for end-to-end runs on the serving sandbox (tests and scripts/reliability.py).

- ``World``: read-only views of both schedulers (phases, pods, Slurm nodes and jobs).
- ``Watcher``: a thread sampling both every ``period_s`` and recording invariant violations
  (a node running research jobs while a serving pod is on it; Ready capacity < min_serving).
  Given ``asleep`` (warm lending), the one allowed pod beside research jobs is a sleeping one,
  not Ready.
- ``DaemonProc``: ``gpu-bridge run --config`` as a subprocess with a JSON log, as an
  operator runs it (optionally with crash injection, see ``gpu_bridge_lab.faults``).
- ``put_load``, ``wait_until``, ``read_events``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpu_bridge_lab import faults
from bridge import wellknown as wk
from gpu_bridge_lab.sandbox import serving
from gpu_bridge_lab.sandbox.cluster import slurm as sandbox_slurm


def put_load(vllm_url: str, body: Mapping[str, Any]) -> None:
    """Set the vLLM simulator's arrival process (e.g. ``{"rate": 2.0, "cv": 1.0}``)."""
    req = urllib.request.Request(vllm_url + "/load", data=json.dumps(dict(body)).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback only
        if resp.status != 200:
            raise RuntimeError(f"PUT {vllm_url}/load: HTTP {resp.status}")


def replica_sleeping(vllm_url: str, pod: str) -> bool | None:
    """The vLLM simulator's ``GET /replicas/{pod}/is_sleeping`` (None: no such replica or no
    sleep mode)."""
    url = f"{vllm_url}/replicas/{urllib.parse.quote(pod, safe='')}/is_sleeping"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback only
            value = json.loads(resp.read()).get("is_sleeping")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return value if isinstance(value, bool) else None


def submit_backlog(sb: Any, nodes: int, partition: str, jobs: int, out: Path, name: str, *extra: str) -> list[str]:
    """Drain ``gpu-node-[01-NN]`` as gpu-bridge's own (slurm_conf/README.md's install: the
    lendable nodes start drained, so waiting jobs start only on nodes the daemon lends) and
    submit ``jobs`` whole-node jobs to ``partition`` that requeue and record each start in
    ``out/runs-I``; their job ids."""
    drained = sb.run_slurm(["scontrol", "update", f"NodeName=gpu-node-[01-{nodes:02d}]", "State=DRAIN",
                            "Reason=gpu-bridge: serving"])
    assert drained.returncode == 0, drained.stderr
    ids = []
    for i in range(jobs):
        res = sb.run_slurm(["sbatch", "--parsable", "-p", partition, "--requeue", *extra, "--gres=gpu:4",
                            "-J", f"{name}-{i}", "-o", str(out / f"job-{i}-%j.out"),
                            "--wrap", f"echo start $SLURM_RESTART_COUNT >> {out}/runs-{i}; sleep 600"])
        assert res.returncode == 0, res.stderr
        ids.append(res.stdout.strip().split(";")[0])
    return ids


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.25) -> Any:
    """Poll ``check`` until truthy; AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def lease_identity(identity: str) -> tuple[str, int] | None:
    """(hostname, pid) of a daemon's Lease identity, ``hostname-pid-suffix``
    (bridge.adapters.kube.lease.default_identity); None for any other holder."""
    parts = identity.rsplit("-", 2)
    return (parts[0], int(parts[1])) if len(parts) == 3 and parts[1].isdigit() else None


def poll(check: Callable[[], Any], timeout_s: float, poll_s: float = 0.25) -> Any:
    """Like ``wait_until`` but returns None on timeout (for "did it happen?" questions)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    return None


def read_events(log_path: Path, event: str | None = None) -> list[dict[str, Any]]:
    """The JSON log lines of one event (all events when None); non-JSON lines skipped."""
    out = []
    try:
        text = log_path.read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and (event is None or doc.get("event") == event):
            out.append(doc)
    return out


def event_time(doc: Mapping[str, Any]) -> float:
    return datetime.fromisoformat(str(doc["timestamp"]).replace("Z", "+00:00")).timestamp()


# The log events that are writes to Slurm or Kubernetes (the actuator's and the adapters').
WRITE_EVENTS = frozenset({"node_step", "pool_scaled", "node_transition_started", "node_phase_set", "node_fenced",
                          "node_unfenced", "slurm_job_released"})


def write_events(log_path: Path) -> list[dict[str, Any]]:
    """Events that record a write (a ``node_step`` counts only when it changed something)."""
    out = []
    for doc in read_events(log_path):
        ev = doc.get("event")
        if ev not in WRITE_EVENTS:
            continue
        if ev == "node_step" and not doc.get("changed"):
            continue
        out.append(doc)
    return out


_LIVE_JOB_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED"})


def _plain_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """Slurm 24.11's ``job_state: ["RUNNING"]`` and ``{"set","infinite","number"}`` values as
    22.05 writes them (``"RUNNING"``, plain numbers), so checks read both releases alike."""
    out: dict[str, Any] = {}
    for k, v in job.items():
        if k == "job_state" and isinstance(v, list):
            v = str(v[0]) if v else ""
        elif isinstance(v, dict) and set(v) == {"set", "infinite", "number"}:
            v = v["number"] if v["set"] and not v["infinite"] else 0
        out[k] = v
    return out


def stop_process(proc: subprocess.Popen[bytes] | None, timeout_s: float) -> int | None:
    """SIGTERM, SIGKILL after ``timeout_s``; the exit code (None: never started)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(10)
    return proc.returncode


class World:
    """Read-only views of both schedulers of a serving sandbox."""

    def __init__(self, sb: Any) -> None:
        self.sb = sb
        # research partitions: the sandbox's preempt-fast too when it runs one (issue 23's tier)
        fast = getattr(sb, "fast_grace_s", None)
        self.research_partitions = (wk.SLURM_PREEMPT_PARTITION,) + (("preempt-fast",) if fast else ())
        api = k8s_config.new_client_from_config(config_file=str(sb.kubeconfig))
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.apps = k8s.AppsV1Api(api)

    def close(self) -> None:
        self.api.close()

    def nodes(self) -> dict[str, Any]:
        return {n.metadata.name: n for n in self.core.list_node(_request_timeout=5).items}

    def phases(self) -> dict[str, str | None]:
        return {name: (n.metadata.labels or {}).get(wk.LABEL_PHASE) for name, n in self.nodes().items()}

    def fenced(self) -> dict[str, bool]:
        out = {}
        for name, n in self.nodes().items():
            taints = n.spec.taints or []
            out[name] = bool(n.spec.unschedulable) or any(t.key == wk.TAINT_KEY for t in taints)
        return out

    def _pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(serving.NAMESPACE, label_selector=serving.POD_SELECTOR,
                                                  _request_timeout=5).items)

    def pods_by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in self._pods():
            if p.spec.node_name:
                out.setdefault(p.spec.node_name, []).append(p.metadata.name)
        return out

    def ready_pods_by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in self._pods():
            ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
            if p.spec.node_name and p.metadata.deletion_timestamp is None and ready:
                out.setdefault(p.spec.node_name, []).append(p.metadata.name)
        return out

    def replicas(self) -> int:
        dep = self.apps.read_namespaced_deployment(serving.DEPLOYMENT, serving.NAMESPACE, _request_timeout=5)
        return int(dep.spec.replicas or 0)

    def jobs(self) -> list[dict[str, Any]]:
        """squeue's jobs in 22.05's plain shape (24.11's state lists and number objects flattened)."""
        out = self.sb.run_slurm(["squeue", "--json"]).stdout
        return [_plain_job(j) for j in json.loads(out)["jobs"]]

    def slurm_states(self) -> dict[str, str]:
        return sandbox_slurm.node_states(self.sb.slurm)

    def research_running_by_node(self, jobs: list[dict[str, Any]] | None = None) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for j in jobs if jobs is not None else self.jobs():
            if j["partition"] not in self.research_partitions or j["job_state"] != "RUNNING":
                continue
            out.setdefault(j.get("nodes") or "", []).append(str(j["job_id"]))
        return out

    def holds(self, jobs: list[dict[str, Any]] | None = None) -> dict[str, str]:
        """node -> job id of our hold job (pending or running)."""
        out = {}
        for j in jobs if jobs is not None else self.jobs():
            if j["job_state"] not in _LIVE_JOB_STATES:
                continue
            if j["partition"] == wk.SLURM_HOLD_PARTITION and str(j["name"]).startswith(wk.SLURM_HOLD_JOB_PREFIX):
                out[str(j["name"])[len(wk.SLURM_HOLD_JOB_PREFIX):]] = str(j["job_id"])
        return out

    def ownership(self) -> dict[str, str]:
        """node -> "serving" (Ready pod, drained by us in Slurm), "lent" (schedulable in Slurm,
        no serving pod), or a description of why it is in neither or both."""
        phases = self.phases()
        fenced = self.fenced()
        ready = self.ready_pods_by_node()
        pods = self.pods_by_node()
        jobs = self.jobs()
        holds = self.holds(jobs)
        research = self.research_running_by_node(jobs)
        states = self.slurm_states()
        out = {}
        for node, phase in phases.items():
            st = states.get(node, "unknown")
            slurm_usable = not any(x in st for x in ("drain", "down", "fail", "unknown")) and node not in holds
            if node in research and node in pods:
                out[node] = f"BOTH: jobs {research[node]} and pods {pods[node]}"
            elif phase == "serving" and node in ready and ("drain" in st or "down" in st):
                out[node] = "serving"
            elif phase == "lent" and fenced[node] and node not in pods and slurm_usable:
                out[node] = "lent"
            else:
                out[node] = (f"in transit: phase={phase} fenced={fenced[node]} ready_pods={len(ready.get(node, []))} "
                             f"slurm={st} hold={holds.get(node)}")
        return out


class Watcher(threading.Thread):
    """Samples both schedulers every ``period_s`` and records invariant violations."""

    def __init__(self, world: World, *, min_serving: int, period_s: float = 0.5,
                 asleep: Callable[[str], bool | None] | None = None, mem_hold_partition: str | None = None) -> None:
        super().__init__(daemon=True)
        self.world = world
        self.min_serving = min_serving
        self.period_s = period_s
        self.asleep = asleep  # pod -> its engine sleeps (warm lending): such a pod may stay beside research jobs
        self.warm_samples = 0  # samples that saw research jobs beside a sleeping, not Ready pod
        # warm lending's memory hold (slurm.warm_partition): a lent node running research beside its
        # sleeping pod must carry its running gpu-bridge-warm:<node> job (reclaiming: it goes first)
        self.mem_hold_partition = mem_hold_partition
        self.mem_hold_samples = 0
        self.stop_event = threading.Event()
        self.violations: list[str] = []
        self.min_ready = 10**9
        self.samples = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                squeue = self.world.jobs()  # before the phases: a hold missing now was cancelled after the lend ended
                ready = self.world.ready_pods_by_node()
                pods = self.world.pods_by_node()
                research = self.world.research_running_by_node(squeue)
                phases = self.world.phases() if self.mem_hold_partition else {}
            except Exception:  # noqa: BLE001 - a transient read error (e.g. an injected outage) is not a violation
                self.stop_event.wait(self.period_s)
                continue
            self.samples += 1
            n_ready = sum(len(v) for v in ready.values())
            self.min_ready = min(self.min_ready, n_ready)
            if n_ready < self.min_serving:
                self.violations.append(f"{time.time():.1f}: only {n_ready} Ready serving pods (< {self.min_serving})")
            for node, jobs in research.items():
                if node not in pods:
                    continue
                if self.asleep is not None and len(pods[node]) == 1 and node not in ready and self.asleep(pods[node][0]):
                    self.warm_samples += 1  # lent warm: its one pod sleeps, out of the Service
                    if self.mem_hold_partition and phases.get(node) == "lent":
                        if any(j["partition"] == self.mem_hold_partition and j["name"] == wk.SLURM_WARM_HOLD_JOB_PREFIX + node
                               and j["job_state"] == "RUNNING" and j.get("nodes") == node for j in squeue):
                            self.mem_hold_samples += 1
                        else:
                            self.violations.append(f"{time.time():.1f}: {node} lent warm runs jobs {jobs} "
                                                   "without its memory hold running")
                    continue
                self.violations.append(f"{time.time():.1f}: {node} runs jobs {jobs} and serving pods {pods[node]}"
                                       + (" (not one sleeping pod out of the Service)" if self.asleep is not None else ""))
            self.stop_event.wait(self.period_s)

    def mark(self) -> int:
        """The index of the next violation (to attribute violations to a phase of a run)."""
        return len(self.violations)

    def close(self) -> None:
        self.stop_event.set()
        self.join(5)


@dataclass
class DaemonProc:
    """``gpu-bridge run --config CFG --log-format json`` as a subprocess."""

    config: Path
    log_path: Path
    env: Mapping[str, str]
    extra_env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    def start(self) -> DaemonProc:
        env = {**os.environ, **self.env, **self.extra_env}
        self.started_at = time.time()
        with open(self.log_path, "a") as log_file:
            self.proc = subprocess.Popen(
                # with crash injection asked for, the daemon runs with the injector hooked in
                [sys.executable, "-m", "gpu_bridge_lab.faults" if faults.CRASH_ENV in self.extra_env else "bridge", "run",
                 "--config", str(self.config), "--log-format", "json"],
                stdout=log_file, stderr=subprocess.STDOUT, env=env,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code (-9 after a SIGKILL), or None if still running after ``timeout_s``."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (the daemon finishes its iteration and exits 0), SIGKILL after ``timeout_s``."""
        return stop_process(self.proc, timeout_s)

    def metrics_url(self, timeout_s: float = 15.0) -> str | None:
        """From this run's ``metrics_listening`` log line."""

        def find() -> str | None:
            docs = [d for d in read_events(self.log_path, "metrics_listening") if event_time(d) >= self.started_at - 1]
            return f"http://{docs[-1]['host']}:{docs[-1]['port']}/metrics" if docs else None

        return poll(find, timeout_s, 0.1)

    def metric(self, name: str) -> float | None:
        """One sample value from the daemon's /metrics (None if unreachable or absent)."""
        url = self.metrics_url(1.0)
        if url is None:
            return None
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback only
                text = resp.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                try:
                    return float(line.rsplit(" ", 1)[1])
                except ValueError:
                    return None
        return None

    def ticks(self) -> int | None:
        """Ticks this instance completed (the tick-duration histogram's count)."""
        v = self.metric("gpu_bridge_tick_duration_seconds_count")
        return None if v is None else int(v)


@dataclass
class WebProc:
    """``gpu-bridge web --config CFG --log-format json`` as a subprocess (the research view,
    under the identity its config names: ``web.kubeconfig``)."""

    config: Path
    log_path: Path
    env: Mapping[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    def start(self) -> WebProc:
        self.started_at = time.time()
        with open(self.log_path, "a") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bridge", "web", "--config", str(self.config), "--log-format", "json"],
                stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
            )
        return self

    def url(self, timeout_s: float = 30.0) -> str:
        """The base URL, from this run's ``web_listening`` log line, once it answers."""

        def find() -> str | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"gpu-bridge web exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            docs = [d for d in read_events(self.log_path, "web_listening") if event_time(d) >= self.started_at - 1]
            return f"http://{docs[-1]['host']}:{docs[-1]['port']}" if docs else None

        return str(wait_until(find, timeout_s, "gpu-bridge web to listen"))

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (uvicorn finishes the requests under way and exits 0), SIGKILL after ``timeout_s``."""
        return stop_process(self.proc, timeout_s)
