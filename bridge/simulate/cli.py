"""``gpu-bridge simulate``: replay a load trace through the lending policy and its baselines.

"How many GPU-hours would we have harvested with these settings, at what risk to serving?"
The delays come from the daemon's config (``--config``), with command-line overrides.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import Any

from bridge.config import Config, VictimRule, default_config, load_config
from bridge.errors import BridgeError, ConfigError

VICTIMS = {"bridge": VictimRule.LEAST_LOST_WORK, "naive": VictimRule.NEWEST_FIRST}


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="replay a load trace through the policy and its baselines (offline)",
        description="Replay a serving load trace through the lending policy (the daemon's own plan()) "
        "and the baselines, with modelled delays (scrape, tick, vLLM drain and cold start, Slurm "
        "grace) and a research backlog; report lent/useful/lost GPU-hours, preemptions and "
        "SLO-violation minutes per policy. See docs/simulator.md.",
    )
    p.add_argument("--trace", metavar="FILE", help="load trace CSV (ServeGen format); default: the shipped 14-day trace")
    p.add_argument("--config", metavar="FILE", help="the daemon's YAML config (delays, targets, policy settings)")
    p.add_argument("--pool", help="pool of the config to simulate (default: its first)")
    p.add_argument("--nodes", type=int, default=24, help="nodes in the pool (default 24)")
    p.add_argument("--gpus-per-node", type=int, default=4, help="GPUs per node (default 4)")
    p.add_argument(
        "--policy",
        choices=("bridge", "fixed-window", "reactive", "oracle", "all"),
        default="all",
        help="policy to simulate (default all)",
    )
    p.add_argument(
        "--peak-replicas",
        type=float,
        default=None,
        help="replicas the trace's busiest 10-minute window needs (default 0.8 x nodes x replicas per node)",
    )
    p.add_argument("--replica-rps", type=float, default=4.0, help="requests/s one replica carries at its target (default 4)")
    p.add_argument("--max-cv", type=float, default=None, help="cap the trace's within-window cv (default: as measured)")
    p.add_argument("--days", type=float, default=None, help="simulate only the first DAYS of the trace")
    p.add_argument("--seed", type=int, default=1, help="seed of the within-window bursts and the job mix (default 1)")
    p.add_argument("--cold-start-s", type=float, help="mean vLLM pod start to Ready (overrides pools[].cold_start_s)")
    p.add_argument(
        "--cold-start-cv",
        type=float,
        default=0.0,
        help="cold starts drawn from a lognormal with that mean and this coefficient of variation (default 0: always the mean)",
    )
    p.add_argument(
        "--history-days",
        type=float,
        default=0.0,
        help="give the first DAYS of the trace as history (what Prometheus holds when the daemon starts); simulate the rest",
    )
    p.add_argument("--drain-s", type=float, help="vLLM drain on lend (overrides pools[].drain_s)")
    p.add_argument("--grace-s", type=float, help="Slurm GraceTime of a preempted job (overrides slurm.grace_s)")
    p.add_argument("--tick-s", type=float, help="policy tick (overrides policy.tick_s)")
    p.add_argument("--scrape-s", type=float, help="vLLM scrape interval (overrides prometheus.scrape_interval_s)")
    p.add_argument(
        "--victims",
        choices=tuple(VICTIMS),
        help="reclaim victim rule: bridge = least lost work (the policy's), naive = newest job first "
        "(default: policy.victims of the config)",
    )
    p.add_argument("--job-mix", metavar="FILE", help="YAML research job mix (see docs/simulator.md)")
    p.add_argument("--fixed-floor", type=int, help="serving floor of fixed-window in nodes (default: p95 night demand + headroom)")
    p.add_argument("--json", action="store_true", help="print a JSON list of metrics objects instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="write a PNG plot of load, capacity and lent nodes")
    p.set_defaults(func=run)


def apply_overrides(
    cfg: Config,
    *,
    pool: str | None = None,
    cold_start_s: float | None = None,
    drain_s: float | None = None,
    grace_s: float | None = None,
    tick_s: float | None = None,
    scrape_s: float | None = None,
    victims: str | None = None,
) -> Config:
    """The config with the simulator's command-line overrides applied (validated)."""
    problems: list[str] = []
    for flag, v, gt in (
        ("--cold-start-s", cold_start_s, False),
        ("--drain-s", drain_s, False),
        ("--grace-s", grace_s, False),
        ("--tick-s", tick_s, True),
        ("--scrape-s", scrape_s, True),
    ):
        if v is None:
            continue
        if not math.isfinite(v) or (v <= 0 if gt else v < 0):
            problems.append(f"{flag}: must be {'> 0' if gt else '>= 0'}, got {v:g}")
    if pool is not None and pool not in {p.name for p in cfg.pools}:
        problems.append(f"--pool: no pool named {pool!r} in the config (pools: {', '.join(p.name for p in cfg.pools)})")
    if problems:
        raise ConfigError(problems)
    target = pool or cfg.pools[0].name
    pools = []
    for p in cfg.pools:
        if p.name == target:
            kw: dict[str, float] = {}
            if cold_start_s is not None:
                kw["cold_start_s"] = cold_start_s
            if drain_s is not None:
                kw["drain_s"] = drain_s
            p = dataclasses.replace(p, **kw)
        pools.append(p)
    pol = cfg.policy
    if tick_s is not None:
        pol = dataclasses.replace(pol, tick_s=tick_s)
    if victims is not None:
        pol = dataclasses.replace(pol, victims=VICTIMS[victims])
    slurm = cfg.slurm if grace_s is None else dataclasses.replace(cfg.slurm, grace_s=grace_s)
    prom = cfg.prometheus if scrape_s is None else dataclasses.replace(cfg.prometheus, scrape_interval_s=scrape_s)
    return dataclasses.replace(cfg, pools=tuple(pools), policy=pol, slurm=slurm, prometheus=prom)


