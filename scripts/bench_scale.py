#!/usr/bin/env python3
"""The daemon at scale: 2,000 nodes and 10,000 pods on a real Kubernetes control plane,
Slurm output of the same size, the real ``Daemon.iterate()`` (its passes, chained). Prints numbers, asserts nothing.

    .venv/bin/python scripts/bench_scale.py [--nodes 2000] [--pods 10000] [--lent 200] [--ticks 40]
    .venv/bin/python scripts/bench_scale.py --fake-kube --nodes 10000 --lent 1000 --ticks 10

``--fake-kube``: the lab's in-memory FakeKube instead of the control plane (no other pods; its
reads parse every object on each call, so its CPU per tick is the fake's as much as the daemon's).

- Kubernetes: a real control plane (gpu_bridge_lab.sandbox.realkube: etcd, kube-apiserver,
  controllers, scheduler, kwok as the kubelets, heartbeats every 60 s), seeded through its API:
  ``--nodes`` pool nodes (``--lent`` of them lent: fenced, no pod), the vLLM Deployment with
  one Ready pod per serving node (placed by the real ReplicaSet controller and scheduler, made
  Ready by kwok), and other pods (node agents, batch pods in another namespace) up to
  ``--pods`` in all. The daemon reads it through the real ``KubeAdapter`` (list + watch cache).
- Slurm: a CommandRunner for ``bridge/adapters/slurm/cli.py`` that keeps a small Slurm model
  (drains, hold jobs that preempt research jobs with ``--grace-s`` of GraceTime, Slurm's own
  requeue 30 s after it as 22.05's sweep, so the daemon's requeue at its end frees the node;
  research jobs) and answers ``sinfo --json`` /
  ``squeue --json`` in the 22.05 shape with full-size records (copied from the recorded
  fixtures), so the parsing cost is real. Rendering the JSON is cached and its own CPU time
  is measured and subtracted.
- Prometheus: a reader returning the load the scenario sets, stamped with the daemon's clock.

Steady state: the load needs exactly the serving nodes (no lend, no reclaim); every tick runs
the policy. CPU per tick: ``time.thread_time()`` of the ticking thread (the daemon's work)
and ``time.process_time()`` of the whole process (watch threads included). Then a mass reclaim: the load rises so every
lent node is reclaimed at once; per tick the API calls and Slurm commands (and reads, and
passes) against the number of node changes, and the Slurm reads of the tick where the daemon
requeued the victims. Then cProfile's top entries of steady-state ticks.

Measured: README.md "Scale" and docs/real-kubernetes.md (2-core dev VM shared with other
work, Slurm 22.05-size output: sinfo 2.0 MiB, squeue 6.1 MiB per read). The emulator this
bench ran on before it was deleted: 86 ms median CPU per tick, 0 Kubernetes calls per tick.
What keeps a tick there: desired replicas computed once per pool, the cyclic GC paused during
the Slurm parse (about 1 s per tick without it), msgspec decoding only the keys read; a Slurm write reads back
only its one node and our hold ids, so calls follow changes, not nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import gc
import io
import json
import pstats
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge import logs  # noqa: E402
from bridge import wellknown as wk  # noqa: E402
from bridge.adapters.kube.client import KubeAdapter, api_client_from_config  # noqa: E402
from bridge.adapters.protocols import PoolTarget  # noqa: E402
from bridge.adapters.prom.types import PromPool, SignalsReading  # noqa: E402
from bridge.adapters.slurm.cli import CliSlurm, CommandResult  # noqa: E402
from bridge.config import default_config  # noqa: E402
from bridge.daemon import Daemon  # noqa: E402
from bridge.model import LoadSignals  # noqa: E402
from gpu_bridge_lab.sandbox.realkube.serving_model import ServingModel, deployment_object, node_object  # noqa: E402

POOL = "bench"
NS = "serving"
FIX = ROOT / "tests" / "fixtures" / "slurm"
PROMQ = "prometheus queries"  # counted beside the Slurm commands, not in their total
SLURM_WRITES = frozenset({"sbatch", "scancel", "scontrol update", "scontrol requeue"})


def reads(counts: Counter[str]) -> int:
    """The Slurm reads among ``counts`` (SlurmModel.key's names)."""
    return sum(v for k, v in counts.items() if k not in SLURM_WRITES and k != PROMQ)
TARGET_PER_REPLICA = 24.0  # default concurrency_per_replica


# --- Slurm ---------------------------------------------------------------------------------------

class SlurmModel:
    """Just enough Slurm for the lifecycle, answering the CLI adapter's commands (22.05 JSON)."""

    def __init__(self, now: float, grace_s: float = 0.0, sweep_lag_s: float = 30.0) -> None:
        sinfo = json.loads((FIX / "sinfo-22.05.json").read_text())
        squeue = json.loads((FIX / "squeue-22.05.json").read_text())
        self.node_tpl = sinfo["nodes"][0]
        self.job_tpl = next(j for j in squeue["jobs"] if j["job_state"] == "RUNNING")
        self.meta = sinfo["meta"]
        self.now = now
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> {drained, reason}
        self.jobs: dict[int, dict[str, Any]] = {}  # id -> {name, user, partition, state, node, start}
        self.next_id = 1000
        self._cache: dict[str, str] = {}
        self.render_cpu_s = 0.0
        self.commands: Counter[str] = Counter()
        # GraceTime: a hold preempts the research jobs on its node (PreemptTime set, still running);
        # Slurm ends them itself only on its sweep, ``sweep_lag_s`` after the grace (22.05: up to
        # 30 s), so the daemon's own requeue at the grace's end is what frees the node. 0: at once.
        self.grace_s, self.sweep_lag_s = grace_s, sweep_lag_s
        self.requeued = 0  # jobs requeued by `scontrol requeue` (the daemon's)

    # state -------------------------------------------------------------------------------------
    def add_node(self, name: str, *, drained: bool) -> None:
        self.nodes[name] = {"drained": drained, "reason": "gpu-bridge: serving (pool bench)" if drained else ""}

    def add_job(self, name: str, user: str, partition: str, node: str | None, start: float | None) -> int:
        self.next_id += 1
        self.jobs[self.next_id] = {"name": name, "user": user, "partition": partition,
                                   "state": "RUNNING" if node else "PENDING", "node": node or "", "start": start,
                                   "restarts": 0, "preempt": None, "pin": ""}
        self._cache.clear()
        return self.next_id

    # rendering (cached; its CPU is not the daemon's) --------------------------------------------
    def _render(self, what: str) -> str:
        if what in self._cache:
            return self._cache[what]
        t0 = time.thread_time()
        if what == "sinfo":
            busy = {j["node"] for j in self.jobs.values() if j["state"] == "RUNNING"}
            recs = []
            for name, n in self.nodes.items():
                r = dict(self.node_tpl)
                r.update(name=name, hostname=name, state="allocated" if name in busy else "idle",
                         state_flags=["DRAIN"] if n["drained"] else [], reason=n["reason"],
                         gres_used="gpu:4" if name in busy else "gpu:0", partitions=["preempt", "gpu-bridge"])
                recs.append(r)
            text = json.dumps({"meta": self.meta, "errors": [], "nodes": recs})
        else:
            recs = []
            for jid, j in self.jobs.items():
                r = copy.copy(self.job_tpl)
                r.update(job_id=jid, name=j["name"], user_name=j["user"], partition=j["partition"],
                         job_state=j["state"], nodes=j["node"], batch_host=j["node"],
                         start_time=int(j["start"] or 0), restart_cnt=j["restarts"], comment="",
                         node_count=1, tres_per_node="gres:gpu:4", preempt_time=int(j["preempt"] or 0))
                recs.append(r)
            text = json.dumps({"meta": self.meta, "errors": [], "jobs": recs})
        self._cache[what] = text
        self.render_cpu_s += time.thread_time() - t0
        return text

    def _requeue(self, j: dict[str, Any]) -> None:
        j.update(state="PENDING", node="", start=None, preempt=None, restarts=j["restarts"] + 1)

    def _schedule(self) -> None:
        """Slurm's own sweep (a grace over ``sweep_lag_s`` ago), then each pending hold whose node is empty starts."""
        for j in self.jobs.values():
            if j["state"] == "RUNNING" and j["preempt"] is not None and self.now >= j["preempt"] + self.grace_s + self.sweep_lag_s:
                self._requeue(j)
                self._cache.clear()
        busy = {j["node"] for j in self.jobs.values() if j["state"] == "RUNNING"}
        for j in self.jobs.values():
            if j["state"] == "PENDING" and j["pin"] and j["pin"] not in busy:
                j.update(state="RUNNING", node=j["pin"], start=self.now)
                busy.add(j["pin"])
                self._cache.clear()

    @staticmethod
    def key(argv: Sequence[str]) -> str:
        """What a command is, for the counts: reads and writes apart."""
        if argv[0] == "squeue":
            return "squeue --json" if "--json" in argv else ("squeue --jobs" if any(a.startswith("--jobs") for a in argv)
                                                             else "squeue --name")
        return " ".join(argv[:2]) if argv[0] == "scontrol" else argv[0]

    def _requeue_check(self, argv: list[str]) -> CommandResult:
        """``squeue --noheader --jobs=A,B --Format REQUEUE_CHECK_FORMAT`` (or ``--jobs A``)."""
        i = next(i for i, a in enumerate(argv) if a.startswith("--jobs"))
        asked = (argv[i].split("=", 1)[1] if "=" in argv[i] else argv[i + 1]).split(",")
        found = [int(a) for a in asked if int(a) in self.jobs]
        if len(asked) == 1 and not found:
            return CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n")
        lines = [f"{jid}|{j['state']}|{j['partition']}|{'2026-12-02T12:00:00' if j['preempt'] else 'N/A'}|{j['restarts']}|\n"
                 for jid in found for j in (self.jobs[jid],)]
        return CommandResult(0, "".join(lines), "")

    # the CommandRunner ------------------------------------------------------------------------
    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        argv = list(argv)
        self.commands[self.key(argv)] += 1
        self._schedule()
        if argv[1:] in (["--json"], ["--json", "--Node"]) and argv[0] in ("sinfo", "squeue"):
            return CommandResult(0, self._render(argv[0]), "")
        if argv[:4] == ["scontrol", "--oneliner", "show", "node"]:  # the writes' precondition: one node or a list
            busy = {j["node"] for j in self.jobs.values() if j["state"] == "RUNNING"}
            lines = []
            for name in argv[4].split(","):
                n = self.nodes.get(name)
                if n is None:
                    return CommandResult(1, "".join(lines) + f"Node {name} not found\n", "")
                state = ("ALLOCATED" if name in busy else "IDLE") + ("+DRAIN" if n["drained"] else "")
                reason = f" Reason={n['reason']} [root@2026-12-02T12:00:00]" if n["reason"] else ""
                lines.append(f"NodeName={name} Gres=gpu:4 State={state}{reason}\n")
            return CommandResult(0, "".join(lines), "")
        if argv == ["sdiag"]:  # slurmctld's clock: the daemon measures Slurm's own times against it
            return CommandResult(0, f"sdiag output at bench ({int(self.now)})\n", "")
        if argv[:2] == ["squeue", "--noheader"] and self.key(argv) == "squeue --jobs":  # the requeue's re-read
            return self._requeue_check(argv)
        if argv[:2] == ["squeue", "--noheader"]:  # our hold ids: squeue's text output honours filters
            name, part = argv[argv.index("--name") + 1], argv[argv.index("--partition") + 1]
            ids = [f"{jid}|{j['user']}\n" for jid, j in self.jobs.items() if j["name"] == name and j["partition"] == part]
            return CommandResult(0, "".join(ids), "")
        self._cache.clear()
        if argv[:2] == ["scontrol", "update"]:
            opts = dict(a.split("=", 1) for a in argv[2:])
            for n in (self.nodes[name] for name in opts["NodeName"].split(",")):
                if opts["State"] == "DRAIN":
                    n.update(drained=True, reason=opts.get("Reason", ""))
                else:
                    n.update(drained=False, reason="")
            return CommandResult(0, "", "")
        if argv[0] == "sbatch":
            node = argv[argv.index("--nodelist") + 1]
            name = argv[argv.index("--job-name") + 1]
            for j in self.jobs.values():  # the hold job preempts research on the node (requeue)
                if j["node"] == node and j["state"] == "RUNNING" and j["preempt"] is None:
                    j["preempt"] = self.now
                    if not self.grace_s:
                        self._requeue(j)
            jid = self.add_job(name, "root", argv[argv.index("--partition") + 1], None, None)
            self.jobs[jid]["pin"] = node
            self._schedule()
            return CommandResult(0, f"{jid}\n", "")
        if argv[0] == "scancel":
            for a in argv[1:]:
                if a.isdigit():
                    self.jobs.pop(int(a), None)
            return CommandResult(0, "", "")
        if argv[:2] == ["scontrol", "requeue"]:  # one job or a list (Slurm names each it could not)
            errors = []
            for jid in (int(a) for a in argv[2].split(",")):
                if self.jobs.get(jid, {}).get("state") != "RUNNING":
                    errors.append(f"Job is pending execution for job {jid}\n")
                    continue
                self._requeue(self.jobs[jid])
                self.requeued += 1
            self._schedule()
            return CommandResult(1 if errors else 0, "", "".join(errors))
        return CommandResult(1, "", f"bench slurm: unsupported {argv[:2]}")


# --- Prometheus ------------------------------------------------------------------------------------

class Load:
    """A PromReader returning ``replicas`` worth of load, stamped with the daemon's clock."""

    def __init__(self, clock: Any, replicas: float, reporting: int) -> None:
        self.clock, self.replicas, self.reporting = clock, replicas, reporting
        self.queries = 0  # Prometheus queries the daemon made (current, history, reclaim delays)

    def __call__(self) -> int:
        return self.queries

    def current(self, pool: PromPool, *, at: float | None = None, live_pods: Any = None) -> SignalsReading:
        self.queries += 1
        s = LoadSignals(t=self.clock(), running=self.replicas * TARGET_PER_REPLICA, waiting=0.0,
                        kv_cache_usage_sum=0.05 * self.reporting, tokens_per_s=None, replicas_reporting=self.reporting)
        return SignalsReading(pool=pool.name, signals=s)

    def history(self, pool: PromPool, *, start: float, end: float, step_s: float) -> tuple[LoadSignals, ...]:
        self.queries += 1
        return ()

    def reclaim_delays(self, pool: PromPool, *, window_s: float) -> tuple[Any, ...]:
        self.queries += 1
        return ()

    def gpu_free(self, pool: PromPool, nodes: Any, *, node_label: str, gpus: int) -> dict[str, float | None]:
        self.queries += 1
        return {}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# --- the world -------------------------------------------------------------------------------------

def other_pod(i: int, node: str) -> dict[str, Any]:
    ns, app = ("kube-system", "node-agent") if i % 4 == 0 else ("batch", "etl")
    body = {"metadata": {"name": f"{app}-{i:05d}", "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": app, "image": "busybox",
                                                       "resources": {"requests": {"cpu": "100m"}}}]}}
    return body


