"""`gpu-bridge sandbox up | down | status`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bridge import logs
from bridge.errors import SandboxError
from gpu_bridge_lab.sandbox.cluster.sandbox import DEFAULT_DIR, Sandbox


def register_cli(subparsers: Any) -> None:
    up = subparsers.add_parser(
        "up", help="start the sandbox: Slurm + munged, the Kubernetes API server with a serving vLLM Deployment, "
        "the vLLM simulator following it, Prometheus"
    )
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"private directory (default {DEFAULT_DIR})")
    up.add_argument("--nodes", type=int, default=4, help="Slurm nodes gpu-node-01.. (default 4)")
    up.add_argument("--grace-s", type=int, default=10, help="GraceTime of the preempt partition (default 10)")
    up.add_argument("--fast-grace-s", type=int, default=None,
                    help="also create the fast-grace partition preempt-fast (same nodes) with this GraceTime "
                    "(< --grace-s; default: none)")
    up.add_argument("--scrape", action="append", default=[], metavar="[JOB=]HOST:PORT",
                    help="extra Prometheus scrape target (repeatable), e.g. gpu-bridge=127.0.0.1:9464")
    up.add_argument("--job-submit-lua", type=Path, default=None, help="install this job_submit.lua (JobSubmitPlugins=lua)")
    up.add_argument("--extra-slurm-conf", type=Path, default=None, help="file appended to slurm.conf")
    up.add_argument("--no-vllm", action="store_true", help="do not start the vLLM simulator")
    up.add_argument("--vllm-arg", action="append", default=None, metavar="ARG",
                    help="argument passed to `gpu-bridge sandbox vllm` (repeatable; default: --replicas 1)")
    up.add_argument("--no-prometheus", action="store_true", help="Slurm (and munged) only: ready in about 1 s")
    up.add_argument("--kube", action="store_true",
                    help="with --slurm-only/--no-vllm/--no-prometheus: start the Kubernetes control plane anyway")
    up.add_argument("--slurm-only", action="store_true",
                    help="no serving side: no Kubernetes control plane; the vLLM simulator stands alone")
    up.add_argument("--pod-start-delay-s", type=float, default=3.0,
                    help="seconds from a vLLM pod's start to Ready: the modelled cold start (default 3)")
    up.add_argument("--timeout-s", type=float, default=60.0)
    up.set_defaults(func=cmd_up)
    down = subparsers.add_parser("down", help="stop everything the sandbox started")
    down.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    down.set_defaults(func=cmd_down)
    st = subparsers.add_parser("status", help="show the sandbox's processes, nodes and Prometheus targets")
    st.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)


def cmd_up(args: argparse.Namespace) -> int:
    logs.configure(level="warning")
    try:
        extra = args.extra_slurm_conf.read_text() if args.extra_slurm_conf else ""
        if args.slurm_only or args.no_vllm or args.no_prometheus:
            sb = Sandbox(
                args.dir, nodes=args.nodes, grace_s=args.grace_s, fast_grace_s=args.fast_grace_s,
                scrape_targets=args.scrape, job_submit_lua=args.job_submit_lua, extra_slurm_conf=extra,
                vllm=False if args.no_vllm else None,
                vllm_args=tuple(args.vllm_arg) if args.vllm_arg is not None else ("--replicas", "1"),
                kube=args.kube, timeout_s=args.timeout_s, prometheus=not args.no_prometheus,
            )
        else:  # the whole site: Slurm nodes that are also Kubernetes GPU nodes serving vLLM
            from gpu_bridge_lab.sandbox.serving import serving_sandbox

            sb = serving_sandbox(
                args.dir, nodes=args.nodes, grace_s=args.grace_s, fast_grace_s=args.fast_grace_s,
                scrape_targets=args.scrape, job_submit_lua=args.job_submit_lua, extra_slurm_conf=extra,
                pod_start_delay_s=args.pod_start_delay_s, vllm_extra=tuple(args.vllm_arg or ()),
                timeout_s=args.timeout_s,
            )
        if sb.running():
            print(f"gpu-bridge sandbox up: a sandbox is already running in {sb.dir} "
                  f"(`gpu-bridge sandbox down --dir {sb.dir}` first)", file=sys.stderr)
            return 1
        parts = [c.name for c in sb._components()] if hasattr(sb, "_components") else []
        print(f"starting sandbox in {sb.dir}: {', '.join(parts) or 'munged, slurmctld, slurmd, prometheus'} "
              f"({args.nodes} nodes) ...", flush=True)
        sb.up()
    except (SandboxError, ValueError, OSError) as e:
        print(f"gpu-bridge sandbox up: failed: {e}", file=sys.stderr)
        return 1
    for note in sb.notes:
        print(f"note: {note}")
    print(f"sandbox up in {sb.startup_s:.2f} s: {len(sb.node_names)} idle nodes ({sb.node_names[0]}..{sb.node_names[-1]})"
          + (f", Prometheus {sb.prometheus_url}" if "prometheus" in sb.ports else "")
          + (f", vLLM simulator {sb.vllm_url}" if sb.vllm_url else ""))
    for c in sb.components:
        t = getattr(c, "timings", None)
        if t:
            print(f"  Kubernetes control plane v{c.bins.kube_version}: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()))
    print(f"environment: {sb.env_file}   (set -a; . {sb.env_file}; set +a)")
    for k, v in sb.env.items():
        print(f"  {k}={v}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    logs.configure(level="warning")
    try:
        sb = Sandbox.attach(args.dir)
    except SandboxError as e:
        print(f"gpu-bridge sandbox down: {e}", file=sys.stderr)
        return 1
    import time

    t0 = time.monotonic()
    swept = sb.down()
    print(f"sandbox in {sb.dir} stopped in {time.monotonic() - t0:.2f} s"
          + (f" (also stopped {len(swept)} leftover processes)" if swept else ""))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    logs.configure(level="warning")
    try:
        sb = Sandbox.attach(args.dir)
    except SandboxError as e:
        print(f"gpu-bridge sandbox status: {e}", file=sys.stderr)
        return 1
    st = sb.status()
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
    else:
        print(f"sandbox {sb.dir}: {'running' if st['all_alive'] else 'NOT running (or partly)'}")
        for name, p in st["processes"].items():
            print(f"  {name:24s} pid {p['pid']:<8d} {'alive' if p['alive'] else 'dead'}")
        for node, state in sorted(st["nodes"].items()):
            print(f"  node {node}: {state}")
        for job, health in sorted(st.get("targets", {}).items()):
            print(f"  prometheus target {job}: {health}")
    return 0 if st["all_alive"] else 1
