"""The sandbox's Kubernetes API server: real REST API (kubectl and the official client work
against it unchanged) with controllers behind it. See docs/kube-api-server.md.

``gpu-bridge sandbox kube --port P --kubeconfig F [--token T] [--seed-serving ...]``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from gpu_bridge_lab.sandbox.kube.serving_model import DEFAULT_MODEL, ServingModel, cli_args, seed_serving, wait_serving_ready
from gpu_bridge_lab.sandbox.kube.server import KubeServer

__all__ = ["KubeServer", "ServingModel", "cli_args", "seed_serving", "wait_serving_ready", "register_cli"]


def register_cli(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "kube", help="run the sandbox's Kubernetes API server (kubectl and the official client work against it)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: a free one, printed in the ready line)")
    p.add_argument("--kubeconfig", required=True, help="write a kubeconfig for this server here")
    p.add_argument("--token", default=None, help="require this bearer token (written into the kubeconfig)")
    p.add_argument("--pod-start-delay-s", type=float, default=2.0,
                   help="seconds from a pod's binding to Ready (the vLLM cold start; default 2)")
    p.add_argument("--pod-stop-s", type=float, default=None,
                   help="a deleted pod is gone after min(grace, this) seconds (default: its full grace period)")
    p.add_argument("--seed-serving", action="store_true",
                   help="create the serving side: GPU nodes, namespace serving, the vLLM Deployment and its PDB")
    p.add_argument("--nodes", type=int, default=4, help="serving nodes gpu-node-01.. (with --seed-serving; default 4)")
    p.add_argument("--spare-nodes", type=int, default=0, help="extra GPU nodes without a replica (default 0)")
    p.add_argument("--replicas", type=int, default=None, help="vLLM replicas (default: one per serving node)")
    p.add_argument("--pool", default="default", help="value of the gpu-bridge.io/pool node label (default 'default')")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"served model (default {DEFAULT_MODEL})")
    p.add_argument("--grace-s", type=int, default=30, help="the vLLM pods' terminationGracePeriodSeconds (default 30)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from bridge import logs

    for flag, value in (("--nodes", args.nodes), ("--spare-nodes", args.spare_nodes), ("--grace-s", args.grace_s),
                        ("--pod-start-delay-s", args.pod_start_delay_s)):
        if value < 0:
            print(f"gpu-bridge sandbox kube: {flag}: must be >= 0, got {value}", file=sys.stderr)
            return 2
    if args.replicas is not None and args.replicas < 0:
        print(f"gpu-bridge sandbox kube: --replicas: must be >= 0, got {args.replicas}", file=sys.stderr)
        return 2
    logs.configure()
    server = KubeServer(args.host, args.port, token=args.token, pod_start_delay_s=args.pod_start_delay_s,
                        pod_stop_s=args.pod_stop_s)
    try:
        server.start()
    except OSError as exc:
        print(f"gpu-bridge sandbox kube: --port {args.port}: cannot listen: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        if args.seed_serving:
            model = ServingModel(nodes=args.nodes, pool=args.pool, model=args.model, replicas=args.replicas,
                                 termination_grace_s=args.grace_s)
            seed_serving(server.store, model, spare_nodes=args.spare_nodes)
        path = server.write_kubeconfig(args.kubeconfig)
        print(f"gpu-bridge sandbox kube: listening on {server.url} (kubeconfig {path})", flush=True)
        stop.wait()
    finally:
        server.stop()
    return 0
