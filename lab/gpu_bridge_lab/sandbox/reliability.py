"""Reliability scenarios on the real serving sandbox (scripts/reliability.py and the tests).

``Harness`` owns one serving sandbox (real Slurm, the sandbox Kubernetes API server,
Prometheus, the vLLM simulator) and runs the daemon as a subprocess. Scenarios:

- ``crash_matrix``: SIGKILL the daemon right after a chosen write (``gpu_bridge_lab.faults``), restart
  it, and measure how long the restarted daemon takes to converge, with the invariants
  checked all along by a ``Watcher``.
- ``gpu_bridge_lab.sandbox.outages`` and ``two_instances`` build on the same harness.

Convergence ("every node in exactly one pool") is read from both schedulers, never from the
daemon: a node is *serving* when its phase is serving, a Ready pod runs on it and Slurm cannot
schedule on it (drained by us / held); *lent* when its phase is lent, it is fenced, has no
serving pod and Slurm can schedule on it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_bridge_lab import faults
from bridge import wellknown as wk
from gpu_bridge_lab.sandbox.daemon_config import daemon_identity, sandbox_config, write_config
from gpu_bridge_lab.sandbox.e2e import DaemonProc, Watcher, World, event_time, poll, put_load, read_events, write_events
from gpu_bridge_lab.sandbox.serving import serving_sandbox

GRACE_S = 5
POD_START_S = 2.0
LOW = {"rate": 2.0, "cv": 1.0}  # ~0.1 replicas of demand: lend all but min_serving
HIGH = {"rate": 30.0, "cv": 1.0}  # ~2.5 replicas of demand: every node of 3 needed, no runaway queue
JOB_S = 12

# Injection points in the order they happen. Bootstrap: the first start on unmanaged nodes.
BOOTSTRAP_POINTS = ("adopt", "ensure_drained", "ensure_hold")
LEND_POINTS = (faults.START_LENDING, "fence", "mark_pod", faults.SCALE, "evict_pod", "cancel_hold", "resume", "mark_lent")
RECLAIM_POINTS = (faults.START_RECLAIMING, "submit_hold", "requeue_jobs", "drain", "mark_returning", "unfence",
                  faults.SCALE, "mark_serving")


@dataclass
class Row:
    """One injection point's outcome."""

    transition: str  # bootstrap | lend | reclaim
    point: str
    crashed: bool = False  # the injected SIGKILL happened (False: the step did not occur)
    converged: bool = False
    seconds: float | None = None  # restart -> converged
    ticks: int | None = None  # iterations of the restarted daemon until converged
    violations: list[str] = field(default_factory=list)
    jobs_lost: int = 0
    note: str = ""


