"""HTTP front of the simulator: ``/metrics`` plus a small JSON control API, on one port.

    GET    /metrics             Prometheus text exposition (vLLM names)
    GET    /healthz, /health    {"ok": true, ...}
    GET    /replicas            list of replicas with their state
    GET    /replicas/{name}     one replica
    POST   /replicas            {"name", "model"?, "node"?, "warmup_s"?}  -> 201
    DELETE /replicas/{name}     drain (optional ?shutdown_timeout_s=S)    -> 202
    GET    /load                trace clock, rates, overrides
    PUT    /load                {"model"?, "rate"?, "multiplier"?, "cv"?, "reset"?}
    GET    /faults              the injected faults (lab only)
    PUT    /faults              lab faults, each a list of replicas (a key given replaces that
                                list, [] clears it; the others stay; 400 names a bad field):
                                "wake_fails": /wake_up answers 500, the engine left asleep;
                                "wake_hangs": /wake_up answers only after "wake_hang_s" (default
                                60 s of wall time), then wakes as usual;
                                "sleep_fails": /sleep answers 500, the engine left awake;
                                "no_sleep_mode": /sleep, /wake_up, /is_sleeping answer vLLM's 404
                                {"detail": "Not Found"} (an engine restarted without sleep mode);
                                "unreachable": the pod's own address (--pod-port) refuses
                                connections, as a dead engine's port does (/replicas/{name}/...
                                here still answer: the lab's view)

vLLM's sleep-mode dev endpoints, per replica (each replica is one vLLM server; its base URL
is ``/replicas/{name}``), and at the root when exactly one replica exists. Only with
``VLLM_SERVER_DEV_MODE=1`` and ``--enable-sleep-mode``; otherwise 404 ``{"detail": "Not Found"}``
as vLLM answers for a route it did not register. Each call returns when the simulated
offload/wake completes, like vLLM's:

    POST   [/replicas/{name}]/sleep?level=1|2     -> 200 (empty body)
    POST   [/replicas/{name}]/wake_up[?tags=weights&tags=kv_cache]   -> 200 (empty body)
    GET    [/replicas/{name}]/is_sleeping         -> {"is_sleeping": bool}

A ticker thread advances the simulation from the monotonic wall clock every ``tick_s``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from bridge import logs
from gpu_bridge_lab.sandbox.vllm.metrics import make_registry
from gpu_bridge_lab.sandbox.vllm.sim import SimError, Simulation

log = logs.get(__name__)

SLEEP_ACTIONS = ("sleep", "wake_up", "is_sleeping")
MAX_CATCH_UP_S = 30.0  # after a stall longer than this, simulated time skips instead of racing


class SimServer:
    """The simulation, its ticker and its HTTP server. ``start()`` then ``url``; ``stop()``."""

    def __init__(self, sim: Simulation, host: str = "127.0.0.1", port: int = 0, *,
                 metrics_version: str = "v1", tick_s: float = 0.1, dev_mode: bool | None = None) -> None:
        self.sim = sim
        # vLLM registers /sleep, /wake_up, /is_sleeping only with VLLM_SERVER_DEV_MODE=1
        self.dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE") == "1" if dev_mode is None else dev_mode
        self.registry: CollectorRegistry = make_registry(sim, metrics_version)
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer((host, port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0
        self._sim_t0 = 0.0

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self._httpd.server_address[0]
        return f"http://{host}:{self.port}"

    def start(self) -> "SimServer":
        self._t0 = time.monotonic()
        self._sim_t0 = self.sim.t
        for target, name in ((self._tick_loop, "vllm-sim-tick"), (self._serve, "vllm-sim-http")):
            th = threading.Thread(target=target, name=name, daemon=True)
            th.start()
            self._threads.append(th)
        return self

    def _serve(self) -> None:
        self._httpd.serve_forever(poll_interval=0.05)

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        for th in self._threads:
            th.join(timeout=5)

    def wait_until(self, sim_t: float, timeout_s: float = 600.0) -> None:
        """Block until the simulation clock reaches ``sim_t`` (the ticker advances it), as
        vLLM's /sleep and /wake_up return only once the copy is done."""
        deadline = time.monotonic() + timeout_s
        while self.sim.t < sim_t and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(min(0.02, self.tick_s))

    def hold(self, seconds: float) -> None:
        """Wait ``seconds`` of wall time (a hung call), or until the server stops."""
        self._stop.wait(seconds)

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            target = self._sim_t0 + (time.monotonic() - self._t0)
            lag = target - self.sim.t
            if lag > MAX_CATCH_UP_S:
                log.warning("vllm_sim_lagging", lag_s=round(lag, 1), reason="stall; skipping ahead")
                self._sim_t0 += lag - self.tick_s
                target = self._sim_t0 + (time.monotonic() - self._t0)
            try:
                self.sim.advance_to(target)
            except Exception:  # never let the clock die silently
                log.exception("vllm_sim_tick_failed")


