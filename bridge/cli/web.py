"""``gpu-bridge web --config FILE``: serve the read-only research view (uvicorn, one process).

It binds ``web.host``:``web.port`` (loopback by default: put the site's reverse proxy or
Open OnDemand in front), reads with ``web.kubeconfig`` (its own read-only ServiceAccount,
deploy/kubernetes/web-rbac.yaml) and never takes the Lease or writes anything."""

from __future__ import annotations

import argparse
import socket
import sys
import threading
from typing import Any

from bridge import logs
from bridge.cli import fail
from bridge.errors import BridgeError, ConfigError

log = logs.get(__name__)


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "web",
        help="serve the researchers' read-only web view (pool, outlook, jobs, history)",
        description="A read-only web view for researchers: the pool now, the lendable outlook, each job's "
        "preemptions and expected start, and the history. See docs/researcher-guide.md.",
    )
    p.add_argument("--config", required=True, metavar="FILE", help="the YAML config (section web: host, port, kubeconfig, user_header)")
    p.add_argument("--host", help="bind address (default: web.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: web.port; 0 = any free port, printed at start)")
    p.add_argument("--log-format", choices=("json", "console", "auto"), default="auto")
    p.set_defaults(func=cmd_web)


def cmd_web(args: argparse.Namespace) -> int:
    import uvicorn

    from bridge.config import load_config
    from bridge.web.app import build_app
    from bridge.web.source import WebSource
    from bridge.wiring import check_private_file

    fmt = None if args.log_format == "auto" else args.log_format == "json"
    try:
        check_private_file(args.config, what="config")
        config = load_config(args.config)
        if args.port is not None and not 0 <= args.port <= 65535:
            raise ConfigError([f"--port: must be 0..65535, got {args.port}"])
        logs.configure(json=fmt, level=config.daemon.log_level)
        source = WebSource.open(config)
    except BridgeError as exc:
        return fail(exc, "web")
    host = args.host or config.web.host
    port = config.web.port if args.port is None else args.port
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        source.close()
        print(f"gpu-bridge web: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    bound = sock.getsockname()[1]
    threading.Thread(target=source.warm, name="web-warm-up", daemon=True).start()
    server = uvicorn.Server(
        uvicorn.Config(build_app(source), root_path=config.web.root_path, log_config=None, access_log=False,
                       proxy_headers=False, server_header=False, lifespan="off")
    )
    shown = f"[{host}]" if ":" in host else host
    print(f"gpu-bridge web: serving http://{shown}:{bound}{config.web.root_path}/ (read-only)", flush=True)
    log.info("web_listening", host=host, port=bound, user_header=config.web.user_header)

    try:
        server.run(sockets=[sock])  # uvicorn stops on SIGTERM/SIGINT, finishing open requests
    finally:
        source.close()
        sock.close()
        log.info("web_stopped")
    return 0
