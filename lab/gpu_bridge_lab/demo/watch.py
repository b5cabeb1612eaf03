"""What the demo watches: the simulator's load, both schedulers, and the daemon's JSON log.

``Observer`` is the thin adapter (HTTP, Kubernetes API, squeue); ``JobTracker`` and
``LogTail`` turn what it reads into samples and events the timeline prints and the report
sums up.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from bridge import wellknown as wk
from bridge.adapters.slurm.parse import parse_jobs
from bridge.adapters.slurm.types import SlurmJobInfo
from gpu_bridge_lab.sandbox import serving

RUNNING_STATES = frozenset({"running", "completing"})
DONE_STATES = frozenset({"completed", "failed", "cancelled", "timeout", "node_fail", "out_of_memory", "boot_fail",
                         "deadline"})


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at everything, at wall time ``t`` (seconds since the replay started)."""

    t: float
    trace_s: float
    rate: float  # offered load (req/s) the simulator applies now
    arrived: float  # requests arrived so far (counter)
    ready: int  # Ready serving replicas (pods)
    phases: Mapping[str, str]  # node -> gpu-bridge.io/phase
    running: int  # our research jobs running
    pending: int  # ours pending (incl. requeued)
    requeued_pending: int  # ours pending after at least one requeue
    busy_nodes: int = 0  # nodes running one of our jobs

    @property
    def lent(self) -> int:
        return sum(1 for p in self.phases.values() if p == "lent")


class Observer:
    """Reads the simulator, the Kubernetes API server and Slurm (argv lists, timeouts)."""

    def __init__(self, vllm_url: str, kubeconfig: Path, slurm_env: Mapping[str, str], timeout_s: float = 5.0) -> None:
        self.vllm_url = vllm_url
        self.slurm_env = dict(slurm_env)
        self.timeout_s = timeout_s
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        self.core = k8s.CoreV1Api(api)

    def load(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.vllm_url + "/load", timeout=self.timeout_s) as resp:
            return json.loads(resp.read())

    def put_load(self, body: Mapping[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(self.vllm_url + "/load", data=json.dumps(dict(body)).encode(), method="PUT",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read())

    def phases(self) -> dict[str, str]:
        nodes = self.core.list_node(_request_timeout=self.timeout_s).items
        return {n.metadata.name: (n.metadata.labels or {}).get(wk.LABEL_PHASE) or "-" for n in nodes}

    def ready_pods(self) -> int:
        pods = self.core.list_namespaced_pod(serving.NAMESPACE, label_selector=serving.POD_SELECTOR,
                                             _request_timeout=self.timeout_s).items
        n = 0
        for p in pods:
            ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
            if ready and p.spec.node_name and p.metadata.deletion_timestamp is None:
                n += 1
        return n

    def slurm_states(self) -> dict[str, str]:
        """node -> Slurm state (idle, drained, mixed, allocated, ...)."""
        res = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.slurm_env, capture_output=True, text=True,
                             timeout=self.timeout_s * 3, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"sinfo failed (rc {res.returncode}): {res.stderr.strip()[-300:]}")
        out = {}
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1].rstrip("*~#!%$@^-").lower()
        return out

    def jobs(self) -> tuple[SlurmJobInfo, ...]:
        res = subprocess.run(["squeue", "--json", "--states=all"], env=self.slurm_env, capture_output=True,
                             text=True, timeout=self.timeout_s * 3, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"squeue failed (rc {res.returncode}): {res.stderr.strip()[-300:]}")
        return parse_jobs(res.stdout, active_only=False)


@dataclass
class JobRecord:
    job_id: str
    name: str
    submitted_t: float
    runs: int = 0  # times seen starting to run
    restarts: int = 0  # Slurm's restart count
    state: str = "pending"
    nodes: tuple[str, ...] = ()
    first_start_t: float | None = None
    finished_t: float | None = None
    requeued_t: list[float] = field(default_factory=list)
    resumed_t: list[float] = field(default_factory=list)

    @property
    def requeued(self) -> bool:
        return self.restarts > 0 or bool(self.requeued_t)

    @property
    def resumed(self) -> bool:
        return bool(self.resumed_t)


@dataclass(frozen=True, slots=True)
class JobEvent:
    t: float
    job_id: str
    name: str
    kind: str  # started | requeued | resumed | finished | failed
    nodes: tuple[str, ...] = ()
    detail: str = ""  # for failed: Slurm's state and reason


class JobTracker:
    """Follows our jobs through squeue snapshots (pure: no I/O)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}

    def add(self, job_id: str, name: str, t: float) -> None:
        self.jobs[job_id] = JobRecord(job_id, name, t)

    def update(self, snapshot: tuple[SlurmJobInfo, ...], t: float) -> list[JobEvent]:
        seen = {j.job_id: j for j in snapshot}
        events: list[JobEvent] = []
        for rec in self.jobs.values():
            j = seen.get(rec.job_id)
            if j is None:
                if rec.finished_t is None and rec.runs and rec.state not in ("pending", "requeued"):
                    # aged out of squeue (MinJobAge) after it ran: it finished
                    rec.finished_t, rec.state = t, "completed"
                    events.append(JobEvent(t, rec.job_id, rec.name, "finished", rec.nodes))
                continue
            state = j.state
            if j.restart_count > rec.restarts:
                rec.restarts = j.restart_count
                rec.requeued_t.append(t)
                events.append(JobEvent(t, rec.job_id, rec.name, "requeued", rec.nodes))
            if state in RUNNING_STATES and rec.state not in RUNNING_STATES:
                rec.runs += 1
                rec.nodes = j.nodes
                if rec.first_start_t is None:
                    rec.first_start_t = t
                    events.append(JobEvent(t, rec.job_id, rec.name, "started", j.nodes))
                else:
                    rec.resumed_t.append(t)
                    events.append(JobEvent(t, rec.job_id, rec.name, "resumed", j.nodes))
            elif state in DONE_STATES and rec.finished_t is None:
                rec.finished_t = t
                if rec.first_start_t is None:  # ran and ended between two snapshots
                    rec.runs, rec.first_start_t = 1, t
                kind = "finished" if state == "completed" else "failed"
                detail = "" if kind == "finished" else f"state {state}, reason {j.state_reason or '-'}, restarts {j.restart_count}"
                events.append(JobEvent(t, rec.job_id, rec.name, kind, rec.nodes, detail))
            rec.state = state
        return events

    def busy_nodes(self) -> int:
        return len({n for r in self.jobs.values() if r.state in RUNNING_STATES for n in r.nodes})

    def counts(self) -> tuple[int, int, int]:
        """(running, pending, pending after a requeue) of our jobs."""
        running = sum(1 for r in self.jobs.values() if r.state in RUNNING_STATES)
        pending = [r for r in self.jobs.values() if r.state in ("pending", "requeued", "configuring")
                   and r.finished_t is None]
        return running, len(pending), sum(1 for r in pending if r.requeued)


def log_time(doc: Mapping[str, Any]) -> float | None:
    ts = doc.get("timestamp")
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class LogTail:
    """New JSON lines of the daemon's log since the last call (partial lines kept)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._buf = ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                f.seek(self._pos)
                chunk = f.read()
                self._pos = f.tell()
        except FileNotFoundError:
            return []
        self._buf += chunk
        lines = self._buf.split("\n")
        self._buf = lines.pop()
        out = []
        for line in lines:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out


def now() -> float:
    return time.time()