def run(args: argparse.Namespace) -> int:
    from bridge.simulate.baselines import POLICIES, make_controller
    from bridge.simulate.engine import DEFAULT_START_UNIX, Setup, simulate
    from bridge.simulate.report import plot, table, to_json
    from bridge.simulate.research import JobMix, parse_job_mix
    from bridge.simulate.workload import build_workload, split_history
    from bridge.trace import load_trace

    out = sys.stdout
    info = sys.stderr if args.json else sys.stdout
    try:
        if args.nodes < 1:
            raise ConfigError([f"--nodes: must be >= 1, got {args.nodes}"])
        if args.gpus_per_node < 1:
            raise ConfigError([f"--gpus-per-node: must be >= 1, got {args.gpus_per_node}"])
        cfg = load_config(args.config) if args.config else default_config()
        cfg = apply_overrides(
            cfg,
            pool=args.pool,
            cold_start_s=args.cold_start_s,
            drain_s=args.drain_s,
            grace_s=args.grace_s,
            tick_s=args.tick_s,
            scrape_s=args.scrape_s,
            victims=args.victims,
        )
        mix = JobMix()
        if args.job_mix:
            import yaml

            try:
                with open(args.job_mix, encoding="utf-8") as fh:
                    data = yaml.safe_load(fh)
            except OSError as exc:
                raise ConfigError([f"{args.job_mix}: cannot read: {exc.strerror or exc}"]) from exc
            except yaml.YAMLError as exc:
                raise ConfigError([f"{args.job_mix}: invalid YAML: {exc}"]) from exc
            mix = parse_job_mix(data, args.job_mix)
        pool = cfg.pool(args.pool) if args.pool else cfg.pools[0]
        peak = args.peak_replicas if args.peak_replicas is not None else 0.8 * args.nodes * pool.replicas_per_node
        if not (peak > 0 and math.isfinite(peak)):
            raise ConfigError([f"--peak-replicas: must be > 0, got {peak:g}"])
        if not (args.replica_rps > 0 and math.isfinite(args.replica_rps)):
            raise ConfigError([f"--replica-rps: must be > 0, got {args.replica_rps:g}"])
        if args.fixed_floor is not None and not 0 <= args.fixed_floor <= args.nodes:
            raise ConfigError([f"--fixed-floor: must be 0..{args.nodes} (--nodes), got {args.fixed_floor}"])
        if args.days is not None and not args.days > 0:
            raise ConfigError([f"--days: must be > 0, got {args.days:g}"])
        if not (args.cold_start_cv >= 0 and math.isfinite(args.cold_start_cv)):
            raise ConfigError([f"--cold-start-cv: must be >= 0, got {args.cold_start_cv:g}"])
        if not (args.history_days >= 0 and math.isfinite(args.history_days)):
            raise ConfigError([f"--history-days: must be >= 0, got {args.history_days:g}"])
        if args.max_cv is not None and not (args.max_cv > 0 and math.isfinite(args.max_cv)):
            raise ConfigError([f"--max-cv: must be > 0, got {args.max_cv:g}"])
        trace = load_trace(args.trace)
        workload = build_workload(
            trace, peak_replicas=peak, replica_rps=args.replica_rps, days=args.days, seed=args.seed, max_cv=args.max_cv
        )
        try:
            history, workload = split_history(workload, args.history_days)
        except ValueError as exc:
            raise ConfigError([f"--history-days: {str(exc).removeprefix('history_days: ')}"]) from None
    except (ConfigError, BridgeError) as exc:
        problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
        for line in problems:
            print(f"gpu-bridge simulate: {line}", file=sys.stderr)
        return 2
    setup = Setup(
        cfg, workload, args.nodes, args.gpus_per_node, pool.name, mix, args.seed,
        start_unix=DEFAULT_START_UNIX + (history.duration_s if history is not None else 0.0),
        history=history,
        cold_start_cv=args.cold_start_cv,
    )
    print(workload.describe_scale(), file=info)
    print(
        f"{args.nodes} nodes x {args.gpus_per_node} GPUs, {workload.minutes} minutes; tick {setup.tick_s:g} s, "
        f"scrape {setup.scrape_s:g} s, drain {setup.drain_s:g} s, grace {setup.grace_s:g} s, "
        f"cold start {setup.cold_start_s:g} s; victims {cfg.policy.victims.value}",
        file=info,
    )
    names = POLICIES if args.policy == "all" else (args.policy,)
    results = []

    for name in names:
        ctl = make_controller(name, setup, fixed_floor=args.fixed_floor)
        r = simulate(setup, ctl)
        results.append(r)
        if args.json:
            print(f"{name}: {r.wall_s:.1f} s wall", file=info)
    if args.json:
        out.write(to_json(results) + "\n")
    else:
        out.write(table(results) + "\n")
    if args.plot:
        plot(results, workload, args.plot, nodes=args.nodes, replicas_per_node=setup.replicas_per_node)
        print(f"plot written to {args.plot}", file=info)
    return 0