def seed_api(kubeconfig: Path, names: list[str], lent: set[str], pods_total: int, now: float) -> tuple[float, int]:
    """The same world written through the API of a real control plane (kwok runs the pods, the
    real ReplicaSet controller and scheduler place the vLLM replicas). Returns (seconds, pods)."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client as k8s

    t0 = time.perf_counter()
    api = api_client_from_config(kubeconfig=str(kubeconfig))
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = 16
    core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
    for ns in (NS, "batch"):
        core.create_namespace({"metadata": {"name": ns}})
    for ns in (NS, "batch", "kube-system"):  # admission refuses pods until "default" exists
        try:
            core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
        except k8s.exceptions.ApiException as e:
            if e.status != 409:
                raise

    def node(i_n: tuple[int, str]) -> None:
        i, n = i_n
        obj = node_object(n, POOL, 4, i)
        obj["metadata"]["labels"][wk.LABEL_PHASE] = "lent" if n in lent else "serving"
        obj["metadata"]["annotations"] = {wk.ANNOTATION_PHASE_SINCE: f"{now - 86400:.3f}",
                                          wk.ANNOTATION_REASON: "bench", wk.ANNOTATION_OWNER: "bench"}
        if n in lent:
            obj["spec"] = {"unschedulable": True, "taints": [{"key": wk.TAINT_KEY, "effect": wk.TAINT_EFFECT}]}
            obj["metadata"]["annotations"][wk.ANNOTATION_CORDONED] = "true"
        core.create_node(obj)

    def pod(i: int) -> None:
        body = other_pod(i, names[i % len(names)])
        core.create_namespaced_pod(body["metadata"]["namespace"], body)

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(node, enumerate(names, 1)))
        print(f"  {len(names)} nodes created in {time.perf_counter() - t0:.1f} s", flush=True)
        serving = len(names) - len(lent)
        model = ServingModel(nodes=serving, pool=POOL, namespace=NS, replicas=serving, termination_grace_s=1)
        apps.create_namespaced_deployment(NS, deployment_object(model))
        list(ex.map(pod, range(max(0, pods_total - serving))))
        print(f"  {max(0, pods_total - serving)} other pods created at {time.perf_counter() - t0:.1f} s", flush=True)
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        d = apps.read_namespaced_deployment("vllm", NS)
        if (d.status.available_replicas or 0) >= serving:
            break
        time.sleep(1.0)
    total = sum(1 for _ in json.loads(core.list_pod_for_all_namespaces(
        _preload_content=False, _request_timeout=120).data)["items"])
    api.close()
    return time.perf_counter() - t0, total


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--lent", type=int, default=200, help="nodes lent at start; all reclaimed in the mass reclaim")
    ap.add_argument("--ticks", type=int, default=40, help="steady-state ticks measured")
    ap.add_argument("--profile-ticks", type=int, default=15)
    ap.add_argument("--top", type=int, default=18, help="cProfile entries shown")
    ap.add_argument("--pending-jobs", type=int, default=300, help="research jobs waiting in the preempt partition")
    ap.add_argument("--grace-s", type=float, default=10.0,
                    help="GraceTime of a preempted research job; the daemon requeues it at its end (Slurm's own "
                         "sweep comes 30 s later); 0: Slurm requeues at once (no requeue by the daemon)")
    ap.add_argument("--fake-kube", action="store_true",
                    help="the lab's in-memory FakeKube instead of a real control plane (10,000 nodes)")
    ap.add_argument("--no-freeze", action="store_true",
                    help="do not gc.freeze() after seeding (the watch cache's objects are then scanned by "
                         "every full collection the daemon's allocations trigger)")
    args = ap.parse_args()
    logs.configure(json=True, level="error", stream=io.StringIO())  # the daemon's logs cost I/O, not measured here

    now = 1_767_225_600.0
    clock = Clock(now)
    names = [f"gpu-node-{i:04d}" for i in range(1, args.nodes + 1)]
    lent = set(names[-args.lent:]) if args.lent else set()
    serving = [n for n in names if n not in lent]

    slurm_model = SlurmModel(now, grace_s=args.grace_s)
    for n in names:
        slurm_model.add_node(n, drained=n not in lent)
    for n in serving:
        slurm_model.add_job(wk.SLURM_HOLD_JOB_PREFIX + n, "root", wk.SLURM_HOLD_PARTITION, n, now - 86400)
    for n in sorted(lent):
        slurm_model.add_job("train-llm", "alice", wk.SLURM_PREEMPT_PARTITION, n, now - 7200)
    for i in range(args.pending_jobs):
        slurm_model.add_job(f"sweep-{i}", "bob", wk.SLURM_PREEMPT_PARTITION, None, None)

    if args.fake_kube:
        return run_fake(args, now, clock, names, lent, serving, slurm_model)
    with contextlib.ExitStack() as stack:
        from gpu_bridge_lab.sandbox.realkube import control_plane

        # kwok renews 2,000 node Leases: every 60 s, not 10 s, on 2 shared cores (else nodes
        # go NotReady because the simulator is late, which real kubelets would not be)
        sb = stack.enter_context(control_plane(kube_args=("--pod-start-delay-s", "0.2", "--node-heartbeat-s", "60")))
        seed_s, total_pods = seed_api(sb.kubeconfig, names, lent, args.pods, now)
        kubeconfig = sb.kubeconfig
        sinfo_kb = len(slurm_model._render("sinfo")) / 1024
        squeue_kb = len(slurm_model._render("squeue")) / 1024
        print(f"world: {len(names)} pool nodes ({len(serving)} serving, {len(lent)} lent), {total_pods} pods "
              f"({len(serving)} vLLM), {len(slurm_model.jobs)} Slurm jobs; seeded in {seed_s:.1f} s")
        print(f"slurm output per read: sinfo --json {sinfo_kb:.0f} KiB, squeue --json {squeue_kb:.0f} KiB")

        api = api_client_from_config(kubeconfig=str(kubeconfig))
        kube = KubeAdapter(api, pools=[PoolTarget(POOL, NS, "vllm")], identity="bench", watch_timeout_s=300)
        t0 = time.perf_counter()
        kube.start()
        kube.wait_synced(60)
        print(f"watch cache synced in {time.perf_counter() - t0:.2f} s; initial list/watch calls "
              f"{sum(kube.calls.snapshot().values())}")
        if not args.no_freeze:
            gc.collect()
            gc.freeze()  # the watch cache's objects: long-lived, as in the daemon after its first list
            print(f"gc.freeze() after seeding: {gc.get_freeze_count()} objects (the watch cache's) "
                  "kept out of the collector's scans")
        daemon, prom = make_daemon(args, kube, slurm_model, clock, serving)
        try:
            return run(args, daemon, kube, slurm_model, prom, clock, names, lent)
        finally:
            kube.stop()
            api.close()


def make_daemon(args: Any, kube: Any, slurm_model: SlurmModel, clock: Clock, serving: list[str]) -> tuple[Daemon, Load]:
    config = default_config(POOL, namespace=NS, min_serving=1)
    import dataclasses as dc
    config = dc.replace(config, policy=dc.replace(config.policy, max_reclaims_per_tick=max(8, args.lent)),
                        slurm=dc.replace(config.slurm, grace_s=args.grace_s))
    slurm = CliSlurm(runner=slurm_model)
    # steady: the load needs exactly the serving nodes (ceil(d * 1.15 + 0.5) == serving)
    steady_replicas = (len(serving) - 0.5) / 1.15 - 0.2
    prom = Load(clock, steady_replicas, len(serving))
    # the bench's Deployment and pods change only in the reclaim: a watch cache older than the
    # daemon's 75 s (its watches get no event and few bookmarks on the loaded bench machine)
    # would stop the daemon acting half-way through a reclaim with a GraceTime; its watches time out at 300 s
    daemon = Daemon(config, kube=kube, slurm=slurm, prom=prom, prom_pools={POOL: PromPool(POOL, POOL)}, clock=clock,
                    max_cache_age_s=300.0)
    return daemon, prom


class _FakeCalls:
    """FakeKube's call Counter behind the real adapter's ``calls.snapshot()``."""

    def __init__(self, calls: Counter[tuple[str, str]]) -> None:
        self._calls = calls

    def snapshot(self) -> dict[tuple[str, str], int]:
        return dict(self._calls)


def run_fake(args: Any, now: float, clock: Clock, names: list[str], lent: set[str], serving: list[str],
             slurm_model: SlurmModel) -> int:
    """The same world in the lab's FakeKube (pool nodes and vLLM pods only)."""
    from bridge.adapters.protocols import PoolTarget as Target
    from gpu_bridge_lab.fakes.kube import FakeKube

    t0 = time.perf_counter()
    fake = FakeKube(identity="bench", now=now)
    for n in names:
        ann = {wk.ANNOTATION_PHASE_SINCE: f"{now - 86400:.3f}", wk.ANNOTATION_REASON: "bench", wk.ANNOTATION_OWNER: "bench"}
        if n in lent:
            ann[wk.ANNOTATION_CORDONED] = "true"
        fake.add_node(n, POOL, labels={wk.LABEL_PHASE: "lent" if n in lent else "serving"}, annotations=ann,
                      unschedulable=n in lent,
                      taints=[{"key": wk.TAINT_KEY, "effect": wk.TAINT_EFFECT}] if n in lent else ())
    fake.add_pool(Target(POOL, NS, "vllm"), replicas=0, start_delay_s=0.2, grace_s=1.0)
    fake._pools[POOL].replicas = len(serving)
    for n in serving:  # one Ready replica per serving node, placed directly (no scheduler pass per pod)
        fake._create_pod(POOL, n, ready=True)
    print(f"world (FakeKube): {len(names)} pool nodes ({len(serving)} serving, {len(lent)} lent), "
          f"{len(serving)} vLLM pods, {len(slurm_model.jobs)} Slurm jobs; seeded in {time.perf_counter() - t0:.1f} s")
    print(f"slurm output per read: sinfo --json {len(slurm_model._render('sinfo')) / 1024:.0f} KiB, "
          f"squeue --json {len(slurm_model._render('squeue')) / 1024:.0f} KiB")
    fake.calls_view = _FakeCalls(fake.calls)  # type: ignore[attr-defined]
    if not args.no_freeze:
        gc.collect()
        gc.freeze()
    daemon, prom = make_daemon(args, fake, slurm_model, clock, serving)
    return run(args, daemon, fake, slurm_model, prom, clock, names, lent)


