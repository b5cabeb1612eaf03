"""``gpu-bridge simulate``: replay a load trace through the lending policy and its baselines.

"How many GPU-hours would we have harvested with these settings, at what risk to serving?"
The delays come from the daemon's config (``--config``), with command-line overrides.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bridge.config import Config, VictimRule, default_config, load_config, read_yaml, redact_url, replace
from bridge.errors import AdapterError, BridgeError, ConfigError
from bridge.wellknown import LAST_UNIX_S, is_date

if TYPE_CHECKING:
    from bridge.simulate.engine import Result, Setup

VICTIMS = {"bridge": VictimRule.LEAST_LOST_WORK, "naive": VictimRule.NEWEST_FIRST}


MAX_NODES = 100_000  # a pool larger than any serving fleet: beyond it a run would take hours, not an answer
MAX_GPUS_PER_NODE = 64


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="replay a load trace through the policy and its baselines (offline)",
        description="Replay a serving load trace through the lending policy (the daemon's own plan()) "
        "and the baselines, with modelled delays (scrape, tick, vLLM drain and cold start, Slurm "
        "grace) and a research backlog; report lent/useful/lost GPU-hours, preemptions and "
        "SLO-violation minutes per policy. See docs/simulator.md.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", metavar="FILE", help="load trace CSV (ServeGen format); default: the shipped 14-day trace")
    src.add_argument("--prometheus", metavar="URL", nargs="?", const="",
                     help="replay the pool's own vLLM history from this Prometheus instead of a trace "
                     "(no URL: prometheus.url of the config); see docs/simulator.md")
    p.add_argument("--since", metavar="DUR", help="with --prometheus: the last DUR (7d, 36h, 90m; default 7d)")
    p.add_argument("--start", metavar="TIME", help="with --prometheus: range start (ISO 8601, UTC unless it says; or unix seconds)")
    p.add_argument("--end", metavar="TIME", help="with --prometheus: range end (default now)")
    p.add_argument("--export-trace", metavar="FILE", help="with --prometheus: write the load built as a trace CSV (--trace reads it)")
    p.add_argument("--config", metavar="FILE", help="the daemon's YAML config (delays, targets, policy settings)")
    p.add_argument("--pool", help="pool of the config to simulate (default: its first)")
    p.add_argument("--nodes", type=int, default=None,
                   help="nodes in the pool (default 24; with --prometheus: the most replicas seen / replicas per node)")
    p.add_argument("--gpus-per-node", type=int, default=4, help="GPUs per node (default 4)")
    p.add_argument("--policy", choices=("bridge", "fixed-window", "reactive", "oracle", "all"), default="all",
                   help="policy to simulate (default all)")
    p.add_argument("--peak-replicas", type=float, default=None,
                   help="replicas the trace's busiest 10-minute window needs (default 0.8 x nodes x replicas per node)")
    p.add_argument("--replica-rps", type=float, default=None,
                   help="requests/s one replica carries at its target "
                   "(default 4; with --prometheus: measured, Little's law)")
    p.add_argument("--max-cv", type=float, default=None, help="cap the trace's within-window cv (default: as measured)")
    p.add_argument("--days", type=float, default=None, help="simulate only the first DAYS of the trace")
    p.add_argument("--seed", type=int, default=1, help="seed of the within-window bursts and the job mix (default 1)")
    p.add_argument("--cold-start-s", type=float, help="mean vLLM pod start to Ready (overrides pools[].cold_start_s)")
    p.add_argument("--cold-start-cv", type=float, default=0.0,
                   help="cold starts drawn from a lognormal with that mean and this coefficient of variation "
                   "(default 0: always the mean)")
    p.add_argument("--history-days", type=float, default=0.0,
                   help="give the first DAYS of the trace as history (what Prometheus holds when the daemon starts); "
                   "simulate the rest")
    p.add_argument("--drain-s", type=float, help="vLLM drain on lend (overrides pools[].drain_s)")
    p.add_argument("--grace-s", type=float, help="Slurm GraceTime of a preempted job (overrides slurm.grace_s)")
    p.add_argument("--tick-s", type=float, help="policy tick (overrides policy.tick_s)")
    p.add_argument("--scrape-s", type=float, help="vLLM scrape interval (overrides prometheus.scrape_interval_s)")
    p.add_argument("--victims", choices=tuple(VICTIMS),
                   help="reclaim victim rule: bridge = least lost work (the policy's), naive = newest job first "
                   "(default: policy.victims of the config)")
    p.add_argument("--job-mix", metavar="FILE", help="YAML research job mix (see docs/simulator.md)")
    p.add_argument("--fixed-floor", type=int, help="serving floor of fixed-window in nodes (default: p95 night demand + headroom)")
    p.add_argument("--json", action="store_true", help="print a JSON list of metrics objects instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="write a PNG plot of load, capacity and lent nodes")
    p.set_defaults(func=run)


def apply_overrides(cfg: Config, *, pool: str | None = None, cold_start_s: float | None = None,
                    drain_s: float | None = None, grace_s: float | None = None, tick_s: float | None = None,
                    scrape_s: float | None = None, victims: str | None = None) -> Config:
    """The config with the simulator's command-line overrides applied (validated)."""
    numbers = (("--cold-start-s", cold_start_s, True), ("--drain-s", drain_s, True), ("--grace-s", grace_s, True),
               ("--tick-s", tick_s, False), ("--scrape-s", scrape_s, False))
    problems = [why for flag, v, zero_ok in numbers if (why := _bad_number(flag, v, zero_ok=zero_ok)) is not None]
    if pool is not None and pool not in {p.name for p in cfg.pools}:
        problems.append(f"--pool: no pool named {pool!r} in the config (pools: {', '.join(p.name for p in cfg.pools)})")
    if problems:
        raise ConfigError(problems)
    target = pool or cfg.pools[0].name
    pools = []
    for p in cfg.pools:
        if p.name == target:
            if cold_start_s is not None:
                p = replace(p, cold_start_s=cold_start_s)
            if drain_s is not None:
                p = replace(p, drain_s=drain_s)
        pools.append(p)
    pol = cfg.policy
    if tick_s is not None:
        pol = replace(pol, tick_s=tick_s)
    if victims is not None:
        pol = replace(pol, victims=VICTIMS[victims])
    slurm = cfg.slurm if grace_s is None else replace(cfg.slurm, grace_s=grace_s)
    prom = cfg.prometheus if scrape_s is None else replace(cfg.prometheus, scrape_interval_s=scrape_s)
    return replace(cfg, source="command-line overrides", pools=tuple(pools), policy=pol, slurm=slurm, prometheus=prom)


