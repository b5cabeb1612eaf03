"""`gpu-bridge demo`: sandbox up, daemon started, a day replayed, jobs submitted, all shown.

The order: the sandbox (real Slurm + munge, the sandbox Kubernetes API server with the vLLM
Deployment, the vLLM simulator replaying the trace, real Prometheus); the daemon as an
operator runs it (``gpu-bridge run --config DIR/gpu-bridge.yaml --log-format json``,
started through the sandbox so ``gpu-bridge sandbox down`` stops it too); then one loop
that samples everything once a second, prints what changed, and submits research jobs.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gpu_bridge_lab.demo import report
from gpu_bridge_lab.demo.jobs import JobSubmitter, job_plan
from gpu_bridge_lab.demo.shape import DAY_S, DayShape, clock, day_shape, replica_rps_at_target
from gpu_bridge_lab.demo.timeline import Display, Event, daemon_event, job_event, progress_text
from gpu_bridge_lab.demo.watch import JobTracker, LogTail, Observer, Sample, log_time
from gpu_bridge_lab.sandbox.cluster.procs import free_ports
from gpu_bridge_lab.sandbox.daemon_config import daemon_identity, sandbox_config, write_config
from gpu_bridge_lab.sandbox.serving import serving_sandbox
from bridge.trace import load_trace

GRACE_S = 5  # Slurm GraceTime of the preemptible partition
POD_START_S = 3.0  # vLLM cold start in the sandbox
MIN_SERVING = 1
CONCURRENCY_PER_REPLICA = 60.0  # the sandbox config's per-replica target
MAX_CV = 1.5  # burstiness cap: the raw trace's cv (median 2.9, bursts > 50) makes a 4-node demo unreadable
MAX_DIR_LEN = 60


@dataclass(frozen=True, slots=True)
class DemoOptions:
    dir: Path
    minutes: float = 5.0
    nodes: int = 4
    keep: bool = False
    plot: Path | None = None
    day: int = 9
    start: str = "22:00"
    seed: int = 1
    summary_json: Path | None = None


class _Interrupted(Exception):
    pass


def _on_term(_signum: int, _frame: Any) -> None:
    raise _Interrupted()


def run_demo(opts: DemoOptions, out: TextIO | None = None) -> int:
    """The whole demo; returns the exit code. Tears the sandbox down unless ``keep``
    (and always on Ctrl-C, SIGTERM or SIGHUP)."""
    out = out or sys.stdout
    d = opts.dir.absolute()
    if len(str(d)) > MAX_DIR_LEN:
        print(f"gpu-bridge demo: --dir: at most {MAX_DIR_LEN} characters (unix sockets live in it), got {d}",
              file=sys.stderr)
        return 2
    replica_rps = replica_rps_at_target(CONCURRENCY_PER_REPLICA)
    try:
        shape = day_shape(load_trace(), day=opts.day, start=opts.start, minutes=opts.minutes, nodes=opts.nodes,
                          replica_rps=replica_rps)
    except ValueError as exc:
        print(f"gpu-bridge demo: {exc}", file=sys.stderr)
        return 2
    show = Display(out)
    # the daemon's /metrics (scraped by the sandbox's Prometheus: the research view's history) and the view
    metrics_port, web_port = free_ports(2)
    web_url = f"http://127.0.0.1:{web_port}"
    sb = serving_sandbox(d, nodes=opts.nodes, grace_s=GRACE_S, pod_start_delay_s=POD_START_S, pod_grace_s=3,
                         shutdown_timeout_s=2, speed=shape.speed, trace_start_s=shape.trace_start_s,
                         peak_rps=shape.global_peak_rps, vllm_extra=("--max-cv", str(MAX_CV), "--seed", str(opts.seed)),
                         scrape_targets=[f"gpu-bridge=127.0.0.1:{metrics_port}"])
    if sb.running():  # never tear down a sandbox this run did not start
        print(f"gpu-bridge demo: a sandbox already runs in {d} (a kept demo?): stop it with "
              f"`{_cli_name()} sandbox down --dir {d}` or pick another --dir", file=sys.stderr)
        return 1
    _intro(show, opts, shape)
    # SIGTERM and SIGHUP (the terminal closed) tear down like Ctrl-C.
    previous = {sig: signal.signal(sig, _on_term) for sig in (signal.SIGTERM, signal.SIGHUP)}
    # Ctrl-C even when started from a shell that ignores SIGINT for background jobs.
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    rc = 0
    keep = opts.keep
    try:
        show.info(f"[1/4] starting the sandbox in {d} ...")
        sb.up()
        show.info(f"      up in {time.monotonic() - t0:.1f} s: munged; slurmctld + {opts.nodes} slurmd "
                  f"(partitions preempt GraceTime {GRACE_S} s, gpu-bridge for hold jobs); Kubernetes API server "
                  f"({opts.nodes} GPU nodes, Deployment serving/vllm x{opts.nodes}, vLLM start {POD_START_S:.0f} s); "
                  f"vLLM simulator following the Ready pods ({sb.vllm_url}); Prometheus ({sb.prometheus_url}, 1 s scrapes)")
        cfg_path = write_config(d / "gpu-bridge.yaml", _config(sb, opts.minutes, metrics_port=metrics_port, web_port=web_port))
        log_path = d / "daemon.log"
        log_path.unlink(missing_ok=True)
        sb.spawn("gpu-bridge", [sys.executable, "-m", "bridge", "run", "--config", str(cfg_path), "--log-format",
                                "json"], log_path)
        show.info(f"[2/4] daemon started: gpu-bridge run --config {cfg_path} --log-format json  (log: {log_path})")
        sb.spawn("gpu-bridge-web", [sys.executable, "-m", "bridge", "web", "--config", str(cfg_path), "--log-format",
                                    "json"], d / "web.log")
        show.info(f"      research view: {web_url}/  (gpu-bridge web --config {cfg_path}: read-only, its own "
                  f"ServiceAccount; log: {d / 'web.log'})")
        show.info("[3/4] replaying the day and submitting research jobs (sbatch -p preempt --requeue --gres=gpu:4):")
        samples, events, tracker, submitter = _replay(sb, d, shape, opts, show)
        show.done()
        show.info("[4/4] summary")
        summary = report.summarize(samples, events, tracker, shape=shape, min_serving=MIN_SERVING, nodes=opts.nodes)
        summary["sandbox_startup_s"] = round(sb.startup_s or 0.0, 1)
        summary["submit_errors"] = submitter.errors[:5]
        show.info(report.table(summary))
        report.dump(d / "demo-run.json", samples, events)
        png = opts.plot or d / "demo.png"
        if samples:
            report.plot(png, samples, events, shape=shape, nodes=opts.nodes, min_serving=MIN_SERVING)
            summary["plot"] = str(png)
            show.info(f"plot of the day: {png}")
        if opts.summary_json is not None:
            opts.summary_json.write_text(json.dumps(summary, indent=2))
    except (KeyboardInterrupt, _Interrupted):
        show.done()
        show.info("interrupted: tearing down")
        keep = False
        rc = 130
    except Exception as exc:  # the sandbox's own errors carry log tails
        show.done()
        show.info(f"gpu-bridge demo failed: {exc}")
        if "Permission denied" in str(exc):
            show.info("hint: munged runs as user munge, so every parent of --dir must be searchable by others "
                      "(e.g. a directory under /tmp)")
        keep = False
        rc = 1
    finally:
        try:
            if keep:
                _print_keep(show, d, web_url)
            else:
                t1 = time.monotonic()
                sb.down()
                show.info(f"sandbox torn down in {time.monotonic() - t1:.1f} s (nothing left running); "
                          f"logs stay in {d}/log and {d}/daemon.log")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    show.info(f"demo took {time.monotonic() - t0:.0f} s")
    if rc == 0:
        show.info(f"look at: {web_url}/pool  (the research view: the pool now, the outlook, each job's preemptions, "
                  f"the history)" + ("" if keep else "; it was torn down with the sandbox: run with --keep to keep it up"))
    return rc


def _config(sb: Any, minutes: float, *, metrics_port: int = 0, web_port: int = 0) -> dict[str, Any]:
    """The sandbox config with the anti-thrash windows scaled with the day: about 70 trace
    minutes of low demand before a lend, 50 trace minutes lent at least; the research view on
    ``web_port`` under its own read-only ServiceAccount."""
    doc = sandbox_config(prometheus_url=sb.prometheus_url, **daemon_identity(sb), grace_s=GRACE_S, metrics_port=metrics_port,
                         cold_start_s=POD_START_S, min_serving=MIN_SERVING,
                         concurrency_per_replica=CONCURRENCY_PER_REPLICA,
                         scale_down_window_s=max(5.0, 3.0 * minutes), min_lend_s=max(4.0, 2.0 * minutes),
                         # a lend must fit under the peak of the last ~2 trace hours
                         lend_lookback_s=max(8.0, 5.0 * minutes))
    doc["web"] = {"host": "127.0.0.1", "port": web_port, "kubeconfig": str(sb.web_kubeconfig), "cache_s": 1.0}
    return doc


def _intro(show: Display, opts: DemoOptions, shape: DayShape) -> None:
    show.info(
        f"gpu-bridge demo: 24 h of the shipped ServeGen trace from {clock(shape.trace_start_s)} in {opts.minutes:g} min "
        f"(x{shape.speed:.0f}) on {opts.nodes} 4-GPU nodes.\n"
        f"  load: the day's busiest 10-min window ({shape.raw_peak_rps:.0f} req/s at {clock(shape.peak_at_s)}) scaled "
        f"x{shape.scale:.4f} to {shape.peak_rps:.1f} req/s = {shape.peak_replicas:.1f} replicas at the per-replica "
        f"target ({shape.replica_rps:.1f} req/s: {CONCURRENCY_PER_REPLICA:.0f} requests in flight); quietest window "
        f"{shape.trough_rps:.1f} req/s = {shape.trough_replicas:.1f} replicas; burstiness capped at cv {MAX_CV}.\n"
        f"  The trace's days are not a clean day/night curve; this window has a real night trough and a morning "
        f"rise, so no shaping is applied (see docs/demo.md).")


def _replay(sb: Any, d: Path, shape: DayShape, opts: DemoOptions, show: Display
            ) -> tuple[list[Sample], list[Event], JobTracker, JobSubmitter]:
    obs = Observer(sb.vllm_url, sb.kubeconfig, sb.slurm_env())
    tail = LogTail(d / "daemon.log")
    tracker = JobTracker()
    # Job durations follow the day's compression, but stay several GraceTimes long so a
    # reclaim finds work to preempt (and a short run can show a requeue and a resume).
    time_scale = max(0.7, opts.minutes / 5.0)
    submitter = JobSubmitter(d / "jobs", sb.slurm_env(), job_plan(200, seed=opts.seed, time_scale=time_scale),
                             max_pending=3, gap_s=max(1.5, 4.0 * time_scale))
    samples: list[Sample] = []
    events: list[Event] = []
    end_trace = shape.trace_start_s + DAY_S
    wall_limit = opts.minutes * 60.0 * 1.3 + 30.0
    start = time.monotonic()
    wall0 = time.time()
    demand: float | None = None
    trace_s = shape.trace_start_s
    adopted = False
    while True:
        t = time.monotonic() - start
        try:
            load = obs.load()
            phases = obs.phases()
            ready = obs.ready_pods()
            snapshot = obs.jobs()
        except Exception as exc:  # one bad read is not the end of the demo
            show.info(f"  (read failed, retrying: {exc})")
            time.sleep(1.0)
            if time.monotonic() - start > wall_limit:
                break
            continue
        trace_s = float(load["trace_time_s"])
        model = next(iter(load["models"].values()))
        fresh = [job_event(e, t, trace_s) for e in tracker.update(snapshot, t)]
        for doc in tail.read():
            if doc.get("event") == "pool_decision" and isinstance(doc.get("demand"), (int, float)):
                demand = float(doc["demand"])
            lt = log_time(doc)
            et = (lt - wall0) if lt is not None else t
            ev = daemon_event(doc, et, trace_s - (t - et) * shape.speed)
            if ev is not None:
                fresh.append(ev)
        for ev in sorted(fresh, key=lambda e: e.t):  # the daemon's events carry their own log time
            events.append(ev)
            show.event(ev)
        running, pending, requeued = tracker.counts()
        s = Sample(t, trace_s, float(model["rate"]), float(model["arrived"]), ready, phases, running, pending, requeued,
                   tracker.busy_nodes())
        samples.append(s)
        show.progress(progress_text(s, nodes=opts.nodes, demand=demand, replica_rps=shape.replica_rps), t)
        if trace_s >= end_trace or t > wall_limit:
            break
        if not adopted:
            adopted = _adopted(obs, phases)
            if adopted:
                show.info(f"  (+{t:.0f}s: the daemon has taken over every node: phase label set, serving nodes drained "
                          f"in Slurm; researchers start submitting)")
        spec = submitter.maybe_submit(t, pending) if adopted else None
        if spec is not None:
            job_id = next(reversed(submitter.submitted))
            tracker.add(job_id, spec.name, t)
            ev = Event(t, trace_s, "", "job-submitted",
                       f"job {job_id} ({spec.name}) submitted: {spec.nodes} node(s), ~{spec.duration_s:.0f} s of work"
                       + (", checkpoints" if spec.checkpoints else ", no checkpoint"), {"job": job_id})
            events.append(ev)
            show.event(ev)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - start - t)))
    return samples, events, tracker, submitter


def _adopted(obs: Observer, phases: dict[str, str]) -> bool:
    """Every node has a phase and no serving node is open to Slurm: jobs submitted before
    that could land on a node vLLM serves on (the daemon drains serving nodes at adoption)."""
    if not phases or any(p == "-" for p in phases.values()):
        return False
    try:
        states = obs.slurm_states()
    except (RuntimeError, OSError, subprocess.SubprocessError):
        return False
    return all(not states.get(n, "idle").startswith(("idle", "mix", "alloc")) for n, p in phases.items() if p == "serving")


def _cli_name() -> str:
    """How to call gpu-bridge from the user's shell (the venv may not be on PATH)."""
    if shutil.which("gpu-bridge"):
        return "gpu-bridge"
    venv = Path(sys.executable).parent / "gpu-bridge"
    return str(venv) if venv.exists() else f"{sys.executable} -m bridge"


def _print_keep(show: Display, d: Path, web_url: str) -> None:
    cli = _cli_name()
    show.info(
        "sandbox kept (the daemon keeps running; the trace goes on). Look around:\n"
        f"  {web_url}/pool  (the research view, in a browser)\n"
        f"  set -a; . {d}/env; set +a\n"
        "  sinfo; squeue\n"
        "  kubectl get nodes -L gpu-bridge.io/phase\n"
        f"  {cli} status --config {d}/gpu-bridge.yaml\n"
        f"  tail -f {d}/daemon.log\n"
        f"stop it all with: {cli} sandbox down --dir {d}")
