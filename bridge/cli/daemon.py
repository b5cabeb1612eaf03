"""`gpu-bridge run | status | plan`: the daemon and the commands that look at what it sees."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

from bridge import logs, sdnotify, wellknown
from bridge.cli import fail
from bridge.config import Config, PoolConfig, load_config
from bridge.adapters.kube.objects import NodeInfo
from bridge.adapters.protocols import Leader
from bridge.daemon import Daemon, with_slurm_grace
from bridge.ledger import TickResult
from bridge.errors import AdapterError, BridgeError, ConfigError
from bridge.adapters.kube.lease import LeaderElector, LeaseKeeper
from bridge.metrics import BridgeMetrics, serve
from bridge.lifecycle import NodeFacts, asleep, gpu_short
from bridge.model import Phase, Pin, PoolState
from bridge.observe import Observation
from bridge.wiring import Adapters, build_adapters, check_private_file, policy_memory

log = logs.get(__name__)


def register_cli(subparsers: Any) -> None:
    run = subparsers.add_parser("run", help="run the daemon (observe -> plan -> act)")
    run.add_argument("--config", required=True, help="YAML config file")
    run.add_argument("--dry-run", action="store_true", help="decide and log, write nothing")
    run.add_argument("--once", action="store_true", help="one iteration, then exit (with --dry-run: what would happen now)")
    run.add_argument("--log-format", choices=("json", "console", "auto"), default="auto")
    run.set_defaults(func=cmd_run)

    status = subparsers.add_parser("status", help="who owns every node, in which phase, and why")
    status.add_argument("--config", required=True)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    for name, helptext in (
        ("lend", "ask the daemon to lend NODE to Slurm (same lifecycle and safety checks as its own moves)"),
        ("reclaim", "ask the daemon to take NODE back for serving (jobs are requeued, never cancelled)"),
    ):
        p = subparsers.add_parser(name, help=helptext)
        p.add_argument("node")
        p.add_argument("--config", required=True)
        p.add_argument("--wait", type=wait_seconds, default=0.0, metavar="S", help="wait up to S seconds for the move to finish")
        p.set_defaults(func=cmd_request, request=name)
    pin = subparsers.add_parser("pin", help="keep NODE on one side (moving it there first); the policy leaves it alone")
    pin.add_argument("node")
    pin.add_argument("side", choices=("serving", "slurm"))
    pin.add_argument("--config", required=True)
    pin.set_defaults(func=cmd_pin)
    unpin = subparsers.add_parser("unpin", help="give NODE back to the policy")
    unpin.add_argument("node")
    unpin.add_argument("--config", required=True)
    unpin.set_defaults(func=cmd_pin, side=None)

    plan = subparsers.add_parser("plan", help="what the policy would do now, and why (writes nothing)")
    plan.add_argument("--config", required=True)
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=cmd_plan)


T = TypeVar("T")


def _load(path: str) -> Config:
    check_private_file(path, what="config")
    return load_config(path)


def _one_shot(args: argparse.Namespace, step: Callable[[Daemon], T]) -> tuple[Daemon, T] | int:
    """``status`` and ``plan``: a dry-run daemon on the config's adapters (its Kubernetes cache
    given up to ``kubernetes.timeout_s`` to sync), ``step`` run on it once, the adapters closed
    whatever happens. The daemon and what ``step`` returned, or the exit code of a failure."""
    logs.configure(json=True, level="warning")
    try:
        config = _load(args.config)
        adapters = build_adapters(config, leader=False)
    except BridgeError as exc:
        return fail(exc)
    try:
        if not adapters.kube.cache_status().synced:
            deadline = time.monotonic() + config.kubernetes.timeout_s
            while time.monotonic() < deadline and not adapters.kube.cache_status().synced:
                time.sleep(0.05)
        memory = policy_memory(config, adapters.prom, adapters.prom_pools, time.time())
        daemon = Daemon(config, kube=adapters.kube, slurm=adapters.slurm, prom=adapters.prom, prom_pools=adapters.prom_pools,
                        dry_run=True, memory=memory, replicas=adapters.replicas)
        return daemon, step(daemon)
    except BridgeError as exc:
        return fail(exc)
    finally:
        adapters.close()


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config = _load(args.config)
    except BridgeError as exc:
        return fail(exc)
    fmt = None if args.log_format == "auto" else args.log_format == "json"
    logs.configure(json=fmt, level=config.daemon.log_level)
    dry_run = args.dry_run or config.daemon.dry_run
    log.info("starting", dry_run=dry_run, config=args.config, pools=[p.name for p in config.pools])
    if dry_run:
        log.warning("dry_run_mode", detail="DRY RUN: decisions are logged, nothing is written to Slurm or Kubernetes")
    try:
        # One writer: a dry run never takes (nor competes for) the Lease, whatever it runs
        # beside; a real run, --once included, writes only as the Lease holder.
        adapters = build_adapters(config, leader=not dry_run)
    except BridgeError as exc:
        return fail(exc)
    try:
        config = with_slurm_grace(config, adapters.slurm)  # Slurm's GraceTime, never less
    except BridgeError as exc:
        adapters.close()
        return fail(exc)
    metrics = BridgeMetrics()
    metrics.set_dry_run(dry_run)
    for p in config.pools:
        metrics.record_settings(pool=p.name, min_serving=p.min_serving, reclaim_budget_s=config.slurm.grace_s + p.cold_start_s + 60)
    server = None
    if not args.once:
        server = serve(metrics.registry, port=config.daemon.metrics_port, addr=config.daemon.metrics_host)
        log.info("metrics_listening", host=config.daemon.metrics_host, port=server.port)
    daemon = Daemon(config, kube=adapters.kube, slurm=adapters.slurm, prom=adapters.prom,
                    prom_pools=adapters.prom_pools, leader=adapters.leader,
                    metrics=metrics if server is not None else None,  # --once: served by no one
                    dry_run=dry_run, after_write=getattr(args, "after_write", None),
                    memory=policy_memory(config, adapters.prom, adapters.prom_pools, time.time()),
                    replicas=adapters.replicas)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        sdnotify.stopping("stopping")
        stop.set()
        daemon.wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    deadline = time.monotonic() + max(10.0, config.kubernetes.timeout_s)
    while not adapters.kube.cache_status().synced and time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.05)
    try:
        if args.once:
            return _run_once(daemon, adapters.leader)
        interval = sdnotify.watchdog_interval_s()
        last_ping = [0.0]
        last_status = [""]

        def on_tick(result: TickResult) -> None:
            # READY=1 after the first whole tick (watches synced, Lease checked, one observation
            # tried), so `systemctl start` returns on a running loop; STATUS= says how it went.
            now = time.monotonic()
            text = tick_status(result, adapters.leader, dry_run=dry_run)
            if not last_status[0]:
                sdnotify.ready(text)
                last_status[0], last_ping[0] = text, now
                log.info("ready", status=text)
                return
            if text != last_status[0]:
                sdnotify.status(text)
                last_status[0] = text
            if interval is None or now - last_ping[0] >= interval / 2:
                sdnotify.watchdog()
                last_ping[0] = now

        keeper = None
        if isinstance(adapters.leader, LeaderElector):
            # renew between (and during slow) ticks; a loop stalled for two lease durations
            # no longer renews, so a standby can take over
            stall_s = 2 * config.daemon.lease_duration_s
            keeper = LeaseKeeper(adapters.leader, alive=lambda: daemon.loop_alive(stall_s)).start()
        try:
            daemon.run(stop, on_tick=on_tick)
        finally:
            if keeper is not None:
                keeper.stop()
        return 0
    finally:
        adapters.close()
        if server is not None:
            server.close()
        log.info("stopped")


def _run_once(daemon: Daemon, leader: Leader | None) -> int:
    """``run --once``: one iteration as the Lease holder, then the Lease given back. Refused
    (exit 1, nothing written) while another instance holds it."""
    try:
        result = daemon.iterate()
    finally:
        if leader is not None and leader.is_leader:
            leader.release()
    if leader is not None and not result.observed and result.error is None:
        holder = getattr(leader, "holder", None) or "another instance"
        print(f"gpu-bridge: run --once refused: the Lease is held by {holder}; nothing was written "
              "(--dry-run shows what would happen without the Lease)", file=sys.stderr)
        return 1
    _print_plan(daemon, as_json=False)
    return 0 if result.observed else 1


def tick_status(result: TickResult, leader: Leader | None, *, dry_run: bool = False) -> str:
    """The one-line STATUS= of ``systemctl status``: leading, standby, or why the tick failed."""
    if result.error:
        return f"tick failed: {result.error}"
    if dry_run and result.observed:
        return "dry run: deciding and logging, writing nothing (never takes the Lease)"
    if result.observed:
        return "leading" if leader is not None else "acting (no leader election)"
    return "standby: another instance holds the Lease"


def _since(t: float, now: float) -> str:
    age = max(0, int(now - t))
    if age < 120:
        return f"{age}s"
    if age < 7200:
        return f"{age // 60}m"
    return f"{age // 3600}h{(age % 3600) // 60:02d}m"


def _gpu_wait(facts: NodeFacts | None, pool: PoolConfig | None, now: float) -> str | None:
    """For a node returning asleep whose free-GPU check holds the wake: what it read and when it
    gives up (the wake then goes cold); None otherwise."""
    if (facts is None or pool is None or facts.phase is not Phase.RETURNING or not asleep(facts)
            or not gpu_short(facts, pool.wake_gpu_need_mib)):
        return None
    read = ("unknown" if facts.gpu_free_mib is None else
            f"{facts.gpu_free_mib:,.0f} MiB " + ("beyond the engine's need" if pool.wake_gpu_free_mib == "auto" else
                                                  f"free of {pool.wake_gpu_free_mib:,.0f}"))
    return f"wake waits for GPU memory ({read}); cold in {max(0.0, pool.wake_gpu_wait_s - (now - facts.phase_since)):.0f} s"


def status_rows(obs: Observation, config: Config | None = None) -> list[dict[str, Any]]:
    """One row per pool node: who owns it, its phase, since when, why, what runs on it (with
    ``config``: also a wake held by the free-GPU check)."""
    rows = []
    now = obs.view.now
    pools = {p.name: p for p in config.pools} if config is not None else {}
    for n in obs.view.nodes:
        facts = obs.facts.get(n.name)
        if n.phase in (Phase.SERVING, Phase.RETURNING):
            owner = "serving" if n.phase is Phase.SERVING else "-> serving"
        elif n.phase is Phase.LENT:
            owner = "slurm"
        else:
            owner = "-> slurm" if n.phase is Phase.LENDING else "-> serving"
        pods = [p.name + ("" if p.ready else " (not ready)") for p in (facts.pods if facts else ())]
        rows.append(
            {
                "node": n.name,
                "pool": n.pool,
                "owner": owner,
                "phase": str(n.phase),
                "since": datetime.fromtimestamp(n.phase_since, UTC).isoformat(),
                "age": _since(n.phase_since, now),
                "pin": str(n.pin) if n.pin else None,
                "problem": n.problem,
                "slurm_state": n.slurm_state,
                "serving_pods": pods,
                "slurm_jobs": list(n.jobs),
                "hold_job": facts.hold.job_id if facts and facts.hold else None,
                "gpu_wait": _gpu_wait(facts, pools.get(n.pool or ""), now),
                "reason": n.reason,
            }
        )
    return rows


WHY_WIDTH = 72  # the table's WHY column; --json has the whole reason


def status_table(rows: list[dict[str, Any]]) -> str:
    """The human table of ``gpu-bridge status``: who owns each node, since when, and why."""
    headers = ("NODE", "POOL", "OWNER", "PHASE", "SINCE", "SLURM", "ON IT", "NOTE", "WHY")
    table = []
    for r in rows:
        on_it = ", ".join(r["serving_pods"] + [f"job {j}" for j in r["slurm_jobs"]]) or "-"
        note = (r["problem"] or r.get("gpu_wait") or (f"pinned {r['pin']}" if r["pin"] else "")
                or (f"hold {r['hold_job']}" if r["hold_job"] else ""))
        why = r["reason"] or ""
        if len(why) > WHY_WIDTH:
            why = why[: WHY_WIDTH - 3] + "..."
        table.append((r["node"], r["pool"], r["owner"], r["phase"], r["age"], r["slurm_state"], on_it, note, why))
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *table, strict=False)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in (headers, *table))


def cmd_status(args: argparse.Namespace) -> int:
    got = _one_shot(args, lambda daemon: daemon.observe(time.time()))
    if isinstance(got, int):
        return got
    rows = status_rows(got[1], got[0].config)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(status_table(rows))
    _print_budgets(got[1].view.pools.values())
    return 0


def _print_budgets(pools: Iterable[PoolState]) -> None:
    """Each pool's SLO budget as the governor sees it (issue 22)."""
    for ps in sorted(pools, key=lambda p: p.name):
        if ps.governor is not None:
            print(f"pool {ps.name}: {ps.governor.describe()}")


