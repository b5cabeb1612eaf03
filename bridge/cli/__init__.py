"""Command-line entry point: argparse only; each command lives in its module of this package.

Every module in COMMAND_MODULES (and every entry point of the ``gpu_bridge.commands`` group)
defines ``register_cli(subparsers)``, which adds its subcommand(s) and sets ``func``
(``args -> int exit code``) on each parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from bridge import __version__
from bridge.errors import BridgeError, ConfigError

# The product's commands, in the order shown in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "bridge.cli.simulate",
    "bridge.cli.forecast",
    "bridge.cli.check_config",
    "bridge.cli.check_slurm",
    "bridge.cli.daemon",
    "bridge.cli.web",
)
# Commands of other installed distributions (the lab's ``sandbox`` and ``demo``): each entry
# point names a ``register_cli(subparsers)``. None on a production host.
COMMAND_GROUP = "gpu_bridge.commands"


def fail(exc: BridgeError, command: str = "") -> int:
    """A command's failure on stderr (a config's problems one a line, as found), exit code 1."""
    lines = exc.problems if isinstance(exc, ConfigError) else [f"gpu-bridge{' ' + command if command else ''}: {exc}"]
    for line in lines:
        print(line, file=sys.stderr)
    return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-bridge",
        description="Lend idle GPU serving nodes to Slurm research jobs and reclaim them for vLLM serving.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-bridge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register_cli(subparsers)
    for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name):
        ep.load()(subparsers)
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
