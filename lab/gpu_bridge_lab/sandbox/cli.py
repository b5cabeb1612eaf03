"""`gpu-bridge sandbox ...`: the local sandbox (real Slurm, real Prometheus, a real Kubernetes
control plane and the vLLM simulator). Each part registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

SANDBOX_COMMAND_MODULES: tuple[str, ...] = (
    "gpu_bridge_lab.sandbox.cluster",  # up / down / status
    "gpu_bridge_lab.sandbox.vllm",  # vllm: the vLLM replica simulator on its own
)


def register_cli(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sandbox", help="start, stop and inspect the local sandbox"
    )
    sandbox_sub = parser.add_subparsers(dest="sandbox_command", metavar="SANDBOX_COMMAND")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    for name in SANDBOX_COMMAND_MODULES:
        importlib.import_module(name).register_cli(sandbox_sub)