class Harness:
    """One serving sandbox + helpers to run daemons against it."""

    def __init__(self, nodes: int = 3, *, min_serving: int = 1, dir: Path | None = None,
                 policy: dict[str, Any] | None = None) -> None:
        self.dir = Path(dir) if dir else Path(tempfile.mkdtemp(prefix="gb-rel-", dir="/tmp"))
        self.n = nodes
        self.min_serving = min_serving
        self.sb = serving_sandbox(self.dir / "sb", nodes=nodes, grace_s=GRACE_S, pod_start_delay_s=POD_START_S,
                                  pod_grace_s=2, shutdown_timeout_s=1, vllm_extra=("--max-cv", "1.5"))
        self.policy_overrides = dict(policy or {})
        self.world: World | None = None
        self.watcher: Watcher | None = None
        self.daemons: list[DaemonProc] = []
        self.jobs: dict[str, Path] = {}  # job id -> its progress file
        self.job_dir = self.dir / "jobs"
        self.config_path = self.dir / "gpu-bridge.yaml"
        self._seq = 0
        self.last_load = "high"

    # --- set-up ---------------------------------------------------------------------------

    def up(self) -> Harness:
        self.dir.chmod(0o755)  # munged (user munge) must reach its socket dir under it
        (self.dir / "sb").mkdir(parents=True, exist_ok=True)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.sb.up()
        self.world = World(self.sb)
        self.write_config()
        self.watcher = Watcher(self.world, min_serving=self.min_serving)
        self.watcher.start()
        return self

    def config_doc(self, kubeconfig: Path | None = None, min_serving: int | None = None, **policy: Any) -> dict[str, Any]:
        ident = daemon_identity(self.sb)
        if kubeconfig is not None:
            ident["kubeconfig"] = kubeconfig
        doc = sandbox_config(prometheus_url=self.sb.prometheus_url, **ident,
                             grace_s=GRACE_S, cold_start_s=POD_START_S, min_serving=min_serving or self.min_serving,
                             scale_down_window_s=6, min_lend_s=10, lease_duration_s=6.0, forecast=False)
        doc["policy"].update(self.policy_overrides)
        doc["policy"].update(policy)
        return doc

    def write_config(self, path: Path | None = None, kubeconfig: Path | None = None, min_serving: int | None = None,
                     **policy: Any) -> Path:
        return write_config(path or self.config_path, self.config_doc(kubeconfig, min_serving, **policy))

    def down(self) -> None:
        for d in self.daemons:
            d.kill()
        if self.watcher is not None:
            self.watcher.close()
        if self.world is not None:
            self.world.close()
        self.sb.down()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Harness:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def w(self) -> World:
        assert self.world is not None
        return self.world

    # --- daemons ----------------------------------------------------------------------------

    def daemon(self, name: str, *, crash_at: str | None = None, config: Path | None = None,
               env: dict[str, str] | None = None) -> DaemonProc:
        self._seq += 1
        extra = dict(env or {})
        if crash_at:
            extra.update({faults.ENABLE_ENV: "1", faults.CRASH_ENV: crash_at})
        log_path = self.dir / f"daemon-{self._seq:02d}-{name}.log"
        d = DaemonProc(config or self.config_path, log_path, self.sb.env, extra).start()
        self.daemons.append(d)
        return d

    def load(self, body: dict[str, float]) -> None:
        assert self.sb.vllm_url
        put_load(self.sb.vllm_url, body)
        self.last_load = "high" if body == HIGH else "low"

    # --- states ----------------------------------------------------------------------------

    def owners(self) -> dict[str, str]:
        try:
            return self.w.ownership()
        except Exception as exc:  # noqa: BLE001 - a read during an injected outage
            return {"?": f"unreadable: {exc}"}

    def all_serving(self) -> bool:
        o = self.owners()
        return len(o) == self.n and all(v == "serving" for v in o.values())

    def lent_down_to_min(self) -> bool:
        o = self.owners()
        vals = list(o.values())
        return (len(o) == self.n and vals.count("lent") == self.n - self.min_serving
                and vals.count("serving") == self.min_serving)

    def settled(self) -> bool:
        o = self.owners()
        return len(o) == self.n and all(v in ("serving", "lent") for v in o.values())

    # --- research jobs ---------------------------------------------------------------------

    def submit_job(self, tag: str) -> str:
        out = self.job_dir / f"runs-{tag}"
        res = self.sb.run_slurm([
            "sbatch", "--parsable", "-p", wk.SLURM_PREEMPT_PARTITION, "--requeue", "--gres=gpu:4", "-J", f"research-{tag}",
            "-o", str(self.job_dir / f"job-{tag}-%j.out"),
            "--wrap", f"echo start $SLURM_RESTART_COUNT >> {out}; sleep {JOB_S}; echo done $SLURM_RESTART_COUNT >> {out}",
        ])
        job_id = res.stdout.strip().split(";")[0]
        self.jobs[job_id] = out
        return job_id

    def job_finished(self, job_id: str) -> bool:
        f = self.jobs[job_id]
        return f.exists() and "done" in f.read_text()

    def lost_jobs(self) -> list[str]:
        """Submitted jobs that neither finished nor are still known to Slurm."""
        try:
            known = {str(j["job_id"]) for j in self.w.jobs()}
        except Exception:  # noqa: BLE001 - slurmctld down: nothing can be judged lost
            return []
        return [j for j in self.jobs if j not in known and not self.job_finished(j)]

    def ensure_jobs_on_lent(self) -> None:
        """Every lent node gets a research job (a pending requeued one, or a new one)."""
        jobs = self.w.jobs()
        waiting = [j for j in jobs if j["partition"] == wk.SLURM_PREEMPT_PARTITION and j["job_state"] != "RUNNING"]
        running = self.w.research_running_by_node(jobs)
        lent = [n for n, v in self.owners().items() if v == "lent"]
        need = len([n for n in lent if n not in running]) - len(waiting)
        for _ in range(max(0, need)):
            self._seq += 1
            self.submit_job(f"j{self._seq}")
        if poll(lambda: set(lent) <= set(self.w.research_running_by_node()), 15, 0.5):
            return
        # requeued jobs may wait for their BeginTime: give each idle lent node a fresh job
        running = self.w.research_running_by_node()
        for _ in [n for n in lent if n not in running]:
            self._seq += 1
            self.submit_job(f"j{self._seq}")
        poll(lambda: set(lent) <= set(self.w.research_running_by_node()), 15, 0.5)

    def unmanage(self) -> None:
        """Make every pool node look never managed: no phase, not drained, no hold job (with
        no daemon running), so the next start adopts them."""
        for node in self.w.nodes():
            self.w.core.patch_node(node, {"metadata": {
                "labels": {wk.LABEL_PHASE: None},
                "annotations": {wk.ANNOTATION_PHASE_SINCE: None, wk.ANNOTATION_REASON: None},
            }})
        holds = list(self.w.holds().values())
        if holds:
            self.sb.run_slurm(["scancel", *holds], check=False)
        for node in self.w.nodes():
            self.sb.run_slurm(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)

    # --- one crash row ----------------------------------------------------------------------

    def crash_row(self, transition: str, point: str, *, crash_timeout_s: float = 60.0,
                  converge_timeout_s: float = 90.0) -> Row:
        """Start a daemon armed to SIGKILL itself after the first write of ``point``; once it
        died, start a plain one and time its convergence to the transition's end state."""
        assert self.watcher is not None
        row = Row(transition, point)
        mark = self.watcher.mark()
        target = self.lent_down_to_min if transition == "lend" else self.all_serving
        armed = self.daemon(f"{transition}-{point}", crash_at=f"{point}:1")
        poll(lambda: not armed.alive() or target(), crash_timeout_s, 0.2)
        rc = armed.returncode()
        row.crashed = rc == -9
        if not row.crashed:
            armed.stop()
            row.converged = target()
            row.note = "step did not occur in this run (no crash)" if rc is None or rc == 0 else f"daemon exited rc {rc}"
        else:
            restarted = time.monotonic()
            d = self.daemon(f"{transition}-after-{point}")
            ok = poll(target, converge_timeout_s, 0.2)
            row.seconds = time.monotonic() - restarted
            row.ticks = d.ticks()
            row.converged = bool(ok)
            if not ok:
                row.note = "; ".join(f"{n}: {v}" for n, v in self.owners().items() if v not in ("serving", "lent"))
            d.stop()
        row.violations = self.watcher.violations[mark:]
        row.jobs_lost = len(self.lost_jobs())
        return row