def _bad_number(flag: str, value: float | None, *, zero_ok: bool = False) -> str | None:
    """Why a flag that must be finite and > 0 (>= 0 with ``zero_ok``) is not; None if it is or is absent."""
    if value is None or (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        return None
    return f"{flag}: must be a finite number {'>= 0' if zero_ok else '> 0'}, got {value:g}"


def _check_number(flag: str, value: float | None, *, zero_ok: bool = False) -> None:
    if (problem := _bad_number(flag, value, zero_ok=zero_ok)) is not None:
        raise ConfigError([problem])


def run(args: argparse.Namespace) -> int:
    from bridge.simulate.engine import DEFAULT_START_UNIX, Setup
    from bridge.simulate.report import plot
    from bridge.simulate.workload import build_workload, split_history
    from bridge.trace import load_trace

    out = sys.stdout
    info = sys.stderr if args.json else sys.stdout
    if args.prometheus is not None:
        return run_history(args, out, info)
    for flag in ("since", "start", "end", "export_trace"):
        if getattr(args, flag) is not None:
            print(f"gpu-bridge simulate: --{flag.replace('_', '-')}: only with --prometheus", file=sys.stderr)
            return 2
    args.nodes = 24 if args.nodes is None else args.nodes
    args.replica_rps = 4.0 if args.replica_rps is None else args.replica_rps
    try:
        if not 1 <= args.nodes <= MAX_NODES:
            raise ConfigError([f"--nodes: must be 1..{MAX_NODES:,}, got {args.nodes}"])
        if not 1 <= args.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise ConfigError([f"--gpus-per-node: must be 1..{MAX_GPUS_PER_NODE}, got {args.gpus_per_node}"])
        cfg, mix = _config_and_mix(args)
        pool = cfg.pool(args.pool) if args.pool else cfg.pools[0]
        peak = args.peak_replicas if args.peak_replicas is not None else 0.8 * args.nodes * pool.replicas_per_node
        _check_number("--peak-replicas", peak)
        _check_number("--replica-rps", args.replica_rps)
        if args.fixed_floor is not None and not 0 <= args.fixed_floor <= args.nodes:
            raise ConfigError([f"--fixed-floor: must be 0..{args.nodes} (--nodes), got {args.fixed_floor}"])
        _check_number("--days", args.days)
        if args.plot and importlib.util.find_spec("matplotlib") is None:
            raise ConfigError(["--plot: needs matplotlib, the [plot] extra: pip install 'gpu-bridge[plot]'"])
        _check_number("--cold-start-cv", args.cold_start_cv, zero_ok=True)
        _check_number("--history-days", args.history_days, zero_ok=True)
        _check_number("--max-cv", args.max_cv)
        trace = load_trace(args.trace)
        try:  # what the trace's rows passed but the simulator cannot use (all rates 0, odd windows)
            workload = build_workload(trace, peak_replicas=peak, replica_rps=args.replica_rps, days=args.days,
                                      seed=args.seed, max_cv=args.max_cv)
        except ValueError as exc:
            raise ConfigError([str(exc)]) from None
        try:
            history, workload = split_history(workload, args.history_days)
        except ValueError as exc:
            raise ConfigError([f"--history-days: {str(exc).removeprefix('history_days: ')}"]) from None
    except BridgeError as exc:
        return fail(EXIT_BAD_INPUT, exc.problems if isinstance(exc, ConfigError) else [str(exc)])
    setup = Setup(cfg, workload, args.nodes, args.gpus_per_node, pool.name, mix, args.seed,
                  start_unix=DEFAULT_START_UNIX + (history.duration_s if history is not None else 0.0), history=history,
                  cold_start_cv=args.cold_start_cv)
    print(workload.describe_scale(), file=info)
    print(f"{args.nodes} nodes x {args.gpus_per_node} GPUs, {workload.minutes} minutes; {_delays(setup)}", file=info)
    results = _compare(args, setup, out, info)
    if args.plot:
        plot(results, workload, args.plot, nodes=args.nodes, replicas_per_node=setup.replicas_per_node)
        print(f"plot written to {args.plot}", file=info)
    return 0


def fail(code: int, lines: list[str], *, command: str = "simulate") -> int:
    """Each line on stderr as ``gpu-bridge COMMAND: line``; returns the exit code ``code``."""
    for line in lines:
        print(f"gpu-bridge {command}: {line}", file=sys.stderr)
    return code


def _delays(setup: Setup) -> str:
    """The modelled delays and the victim rule, as the run's header line states them."""
    return (f"tick {setup.tick_s:g} s, scrape {setup.scrape_s:g} s, drain {setup.drain_s:g} s, "
            f"grace {setup.grace_s:g} s, cold start {setup.cold_start_s:g} s; "
            f"victims {setup.config.policy.victims.value}")


def _compare(args: argparse.Namespace, setup: Setup, out: Any, info: Any) -> list[Result]:
    """Every policy asked for (``--policy``) replayed on ``setup``, the table (or JSON) written."""
    from bridge.simulate.baselines import POLICIES, make_controller
    from bridge.simulate.engine import simulate
    from bridge.simulate.report import table, to_json

    results = []
    for name in POLICIES if args.policy == "all" else (args.policy,):
        r = simulate(setup, make_controller(name, setup, fixed_floor=args.fixed_floor))
        results.append(r)
        if args.json:
            print(f"{name}: {r.wall_s:.1f} s wall", file=info)
    out.write((to_json(results) if args.json else table(results)) + "\n")
    return results


def _config_and_mix(args: argparse.Namespace) -> tuple[Config, Any]:
    """The config with the overrides applied, and the research job mix (ConfigError)."""
    from bridge.simulate.research import JobMix, parse_job_mix

    cfg = load_config(args.config) if args.config else default_config()
    cfg = apply_overrides(cfg, pool=args.pool, cold_start_s=args.cold_start_s, drain_s=args.drain_s,
                          grace_s=args.grace_s, tick_s=args.tick_s, scrape_s=args.scrape_s, victims=args.victims)
    mix = JobMix()
    if args.job_mix:  # the config's reader: duplicate keys, alias bombs and bad scalars are errors
        mix = parse_job_mix(read_yaml(args.job_mix, what="a YAML job mix"), args.job_mix)
    return cfg, mix


# --- simulate --prometheus -----------------------------------------------------------------------

# Exit codes of ``simulate --prometheus`` (docs/simulator.md): 0 done; 1 the history cannot
# say anything (no series for the pool, too little usable data); 2 bad input (flags, config,
# pool); 3 Prometheus unreachable or answering an error.
EXIT_NO_DATA, EXIT_BAD_INPUT, EXIT_PROMETHEUS = 1, 2, 3
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str, flag: str) -> float:
    """``7d``, ``36h``, ``90m``, ``3600s`` or plain seconds -> seconds (ConfigError naming ``flag``)."""
    m = _DURATION.match(text or "")
    if not m or not float(m.group(1)) > 0:
        raise ConfigError([f"{flag}: expected a duration like 7d, 36h, 90m or seconds, got {text!r}"])
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_time(text: str, flag: str) -> float:
    """ISO 8601 (UTC unless an offset is given) or unix seconds -> unix seconds."""
    try:
        seconds = float(text)  # also nan, inf and 1e30: none is a time (the range below)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError([f"{flag}: expected ISO 8601 (2026-11-02T00:00, UTC unless it says) or unix seconds, "
                               f"got {text!r}"]) from None
        seconds = (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)).timestamp()
    if not is_date(seconds):
        raise ConfigError([f"{flag}: must be between 1970-01-01 and 9999-12-31 (unix seconds 0 to {LAST_UNIX_S:.0f}), "
                           f"got {text!r}"])
    return seconds


