"""A randomized soak on the real serving sandbox (``scripts/reliability.py --soak``).

From one seed: load flips at random intervals, faults at random times (the daemon SIGKILLed,
slurmctld SIGKILLed and restarted, Prometheus paused, a second daemon, the leader paused past
its Lease, kube-apiserver or etcd paused past the Lease, a node's slurmd SIGKILLed and
restarted, slurmctld paused), several research jobs in flight that checkpoint unit by unit.
Invariants are checked every second from outside, through the real CLIs (``scontrol``,
``squeue``, ``kubectl``), never through the daemon:

1. no node usable by Slurm while a serving pod is bound to it (read Slurm, then Kubernetes,
   then Slurm again: a violation only if both Slurm reads say usable, so a transition between
   the reads is not mistaken for one);
2. Ready serving pods never below ``min_serving``;
3. no research job is ever seen TIMEOUT, FAILED, CANCELLED, NODE_FAIL, ... (seen live, judged
   at the end: ``judge_bad_ends`` reports apart, with slurmctld's own log as evidence, a run
   whose start a slurmctld SIGKILL lost and that Slurm then failed itself);

and at the end:

4. every submitted job COMPLETED with its work done exactly once (below);
5. after the faults stop, every node is serving or lent and its phase agrees with Slurm
   (serving: drained by gpu-bridge; lent: usable by Slurm);
6. after the faults a running daemon holds the Lease, and only the Lease holder wrote: every
   write a daemon logged lies within its own leadership (from acquiring the Lease to losing,
   releasing or dying), and no other daemon acquired the Lease between that acquisition and
   the write.

**Exactly once.** A job has N units of work. After a unit it appends ``unit <i> <job> <run>``
to its units file in one ``write`` (its checkpoint: a run resumes at the number of units
recorded). A unit a run was doing when it was preempted is redone by the next run, which is
allowed; a unit recorded twice, out of order, by another job or after ``done`` is a violation.
A job requeued after its work was done (a requeue racing its exit, or slurmctld recovering it
as running after a SIGKILL lost its completion) runs again, finds N units and records
``done`` again without working: allowed, and counted (``noop_reruns``). So "exactly once"
means: each unit is committed once, and every run resumed exactly where the previous one
committed.

Research jobs behave in two ways, drawn per job: ``save`` (on the preemption signal, take a
random 0 .. GraceTime + 3 s to save, then exit with ``SLURM_REQUEUE_EXIT``: some exit before
the grace deadline, some after) and ``run-on`` (ignore the signal and keep working until
stopped; some finish their last unit inside the grace or after its deadline).
"""

from __future__ import annotations

import heapq
import json
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge import wellknown as wk
from gpu_bridge_lab.sandbox.daemon_config import daemon_identity, write_config
from gpu_bridge_lab.sandbox.e2e import DaemonProc, event_time, lease_identity, poll, read_events, write_events
from gpu_bridge_lab.sandbox.reliability import GRACE_S, HIGH, LOW, Harness

BAD_JOB_STATES = frozenset({"TIMEOUT", "FAILED", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                            "DEADLINE", "PREEMPTED", "REVOKED", "SPECIAL_EXIT"})
FAULTS = ("daemon_kill", "slurmctld_kill", "prometheus_pause", "second_daemon", "leader_pause",
          "apiserver_pause", "etcd_pause", "slurmd_kill", "slurmctld_pause")
# paused past the soak's Lease (6 s) so the leader cannot renew it: leadership must lapse and
# be taken again once the control plane answers (etcd: the apiserver answers, with errors);
# slurmctld paused (hung, not refusing): every Slurm command of the daemon waits out its
# timeout, and a command sent before the pause may be carried out after it
CONTROL_PLANE_PAUSES = {"apiserver_pause": "kube-apiserver", "etcd_pause": "etcd", "slurmctld_pause": "slurmctld"}
LEADER_EVENTS_START = ("lease_acquired", "lease_expired_taking_over")
LEADER_EVENTS_END = ("leadership_lost", "leadership_lapsed", "lease_released")

# One research job: units of work, checkpointed one by one (see the module docstring).
JOB_SCRIPT = r"""#!/bin/bash
tag=$1; units=$2; slices=$3; mode=$4; save_s=$5; dir=$6; rq=$7
f="$dir/units-$tag"
got=0
trap 'got=1' URG
run=${SLURM_RESTART_COUNT:-0}
if [ -f "$f" ]; then i=$(grep -c '^unit ' "$f"); else i=0; fi
echo "start $SLURM_JOB_ID $run $i $(date +%s.%N)" >> "$dir/runs-$tag"
while [ "$i" -lt "$units" ]; do
    s=0
    while [ "$s" -lt "$slices" ]; do
        sleep 0.1
        s=$((s + 1))
        if [ "$got" = 1 ] && [ "$mode" = save ]; then
            sleep "$save_s"
            echo "saved $SLURM_JOB_ID $run $i $(date +%s.%N)" >> "$dir/runs-$tag"
            exit "$rq"
        fi
    done
    echo "unit $i $SLURM_JOB_ID $run" >> "$f"
    i=$((i + 1))
done
echo "done $SLURM_JOB_ID $run" >> "$f"
exit 0
"""