def crash_matrix(h: Harness, *, bootstrap: Iterable[str] = BOOTSTRAP_POINTS, lend: Sequence[str] = LEND_POINTS,
                 reclaim: Sequence[str] = RECLAIM_POINTS, finish_jobs: bool = True, log: Any = print) -> list[Row]:
    """Every injection point once. Lend and reclaim rows alternate (each reclaim takes back the
    nodes the previous lend gave, with research jobs on them); the last step lends again and
    waits for every research job to finish (none lost)."""
    rows: list[Row] = []
    h.load(HIGH)
    for point in bootstrap:
        h.unmanage()
        rows.append(h.crash_row("bootstrap", point))
        log(format_row(rows[-1]))
    if not h.all_serving():  # from a fresh sandbox without bootstrap rows: adopt first
        d = h.daemon("adopt")
        poll(h.all_serving, 60, 0.2)
        d.stop()
    for i in range(max(len(lend), len(reclaim))):
        h.load(LOW)
        rows.append(h.crash_row("lend", lend[i] if i < len(lend) else "none"))
        log(format_row(rows[-1]))
        h.ensure_jobs_on_lent()
        h.load(HIGH)
        rows.append(h.crash_row("reclaim", reclaim[i] if i < len(reclaim) else "none"))
        log(format_row(rows[-1]))
    if finish_jobs:
        h.load(LOW)
        d = h.daemon("finish")
        poll(lambda: all(h.job_finished(j) for j in h.jobs), 150 + JOB_S * max(1, len(h.jobs)), 1.0)
        d.stop()
        unfinished = [j for j in h.jobs if not h.job_finished(j)]
        if unfinished:
            log(h.sb.run_slurm(["squeue", "-o", "%i %j %T %r %S %N"], check=False).stdout)
            log(str(h.owners()))
        rows.append(Row("final", "jobs finish", converged=not unfinished, jobs_lost=len(h.lost_jobs()),
                        note=f"{len(h.jobs) - len(unfinished)}/{len(h.jobs)} research jobs finished"
                        + (f"; unfinished {unfinished}" if unfinished else "")))
        log(format_row(rows[-1]))
    return rows