def _print_plan(daemon: Daemon, *, as_json: bool) -> None:
    plan = daemon.ledger.last_plan
    if plan is None:
        print("no plan (not observed)")
        return
    if as_json:
        out = {"now": plan.now, "pools": [_asdict(d) for d in plan.pools],
               "actions": [_asdict(a) for a in plan.actions], "held": dict(plan.held)}
        print(json.dumps(out, indent=2, default=str))
        return
    for d in plan.pools:
        print(f"pool {d.pool}: {d.detail}")
    if daemon.ledger.last_observation is not None:
        _print_budgets(daemon.ledger.last_observation.view.pools.values())
    for a in plan.actions:
        print(f"  {a.kind} {a.node}: {a.detail}")
    if not plan.actions:
        print("  no action")
    for node, why in sorted(plan.held.items()):
        print(f"  held {node}: {why}")


def _asdict(obj: Any) -> dict[str, Any]:
    """A dataclass's fields, one level deep (``json.dumps(default=str)`` renders the values)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def cmd_plan(args: argparse.Namespace) -> int:
    got = _one_shot(args, lambda daemon: daemon.iterate())
    if isinstance(got, int):
        return got
    _print_plan(got[0], as_json=args.json)
    return 0


@contextlib.contextmanager
def _writer(args: argparse.Namespace) -> Iterator[tuple[Config, Adapters]]:
    """The operator commands' config and adapters (no Lease, no watches), closed after use; a
    bad NODE argument is refused before anything is read or connected."""
    from bridge.names import validate_node_name

    if (node := getattr(args, "node", None)) is not None:
        try:
            validate_node_name(node)
        except AdapterError as exc:
            raise ConfigError([f"NODE: {str(exc).removeprefix(exc.system + ': ')}"]) from None
    config = _load(args.config)
    adapters = build_adapters(config, leader=False, start_watches=False)
    try:
        yield config, adapters
    finally:
        adapters.close()


def wait_seconds(text: str) -> float:
    """``--wait S``: a finite number of seconds >= 0 (a usage error otherwise, exit 2, before
    anything is read or written: ``nan`` and ``-5`` did not wait at all, ``inf`` waited forever)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def _pool_node(adapters: Adapters, config: Config, name: str) -> NodeInfo:
    node = adapters.kube.read_node(name)
    if node.pool not in {p.name for p in config.pools}:
        raise ConfigError([f"{name}: not a node of a configured pool (label {wellknown.LABEL_POOL}={node.pool!r})"])
    return node


