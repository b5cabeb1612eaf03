"""Reliability scenarios on the real serving sandbox (scripts/reliability.py and the tests).

``Harness`` owns one serving sandbox (real Slurm, the sandbox Kubernetes API server,
Prometheus, the vLLM simulator) and runs the daemon as a subprocess. Scenarios:

- ``crash_matrix``: SIGKILL the daemon right after a chosen write (``gpu_bridge_lab.faults``), restart
  it, and measure how long the restarted daemon takes to converge, with the invariants
  checked all along by a ``Watcher``. ``Harness(warm=True)`` runs the warm variant (the pool
  lends warm: readiness gate, each pod's engine at its own IP; rows ``WARM_ROWS``),
  ``Harness(fast_tier=True)`` the fast tier's (``preempt-fast``; rows ``FAST_TIER_ROWS``).
- ``fallback_matrix`` (``Harness(warm=True)``; rows ``WARM_FALLBACK_ROWS``): warm lending's cold
  fallback, each row causing its failure for real first (a memory hold scancelled, an engine
  woken behind the daemon's back, a sleeping pod deleted; through the simulator's ``PUT /faults``:
  a wake failing or hanging, an engine unreachable or without sleep mode, a sleep failing at
  lend), then the same SIGKILL right after the fallback's first write, restart, convergence.
- ``gpu_bridge_lab.sandbox.outages`` and ``two_instances`` build on the same harness.

Convergence ("every node in exactly one pool") is read from both schedulers, never from the
daemon: a node is *serving* when its phase is serving, a Ready pod runs on it and Slurm cannot
schedule on it (drained by us / held); *lent* when its phase is lent, it is fenced, has no
serving pod and Slurm can schedule on it. Warm (``warm_ownership``): a lent node may keep
exactly one pod, the one its record names asleep, not Ready, its gate closed and its engine
answering ``GET http://<pod IP>:<port>/is_sleeping`` true; a serving node has no record and
every pod Ready, its gate open, its engine awake.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_bridge_lab import faults
from bridge import wellknown as wk
from gpu_bridge_lab.sandbox.daemon_config import daemon_identity, sandbox_config, write_config
from gpu_bridge_lab.sandbox.e2e import (
    DaemonProc,
    Watcher,
    World,
    event_time,
    poll,
    put_load,
    read_events,
    replica_sleeping,
    write_events,
)
from gpu_bridge_lab.sandbox.cluster.slurm import FAST_PARTITION, node_names
from gpu_bridge_lab.sandbox.dcgm import FakeDcgm
from gpu_bridge_lab.sandbox import serving
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

# Warm lending (Harness(warm=True)): every write of the warm path, as (transition, point) in the
# order they happen; a new write of the warm path is one more tuple here (e.g. the memory
# hold's submit at lend and cancel at reclaim). No scale and no mark_pod: a node lent warm
# keeps its replica counted. The cold fallback's writes (warm_lost, check_asleep, mark_pod and the
# scale, delete_asleep, mem_hold_lost) happen only after a failure: WARM_FALLBACK_ROWS below (and
# tests/unit/test_daemon_warm.py over the fakes).
WARM_ROWS: tuple[tuple[str, str], ...] = (
    ("bootstrap", "open_gate"),  # a fresh warm pool's pods start not Ready: the first start opens their gates
    ("lend", faults.START_LENDING), ("lend", "fence"), ("lend", "close_gate"), ("lend", "sleep_replica"),
    ("lend", "submit_mem_hold"), ("lend", "cancel_hold"), ("lend", "resume"), ("lend", "mark_lent"),
    ("reclaim", faults.START_RECLAIMING), ("reclaim", "submit_hold"), ("reclaim", "requeue_jobs"), ("reclaim", "drain"),
    ("reclaim", "mark_returning"), ("reclaim", "cancel_mem_hold"), ("reclaim", "wake_replica"), ("reclaim", "open_gate"),
    ("reclaim", "unfence"), ("reclaim", "mark_serving"), ("reclaim", "clear_warm"),
)
# The fast tier (Harness(fast_tier=True), fast-tier jobs waiting): the lend's partition write,
# then a reclaim of the nodes lent to that tier (their jobs' grace is the fast one).
FAST_TIER_ROWS: tuple[tuple[str, str], ...] = (("lend", faults.SET_TIER), ("reclaim", "drain"))
# The cold fallback's writes (issue 23), in the order the variant runs them (Harness(warm=True),
# ``fallback_matrix``): each happens only after a failure, so each row first causes that failure
# for real on the sandbox (FALLBACK_FAILURES, FALLBACK_FAULTS), then crashes the daemon right
# after the fallback's first write. "lend": a lend whose sleep fails, the nodes lent cold; "lent":
# on one node lent warm with research jobs on it, the node stays lent and goes cold (its sleeping
# pod evicted, the Deployment scaled down); "reclaim": the node serves again, cold-started (its
# pod replaced). The fallback's pod goes by the scale, marked cheapest first (mark_pod; delete_asleep,
# its eviction, only if it outlives the scale): mark_pod twice, on a lent node (after check_asleep
# recorded it cold) and on a returning one (after a failed wake).
WARM_FALLBACK_ROWS: tuple[tuple[str, str], ...] = (
    ("lend", "sleep_replica"),
    ("lent", "mem_hold_lost"), ("lent", "check_asleep"), ("lent", "warm_lost"), ("lent", "mark_pod"),
    ("reclaim", "gpu_held"), ("reclaim", "wake_replica"), ("reclaim", "mark_pod"),
)
# the failures each row is run with, one run each, in this order (a write the lifecycle reaches
# from several failures, e.g. check_asleep from an engine awake, silent or without sleep mode)
FALLBACK_FAILURES: dict[tuple[str, str], tuple[str, ...]] = {
    ("lend", "sleep_replica"): ("sleep_fails",),
    ("lent", "mem_hold_lost"): ("mem_hold_cancelled",),
    ("lent", "check_asleep"): ("engine_woken", "unreachable", "no_sleep_mode"),
    ("lent", "warm_lost"): ("pod_deleted",),
    ("lent", "mark_pod"): ("engine_woken",),
    ("reclaim", "gpu_held"): ("gpu_memory_held",),
    ("reclaim", "wake_replica"): ("wake_hangs",),
    ("reclaim", "mark_pod"): ("wake_fails",),
}
FALLBACK_FAULTS: dict[str, str] = {
    "sleep_fails": "every serving engine's /sleep answering 500 (the simulator's PUT /faults sleep_fails), then the load lowered",
    "mem_hold_cancelled": "its memory-hold job scancelled as the Slurm admin",
    "engine_woken": "its engine woken behind the daemon's back (POST /wake_up at the pod's IP)",
    "unreachable": "its engine's address refusing connections, as a dead engine's port (PUT /faults unreachable)",
    "no_sleep_mode": "its engine answering as vLLM without sleep mode: 404 on /sleep, /wake_up, /is_sleeping "
                     "(PUT /faults no_sleep_mode: an engine restarted without --enable-sleep-mode)",
    "pod_deleted": "its sleeping pod deleted (Kubernetes API)",
    "gpu_memory_held": "GPU memory held on every node lent warm (the fake dcgm-exporter's knob: a research job stuck "
                       "in Kill task failed), past wake_gpu_wait_s, then a reclaim",
    "wake_hangs": "every sleeping engine's /wake_up answering only after 3 x wake_s (PUT /faults wake_hangs), then a reclaim",
    "wake_fails": "every sleeping engine's /wake_up answering 500 (the simulator's PUT /faults), then a reclaim",
}
# the log event the daemon writes for the node when it falls back (the row's evidence, with the
# node's own state): warm_lost for a lost pod or memory hold, warm_fallback for a failed check,
# sleep or wake; FALLBACK_REASONS: what that event's reason must say (each in it), so the row
# shows the daemon took the failure's own path (e.g. a timeout, not some other error)
FALLBACK_EVENTS: dict[str, str] = {"sleep_fails": "warm_fallback", "mem_hold_cancelled": "warm_lost",
                                   "engine_woken": "warm_fallback", "unreachable": "warm_fallback",
                                   "no_sleep_mode": "warm_fallback", "pod_deleted": "warm_lost",
                                   "wake_hangs": "warm_fallback", "wake_fails": "warm_fallback",
                                   "gpu_memory_held": "warm_fallback"}
FALLBACK_REASONS: dict[str, tuple[str, ...]] = {
    "sleep_fails": ("sleep of", "HTTP 500", "lent cold"),
    "mem_hold_cancelled": ("memory hold",),
    "engine_woken": ("is awake on a lent node",),
    "unreachable": ("does not answer", "ConnectionError", "refused"),
    "no_sleep_mode": ("does not answer", "no sleep mode here"),
    "pod_deleted": ("is gone",),
    "wake_hangs": ("wake of", "ReadTimeout", "reclaimed cold"),
    "wake_fails": ("wake of", "HTTP 500", "reclaimed cold"),
    "gpu_memory_held": ("gpu_memory_held", "not woken, reclaimed cold"),
}
# Points that happen only in some runs ("crashed: no" is then not a failure): requeue_jobs only
# when a preempted job outlives its GraceTime + 1 s by slurmctld's clock, evict_pod only when the
# ReplicaSet removed another pod than the marked one; "none" pads the shorter list.
OPTIONAL_POINTS = frozenset({"requeue_jobs", "evict_pod", "none"})
FAST_GRACE_S = 2  # the fast tier's GraceTime (< GRACE_S)
WAKE_S = 10.0  # warm pool: the wake timeout (the simulator's wake takes ~2.6 s)
WAKE_HANG_S = 3 * WAKE_S  # the wake_hangs failure: a wake that answers well after the daemon gave up
DRAIN_S = 45.0  # warm pool: how long a lend retries the sleep while in-flight requests finish
# warm pool: Slurm counts memory and has the memory holds' partition (test_e2e_warm.py's lines:
# slurm_conf/slurm.conf.snippet's opt-in ones); the hold leaves a research job without --mem its share
REAL_MEMORY_MB = 16000  # the sandbox's nodes (8 CPUs)
WARM_HOLD_MB = 12000  # pools[].warm_hold_mb
# gpu_check: the pool's wake_gpu_free_mib is auto (the engine's gpu_memory_utilization, 0.9 in the simulator, x each
# GPU's memory: ~73,400 MiB of the fake dcgm-exporter's 81,559); the gpu_memory_held failure holds this much on each GPU
GPU_HELD_MIB = 70_000
GPU_WAIT_S = 20.0  # gpu_check: pools[].wake_gpu_wait_s


def warm_slurm_conf(nodes: int) -> str:
    return "\n".join([
        "SelectTypeParameters=CR_Core_Memory",  # replaces the sandbox's CR_Core (the last line wins)
        f"DefMemPerCPU={REAL_MEMORY_MB // 8}",
        f"PartitionName={wk.SLURM_WARM_PARTITION} Nodes=gpu-node-[01-{nodes:02d}] PriorityTier=100 PreemptMode=OFF "
        "OverSubscribe=NO MaxTime=INFINITE State=UP",
    ])


def rows_of(rows: Sequence[tuple[str, str]], transition: str) -> tuple[str, ...]:
    """The points of one transition, in order, from a (transition, point) list."""
    return tuple(p for t, p in rows if t == transition)


def _free_port() -> int:
    """A port free on every address (each pod IP gets a listener on it)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


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
    # the warm fallback's rows: the fallback the row's failure asks for happened (None: not such a row)
    fell_back: bool | None = None
    # the warm fallback's rows: the watcher's samples of the fault's own two-pool state (the node
    # named, between the injected failure and its sleeping pod gone): the failure itself, which
    # the row measures the daemon ending; not counted in ``violations``
    fault_window: list[str] = field(default_factory=list)
    # the warm fallback's rows: the failure caused first (FALLBACK_FAULTS; "" for other rows)
    failure: str = ""

    @property
    def must_crash(self) -> bool:
        """The point is written in every run of this transition: not crashing there means the
        row tested nothing (reported, and a failure of the matrix)."""
        return self.transition not in ("final",) and self.point not in OPTIONAL_POINTS

    @property
    def ok(self) -> bool:
        return (self.converged and not self.violations and not self.jobs_lost and (self.crashed or not self.must_crash)
                and self.fell_back is not False)