def history_range(args: argparse.Namespace, now: float) -> tuple[float, float]:
    """(start, end) unix seconds from --since / --start / --end (ConfigError)."""
    if args.since is not None and args.start is not None:
        raise ConfigError(["--since and --start: give one of them"])
    end = parse_time(args.end, "--end") if args.end is not None else now
    if args.start is not None:
        start = parse_time(args.start, "--start")
    else:
        start = end - parse_duration(args.since if args.since is not None else "7d", "--since")
    if not end > start:
        raise ConfigError([f"--start/--end: the range is empty ({start:.0f} .. {end:.0f})"])
    if end > now + 60:
        raise ConfigError([f"--end: lies in the future ({args.end})"])
    return start, end


def run_history(args: argparse.Namespace, out: Any, info: Any) -> int:
    """``simulate --prometheus``: the pool's own vLLM history through the same comparison."""
    import time as _time

    from bridge.adapters.prom.types import PromPool, selector
    from bridge.wiring import prom_adapter
    from bridge.simulate.engine import Setup
    from bridge.simulate.history import HistoryError, build_history_load, trace_csv
    from bridge.simulate.report import plot

    try:
        for flag in ("days", "peak_replicas", "max_cv"):
            if getattr(args, flag) is not None:
                raise ConfigError([f"--{flag.replace('_', '-')}: not with --prometheus (the history sets the load)"])
        if args.nodes is not None and args.nodes < 1:
            raise ConfigError([f"--nodes: must be >= 1, got {args.nodes}"])
        if args.gpus_per_node < 1:
            raise ConfigError([f"--gpus-per-node: must be >= 1, got {args.gpus_per_node}"])
        _check_number("--replica-rps", args.replica_rps)
        cfg, mix = _config_and_mix(args)
        pool = cfg.pool(args.pool) if args.pool else cfg.pools[0]
        url = args.prometheus or cfg.prometheus.url
        shown = redact_url(url)  # the url as printed: never its password
        if not re.match(r"^https?://[^\s/]+", url):
            raise ConfigError([f"--prometheus: expected an http(s) URL, got {shown!r}"])
        start, end = history_range(args, _time.time())
    except ConfigError as exc:
        return fail(EXIT_BAD_INPUT, exc.problems)
    ppool = PromPool.from_config(pool, cfg.prometheus)
    try:
        adapter = prom_adapter(cfg, url=url, timeout_s=max(cfg.prometheus.timeout_s, 60.0))
    except ConfigError as exc:
        return fail(EXIT_BAD_INPUT, exc.problems)
    try:
        hist = adapter.request_history(ppool, start=start, end=end, step_s=60.0)
    except AdapterError as exc:
        return fail(EXIT_PROMETHEUS, [f"Prometheus at {shown}: {exc}"])
    source = f"prometheus {shown}, pool {pool.name} (model_name={pool.model!r})"
    try:
        hl = build_history_load(hist, pool.target, replica_rps=args.replica_rps, source=source)
    except HistoryError as exc:
        return fail(EXIT_NO_DATA, [str(exc), f"series selected by {{{selector(ppool)}}} from {shown}"])
    nodes = args.nodes
    nodes_src = "--nodes"
    if nodes is None:
        try:
            nodes = adapter.pool_nodes(ppool)  # the daemon's own gpu_bridge_nodes, if it runs
            nodes_src = "gpu_bridge_nodes (the daemon's metric)"
        except AdapterError:
            nodes = None
    if nodes is None:
        nodes = max(1, math.ceil(hl.replicas_seen / pool.replicas_per_node))
        nodes_src = f"{hl.replicas_seen} replicas seen at most / {pool.replicas_per_node} per node"
    for line in hl.describe():
        print(line, file=info)
    setup = Setup(cfg, hl.workload, nodes, args.gpus_per_node, pool.name, mix, args.seed, start_unix=hl.start_unix)
    print(f"{nodes} nodes ({nodes_src}) x {args.gpus_per_node} GPUs; {_delays(setup)}", file=info)
    if hl.workload.load.max() > nodes * pool.replicas_per_node:
        print(f"note: the busiest minute needs {hl.workload.load.max():.1f} replicas, more than the pool's "
              f"{nodes * pool.replicas_per_node}: those minutes violate under every policy", file=info)
    if args.export_trace:
        try:
            with open(args.export_trace, "w", encoding="utf-8") as fh:
                fh.write(trace_csv(hl.trace))
        except OSError as exc:
            return fail(EXIT_BAD_INPUT, [f"--export-trace: cannot write {args.export_trace}: {exc.strerror or exc}"])
        print(f"trace written to {args.export_trace} ({len(hl.trace.rates)} windows of 600 s; "
              f"replay: gpu-bridge simulate --trace {args.export_trace} --nodes {nodes} "
              f"--replica-rps {hl.replica_rps:.4g} --peak-replicas {hl.workload.peak_replicas:.4g})", file=info)
    results = _compare(args, setup, out, info)
    png = args.plot or f"gpu-bridge-replay-{pool.name}.png"
    plot(results, hl.workload, png, nodes=nodes, replicas_per_node=setup.replicas_per_node)
    print(f"plot written to {png}", file=info)
    return 0