def cmd_request(args: argparse.Namespace) -> int:
    logs.configure(json=True, level="warning")
    try:
        with _writer(args) as (config, adapters):
            _pool_node(adapters, config, args.node)
            adapters.kube.set_request(args.node, args.request)
    except (BridgeError, ValueError) as exc:
        return fail(exc if isinstance(exc, BridgeError) else ConfigError([str(exc)]))
    print(f"{args.request} of {args.node} requested; the leading gpu-bridge carries it out (kubectl describe node {args.node})")
    if args.wait > 0:
        return _wait_phase(args, Phase.LENT if args.request == "lend" else Phase.SERVING)
    return 0


def _wait_phase(args: argparse.Namespace, target: Phase) -> int:
    deadline = time.monotonic() + args.wait
    last = None
    while time.monotonic() < deadline:
        try:
            with _writer(args) as (_, adapters):
                node = adapters.kube.read_node(args.node)
        except BridgeError as exc:
            return fail(exc)
        if node.phase != last:
            print(f"{args.node}: {node.phase} ({node.reason or ''})")
            last = node.phase
        if node.phase is target and wellknown.ANNOTATION_REQUEST not in node.annotations:
            return 0
        if wellknown.ANNOTATION_REQUEST not in node.annotations and node.phase in (Phase.SERVING, Phase.LENT):
            # request consumed but not carried out (the phase is not the target): refused (the Event says why)
            print(f"{args.node}: request not carried out (see: kubectl describe node {args.node})", file=sys.stderr)
            return 1
        time.sleep(1.0)
    print(f"{args.node}: still {last} after {args.wait:.0f} s", file=sys.stderr)
    return 1


def cmd_pin(args: argparse.Namespace) -> int:
    logs.configure(json=True, level="warning")
    try:
        with _writer(args) as (config, adapters):
            node = _pool_node(adapters, config, args.node)
            pin = Pin(args.side) if args.side else None
            adapters.kube.set_pin(args.node, pin)
            moved = ""
            if pin is Pin.SLURM and node.phase in (None, Phase.SERVING):
                adapters.kube.set_request(args.node, "lend")
                moved = "; lending it first"
            elif pin is Pin.SERVING and node.phase is Phase.LENT:
                adapters.kube.set_request(args.node, "reclaim")
                moved = "; reclaiming it first"
    except (BridgeError, ValueError) as exc:
        return fail(exc if isinstance(exc, BridgeError) else ConfigError([str(exc)]))
    print(f"{args.node}: " + (f"pinned to {args.side}{moved}" if args.side else "unpinned: the policy decides again"))
    return 0