HEADER = f"{'transition':<10} {'injection point':<17} {'crashed':<8} {'converged':<10} {'s':>6} {'ticks':>6} " \
         f"{'violations':>10} {'jobs lost':>9}  note"


def format_row(r: Row) -> str:
    secs = f"{r.seconds:.1f}" if r.seconds is not None else "-"
    ticks = str(r.ticks) if r.ticks is not None else "-"
    return (f"{r.transition:<10} {r.point:<17} {'yes' if r.crashed else 'no':<8} {'yes' if r.converged else 'NO':<10} "
            f"{secs:>6} {ticks:>6} {len(r.violations):>10} {r.jobs_lost:>9}  {r.note}"
            + (f" [{r.violations[0]}]" if r.violations else ""))


def format_matrix(rows: Sequence[Row]) -> str:
    return "\n".join([HEADER, *(format_row(r) for r in rows)])


__all__ = ["Harness", "Row", "crash_matrix", "format_matrix", "format_row", "read_events"]


@dataclass
class TwoInstanceResult:
    leader_first: str  # log file name of the first holder
    standby: str
    writes_before_kill: dict[str, int]  # log -> writes while the first holder lived
    killed_mid: str  # which node in which phase when the holder was SIGKILLed
    takeover_s: float | None  # SIGKILL -> the standby's lease_acquired / lease_expired_taking_over
    lease_duration_s: float
    finished: bool  # the half-done transition completed under the new holder
    finish_s: float | None
    standby_writes_before_takeover: int
    violations: list[str]
    jobs_lost: int


def two_instances(h: Harness, *, lease_duration_s: float = 6.0) -> TwoInstanceResult:
    """Two daemons with the same config; SIGKILL the Lease holder while a node is lending."""
    assert h.watcher is not None
    mark = h.watcher.mark()
    h.load(HIGH)
    a = h.daemon("instance-a")
    poll(lambda: read_events(a.log_path, "lease_acquired"), 30, 0.2)
    b = h.daemon("instance-b")
    poll(lambda: b.metrics_url(0.1), 30, 0.2)
    time.sleep(2.0)
    h.load(LOW)
    node = poll(lambda: next((n for n, p in h.w.phases().items() if p == "lending"), None), 90, 0.05)
    killed_at_wall = time.time()
    killed_at = time.monotonic()
    a.kill()
    killed_mid = f"{node} lending" if node else "no node lending (killed while steady)"

    def took_over() -> float | None:
        for ev in ("lease_acquired", "lease_expired_taking_over"):
            docs = [d for d in read_events(b.log_path, ev) if event_time(d) >= killed_at_wall]
            if docs:
                return event_time(docs[0])
        return None

    t_over = poll(took_over, lease_duration_s * 3 + 10, 0.1)
    takeover_s = t_over - killed_at_wall if t_over else None
    ok = poll(h.lent_down_to_min, 90, 0.2)
    finish_s = time.monotonic() - killed_at if ok else None
    b.stop()
    b_writes = write_events(b.log_path)
    before = [w for w in b_writes if event_time(w) < (t_over or float("inf"))]
    return TwoInstanceResult(
        leader_first=a.log_path.name, standby=b.log_path.name,
        writes_before_kill={a.log_path.name: len(write_events(a.log_path)),
                            b.log_path.name: len([w for w in b_writes if event_time(w) < killed_at_wall])},
        killed_mid=killed_mid, takeover_s=takeover_s, lease_duration_s=lease_duration_s, finished=bool(ok),
        finish_s=finish_s, standby_writes_before_takeover=len(before), violations=h.watcher.violations[mark:],
        jobs_lost=len(h.lost_jobs()),
    )


def format_two_instances(r: TwoInstanceResult) -> str:
    return "\n".join([
        f"instance A ({r.leader_first}) took the Lease; instance B ({r.standby}) stood by",
        "writes while A lived: " + ", ".join(f"{k}: {v}" for k, v in r.writes_before_kill.items()),
        f"B's writes before it held the Lease: {r.standby_writes_before_takeover}",
        f"A SIGKILLed with {r.killed_mid}",
        f"B took over after {r.takeover_s:.1f} s (lease duration {r.lease_duration_s:.0f} s)" if r.takeover_s is not None
        else "B did NOT take over",
        f"half-done transition finished by B: {'yes' if r.finished else 'NO'}"
        + (f", {r.finish_s:.1f} s after the kill" if r.finish_s is not None else ""),
        f"invariant violations: {len(r.violations)}; jobs lost: {r.jobs_lost}",
    ])