_LIVE_JOB_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED"})


def _pod_facts(p: Any) -> dict[str, Any]:
    """A serving pod as the warm checks read it: name, IP, Ready, the bridge's gate, terminating."""
    conds = {c.type: c.status for c in p.status.conditions or ()}
    gate = {"True": True, "False": False}.get(conds.get(wk.CONDITION_AWAKE, ""))
    ready = conds.get("Ready") == "True"
    terminating = p.metadata.deletion_timestamp is not None
    name = p.metadata.name
    return {"name": name, "ip": p.status.pod_ip or "", "ready": ready, "gate": gate, "terminating": terminating,
            "describe": f"{name}(ready={ready} gate={gate}{' terminating' if terminating else ''})"}


class Harness:
    """One serving sandbox + helpers to run daemons against it."""

    def __init__(self, nodes: int = 3, *, min_serving: int = 1, dir: Path | None = None,
                 policy: dict[str, Any] | None = None, warm: bool = False, fast_tier: bool = False,
                 gpu_check: bool = False) -> None:
        if gpu_check and not warm:
            raise ValueError("gpu_check: the free-GPU check guards a warm wake; it needs warm=True")
        self.dir = Path(dir) if dir else Path(tempfile.mkdtemp(prefix="gb-rel-", dir="/tmp"))
        self.n = nodes
        self.min_serving = min_serving
        # warm: the pool lends warm (test_e2e_warm.py's sandbox: the readiness gate, the kept
        # replica, each pod's engine at http://<pod IP>:warm_port)
        self.warm_port = _free_port() if warm else None
        self.fast_tier = fast_tier  # preempt-fast (test_e2e_fast_tier.py's sandbox); research jobs go there
        self.research_partition = FAST_PARTITION if fast_tier else wk.SLURM_PREEMPT_PARTITION
        # gpu_check (warm): the fake dcgm-exporter scraped and the pool's free-GPU check before a wake on
        self.dcgm = FakeDcgm(node_names(nodes)).start() if gpu_check else None
        self.sb = serving_sandbox(self.dir / "sb", nodes=nodes, grace_s=GRACE_S, pod_start_delay_s=POD_START_S,
                                  pod_grace_s=2, shutdown_timeout_s=1, vllm_extra=("--max-cv", "1.5"),
                                  warm_port=self.warm_port, fast_grace_s=FAST_GRACE_S if fast_tier else None,
                                  timeout_s=90.0 if warm else 60.0, extra_slurm_conf=warm_slurm_conf(nodes) if warm else "",
                                  dcgm=self.dcgm)
        # warm: the pods a reclaim row starts from (node -> (pod, uid) asleep), to tell woken from cold-started
        self._asleep_before: dict[str, tuple[str, str]] = {}
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

    @property
    def warm(self) -> bool:
        return self.warm_port is not None

    def up(self) -> Harness:
        self.dir.chmod(0o755)  # munged (user munge) must reach its socket dir under it
        (self.dir / "sb").mkdir(parents=True, exist_ok=True)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.job_dir.chmod(0o777)
        self.sb.up()
        self.world = World(self.sb)
        self.write_config()
        vllm_url = self.sb.vllm_url
        assert vllm_url
        asleep = (lambda pod: replica_sleeping(vllm_url, pod)) if self.warm else None
        self.watcher = Watcher(self.world, min_serving=self.min_serving, asleep=asleep,
                               mem_hold_partition=wk.SLURM_WARM_PARTITION if self.warm else None)
        if not self.warm:  # warm: a fresh pool's pods are not Ready until a daemon opens their gates
            self.watcher.start()
        return self

    def start_watcher(self) -> None:
        """Start the invariant watcher if it is not running yet (warm: once the gates are open)."""
        assert self.watcher is not None
        if not self.watcher.is_alive() and not self.watcher.stop_event.is_set():
            self.watcher.start()

    def config_doc(self, kubeconfig: Path | None = None, min_serving: int | None = None, **policy: Any) -> dict[str, Any]:
        ident = daemon_identity(self.sb)
        if kubeconfig is not None:
            ident["kubeconfig"] = kubeconfig
        doc = sandbox_config(prometheus_url=self.sb.prometheus_url, **ident,
                             grace_s=GRACE_S, cold_start_s=POD_START_S, min_serving=min_serving or self.min_serving,
                             scale_down_window_s=6, min_lend_s=10, lease_duration_s=6.0, forecast=False)
        doc["policy"].update(self.policy_overrides)
        doc["policy"].update(policy)
        if self.warm:
            doc["pools"][0].update(warm_lending=True, wake_s=WAKE_S, vllm_port=self.warm_port, drain_s=DRAIN_S,
                                   warm_hold_mb=WARM_HOLD_MB)
            if self.dcgm is not None:
                doc["pools"][0].update(wake_gpu_free_mib="auto", wake_gpu_wait_s=GPU_WAIT_S)
        if self.fast_tier:
            doc["slurm"].update(fast_partition=FAST_PARTITION, fast_grace_s=FAST_GRACE_S)
        return doc

    def write_config(self, path: Path | None = None, kubeconfig: Path | None = None, min_serving: int | None = None,
                     **policy: Any) -> Path:
        return write_config(path or self.config_path, self.config_doc(kubeconfig, min_serving, **policy))

    def down(self) -> None:
        for d in self.daemons:
            d.kill()
        if self.watcher is not None:
            if self.watcher.is_alive():
                self.watcher.close()
            else:
                self.watcher.stop_event.set()
        if self.world is not None:
            self.world.close()
        self.sb.down()
        if self.dcgm is not None:
            self.dcgm.stop()
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
            return self.warm_ownership() if self.warm else self.w.ownership()
        except Exception as exc:  # noqa: BLE001 - a read during an injected outage
            return {"?": f"unreadable: {exc}"}

    def is_sleeping_at(self, ip: str) -> bool | None:
        """What the daemon asks: ``GET http://<pod IP>:<vllm_port>/is_sleeping`` (None: no answer)."""
        try:
            with urllib.request.urlopen(f"http://{ip}:{self.warm_port}/is_sleeping", timeout=3) as resp:  # noqa: S310
                value = json.loads(resp.read()).get("is_sleeping")
        except (OSError, ValueError):
            return None
        return value if isinstance(value, bool) else None

    def warm_ownership(self) -> dict[str, str]:
        """``World.ownership`` for a pool that lends warm, read from both schedulers and each
        pod's engine: node -> "serving", "lent" (warm: its one pod asleep, not Ready, gate
        closed, the record naming it; or cold: no pod, no record or a ``cold`` one), or why it
        is in neither or both."""
        nodes = self.w.nodes()
        pods: dict[str, list[Any]] = {}
        for p in self.w._pods():
            if p.spec.node_name:
                pods.setdefault(p.spec.node_name, []).append(p)
        jobs = self.w.jobs()
        holds = self.w.holds(jobs)
        research = self.w.research_running_by_node(jobs)
        states = self.w.slurm_states()
        mem_holds = {str(j["name"])[len(wk.SLURM_WARM_HOLD_JOB_PREFIX):]: str(j["job_state"]) for j in jobs
                     if j["partition"] == wk.SLURM_WARM_PARTITION and str(j["name"]).startswith(wk.SLURM_WARM_HOLD_JOB_PREFIX)
                     and j["job_state"] in _LIVE_JOB_STATES}  # squeue still lists a cancelled one for a while
        out = {}
        for name, n in nodes.items():
            phase = (n.metadata.labels or {}).get(wk.LABEL_PHASE)
            record = (n.metadata.annotations or {}).get(wk.ANNOTATION_WARM)
            fenced = bool(n.spec.unschedulable) or any(t.key == wk.TAINT_KEY for t in n.spec.taints or ())
            st = states.get(name, "unknown")
            slurm_usable = not any(x in st for x in ("drain", "down", "fail", "unknown")) and name not in holds
            facts = [_pod_facts(p) for p in pods.get(name, [])]
            awake_pods = [f for f in facts if f["terminating"] or f["ready"] or f["gate"] is not False
                          or self.is_sleeping_at(f["ip"]) is not True]
            asleep_one = len(facts) == 1 and not awake_pods
            if name in research and facts and not asleep_one:
                out[name] = f"BOTH: jobs {research[name]} and pods {[f['describe'] for f in facts]}"
            elif (phase == "serving" and record is None and ("drain" in st or "down" in st) and facts
                  and name not in mem_holds
                  and any(f["ready"] and not f["terminating"] for f in facts)
                  and all(f["terminating"] or (f["ready"] and f["gate"] is True and self.is_sleeping_at(f["ip"]) is False)
                          for f in facts)):
                out[name] = "serving"
            elif phase == "lent" and fenced and slurm_usable and (
                    (not facts and (record is None or record.startswith("cold/")) and name not in mem_holds)
                    or (asleep_one and record == f"asleep/{facts[0]['name']}" and mem_holds.get(name) == "RUNNING")):
                out[name] = "lent"
            else:
                out[name] = (f"in transit: phase={phase} fenced={fenced} warm={record} "
                             f"pods={[f['describe'] for f in facts]} slurm={st} hold={holds.get(name)} "
                             f"mem_hold={mem_holds.get(name)}")
        return out

    def warm_summary(self, transition: str) -> str:
        """A converged warm row, in words: which lent nodes sleep and which went cold; which
        reclaimed nodes serve with their replica woken (the same pod) or cold-started."""
        if not self.warm:
            return ""
        nodes = self.w.nodes()
        records = {n: (v.metadata.annotations or {}).get(wk.ANNOTATION_WARM) for n, v in nodes.items()}
        live = {p.spec.node_name: (p.metadata.name, p.metadata.uid) for p in self.w._pods()
                if p.spec.node_name and p.metadata.deletion_timestamp is None}
        if transition == "lend":
            lent = sorted(n for n, v in self.w.phases().items() if v == "lent")
            self._asleep_before = {n: live[n] for n in lent if n in live and records[n] == f"asleep/{live[n][0]}"}
            cold = [n for n in lent if n not in self._asleep_before]
            return f"lent warm {len(self._asleep_before)}" + (f", cold {len(cold)} ({', '.join(cold)})" if cold else "")
        if transition == "reclaim":
            woken = [n for n, pod in self._asleep_before.items() if live.get(n) == pod]
            cold = sorted(set(self._asleep_before) - set(woken))
            self._asleep_before = {}
            return f"woken {len(woken)}" + (f", cold-started {len(cold)} ({', '.join(cold)})" if cold else "")
        return ""

    def tier_check(self) -> tuple[str, list[str]]:
        """Fast tier, after a lend: every lent node is in the fast partition only (the tier its
        waiting jobs asked for), so no normal-tier job, with its longer grace, can start there.
        (a note, the nodes that are not)."""
        if not self.fast_tier:
            return "", []
        doc = json.loads(self.sb.run_slurm(["sinfo", "--json"]).stdout)
        parts = {n["name"]: set(n.get("partitions") or ()) for n in doc["nodes"]}
        lent = sorted(n for n, v in self.w.phases().items() if v == "lent")
        bad = [f"{n} lent but in partitions {sorted(parts.get(n, ()))}, not {FAST_PARTITION} only" for n in lent
               if FAST_PARTITION not in parts.get(n, ()) or wk.SLURM_PREEMPT_PARTITION in parts.get(n, ())]
        return f"lent to {FAST_PARTITION} only {len(lent) - len(bad)} of {len(lent)}", bad

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
            "sbatch", "--parsable", "-p", self.research_partition, "--requeue", "--gres=gpu:4", "-J", f"research-{tag}",
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
        waiting = [j for j in jobs if j["partition"] == self.research_partition and j["job_state"] != "RUNNING"]
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

    def backlog(self) -> None:
        """Fast tier: fast-tier jobs waiting for every node a lend may take (lends go to the fast
        tier only for the nodes its waiting jobs ask for)."""
        if not self.fast_tier:
            return
        jobs = self.w.jobs()
        live = [j for j in jobs if j["partition"] == self.research_partition and str(j["job_id"]) in self.jobs]
        for _ in range(max(0, self.n - self.min_serving - len(live))):
            self._seq += 1
            self.submit_job(f"j{self._seq}")

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

    # --- the warm fallback's failures --------------------------------------------------------

    def warm_lent(self) -> dict[str, tuple[str, str]]:
        """Lent nodes recorded asleep with their live pod: node -> (pod, pod IP)."""
        live = {p.spec.node_name: p for p in self.w._pods() if p.spec.node_name and p.metadata.deletion_timestamp is None}
        out = {}
        for name, n in self.w.nodes().items():
            pod = live.get(name)
            if (pod is not None and (n.metadata.labels or {}).get(wk.LABEL_PHASE) == "lent"
                    and (n.metadata.annotations or {}).get(wk.ANNOTATION_WARM) == f"asleep/{pod.metadata.name}"):
                out[name] = (str(pod.metadata.name), str(pod.status.pod_ip or ""))
        return out

    def warm_record(self, node: str) -> str | None:
        return (self.w.nodes()[node].metadata.annotations or {}).get(wk.ANNOTATION_WARM)

    def deployment_settled(self) -> bool:
        """The Deployment asks one replica per serving node and per node lent warm (its kept
        sleeping one), and has exactly that many live pods (no replacement left pending)."""
        phases = self.w.phases()
        want = sum(v == "serving" for v in phases.values()) + len(self.warm_lent())
        live = [p for p in self.w._pods() if p.metadata.deletion_timestamp is None]
        return self.w.replicas() == want == len(live)

    def set_sim_faults(self, wake_fails: Sequence[str] = (), **faults: Any) -> None:
        """The vLLM simulator's lab fault knob (``PUT /faults``): these replicas' ``/wake_up``
        answers 500; ``faults``: its other keys (``wake_hangs``, ``wake_hang_s``, ``sleep_fails``,
        ``no_sleep_mode``, ``unreachable``). Every list not given is cleared."""
        assert self.sb.vllm_url
        body: dict[str, Any] = {"wake_fails": list(wake_fails), "wake_hangs": [], "sleep_fails": [], "no_sleep_mode": [],
                                "unreachable": []}
        body.update({k: list(v) if isinstance(v, (list, tuple)) else v for k, v in faults.items()})
        req = urllib.request.Request(self.sb.vllm_url + "/faults", data=json.dumps(body).encode(),
                                     method="PUT", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback only
            if resp.status != 200:
                raise RuntimeError(f"PUT {self.sb.vllm_url}/faults: HTTP {resp.status}")

    def mem_hold_job(self, node: str) -> str | None:
        """The live ``gpu-bridge-warm:<node>`` job's id, if any."""
        return next((str(j["job_id"]) for j in self.w.jobs() if j["partition"] == wk.SLURM_WARM_PARTITION
                     and j["name"] == wk.SLURM_WARM_HOLD_JOB_PREFIX + node and j["job_state"] in _LIVE_JOB_STATES), None)

    def cause_failure(self, failure: str, node: str, pod: str, ip: str, *, also: Sequence[str] = ()) -> str:
        """Cause, for real, one of FALLBACK_FAULTS on ``node`` (its sleeping ``pod`` at ``ip``;
        a failed or hung wake on the pods ``also`` too); what was done, in words."""
        more = f" (and {', '.join(also)}'s)" if also else ""
        if failure == "mem_hold_cancelled":
            job = self.mem_hold_job(node)
            if job is None:
                raise RuntimeError(f"{node}: no memory-hold job to cancel")
            self.sb.run_slurm(["scancel", job])
            return f"scancel {job}"
        if failure == "engine_woken":
            req = urllib.request.Request(f"http://{ip}:{self.warm_port}/wake_up", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - the pod's loopback IP
                if resp.status != 200:
                    raise RuntimeError(f"POST http://{ip}:{self.warm_port}/wake_up: HTTP {resp.status}")
            return f"{pod} woken at {ip}"
        if failure == "pod_deleted":
            self.w.core.delete_namespaced_pod(pod, serving.NAMESPACE, _request_timeout=5)
            return f"{pod} deleted"
        if failure == "wake_fails":
            self.set_sim_faults([pod, *also])
            self.load(HIGH)
            return f"{pod}'s wake fails{more}; load high"
        if failure == "unreachable":
            self.set_sim_faults(unreachable=[pod])
            return f"{pod} unreachable at {ip}"
        if failure == "no_sleep_mode":
            self.set_sim_faults(no_sleep_mode=[pod])
            return f"{pod} without sleep mode at {ip}"
        if failure == "wake_hangs":
            self.set_sim_faults(wake_hangs=[pod, *also], wake_hang_s=WAKE_HANG_S)
            self.load(HIGH)
            return f"{pod}'s wake hangs {WAKE_HANG_S:g} s{more}; load high"
        if failure == "gpu_memory_held":
            assert self.dcgm is not None, "gpu_memory_held needs Harness(gpu_check=True)"
            held = sorted(self.warm_lent())  # read once: the message names the nodes held
            self.dcgm.hold({n: GPU_HELD_MIB for n in held})
            self.load(HIGH)
            return f"{GPU_HELD_MIB} MiB held on each GPU of {', '.join(held)}; load high"
        if failure == "sleep_fails":
            pods = sorted(str(p.metadata.name) for p in self.w._pods() if p.metadata.deletion_timestamp is None)
            self.set_sim_faults(sleep_fails=pods)
            self.load(LOW)
            return f"the sleeps of {', '.join(pods)} fail; load low"
        raise ValueError(f"{failure}: not a failure of the warm fallback's rows ({', '.join(FALLBACK_FAULTS)})")

    def fallback_row(self, transition: str, point: str, failure: str | None = None, *,
                     converge_timeout_s: float = 120.0) -> Row:
        """One row of WARM_FALLBACK_ROWS with one of its FALLBACK_FAILURES (default: the first):
        cause the failure (a lent node's: on the first node lent warm, once the armed daemon has
        done a pass, so a running daemon notices it; a failed or hung wake: the fault set, then
        the load raised; a failed sleep: every serving engine's, then the load lowered, from all
        serving), the daemon armed to SIGKILL itself after ``point``'s first write, restarted,
        converged: the node lent cold ("lend": every lent node; "lent") or all serving with the
        node's pod replaced ("reclaim"), every other node as the transition's end state says.
        ``fell_back``: the node's state shows the fallback (record ``cold/<pod>`` and the pod
        gone; reclaim: a new pod serving, the record cleared) and a daemon of the row logged the
        fallback's event for the node, its reason saying the failure's own (FALLBACK_REASONS)."""
        assert self.watcher is not None
        failure = failure or FALLBACK_FAILURES[(transition, point)][0]
        if failure not in FALLBACK_FAILURES[(transition, point)]:
            raise ValueError(f"{failure}: not a failure of the row {transition} {point}")
        # node -> (its pod, IP): the sleeping one ("lent", "reclaim": the first node lent warm),
        # or every serving one ("lend": the nodes the lend takes are known only at its end)
        if transition == "lend":
            if not self.all_serving():
                return Row(transition, point, fell_back=False, failure=failure, note="NOT RUN: not every node serving")
            live = {p.spec.node_name: p for p in self.w._pods() if p.spec.node_name and p.metadata.deletion_timestamp is None}
            watched = {n: (str(p.metadata.name), str(p.status.pod_ip or "")) for n, p in live.items()}
        else:
            warm = self.warm_lent()
            if not warm:
                return Row(transition, point, fell_back=False, failure=failure, note="NOT RUN: no node lent warm to fail")
            first = sorted(warm)[0]
            # a reclaim's wake fails on every node lent warm: failed wakes at once, each pod going
            # by the scale (two refused evictions once kept such nodes returning, Finding 8)
            watched = dict(sorted(warm.items())) if transition == "reclaim" else {first: warm[first]}
        times: dict[str, float] = {}
        first_daemon = len(self.daemons)

        def pod_gone(node: str) -> bool:
            gone = not any(p.metadata.name == watched[node][0] for p in self.w._pods())
            if gone:
                times.setdefault(f"gone:{node}", time.time())
            return gone

        def failed_nodes() -> list[str]:
            """The nodes the row asks to fall back: "lend", every node lent at the end."""
            if transition != "lend":
                return list(watched)
            return sorted(n for n, v in self.w.phases().items() if v == "lent" and n in watched)

        def node_fell_back(node: str) -> bool:
            record = self.warm_record(node)
            if transition in ("lend", "lent"):
                return record == f"cold/{watched[node][0]}" and pod_gone(node)
            return record is None and pod_gone(node)

        def target() -> bool:
            try:
                for node in watched if transition != "lend" else ():
                    pod_gone(node)  # first: when the pod went, for the failure's own window
                end = self.lent_down_to_min() if transition in ("lend", "lent") else self.all_serving()
                nodes = failed_nodes()
                return bool(end and nodes and all(node_fell_back(n) for n in nodes) and self.deployment_settled())
            except Exception:  # noqa: BLE001 - a read that failed is not converged
                return False

        did: list[str] = []

        def inject(armed: DaemonProc) -> None:
            node = next(iter(watched))
            if transition == "lent":
                poll(lambda: (armed.ticks() or 0) >= 1, 30, 0.3)
            research = self.w.research_running_by_node().get(node, []) if transition != "lend" else []
            if transition == "lent" and not research:  # a job ended meanwhile (JOB_S): the failure beside research
                self.ensure_jobs_on_lent()
                research = self.w.research_running_by_node().get(node, [])
            times["fault"] = time.time()
            where = "" if transition == "lend" else f" (research jobs there: {', '.join(research) or 'none'})"
            also = [p for n, (p, _) in watched.items() if n != node] if transition == "reclaim" else []
            did.append(self.cause_failure(failure, node, *watched[node], also=also) + where)

        try:
            row = self.crash_row(transition, point, target=target, inject=inject, converge_timeout_s=converge_timeout_s)
        finally:
            if failure in ("wake_fails", "wake_hangs", "unreachable", "no_sleep_mode", "sleep_fails"):
                self.set_sim_faults([])
            if failure == "gpu_memory_held" and self.dcgm is not None:
                self.dcgm.hold({})
        row.failure = failure
        wrong = self._crash_write_wrong(point, first_daemon, watched)
        if wrong:  # the crash came after another node's write of that step (a wake that succeeded): not this row's
            row.crashed = False
            row.note = f"CRASHED AFTER ANOTHER WRITE: {wrong}" + (f"; {row.note}" if row.note else "")
        event, reasons = FALLBACK_EVENTS[failure], FALLBACK_REASONS[failure]
        state_ok = target()
        nodes = failed_nodes()
        logged = {n: [d for proc in self.daemons[first_daemon:] for d in read_events(proc.log_path, event)
                      if d.get("node") == n and all(r in str(d.get("reason", "")) for r in reasons)] for n in nodes}
        row.fell_back = bool(nodes) and all(logged.values()) and state_ok
        # another node's warm replica lost meanwhile (the failure was this node's only): said in the note
        collateral = sorted({str(d.get("node")) for proc in self.daemons[first_daemon:]
                             for d in read_events(proc.log_path, "warm_lost") if d.get("node") not in watched})
        # the failure's own two-pool state (research beside an engine awake or silent, or without
        # the memory hold) until the pod is gone: the watcher's samples naming the node up to then
        # (a failed sleep at lend has none: the node is never given to Slurm warm)
        own: list[str] = []
        for node in watched if transition != "lend" else ():
            end = times.get(f"gone:{node}", float("inf")) + 1.0
            own += [v for v in row.violations if f": {node} " in v and _violation_time(v) <= end and v not in own]
        row.violations = [v for v in row.violations if v not in own]
        row.fault_window = own
        gone = [times[f"gone:{n}"] for n in watched if f"gone:{n}" in times]
        window = (f"{max(gone) - times['fault']:.1f} s" if gone and "fault" in times and transition != "lend"
                  else "" if transition == "lend" else "never ended")
        where = ", ".join(nodes) or "no node"
        end_state = {"lend": "lent cold", "lent": "lent cold", "reclaim": "serving, cold-started"}[transition]
        row.note = "; ".join(x for x in (
            f"{failure}: " + (f"{next(iter(watched))}: " if transition != "lend" else "")
            + (did[0] if did else "failure NOT caused"),
            f"{event} ({' + '.join(reasons)}) logged for {where}" if nodes and all(logged.values())
            else f"NO {event} ({' + '.join(reasons)}) logged for {', '.join(n for n in nodes if not logged[n]) or 'any node'}",
            f"{where} {end_state}" if state_ok
            else f"{where} NOT fallen back (warm={[self.warm_record(n) for n in nodes or watched]})",
            f"failure to pod gone {window}" + (f", {len(own)} watcher samples of it" if own else "") if window else "",
            f"ALSO warm_lost on {', '.join(collateral)} (another node's sleeping replica lost)" if collateral else "",
            row.note) if x)
        return row

    def _crash_write_wrong(self, point: str, first_daemon: int, watched: dict[str, tuple[str, str]]) -> str:
        """A failed sleep or wake's row: the armed daemon's last warm record written before its
        crash must be a watched node's ``cold/<pod>`` (the same step records ``asleep``/``awake``
        on a node whose call succeeded); what it was instead, or "" when right (or not such a row)."""
        if point not in ("sleep_replica", "wake_replica") or len(self.daemons) <= first_daemon:
            return ""
        log_path = self.daemons[first_daemon].log_path
        crash = read_events(log_path, "fault_injection_crash")
        if not crash:
            return ""
        at = event_time(crash[-1])
        sets = [d for d in read_events(log_path, "node_warm_set") if event_time(d) <= at]
        last = sets[-1] if sets else None
        if last is None:
            return "no warm record written before the crash"
        node, record = str(last.get("node")), str(last.get("reason"))
        return "" if node in watched and record == f"cold/{watched[node][0]}" else f"{node} {record}"

    # --- one crash row ----------------------------------------------------------------------

    def crash_row(self, transition: str, point: str, *, crash_timeout_s: float | None = None,
                  converge_timeout_s: float = 90.0, target: Callable[[], bool] | None = None,
                  inject: Callable[[DaemonProc], None] | None = None) -> Row:
        """Start a daemon armed to SIGKILL itself after the first write of ``point``; once it
        died, start a plain one and time its convergence to the transition's end state.
        ``crash_timeout_s``: how long the armed daemon may take to crash or (a point not
        written) to reach the end state itself; default 60 s, 150 s warm, whose lends retry the
        sleep each pass until the gated-out replica's in-flight requests finish (up to
        ``drain_s``), one node after the other. ``target``: the end state (default: the
        transition's, lent down to ``min_serving`` or all serving); ``inject``: called with the
        armed daemon just started (the warm fallback's rows cause their failure there)."""
        assert self.watcher is not None
        if crash_timeout_s is None:
            crash_timeout_s = 150.0 if self.warm else 60.0
        row = Row(transition, point)
        mark = self.watcher.mark()
        if target is None:
            target = self.lent_down_to_min if transition in ("lend", "lent") else self.all_serving
        armed = self.daemon(f"{transition}-{point}", crash_at=f"{point}:1")
        if inject is not None:
            inject(armed)
        poll(lambda: not armed.alive() or target(), crash_timeout_s, 0.2)
        rc = armed.returncode()
        row.crashed = rc == -9
        if not row.crashed:
            armed.stop()
            row.converged = target()
            row.note = "step did not occur in this run (no crash)" if rc is None or rc == 0 else f"daemon exited rc {rc}"
            if not row.converged:
                row.note += f"; not converged within {crash_timeout_s:.0f} s: " + "; ".join(
                    f"{n}: {v}" for n, v in self.owners().items() if v not in ("serving", "lent"))
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
        if row.converged and transition in ("lend", "reclaim") and inject is None:
            notes = [row.note, self.warm_summary(transition)]
            if transition == "lend":
                tiers, wrong = self.tier_check()
                notes.append(tiers)
                row.violations += wrong
            row.note = "; ".join(x for x in notes if x)
        if row.crashed is False and row.must_crash:
            row.note = f"NOT REACHED: {point} was never written in this run" + (f" ({row.note})" if row.note else "")
        row.jobs_lost = len(self.lost_jobs())
        return row


def matrix_rows(*, warm: bool = False, fast_tier: bool = False) -> tuple[tuple[str, str], ...]:
    """A whole matrix as (transition, point): warm, fast tier, or the cold one."""
    if warm:
        return WARM_ROWS
    if fast_tier:
        return FAST_TIER_ROWS
    return (*(("bootstrap", p) for p in BOOTSTRAP_POINTS), *(("lend", p) for p in LEND_POINTS),
            *(("reclaim", p) for p in RECLAIM_POINTS))


def default_rows(h: Harness) -> tuple[tuple[str, str], ...]:
    """The harness' whole matrix (``matrix_rows`` of its kind)."""
    return matrix_rows(warm=h.warm, fast_tier=h.fast_tier)


def crash_matrix(h: Harness, *, bootstrap: Iterable[str] | None = None, lend: Sequence[str] | None = None,
                 reclaim: Sequence[str] | None = None, finish_jobs: bool = True, log: Any = print) -> list[Row]:
    """Every injection point once. Lend and reclaim rows alternate (each reclaim takes back the
    nodes the previous lend gave, with research jobs on them); the last step lends again and
    waits for every research job to finish (none lost). A list left None is the harness' own
    (``default_rows``: warm, fast tier or cold)."""
    rows: list[Row] = []
    whole = default_rows(h)
    bootstrap = rows_of(whole, "bootstrap") if bootstrap is None else bootstrap
    lend = rows_of(whole, "lend") if lend is None else lend
    reclaim = rows_of(whole, "reclaim") if reclaim is None else reclaim
    h.load(HIGH)
    for point in bootstrap:
        h.unmanage()
        rows.append(h.crash_row("bootstrap", point))
        log(format_row(rows[-1]))
    if not h.all_serving():  # from a fresh sandbox without bootstrap rows: adopt first
        d = h.daemon("adopt")
        poll(h.all_serving, 90, 0.2)
        d.stop()
    h.start_watcher()
    for i in range(max(len(lend), len(reclaim))):
        h.load(LOW)
        h.backlog()
        rows.append(h.crash_row("lend", lend[i] if i < len(lend) else "none"))
        log(format_row(rows[-1]))
        h.ensure_jobs_on_lent()
        h.load(HIGH)
        rows.append(h.crash_row("reclaim", reclaim[i] if i < len(reclaim) else "none"))
        log(format_row(rows[-1]))
    if finish_jobs:
        rows.append(_finish_row(h, log, warm_samples=True))
    return rows


def _finish_row(h: Harness, log: Any, *, warm_samples: bool) -> Row:
    """Lend again (load low, a backlog) and wait for every research job to finish: none lost."""
    h.load(LOW)
    h.backlog()
    d = h.daemon("finish")
    poll(lambda: all(h.job_finished(j) for j in h.jobs), 150 + JOB_S * max(1, len(h.jobs)), 1.0)
    d.stop()
    unfinished = [j for j in h.jobs if not h.job_finished(j)]
    if unfinished:
        log(h.sb.run_slurm(["squeue", "-o", "%i %j %T %r %S %N"], check=False).stdout)
        log(str(h.owners()))
    row = Row("final", "jobs finish", converged=not unfinished, jobs_lost=len(h.lost_jobs()),
              note=f"{len(h.jobs) - len(unfinished)}/{len(h.jobs)} research jobs finished"
              + (f"; unfinished {unfinished}" if unfinished else "")
              + (f"; research beside a sleeping pod in {h.watcher.warm_samples} of {h.watcher.samples} samples"
                 if warm_samples and h.warm and h.watcher is not None else ""))
    log(format_row(row))
    return row


def _violation_time(v: str) -> float:
    """A watcher violation's time (its ``<epoch>:`` prefix); inf if it has none."""
    try:
        return float(v.split(":", 1)[0])
    except ValueError:
        return float("inf")


def _settle_with(h: Harness, name: str, load: dict[str, float], done: Callable[[], bool], timeout_s: float) -> bool:
    """A plain daemon under ``load`` until ``done`` (or ``timeout_s``), then stopped."""
    h.load(load)
    if load is LOW:
        h.backlog()
    d = h.daemon(name)
    ok = bool(poll(done, timeout_s, 0.5))
    d.stop()
    return ok


def fallback_rows(points: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
    """WARM_FALLBACK_ROWS with each of its failures, in the order run, as (transition, point,
    failure); ``points``: only the rows whose point or failure is one of them."""
    return [(t, p, f) for t, p in WARM_FALLBACK_ROWS for f in FALLBACK_FAILURES[(t, p)]
            if points is None or p in points or f in points]


def fallback_matrix(h: Harness, *, points: Sequence[str] | None = None, finish_jobs: bool = True,
                    log: Any = print) -> list[Row]:
    """WARM_FALLBACK_ROWS with each of their failures (``points``: only the rows whose point or
    failure is one of them) on a warm harness: adopt; a lend row from every node serving (a
    plain reclaim first if not); the others on the first node still lent warm, a plain reclaim
    and warm lend in between when none is left, research jobs on the lent nodes; the last step
    lends again and waits for every research job to finish (none lost)."""
    assert h.warm, "the warm fallback's rows need Harness(warm=True)"
    rows: list[Row] = []
    if not _settle_with(h, "adopt", HIGH, h.all_serving, 120):
        log(f"adopt: not all serving: {h.owners()}")
    h.start_watcher()
    for transition, point, failure in fallback_rows(points):
        if transition == "lend":
            if not h.all_serving():
                _settle_with(h, "reclaim", HIGH, h.all_serving, 180)
        elif not h.warm_lent():
            if not h.all_serving():
                _settle_with(h, "reclaim", HIGH, h.all_serving, 180)
            _settle_with(h, "lend", LOW, lambda: h.lent_down_to_min() and len(h.warm_lent()) == h.n - h.min_serving, 240)
        h.ensure_jobs_on_lent()
        rows.append(h.fallback_row(transition, point, failure))
        log(format_row(rows[-1]))
    if finish_jobs:
        rows.append(_finish_row(h, log, warm_samples=False))
    return rows


HEADER = f"{'transition':<10} {'injection point':<17} {'crashed':<8} {'converged':<10} {'s':>6} {'ticks':>6} " \
         f"{'violations':>10} {'jobs lost':>9}  note"


def format_row(r: Row) -> str:
    secs = f"{r.seconds:.1f}" if r.seconds is not None else "-"
    ticks = str(r.ticks) if r.ticks is not None else "-"
    crashed = "yes" if r.crashed else "NO" if r.must_crash else "no"
    return (f"{r.transition:<10} {r.point:<17} {crashed:<8} {'yes' if r.converged else 'NO':<10} "
            f"{secs:>6} {ticks:>6} {len(r.violations):>10} {r.jobs_lost:>9}  {r.note}"
            + (f" [{r.violations[0]}]" if r.violations else ""))


def format_matrix(rows: Sequence[Row]) -> str:
    return "\n".join([HEADER, *(format_row(r) for r in rows)])


__all__ = ["FALLBACK_EVENTS", "FALLBACK_FAILURES", "FALLBACK_FAULTS", "FALLBACK_REASONS", "FAST_PARTITION", "FAST_TIER_ROWS", "WARM_FALLBACK_ROWS", "WARM_ROWS", "Harness", "Row",
           "crash_matrix", "default_rows", "fallback_matrix", "fallback_rows",
           "format_matrix", "format_row", "matrix_rows", "read_events", "rows_of"]


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