def _make_handler(server: SimServer) -> type[BaseHTTPRequestHandler]:
    sim = server.sim

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "vllm-sim"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence access log
            return None

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj, sort_keys=True).encode(), "application/json")

        def _error(self, status: int, message: str) -> None:
            self._json(status, {"error": message, "status": status})

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            if not raw.strip():
                return {}
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise SimError(f"request body: invalid JSON ({exc})") from exc

        def _sleep_route(self, method: str, path: str, query: dict[str, list[str]]) -> bool:
            """vLLM's dev endpoints; False when ``path`` is none of them."""
            name, _, action = path.rpartition("/")
            if action not in SLEEP_ACTIONS or not (name == "" or name.startswith("/replicas/")):
                return False
            if not server.dev_mode or sim.sleep_params is None:
                self._json(404, {"detail": "Not Found"})
                return True
            if name:
                replica = unquote(name[len("/replicas/"):])
            else:
                with sim.lock:
                    names = list(sim.replicas)
                if len(names) != 1:
                    raise SimError(f"{len(names)} replicas here: use /replicas/{{name}}/{action}", 404)
                replica = names[0]
            with sim.lock:
                no_sleep_mode = replica in sim.no_sleep_mode
            if no_sleep_mode:  # the lab fault: an engine restarted without sleep mode, as vLLM answers then
                self._json(404, {"detail": "Not Found"})
                return True
            if (method, action) not in (("POST", "sleep"), ("POST", "wake_up"), ("GET", "is_sleeping")):
                self._json(405, {"detail": "Method Not Allowed"})
                return True
            if action == "is_sleeping":
                self._json(200, {"is_sleeping": sim.is_sleeping(replica)})
                return True
            if action == "sleep":
                raw = query.get("level", ["1"])[0]
                try:
                    level = int(raw)
                except ValueError as exc:
                    raise SimError(f"level: expected 1 or 2, got {raw!r}", 400) from exc
                done = sim.sleep_replica(replica, level)
            else:
                hang_s = sim.wake_hang(replica)
                if hang_s:  # the lab fault: no answer (and no wake) for hang_s, then the wake as usual
                    log.warning("replica_sleep_mode", pod=replica, step=action, reason=f"hangs {hang_s:g} s (PUT /faults)")
                    server.hold(hang_s)
                done = sim.wake_replica(replica, query.get("tags") or None)
            log.info("replica_sleep_mode", pod=replica, step=action, reason=f"completes at sim t={done:.1f}")
            server.wait_until(done)
            self._send(200, b"", "application/json")
            return True

        def _route(self, method: str) -> None:
            parts = urlsplit(self.path)
            path = parts.path.rstrip("/") or "/"
            query = parse_qs(parts.query)
            try:
                self._answer(method, path, query)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a hung wake): nobody to answer
                self.close_connection = True

        def _answer(self, method: str, path: str, query: dict[str, list[str]]) -> None:
            try:
                if self._sleep_route(method, path, query):
                    pass
                elif path == "/metrics" and method in ("GET", "HEAD"):
                    self._send(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/health") and method in ("GET", "HEAD"):
                    self._json(200, {"ok": True, "sim_time_s": round(sim.t, 3), "replicas": len(sim.replicas)})
                elif path == "/replicas" and method == "GET":
                    self._json(200, {"replicas": sim.replica_list()})
                elif path == "/replicas" and method == "POST":
                    body = self._body()
                    if not isinstance(body, dict):
                        raise SimError("replica: expected a JSON object")
                    unknown = set(body) - {"name", "model", "node", "warmup_s"}
                    if unknown:
                        raise SimError(f"replica: unknown key(s) {', '.join(sorted(unknown))}; expected name, model, node, warmup_s")
                    node = body.get("node") or ""
                    if not isinstance(node, str):
                        raise SimError(f"replica.node: expected a string, got {node!r}")
                    warm = body.get("warmup_s")
                    if warm is not None and (isinstance(warm, bool) or not isinstance(warm, (int, float))):
                        raise SimError(f"replica.warmup_s: expected a number, got {warm!r}")
                    rep = sim.add_replica(body.get("name"), body.get("model"), node, warm)  # type: ignore[arg-type]
                    log.info("replica_added", pod=rep.name, node=rep.node, model=rep.model, phase=rep.state)
                    self._json(201, rep.snapshot())
                elif path.startswith("/replicas/") and method == "GET":
                    name = unquote(path[len("/replicas/"):])
                    rep = sim.replicas.get(name)
                    if rep is None:
                        raise SimError(f"replica {name!r} not found", 404)
                    self._json(200, rep.snapshot())
                elif path.startswith("/replicas/") and method == "DELETE":
                    name = unquote(path[len("/replicas/"):])
                    timeout = None
                    if "shutdown_timeout_s" in query:
                        try:
                            timeout = float(query["shutdown_timeout_s"][0])
                        except ValueError as exc:
                            raise SimError("shutdown_timeout_s: expected a number") from exc
                    rep = sim.remove_replica(name, timeout)
                    log.info("replica_draining", pod=rep.name, node=rep.node, phase=rep.state)
                    self._json(202, rep.snapshot())
                elif path == "/load" and method == "GET":
                    self._json(200, sim.load_status())
                elif path == "/load" and method in ("PUT", "POST"):
                    status = sim.set_load(self._body())
                    log.info("load_override", reason=json.dumps(status["models"], sort_keys=True))
                    self._json(200, status)
                elif path == "/faults" and method == "GET":
                    self._json(200, sim.faults())
                elif path == "/faults" and method in ("PUT", "POST"):
                    status = sim.set_faults(self._body())
                    log.warning("vllm_sim_faults", reason=json.dumps(status, sort_keys=True))
                    self._json(200, status)
                elif path in ("/metrics", "/healthz", "/health", "/replicas", "/load", "/faults") or path.startswith("/replicas/"):
                    self._error(405, f"{method} not allowed on {path}")
                else:
                    self._error(404, f"no such path {path}; try /metrics, /healthz, /replicas, /load")
            except SimError as exc:
                self._error(exc.status, str(exc))
            except Exception as exc:  # a bug must answer 500, not kill the connection silently
                log.exception("vllm_sim_http_error", reason=str(exc))
                self._error(500, f"internal error: {exc}")

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

        def do_HEAD(self) -> None:  # noqa: N802
            self._route("HEAD")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._route("PUT")

        def do_DELETE(self) -> None:  # noqa: N802
            self._route("DELETE")

    return Handler