@dataclass
class SoakConfig:
    seed: int
    duration_s: float
    nodes: int = 4
    min_serving: int = 1
    jobs_in_flight: int = 4
    flip_s: tuple[float, float] = (40.0, 90.0)  # load flips every uniform(a, b) seconds
    fault_gap_s: tuple[float, float] = (15.0, 45.0)  # a fault every uniform(a, b) seconds
    units: tuple[int, int] = (4, 12)
    unit_s: tuple[float, float] = (1.5, 4.0)
    tick_s: float = 1.0
    lease_duration_s: float = 6.0
    drain_timeout_s: float = 420.0  # after the faults: time for every job to complete
    faults: tuple[str, ...] = FAULTS  # the kinds drawn from (``--faults``: a focused run)


@dataclass
class Violation:
    t: float  # seconds since the soak started
    kind: str
    evidence: str

    def __str__(self) -> str:
        return f"[{self.t:7.1f} s] VIOLATION {self.kind}: {self.evidence}"


@dataclass
class SoakJob:
    tag: str
    job_id: str
    units: int
    mode: str
    submitted_at: float = 0.0
    states: list[str] = field(default_factory=list)
    ended_badly: str = ""  # evidence of a bad state seen live (judged at the end: judge_bad_ends)
    lost: str = ""  # lost by slurmctld (a SIGKILL before it saved the submission): the evidence


@dataclass
class SoakResult:
    seed: int
    duration_s: float
    faults: list[tuple[float, str, str]]
    violations: list[Violation]
    jobs: int
    completed: int
    requeues: int
    flips: int
    samples: int
    skipped_samples: int
    wall_s: float
    lost_by_slurmctld: list[str] = field(default_factory=list)
    noop_reruns: list[str] = field(default_factory=list)
    slurm_double_starts: list[str] = field(default_factory=list)
    failed_by_slurmctld: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for _, k, _ in self.faults:
            kinds[k] = kinds.get(k, 0) + 1
        return (f"soak seed={self.seed} duration={self.duration_s:.0f}s wall={self.wall_s:.0f}s flips={self.flips} "
                f"faults={len(self.faults)} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or 'none'}) "
                f"jobs={self.jobs} completed={self.completed} requeues={self.requeues} "
                f"lost_by_slurmctld_sigkill={len(self.lost_by_slurmctld)} noop_reruns={len(self.noop_reruns)} "
                f"started_twice_by_slurmctld={len(self.slurm_double_starts)} "
                f"failed_by_slurmctld_after_lost_start={len(self.failed_by_slurmctld)} "
                f"samples={self.samples} (skipped {self.skipped_samples}) violations={len(self.violations)}")