def _calls(kube: Any) -> dict[tuple[str, str], int]:
    return kube.calls_view.snapshot() if hasattr(kube, "calls_view") else kube.calls.snapshot()


def run(args: Any, daemon: Daemon, kube: KubeAdapter, slurm_model: SlurmModel, prom: Load, clock: Clock,
        names: list[str], lent: set[str]) -> int:
    tick_s = daemon.config.policy.tick_s

    gc_time = [0.0]
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - gc_start[0]

    gc.callbacks.append(on_gc)

    def one_tick(step_s: float | None = None) -> tuple[float, float, dict[str, int], Counter[str], Any]:
        clock.t += tick_s if step_s is None else step_s
        slurm_model.now = clock.t
        if hasattr(kube, "step"):  # FakeKube: its controllers move only when stepped
            kube.step(clock.t)
        k0, s0, r0 = _calls(kube), Counter(slurm_model.commands), slurm_model.render_cpu_s
        q0 = prom.queries
        c0, p0 = time.thread_time(), time.process_time()
        result = daemon.iterate()
        c1, p1 = time.thread_time(), time.process_time()
        render = slurm_model.render_cpu_s - r0
        k1 = _calls(kube)
        kd = {f"{v} {r}": k1[(v, r)] - k0.get((v, r), 0) for (v, r) in k1 if k1[(v, r)] - k0.get((v, r), 0)}
        sd = Counter(slurm_model.commands)
        sd.subtract(s0)
        if prom.queries - q0:
            sd[PROMQ] = prom.queries - q0
        return c1 - c0 - render, p1 - p0 - render, kd, +sd, result

    for _ in range(3):  # warm up: first plan, history recorder
        one_tick()
    cpu, proc, kube_calls, slurm_cmds, actions = [], [], Counter(), Counter(), 0
    gc_time[0] = 0.0
    for _ in range(args.ticks):
        c, p, kd, sd, result = one_tick()
        cpu.append(c)
        proc.append(p)
        kube_calls.update(kd)
        slurm_cmds.update(sd)
        actions += len(result.planned.actions) if result.planned else 0
    print()
    print(f"STEADY STATE ({args.ticks} ticks, policy run every tick, {actions} actions planned)")
    print(f"  CPU per tick, daemon thread (thread_time):  median {statistics.median(cpu) * 1000:7.1f} ms   "
          f"p95 {pct(cpu, 0.95) * 1000:7.1f} ms   max {max(cpu) * 1000:7.1f} ms   (target < 100 ms)")
    print(f"  CPU per tick, whole process (process_time): median {statistics.median(proc) * 1000:7.1f} ms   "
          f"p95 {pct(proc, 0.95) * 1000:7.1f} ms")
    print(f"  of which cyclic GC pauses (any thread):     mean {gc_time[0] / args.ticks * 1000:7.1f} ms")
    print(f"  Kubernetes API calls per tick: {sum(kube_calls.values()) / args.ticks:.2f} {dict(kube_calls) or ''}")
    print(f"  Slurm commands per tick:       {(sum(slurm_cmds.values()) - slurm_cmds[PROMQ]) / args.ticks:.2f} "
          f"{ {k: round(v / args.ticks, 2) for k, v in slurm_cmds.items()} }")
    print(f"  Slurm reads per tick:          {reads(slurm_cmds) / args.ticks:.2f}")

    # --- mass reclaim ---------------------------------------------------------------------------
    print()
    print(f"MASS RECLAIM: load rises to need all {len(names)} nodes; {len(lent)} lent nodes reclaimed")
    prom.replicas = len(names) * 1.0
    prom.reporting = len(names) - len(lent)
    print(f"  {'tick':>4} {'cpu ms':>8} {'proc ms':>8} {'changes':>8} {'k8s calls':>9} {'slurm cmds':>10} {'reads':>6} "
          f"{'passes':>6}  {'calls/change':>12}  phases of the reclaimed nodes")
    tot_changes = tot_k = tot_s = tot_reads = 0
    requeue_ticks: list[tuple[int, int, int, int]] = []  # (tick, passes, Slurm reads, jobs requeued) where the daemon requeued
    requeued_before = slurm_model.requeued
    not_acting: Counter[str] = Counter()  # ticks the daemon did not act, by why
    reclaim_cpu: list[float] = []
    start = time.monotonic()
    prev = {n.name: n.phase for n in kube.nodes() if n.name in lent}
    last = time.monotonic()
    for tick in range(1, 400):
        # in transit the daemon iterates every transit_poll_s of real time: the clock follows it
        t = time.monotonic()
        c, p, kd, sd, result = one_tick(step_s=tick_s if tick == 1 else t - last)  # 1st: a policy tick
        last = t
        if not result.observed:
            not_acting[result.error or "not leading"] += 1
        phases = {n.name: n.phase for n in kube.nodes() if n.name in lent}
        changes = sum(1 for n in lent if phases.get(n) != prev.get(n))
        prev = phases
        k, s, r = sum(kd.values()), sum(sd.values()) - sd[PROMQ], reads(sd)
        tot_changes, tot_k, tot_s, tot_reads = tot_changes + changes, tot_k + k, tot_s + s, tot_reads + r
        passes = sd["sdiag"]  # one slurmctld clock read per pass
        if sd["scontrol requeue"]:
            requeue_ticks.append((tick, passes, r, slurm_model.requeued - requeued_before))
        requeued_before = slurm_model.requeued
        reclaim_cpu.append(c)
        summary = dict(sorted(Counter(str(v) for v in phases.values()).items()))
        ratio = f"{(k + s) / changes:12.1f}" if changes else f"{'-':>12}"
        if changes or k or s > passes * 3 or tick <= 2:
            print(f"  {tick:>4} {c * 1000:8.1f} {p * 1000:8.1f} {changes:8d} {k:9d} {s:10d} {r:6d} {passes:6d}  {ratio}  {summary}")
            if k:
                print(f"  {'':>4} k8s: {kd}")
            if s:
                print(f"  {'':>4} slurm: {dict(sd)}")
        if all(v == "serving" for v in phases.values()):
            break
        time.sleep(daemon.transit_poll_s)  # as the daemon's loop does while nodes are in transit
    wall = time.monotonic() - start
    done = sum(1 for v in prev.values() if v == "serving")
    print(f"  {done}/{len(lent)} reclaimed nodes serving after {tick} ticks ({wall:.1f} s wall); "
          f"{tot_changes} node phase changes, {tot_k} Kubernetes calls, {tot_s} Slurm commands "
          f"({tot_reads} reads): {(tot_k + tot_s) / max(1, tot_changes):.1f} calls per change")
    print(f"  Slurm reads per tick over the reclaim: {tot_reads / tick:.1f} (steady state: {reads(slurm_cmds) / args.ticks:.1f})")
    for why, n in not_acting.items():
        print(f"  {n} ticks the daemon did not act: {why}")
    for t, n, r, q in requeue_ticks:
        print(f"  the daemon's requeue (tick {t}): {q} jobs requeued, {r} Slurm reads in {n} passes "
              f"({r / max(1, n):.1f} reads per pass)")
    print(f"  CPU per reclaim tick (daemon thread): median {statistics.median(reclaim_cpu) * 1000:.0f} ms, "
          f"max {max(reclaim_cpu) * 1000:.0f} ms")

    # --- steady state again, then where the time goes ------------------------------------------
    for _ in range(3):
        one_tick()
    if args.profile_ticks <= 0:
        return 0
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.profile_ticks):
        one_tick()
    prof.disable()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(args.top)
    print()
    print(f"WHERE THE TIME GOES (cProfile, {args.profile_ticks} steady-state ticks after the reclaim, by own time)")
    lines = out.getvalue().splitlines()
    start_i = next(i for i, line in enumerate(lines) if "ncalls" in line)
    for line in lines[start_i:start_i + args.top + 1]:
        print("  " + line.rstrip())
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(r"bridge/(daemon|observe|policy|adapters|lifecycle|actuate)", args.top)
    print()
    print("  by cumulative time, bridge code only:")
    lines = out.getvalue().splitlines()
    start_i = next(i for i, line in enumerate(lines) if "ncalls" in line)
    for line in lines[start_i:start_i + args.top + 1]:
        print("  " + line.rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
