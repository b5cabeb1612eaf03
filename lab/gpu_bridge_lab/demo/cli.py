"""`gpu-bridge demo`: argparse only; the demo itself is gpu_bridge_lab.demo.run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bridge import logs
from gpu_bridge_lab.demo.run import DemoOptions, run_demo
from gpu_bridge_lab.demo.shape import DEFAULT_DAY, DEFAULT_START

DEFAULT_DEMO_DIR = "/tmp/gpu-bridge-demo"


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the whole story on a local sandbox: a compressed day, nodes lent and reclaimed, jobs requeued",
        description="Bring the sandbox up, start the daemon, replay 24 h of the shipped trace in a few minutes "
                    "with a stream of research jobs, show what happens, then print a summary and write a PNG.",
    )
    p.add_argument("--dir", default=DEFAULT_DEMO_DIR, help=f"sandbox directory (default {DEFAULT_DEMO_DIR})")
    p.add_argument("--minutes", type=float, default=5.0, help="wall minutes for the 24 trace hours (default 5)")
    p.add_argument("--nodes", type=int, default=4, help="4-GPU nodes in the pool (default 4)")
    p.add_argument("--keep", action="store_true", help="leave the sandbox (and the daemon) running at the end")
    p.add_argument("--plot", default=None, help="PNG of the day (default DIR/demo.png)")
    p.add_argument("--start", default=DEFAULT_START, help=f"trace clock to start at, HH:MM (default {DEFAULT_START})")
    p.add_argument("--day", type=int, default=DEFAULT_DAY, help=f"trace day to start on (default {DEFAULT_DAY})")
    p.add_argument("--seed", type=int, default=1, help="seed of the job stream and the arrivals")
    p.add_argument("--summary-json", default=None, help="also write the summary as JSON to this file")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    logs.configure(json=False, level="warning")
    opts = DemoOptions(
        dir=Path(args.dir),
        minutes=args.minutes,
        nodes=args.nodes,
        keep=args.keep,
        plot=Path(args.plot) if args.plot else None,
        day=args.day,
        start=args.start,
        seed=args.seed,
        summary_json=Path(args.summary_json) if args.summary_json else None,
    )
    return run_demo(opts)