def _parse_scontrol_nodes(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        m = re.search(r"NodeName=(\S+)", line)
        st = re.search(r" State=(\S+)", line)
        if m and st:
            reason = re.search(r" Reason=(.*?)(?: \[|$)", line)
            out[m.group(1)] = st.group(1) + ("|" + reason.group(1) if reason else "")
    return out


_PURGED = re.compile(r"^\[(\S+)\] Purged files for defunct batch JobId=(\d+)")
_NON_STARTABLE = re.compile(r"^\[(\S+)\] Killing non-startable batch JobId=(\d+): Job credential revoked")
# slurmctld writes its state at most every 5 s (SAVE_MAX_WAIT in its state_save.c): a SIGKILL
# loses what changed in the last 5 s; 1 s more for the clocks of the job and of the harness
SLURM_UNSAVED_WINDOW_S = 6.0


def _ctld_log_times(ctld_log: Path, pattern: re.Pattern[str]) -> dict[str, list[float]]:
    """job id -> when slurmctld logged ``pattern`` (its group 1 the stamp, group 2 the job id)."""
    out: dict[str, list[float]] = {}
    try:
        text = ctld_log.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            t = time.mktime(time.strptime(m.group(1).split(".")[0], "%Y-%m-%dT%H:%M:%S"))
            out.setdefault(m.group(2), []).append(t + float("0." + m.group(1).split(".")[1]) if "." in m.group(1) else t)
    return out


def purged_jobs(ctld_log: Path) -> dict[str, list[float]]:
    """job id -> when slurmctld purged a batch job it had no record of (after a restart)."""
    return _ctld_log_times(ctld_log, _PURGED)


def non_startable_jobs(ctld_log: Path) -> dict[str, list[float]]:
    """job id -> when slurmctld failed a batch job slurmd refused to launch again ("Job
    credential revoked": slurmd had killed the run the restarted controller did not know of)."""
    return _ctld_log_times(ctld_log, _NON_STARTABLE)


def slurm_usable(state: str) -> bool:
    """A node Slurm may start a research job on: no DRAIN/DOWN/FAIL, responding, registered."""
    base = state.split("|", 1)[0]
    return not any(x in base for x in ("DRAIN", "DOWN", "FAIL", "UNKNOWN", "*", "NOT_RESPONDING", "FUTURE"))


class Soak:
    """One seeded soak run (see the module docstring)."""

    def __init__(self, cfg: SoakConfig, *, log: Callable[[str], None] = print, dir: Path | None = None,
                 keep_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.keep_dir = keep_dir  # where the evidence of a failed run is copied
        self.rng = random.Random(cfg.seed)
        self.say = log
        self.h = Harness(cfg.nodes, min_serving=cfg.min_serving, dir=dir)
        self.t0 = 0.0
        self.faults: list[tuple[float, str, str]] = []
        self.violations: list[Violation] = []
        self.jobs: dict[str, SoakJob] = {}
        self.agenda: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = 0
        self.leader: DaemonProc | None = None
        self.second: DaemonProc | None = None
        self.daemon_ends: dict[str, float] = {}  # log path -> wall time it was SIGKILLed
        self.paused: set[str] = set()
        self.ctld_kills: list[float] = []
        self.slurm_double_starts: list[str] = []  # a run started twice by slurmctld after a SIGKILL
        self.noop_reruns: list[str] = []  # requeued after its work was done: reran with nothing to do
        self.lost: list[str] = []  # submissions slurmctld lost in a SIGKILL (see judge_lost_submissions)
        self.failed_by_slurm: list[str] = []  # runs slurmctld lost in a SIGKILL, then failed (judge_bad_ends)
        self.flips = 0
        self.samples = 0
        self.skipped = 0
        self.lock = threading.Lock()
        self.stop_checks = threading.Event()
        self.submitting = True

    # --- helpers ---------------------------------------------------------------------------

    def now(self) -> float:
        return time.time() - self.t0

    def violation(self, kind: str, evidence: str) -> None:
        v = Violation(self.now(), kind, evidence)
        with self.lock:
            self.violations.append(v)
        self.say(str(v))

    def at(self, delay_s: float, what: str, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.agenda, (time.time() + delay_s, self._seq, what, action))

    def fault(self, kind: str, detail: str) -> None:
        self.faults.append((self.now(), kind, detail))
        self.say(f"[{self.now():7.1f} s] fault {kind}: {detail}")

    def cli(self, argv: list[str], timeout_s: float = 10.0) -> str:
        if argv[0] == "kubectl":
            # HOME in the soak's dir: kubectl keeps its discovery cache under $HOME/.kube
            env = {**self.h.sb.env, "PATH": "/usr/bin:/bin", "HOME": str(self.h.dir)}
            res = subprocess.run(argv, env=env, cwd=self.h.dir, capture_output=True, text=True, timeout=timeout_s,
                                 check=False)
        else:
            res = self.h.sb.run_slurm(argv, timeout_s=timeout_s, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"{argv[0]} rc {res.returncode}: {res.stderr.strip()[:200]}")
        return res.stdout

    # --- the daemons -------------------------------------------------------------------------

    def config(self) -> Path:
        doc = self.h.config_doc()
        doc["policy"]["tick_s"] = self.cfg.tick_s
        doc["daemon"]["lease_duration_s"] = self.cfg.lease_duration_s
        return write_config(self.h.dir / "soak.yaml", doc)

    def start_leader(self) -> None:
        self.leader = self.h.daemon("soak", config=self.h.dir / "soak.yaml")

    # --- research jobs -------------------------------------------------------------------

    def submit(self) -> None:
        self._seq += 1
        tag = f"s{self.cfg.seed}-{self._seq}"
        units = self.rng.randint(*self.cfg.units)
        slices = max(1, round(self.rng.uniform(*self.cfg.unit_s) * 10))
        mode = self.rng.choice(("save", "run-on"))
        save_s = round(self.rng.uniform(0.0, GRACE_S + 3.0), 2)
        script = self.h.job_dir / "soak-job.sh"
        if not script.exists():
            script.write_text(JOB_SCRIPT)
            script.chmod(0o755)
        res = self.h.sb.run_slurm([
            "sbatch", "--parsable", "-p", wk.SLURM_PREEMPT_PARTITION, "--requeue", "--gres=gpu:4", "-J", f"soak-{tag}",
            f"--signal=B:URG@{GRACE_S}", "-o", str(self.h.job_dir / f"soak-{tag}.out"), "--open-mode=append",
            str(script), tag, str(units), str(slices), mode, str(save_s), str(self.h.job_dir), str(wk.SLURM_REQUEUE_EXIT),
        ], check=False)
        if res.returncode != 0:
            self.say(f"[{self.now():7.1f} s] sbatch failed (slurmctld down?): {res.stderr.strip()[:120]}")
            return
        job_id = res.stdout.strip().split(";")[0]
        self.jobs[job_id] = SoakJob(tag, job_id, units, mode, submitted_at=time.time())

    def top_up(self) -> None:
        if not self.submitting or "slurmctld" not in self.h.sb.records or "slurmctld" in self.paused:
            return  # a submission to a hung slurmctld could be carried out after sbatch gave up: a job not tracked
        live = [j for j in self.jobs.values()
                if not j.lost and not (j.states and j.states[-1] in BAD_JOB_STATES | {"COMPLETED"})]
        for _ in range(self.cfg.jobs_in_flight - len(live)):
            self.submit()

    # --- faults --------------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        h, rng = self.h, self.rng
        if kind == "daemon_kill" and self.leader is not None:
            self.leader.kill()
            self.daemon_ends[str(self.leader.log_path)] = time.time()
            down = round(rng.uniform(0.0, 5.0), 1)
            self.fault(kind, f"SIGKILL {self.leader.log_path.name}; a new daemon in {down} s")
            self.leader = None
            self.at(down, "restart daemon", self.start_leader)
        elif kind == "slurmctld_kill" and "slurmctld" in h.sb.records:
            down = round(rng.uniform(2.0, 12.0), 1)
            h.sb.kill_process("slurmctld")
            self.ctld_kills.append(time.time())
            self.fault(kind, f"SIGKILL slurmctld, restarted in {down} s")
            self.at(down, "restart slurmctld", lambda: h.sb.ensure_daemons())
        elif kind == "prometheus_pause" and "prometheus" not in self.paused:
            hold = round(rng.uniform(5.0, 25.0), 1)
            self._signal_component("prometheus", signal.SIGSTOP)
            self.paused.add("prometheus")
            self.fault(kind, f"SIGSTOP Prometheus for {hold} s")

            def cont() -> None:
                self._signal_component("prometheus", signal.SIGCONT)
                self.paused.discard("prometheus")

            self.at(hold, "resume prometheus", cont)
        elif kind in CONTROL_PLANE_PAUSES and CONTROL_PLANE_PAUSES[kind] in h.sb.records \
                and CONTROL_PLANE_PAUSES[kind] not in self.paused:
            name = CONTROL_PLANE_PAUSES[kind]
            hold = round(rng.uniform(5.0, 25.0), 1)
            self._signal_component(name, signal.SIGSTOP)
            self.paused.add(name)
            lease = "" if name == "slurmctld" else f" (Lease {self.cfg.lease_duration_s:g} s)"
            self.fault(kind, f"SIGSTOP {name} for {hold} s{lease}")

            def cont_plane() -> None:
                self._signal_component(name, signal.SIGCONT)
                self.paused.discard(name)

            self.at(hold, f"resume {name}", cont_plane)
        elif kind == "slurmd_kill":
            running = sorted(n for n in h.sb.node_names if f"slurmd:{n}" in h.sb.records)
            if not running:
                self.fault(kind + "_skipped", "no slurmd running")
                return
            node = rng.choice(running)
            down = round(rng.uniform(2.0, 12.0), 1)
            h.sb.kill_process(f"slurmd:{node}")
            self.fault(kind, f"SIGKILL slurmd of {node} (its jobs' steps run on), restarted in {down} s")
            self.at(down, f"restart slurmd of {node}", lambda: h.sb.ensure_daemons())
        elif kind == "second_daemon" and self.second is None:
            hold = round(rng.uniform(15.0, 60.0), 1)
            self.second = h.daemon("soak-second", config=self.h.dir / "soak.yaml")
            self.fault(kind, f"a second daemon ({self.second.log_path.name}) for {hold} s")

            def stop_second() -> None:
                if self.second is not None:
                    self.second.stop()
                    self.second = None

            self.at(hold, "stop second daemon", stop_second)
        elif kind == "leader_pause" and self.lease_holder() is not None:
            d = self.lease_holder()
            assert d is not None
            hold = round(rng.uniform(1.5, 3.0) * self.cfg.lease_duration_s, 1)
            assert d.proc is not None
            d.proc.send_signal(signal.SIGSTOP)
            self.fault(kind, f"SIGSTOP {d.log_path.name} for {hold} s (Lease {self.cfg.lease_duration_s:g} s)")
            self.at(hold, "resume paused daemon", lambda: d.proc.send_signal(signal.SIGCONT) if d.alive() else None)  # type: ignore[union-attr]
        else:
            self.fault(kind + "_skipped", "not applicable now")

    def lease_holder(self) -> DaemonProc | None:
        """The running daemon that holds the Lease now (read through kubectl)."""
        try:
            ns = daemon_identity(self.h.sb)["lease_namespace"]  # the daemons' own (RBAC: gpu-bridge)
            doc = json.loads(self.cli(["kubectl", "get", "lease", wk.LEASE_NAME, "-n", ns, "-o", "json",
                                       "--request-timeout=5s"]))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError):
            return None
        holder = lease_identity(str((doc.get("spec") or {}).get("holderIdentity") or ""))
        return next((d for d in self.h.daemons if d.alive() and holder is not None and d.pid == holder[1]), None)

    def _signal_component(self, name: str, sig: int) -> None:
        if name in self.h.sb.records:
            self.h.sb.signal_process(name, sig)

    # --- the checks ----------------------------------------------------------------------

    def _slurm_nodes(self) -> dict[str, str]:
        return _parse_scontrol_nodes(self.cli(["scontrol", "-o", "show", "node"]))

    def _holds_running(self) -> set[str]:
        out = self.cli(["squeue", "-h", "-p", wk.SLURM_HOLD_PARTITION, "-t", "RUNNING", "-o", "%j|%N"])
        return {line.split("|")[1] for line in out.splitlines() if line.startswith(wk.SLURM_HOLD_JOB_PREFIX)}

    def _pods(self) -> list[dict[str, Any]]:
        from gpu_bridge_lab.sandbox import serving

        doc = json.loads(self.cli(["kubectl", "get", "pods", "-n", serving.NAMESPACE, "-l", serving.POD_SELECTOR,
                                   "-o", "json", "--request-timeout=5s"]))
        return list(doc.get("items", []))

    def check_once(self) -> None:
        try:
            s1, h1 = self._slurm_nodes(), self._holds_running()
            pods = self._pods()
            s2, h2 = self._slurm_nodes(), self._holds_running()
            jobs = self.cli(["squeue", "-h", "-t", "all", "-o", "%i|%T|%N|%j"])
        except (RuntimeError, subprocess.TimeoutExpired, ValueError):
            self.skipped += 1  # a fault under way (slurmctld down, API slow): no judgement
            return
        self.samples += 1
        bound: dict[str, list[str]] = {}
        ready = 0
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            name = p["metadata"]["name"]
            if node:
                bound.setdefault(node, []).append(name)
            conds = (p.get("status") or {}).get("conditions") or []
            if not p["metadata"].get("deletionTimestamp") and any(
                    c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                ready += 1
        for node, names in bound.items():
            usable = [slurm_usable(s.get(node, "UNKNOWN")) and node not in h for s, h in ((s1, h1), (s2, h2))]
            if all(usable):
                self.violation("slurm-usable-with-pod", f"{node}: Slurm {s1.get(node)} / {s2.get(node)} (no running "
                                                        f"hold job) while serving pod(s) {names} are bound to it")
        if ready < self.cfg.min_serving:
            self.violation("min-serving", f"{ready} Ready serving pod(s) < min_serving {self.cfg.min_serving}")
        for line in jobs.splitlines():
            job_id, state, nodes, name = (line.split("|", 3) + ["", "", ""])[:4]
            j = self.jobs.get(job_id)
            if j is None or j.lost:
                continue
            if name != f"soak-{j.tag}":
                # slurmctld reused the id: our submission was lost in a slurmctld SIGKILL
                # (judged at the end from slurmctld's log; a job that ever ran is a violation)
                j.lost = j.lost or f"id {job_id} now names {name!r} ({state})"
                continue
            if not j.states or j.states[-1] != state:
                j.states.append(state)
                if state in BAD_JOB_STATES and not j.ended_badly:
                    j.ended_badly = (f"job {job_id} ({j.tag}, {j.mode}) {state} on {nodes} at {self.now():.1f} s; "
                                     f"states seen {j.states}; runs: {self._runs(j)}")
                    self.say(f"[{self.now():7.1f} s] job ended badly (judged at the end): {j.ended_badly}")

    def _checker(self) -> None:
        while not self.stop_checks.is_set():
            t = time.monotonic()
            self.check_once()
            self.stop_checks.wait(max(0.0, 1.0 - (time.monotonic() - t)))

    def _runs(self, j: SoakJob) -> list[str]:
        f = self.h.job_dir / f"runs-{j.tag}"
        return f.read_text().splitlines() if f.exists() else []

    def _starts(self, j: SoakJob) -> list[tuple[str, float]]:
        """(SLURM_RESTART_COUNT, wall time) of each run's ``start`` line, in file order."""
        return [(f[2], float(f[4])) for f in (x.split() for x in self._runs(j)) if f[0] == "start" and len(f) >= 5]

    def judge_lost_submissions(self) -> None:
        """A submission slurmctld had not saved when it was SIGKILLed is gone after the restart
        (its StateSaveLocation is written asynchronously; the id is handed out again). Slurm's
        own log says so ("Purged files for defunct batch JobId=N" after the restart; a run it
        had started is then an orphan Slurm kills). Such a job is reported as lost by the
        controller, not as a gpu-bridge violation, only with that evidence and a SIGKILL of
        slurmctld between its submission and the purge; without them it is a violation."""
        purged = purged_jobs(self.h.sb.slurm.ctld_log())
        for j in self.jobs.values():
            when = [t for t in purged.get(j.job_id, []) if t >= j.submitted_at - 1.0]
            seen_done = j.states and j.states[-1] == "COMPLETED"
            if not when or seen_done:
                if j.lost and not seen_done:
                    self.violation("job-vanished", f"job {j.job_id} ({j.tag}): {j.lost}, but slurmctld's log shows "
                                                   f"no purge of it after its submission; runs: {self._runs(j)}")
                    j.lost = ""
                continue
            runs = [x for x in self._runs(j) if x.startswith("start ")]
            kills = [k for k in self.ctld_kills if j.submitted_at - 1.0 <= k <= when[0]]
            if not kills:
                self.violation("job-vanished", f"job {j.job_id} ({j.tag}) purged by slurmctld at "
                                               f"{when[0] - self.t0:.1f} s with no SIGKILL of slurmctld since its "
                                               f"submission; runs: {runs}")
                continue
            j.lost = (f"submitted at {j.submitted_at - self.t0:.1f} s, slurmctld SIGKILLed at "
                      f"{kills[0] - self.t0:.1f} s before saving it, purged on restart at {when[0] - self.t0:.1f} s "
                      f"(runs started before: {len(runs)}; an orphaned run is killed by Slurm)")
            self.lost.append(f"job {j.job_id} ({j.tag}): {j.lost}")
            self.say(f"[{self.now():7.1f} s] lost by slurmctld (not gpu-bridge): {self.lost[-1]}")

    def judge_bad_ends(self) -> None:
        """Every job seen in a bad state is a violation, but one: slurmctld SIGKILLed within its
        unsaved window after starting the job's run (the start was lost), and after the restart
        Slurm itself failed it ("Killing non-startable batch JobId=N: Job credential revoked":
        slurmd had killed the run the new controller did not know of, then refused the same
        credential). gpu-bridge never touched such a run; it is reported apart, with that
        evidence, like submissions slurmctld lost. Without all of it: a violation."""
        failed = non_startable_jobs(self.h.sb.slurm.ctld_log())
        for j in self.jobs.values():
            if not j.ended_badly or j.lost:
                continue
            last = max((t for _, t in self._starts(j)), default=None)
            kills = [k for k in self.ctld_kills if last is not None and last <= k <= last + SLURM_UNSAVED_WINDOW_S]
            when = [t for t in failed.get(j.job_id, []) if kills and t >= kills[0]]
            final = j.states[-1] if j.states else ""
            if kills and when and final == "FAILED":
                j.lost = (f"run started at {last - self.t0:.1f} s, slurmctld SIGKILLed {kills[0] - last:.1f} s later "
                          f"before saving the start, failed by slurmctld on restart at {when[0] - self.t0:.1f} s "
                          f"(Job credential revoked)")
                self.failed_by_slurm.append(f"job {j.job_id} ({j.tag}): {j.lost}")
                self.say(f"[{self.now():7.1f} s] failed by slurmctld after a lost start (not gpu-bridge): "
                         f"{self.failed_by_slurm[-1]}")
            else:
                self.violation("job-ended-badly", j.ended_badly)

    def check_jobs(self) -> None:
        for j in self.jobs.values():
            if j.lost:
                continue
            f = self.h.job_dir / f"units-{j.tag}"
            lines = f.read_text().splitlines() if f.exists() else []
            units = [line.split() for line in lines if line.startswith("unit ")]
            dones = [line for line in lines if line.startswith("done ")]
            want = [str(i) for i in range(j.units)]
            problems = []
            if [u[1] for u in units] != want:
                problems.append(f"units committed {[u[1] for u in units]} != 0..{j.units - 1} once each in order")
            if any(u[2] != j.job_id for u in units):
                problems.append("units committed by another job id")
            first_done = next((k for k, line in enumerate(lines) if line.startswith("done ")), None)
            if first_done is None:
                problems.append("never recorded done")
            elif any(line.startswith("unit ") for line in lines[first_done:]):
                problems.append("work recorded after the job was done")
            if len(dones) > 1:
                # a run after the job was done: it must have found nothing left to do
                first_done_run = min(int(d.split()[2]) for d in dones)
                later = [x.split() for x in self._runs(j) if x.startswith("start ") and int(x.split()[2]) > first_done_run]
                if any(int(r[3]) != j.units for r in later):
                    problems.append(f"a run after done started below unit {j.units}")
                self.noop_reruns.append(f"job {j.job_id} ({j.tag}): ran {len(dones)} times to done, work once")
            final_ok = bool(j.states) and j.states[-1] == "COMPLETED"
            if not final_ok:
                problems.append(f"final state {j.states[-1] if j.states else 'never seen'} (states {j.states})")
            twice = self._started_twice_by_slurm(j)
            if problems and final_ok and twice:
                # gpu-bridge's requeues raise the restart count; two runs with the same count
                # around a slurmctld SIGKILL are Slurm starting a job whose start it had not saved
                self.slurm_double_starts.append(f"job {j.job_id} ({j.tag}): {twice}; {'; '.join(problems)}")
                self.say(f"[{self.now():7.1f} s] started twice by slurmctld (not gpu-bridge): "
                         f"{self.slurm_double_starts[-1]}")
            elif problems:
                self.violation("job-work", f"job {j.job_id} ({j.tag}, {j.mode}, {j.units} units): "
                                           f"{'; '.join(problems)}; runs: {self._runs(j)}")

    def _started_twice_by_slurm(self, j: SoakJob) -> str:
        """Evidence that Slurm ran the same run of a job twice: two starts with the same
        SLURM_RESTART_COUNT with a SIGKILL of slurmctld between them ("" if not so)."""
        starts: dict[str, list[float]] = {}
        for run, t in self._starts(j):
            starts.setdefault(run, []).append(t)
        for run, times in sorted(starts.items()):
            if len(times) > 1:
                first, second = sorted(times)[:2]
                kills = [k for k in self.ctld_kills if first <= k <= second]
                if kills:
                    return (f"run {run} started at {first - self.t0:.1f} s and again at {second - self.t0:.1f} s "
                            f"after a slurmctld SIGKILL at {kills[0] - self.t0:.1f} s lost its start")
        return ""

    def check_phases(self) -> None:
        try:
            nodes = json.loads(self.cli(["kubectl", "get", "nodes", "-o", "json", "--request-timeout=5s"]))["items"]
            slurm = self._slurm_nodes()
            holds = self._holds_running()
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            self.violation("final-phases", f"could not read the final state: {exc}")
            return
        for n in nodes:
            name = n["metadata"]["name"]
            phase = (n["metadata"].get("labels") or {}).get(wk.LABEL_PHASE)
            st = slurm.get(name, "missing")
            ours = "|" + wk.SLURM_REASON_PREFIX in st
            if phase == "serving" and not ("DRAIN" in st.split("|")[0] and ours):
                self.violation("final-phases", f"{name}: phase serving but Slurm {st}")
            elif phase == "lent" and not (slurm_usable(st) and name not in holds):
                self.violation("final-phases", f"{name}: phase lent but Slurm {st} (hold running: {name in holds})")
            elif phase not in ("serving", "lent"):
                self.violation("final-phases", f"{name}: phase {phase} after settling (Slurm {st})")

    def check_lease_writes(self) -> None:
        """Every logged write lies within its daemon's own leadership (Lease acquired .. lost,
        released or SIGKILLed), and no other daemon acquired the Lease in between."""
        logs = sorted(self.h.dir.glob("daemon-*-soak*.log"))
        spans: dict[str, list[tuple[float, float]]] = {}
        for path in logs:
            evs = [d for d in read_events(path) if d.get("event") in LEADER_EVENTS_START + LEADER_EVENTS_END]
            end_of_log = self.daemon_ends.get(str(path), float("inf"))
            cur: float | None = None
            out = []
            for d in evs:
                if d["event"] in LEADER_EVENTS_START and cur is None:
                    cur = event_time(d)
                elif d["event"] in LEADER_EVENTS_END and cur is not None:
                    out.append((cur, event_time(d)))
                    cur = None
            if cur is not None:
                last = read_events(path)
                stop = event_time(last[-1]) if last else cur
                out.append((cur, min(end_of_log, max(stop, cur))))
            spans[path.name] = out
        for path in logs:
            for w in write_events(path):
                t = event_time(w)
                mine = [(a, b) for a, b in spans[path.name] if a - 0.5 <= t <= b + 0.5]
                own = bool(mine)
                # someone else acquired the Lease after this daemon did and before this write:
                # the writer had lost it (paused, partitioned) even if it did not know yet
                since = max((a for a, _ in mine), default=float("-inf"))
                others = [o for o, sp in spans.items()
                          if o != path.name and any(since + 0.5 < a < t - 0.5 for a, _ in sp)]
                if not own or others:
                    self.violation("lease-writes", f"{path.name} wrote {w.get('event')} {w.get('step', '')} on "
                                                   f"{w.get('node', w.get('pool', '?'))} at {t - self.t0:.1f} s "
                                                   f"{'outside its leadership' if not own else 'while ' + ', '.join(others) + ' led'}")

    # --- the run -------------------------------------------------------------------------

    def run(self) -> SoakResult:
        cfg, rng = self.cfg, self.rng
        wall0 = time.monotonic()
        self.say(f"soak: seed {cfg.seed}, {cfg.duration_s:.0f} s, {cfg.nodes} nodes, GraceTime {GRACE_S} s, tick "
                 f"{cfg.tick_s:g} s, Lease {cfg.lease_duration_s:g} s, {cfg.jobs_in_flight} jobs in flight, "
                 f"flips every {cfg.flip_s[0]:g}-{cfg.flip_s[1]:g} s, faults every {cfg.fault_gap_s[0]:g}-"
                 f"{cfg.fault_gap_s[1]:g} s from {', '.join(cfg.faults)}")
        self.h.up()
        try:
            self.config()
            # a managed pool first (the fresh sandbox's nodes are not adopted yet: Slurm may use
            # them while pods run, which is the starting point, not a fault of the daemon)
            self.h.load(HIGH)
            self.start_leader()
            if not poll(self.h.all_serving, 120, 0.5):
                self.say(f"soak: the pool did not settle before the soak: {self.h.owners()}")
            load = rng.choice(("low", "high"))
            self.h.load(LOW if load == "low" else HIGH)
            self.t0 = time.time()
            checker = threading.Thread(target=self._checker, daemon=True)
            checker.start()
            end = self.t0 + cfg.duration_s
            next_flip = time.time() + rng.uniform(*cfg.flip_s)
            next_fault = time.time() + rng.uniform(*cfg.fault_gap_s)
            next_topup = 0.0
            while time.time() < end:
                now = time.time()
                if now >= next_flip:
                    load = "high" if load == "low" else "low"
                    self.h.load(LOW if load == "low" else HIGH)
                    self.flips += 1
                    self.say(f"[{self.now():7.1f} s] load {load}")
                    next_flip = now + rng.uniform(*cfg.flip_s)
                if now >= next_fault:
                    self.inject(rng.choice(cfg.faults))
                    next_fault = now + rng.uniform(*cfg.fault_gap_s)
                while self.agenda and self.agenda[0][0] <= now:
                    _, _, _, action = heapq.heappop(self.agenda)
                    action()
                if now >= next_topup:
                    self.top_up()
                    next_topup = now + 2.0
                time.sleep(0.2)
            # the end: heal everything, one daemon, low load, let every job finish
            self.say(f"[{self.now():7.1f} s] faults stop; waiting for every job to complete")
            self.submitting = False
            while self.agenda:
                _, _, _, action = heapq.heappop(self.agenda)
                action()
            self.h.sb.ensure_daemons()
            if self.leader is None:
                self.start_leader()
            self.h.load(LOW)
            deadline = time.time() + cfg.drain_timeout_s
            while time.time() < deadline and not all(
                    j.states and j.states[-1] in BAD_JOB_STATES | {"COMPLETED"} for j in self.jobs.values()):
                time.sleep(1.0)
            self.stop_checks.set()
            checker.join(10)
            self.check_once()  # a last sample, to see final states
            self.judge_lost_submissions()
            self.judge_bad_ends()
            self.check_jobs()
            self.h.load(HIGH)
            poll(self.h.all_serving, 120, 0.5)  # settle: reclaim everything (no job left)
            self.check_phases()
            if poll(lambda: self.lease_holder() is not None, 30, 0.5) is None:
                # (also what the leader-pause fault relies on: it pauses the daemon found here)
                self.violation("no-leader", "after the faults, no running daemon holds the Lease (read with kubectl)")
            for d in self.h.daemons:
                d.stop()
            self.check_lease_writes()
        finally:
            self.stop_checks.set()
            requeues = sum(max(0, len([x for x in self._runs(j) if x.startswith("start ")]) - 1)
                           for j in self.jobs.values())
            if self.violations and self.keep_dir is not None:
                self._keep_evidence()
            self.h.down()
        return SoakResult(cfg.seed, cfg.duration_s, self.faults, self.violations, len(self.jobs),
                          sum(1 for j in self.jobs.values() if j.states and j.states[-1] == "COMPLETED"), requeues,
                          self.flips, self.samples, self.skipped, time.monotonic() - wall0, list(self.lost),
                          list(self.noop_reruns), list(self.slurm_double_starts), list(self.failed_by_slurm))

    def _keep_evidence(self) -> None:
        """Copy the daemons' logs, the jobs' files and the sandbox's logs out before tear-down."""
        assert self.keep_dir is not None
        dest = self.keep_dir / f"soak-{self.cfg.seed}-{int(self.t0)}"
        dest.mkdir(parents=True, exist_ok=True)
        for src in [*self.h.dir.glob("daemon-*.log"), *self.h.job_dir.glob("*")]:
            if src.is_file():
                shutil.copy2(src, dest / src.name)
        if self.h.sb.log_dir.exists():
            shutil.copytree(self.h.sb.log_dir, dest / "sandbox-logs", dirs_exist_ok=True)
        self.say(f"evidence kept in {dest}")
