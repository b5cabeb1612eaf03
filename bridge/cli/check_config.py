"""``gpu-bridge check-config FILE``: print the resolved config (defaults filled in) or every
problem found, exit 0 / 1. ``--keys`` lists every key with its default and meaning; ``--schema``
prints the JSON Schema of the file (for editors, e.g. yaml-language-server)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bridge.config import describe_keys, json_schema, load_config, redact_url, to_dict
from bridge.errors import ConfigError


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check-config",
        help="validate a config file and print it resolved",
        description="Validate a gpu-bridge YAML config; print it with every default filled in, "
        "or every problem (file, key path, bad value, what was expected). Exit 0 if valid, 1 if not.",
    )
    p.add_argument("file", nargs="?", help="the YAML config file")
    p.add_argument("--json", action="store_true", help="print the resolved config as JSON instead of YAML")
    p.add_argument("--keys", action="store_true", help="list every key with its default and meaning, then exit")
    p.add_argument("--schema", action="store_true", help="print the config's JSON Schema (for editors), then exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.keys:
        for key, default, doc in describe_keys():
            print(f"{key}\t{default}\t{doc}")
        return 0
    if args.schema:
        print(json.dumps(json_schema(), indent=2))
        return 0
    if not args.file:
        print("gpu-bridge check-config: a FILE is required (or --keys, --schema)", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        for line in exc.problems:
            print(line, file=sys.stderr)
        n = len(exc.problems)
        print(f"{args.file}: {n} problem{'s' if n != 1 else ''}", file=sys.stderr)
        return 1
    data = to_dict(cfg)
    data["prometheus"]["url"] = redact_url(cfg.prometheus.url)  # printed output gets pasted: never a password
    for pool, resolved in zip(cfg.pools, data["pools"]):
        resolved["node_selector"] = dict(pool.selector)
        resolved["model_name"] = pool.model
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=False))
    else:
        import yaml

        sys.stdout.write(f"# {args.file}: valid; resolved with defaults\n")
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    return 0
