"""``gpu-bridge forecast``: when will there be room? Per hour ahead, the serving demand the
policy's forecast expects and the nodes expected to be lendable, from Prometheus only.

Read-only: it needs the daemon's config and read access to Prometheus (no Kubernetes, no
Slurm, no Lease). The numbers come from ``bridge.policy.outlook.lendable_outlook``, the same
function behind the daemon's ``gpu_bridge_pool_lendable_nodes_forecast`` metric.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bridge.config import Config, PoolConfig, default_config, load_config, redact_url
from bridge.errors import AdapterError, ConfigError
from bridge.policy.outlook import HourOutlook



def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "forecast",
        help="per hour ahead: serving demand and nodes expected lendable (read-only, Prometheus only)",
        description="The policy's demand forecast per hour ahead and the nodes it expects to be lendable "
        "(with the margin the policy applies), and when N nodes are expected free for H hours. A forecast, "
        "not a reservation. See docs/researcher-guide.md.",
    )
    p.add_argument("--config", metavar="FILE", help="the daemon's YAML config (default: documented defaults)")
    p.add_argument("--pool", help="pool (default: the config's first)")
    p.add_argument("--prometheus", metavar="URL", help="Prometheus base URL (default: prometheus.url of the config)")
    p.add_argument("--hours", type=int, default=24, help="hours ahead (default 24, at most 24: the outlook's shortest lag, 1 d)")
    p.add_argument("--nodes", type=int, help="with --for: the nodes your job needs")
    p.add_argument("--for", dest="for_", metavar="DUR", help="with --nodes: how long (6h, 90m, 1d)")
    p.add_argument(
        "--pool-nodes", type=int,
        help="nodes in the pool (default: the daemon's gpu_bridge_nodes in Prometheus, else the most replicas seen)",
    )
    p.add_argument("--at", metavar="TIME", help="forecast as of TIME (ISO 8601 or unix s; default now)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _fmt_t(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%a %H:%M")


def sentence(outlook: Sequence[Any], nodes: int, hours: float, now: float) -> str:
    """The plain answer for ``--nodes N --for H``."""
    from bridge.policy.outlook import first_free_window

    w = first_free_window(outlook, nodes, hours)
    span = f"{hours:g} h"
    if w is None:
        known = sum(1 for h in outlook if h.lendable_nodes is not None)
        return (f"No window of {span} with {nodes} node(s) free is expected in the next {len(outlook)} h "
                f"({known} of those hours forecast).")
    lead = (w.start - now) / 3600.0
    when = "now" if lead <= 0 else f"in about {max(1, round(lead))} h"
    return (f"{nodes} node(s) are expected free for {span} from {datetime.fromtimestamp(w.start, UTC):%Y-%m-%d %H:%M} "
            f"UTC ({when}). A forecast, not a reservation: if serving needs the nodes back, jobs are preempted and "
            "requeued.")


class NoHistoryError(Exception):
    """Prometheus has no usable vLLM series for the pool: nothing to forecast from."""


@dataclass(frozen=True, slots=True)
class PoolOutlook:
    """What ``gpu-bridge forecast`` (and ``gpu-bridge web``'s outlook page) shows for a pool."""

    pool: str
    now: float
    nodes: int
    nodes_source: str
    history_since: float  # first usable sample
    read_from: float  # start of the history read
    step_s: float
    margin_note: str
    calibrating: bool
    hours: tuple[HourOutlook, ...]


def read_outlook(
    cfg: Config, pool: PoolConfig, *, url: str, now: float, hours: int, pool_nodes: int | None = None,
    pool_nodes_source: str = "--pool-nodes",
) -> PoolOutlook:
    """The pool's lendable outlook from Prometheus' history (read-only): the history read the
    way the daemon reads it, then ``lendable_outlook`` with ``outlook_calibration``. Raises
    AdapterError (Prometheus) or NoHistoryError."""
    from bridge.adapters.prom.types import PromPool, selector
    from bridge.policy.demand import replicas_needed
    from bridge.policy.calibrate import history_span_s
    from bridge.policy.outlook import OUTLOOK_STEP_S, lendable_outlook, outlook_calibration, outlook_span_s

    from bridge.wiring import prom_adapter

    ppool = PromPool.from_config(pool, cfg.prometheus)
    adapter = prom_adapter(cfg, url=url, timeout_s=max(cfg.prometheus.timeout_s, 30.0))
    # the calibration needs policy.calibration.window_s at its own step, as the daemon reads it
    cc = cfg.policy.calibration
    step = cc.step_s if cc.enabled else OUTLOOK_STEP_S
    span = max(outlook_span_s(cfg, hours), history_span_s(cfg) if cc.enabled else 0.0)  # with the governor's window
    start = math.floor((now - span) / step) * step
    hist = adapter.history(ppool, start=start, end=now, step_s=step)
    nodes = pool_nodes
    nodes_src = pool_nodes_source
    if nodes is None:
        nodes = adapter.pool_nodes(ppool)
        nodes_src = "gpu_bridge_nodes (the daemon's metric)"
    hist = tuple(s for s in hist if s.t <= now)
    known = [s for s in hist if replicas_needed(s, pool.target) is not None]
    if not known:
        raise NoHistoryError(f"pool {pool.name}: no usable vLLM series selected by {{{selector(ppool)}}} in the last "
                             f"{(now - start) / 86400:.1f} days at {redact_url(url)}; nothing to forecast from")
    if nodes is None:
        nodes = max(1, math.ceil(max(s.replicas_reporting for s in hist) / pool.replicas_per_node))
        nodes_src = "most replicas seen (no gpu_bridge_nodes in Prometheus; lent nodes are not seen: --pool-nodes)"
    calib, gov = outlook_calibration(hist, now, config=cfg, pool=pool, nodes=nodes)
    outlook = lendable_outlook(hist, now, config=cfg, pool=pool, nodes=nodes, hours=hours, calibration=calib, governor=gov)
    if calib is None:
        margin_note = "calibration off: headroom settings only"
    elif calib.margin is None:
        margin_note = (f"calibrating: {calib.samples} of {calib.needed} min of history needed; "
                       "the policy lends nothing yet")
    else:
        margin_note = calib.describe()
    if gov is not None and not gov.lend_allowed:
        margin_note += f"; {gov.describe()}"
    return PoolOutlook(
        pool=pool.name, now=now, nodes=nodes, nodes_source=nodes_src, history_since=known[0].t, read_from=start,
        step_s=step, margin_note=margin_note, calibrating=calib is not None and calib.margin is None, hours=outlook,
    )


def outlook_doc(got: PoolOutlook, answer: str | None = None) -> dict[str, Any]:
    """``forecast --json``'s document (also ``gpu-bridge web``'s ``/api/outlook``)."""
    return {
        "pool": got.pool,
        "now": got.now,
        "pool_nodes": got.nodes,
        "pool_nodes_source": got.nodes_source,
        "history_since": got.history_since,
        "history_read_s": got.now - got.read_from,
        "calibration": got.margin_note,
        "calibrating": got.calibrating,
        "hours": [{"start": h.start, "demand_replicas": None if h.demand is None else round(h.demand, 3),
                   "serving_nodes": h.serving_nodes, "lendable_nodes": h.lendable_nodes, "basis": h.basis or None,
                   "margin": h.margin, "held": h.held or None} for h in got.hours],
        "answer": answer,
    }


def run(args: argparse.Namespace) -> int:
    from bridge.policy.outlook import OUTLOOK_LAGS_S
    # exit codes as simulate --prometheus's (docs/researcher-guide.md): 1 no usable history for the pool
    from bridge.cli.simulate import EXIT_BAD_INPUT, EXIT_NO_DATA, EXIT_PROMETHEUS, fail, parse_duration, parse_time

    try:
        cfg: Config = load_config(args.config) if args.config else default_config()
        if args.pool is not None and args.pool not in {p.name for p in cfg.pools}:
            raise ConfigError([f"--pool: no pool named {args.pool!r} in the config (pools: {', '.join(p.name for p in cfg.pools)})"])
        pool: PoolConfig = cfg.pool(args.pool) if args.pool else cfg.pools[0]
        max_h = int(min(OUTLOOK_LAGS_S) // 3600)
        if not 1 <= args.hours <= max_h:
            raise ConfigError([f"--hours: must be 1..{max_h} (the outlook's shortest lag, 1 d), got {args.hours}"])
        if (args.nodes is None) != (args.for_ is None):
            raise ConfigError(["--nodes and --for: give both (the nodes your job needs, and for how long)"])
        if args.nodes is not None and args.nodes < 1:
            raise ConfigError([f"--nodes: must be >= 1, got {args.nodes}"])
        for_h = parse_duration(args.for_, "--for") / 3600.0 if args.for_ is not None else None
        if for_h is not None and for_h > args.hours:
            raise ConfigError([f"--for: {args.for_} is longer than the outlook (--hours {args.hours})"])
        if args.pool_nodes is not None and args.pool_nodes < 1:
            raise ConfigError([f"--pool-nodes: must be >= 1, got {args.pool_nodes}"])
        now = parse_time(args.at, "--at") if args.at is not None else time.time()
        url = args.prometheus or cfg.prometheus.url
    except ConfigError as exc:
        return fail(EXIT_BAD_INPUT, exc.problems, command="forecast")

    try:
        got = read_outlook(cfg, pool, url=url, now=now, hours=args.hours, pool_nodes=args.pool_nodes)
    except AdapterError as exc:
        return fail(EXIT_PROMETHEUS, [f"Prometheus at {redact_url(url)}: {exc}"], command="forecast")
    except NoHistoryError as exc:
        return fail(EXIT_NO_DATA, [str(exc)], command="forecast")
    except ConfigError as exc:  # the https settings of prometheus (CA, client cert, token)
        return fail(EXIT_BAD_INPUT, exc.problems, command="forecast")
    outlook, nodes, nodes_src, margin_note, oldest = got.hours, got.nodes, got.nodes_source, got.margin_note, got.history_since
    start, step = got.read_from, got.step_s
    answer = sentence(outlook, args.nodes, for_h, now) if args.nodes is not None and for_h is not None else None
    if args.json:
        print(json.dumps(outlook_doc(got, answer), indent=2))
        return 0
    print(f"pool {pool.name}: {nodes} nodes ({nodes_src}); "
          f"forecast as of {datetime.fromtimestamp(now, UTC):%Y-%m-%d %H:%M} UTC "
          f"from {(now - oldest) / 86400:.1f} days of history "
          f"(read {(now - start) / 86400:.1f} days at {step:g} s steps)")
    print(f"margin: {margin_note}")
    print(f"{'hour (UTC)':<11} {'demand (replicas)':>17} {'serving':>8} {'lendable':>9}  from")
    for h in outlook:
        if h.demand is None:
            print(f"{_fmt_t(h.start):<11} {'?':>17} {'?':>8} {'?':>9}  no history for this hour yet")
        else:
            held = f"; {h.held}" if h.held else ""
            print(f"{_fmt_t(h.start):<11} {h.demand:>17.2f} {h.serving_nodes:>8} {h.lendable_nodes:>9}  {h.basis}{held}")
    if answer:
        print(answer)
    print("A forecast from this pool's own load (same time yesterday and last week, scaled to today) with the "
          "policy's margin; not a promise: a surge still reclaims nodes (jobs are requeued).")
    return 0
