"""``gpu-bridge check-slurm --config FILE``: does the running Slurm fit gpu-bridge's design?

Reads slurmctld's running settings and partitions through the Slurm adapter (two read-only
``scontrol`` calls, argv lists, the config's ``slurm.command_prefix``/``slurm_conf``) and prints
each key that is missing or conflicts (bridge.slurm_check); exit 1 on any, 0 when all fit.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bridge.cli import fail
from bridge.config import load_config
from bridge.errors import AdapterError, ConfigError
from bridge.slurm_check import check
from bridge.wiring import slurm_adapter


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check-slurm",
        help="check the running Slurm's settings and partitions against gpu-bridge's design (read-only)",
        description="Read `scontrol show config` and the partitions of the running slurmctld and print what "
        "gpu-bridge needs and does not find (preemption type and signal, RequeueExit, the Lua plugins, the two "
        "partitions, nodes shared with other partitions; the fast-grace partition when slurm.fast_partition is set). Exit 0 if everything fits, 1 if not.",
    )
    p.add_argument("--config", required=True, help="the gpu-bridge YAML config (partition names, grace, Slurm access)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return fail(exc)
    slurm = slurm_adapter(config)
    try:
        settings, partitions = slurm.show_config(), slurm.partitions()
    except AdapterError as exc:
        return fail(exc)
    findings = check(config, settings, partitions)
    for f in findings:
        print(f"PROBLEM {f}")
    if findings:
        n = len(findings)
        print(f"{n} problem{'s' if n != 1 else ''}: slurm_conf/README.md says what each setting does", file=sys.stderr)
        return 1
    fast = config.slurm.fast_partition
    tier = f", fast tier {fast} (GraceTime {config.slurm.fast_grace_s:g} s)" if fast is not None else ""
    print(f"Slurm fits gpu-bridge: partitions {config.slurm.preempt_partition} and {config.slurm.hold_partition}, "
          f"preemption with requeue, GraceTime {config.slurm.grace_s:g} s{tier}")
    return 0
