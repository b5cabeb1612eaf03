"""Command-line entry point: argparse only; each command lives in the module that owns it.

Every module in COMMAND_MODULES defines ``register_cli(subparsers)``, which adds its
subcommand(s) and sets ``func`` (``args -> int exit code``) on each parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from bridge import __version__

# Order is the order shown in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "bridge.sandbox.cli",
    "bridge.simulate.cli",
    "bridge.forecast_cli",
    "bridge.config_cli",
    "bridge.daemon_cli",
    "bridge.demo.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-bridge",
        description="Lend idle GPU serving nodes to Slurm research jobs and reclaim them for vLLM serving.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-bridge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register_cli(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
