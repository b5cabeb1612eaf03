"""The HTTP side: a threading HTTP/1.1 server (one thread per connection, so long-lived
watches are fine at this scale), bearer-token auth, routing to ``api.Api``, Status error
bodies and chunked watch streams; and ``KubeServer``, the handle tests and the CLI use."""

from __future__ import annotations

import base64
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from bridge import logs
from gpu_bridge_lab.sandbox.kube import resources as res_mod
from gpu_bridge_lab.sandbox.kube.api import Api, Request, Response, Settings, parse_target
from gpu_bridge_lab.sandbox.kube.controllers import Controllers
from gpu_bridge_lab.sandbox.kube.store import ApiError, Store

log = logs.get(__name__)


def _status(code: int, reason: str, message: str) -> Response:
    return Response.of(code, ApiError(code, reason, message).status())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpu-bridge-kube"
    kube: "KubeServer"  # set on the subclass per server

    def setup(self) -> None:
        super().setup()
        try:  # small replies must not wait for a delayed ACK (Nagle)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    def handle(self) -> None:
        try:
            super().handle()
        except (OSError, ValueError):  # a client that went away (reset, TLS alert, closed socket)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return None

    def _send(self, resp: Response) -> None:
        self.send_response(resp.code)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        self.send_header("Cache-Control", "no-cache, private")
        self._headers_buffer.append(b"\r\n")  # headers and body in one write
        if self.command != "HEAD":
            self._headers_buffer.append(resp.body)
        self.wfile.write(b"".join(self._headers_buffer))
        self._headers_buffer = []

    def _handle(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            query = dict(parse_qsl(url.query, keep_blank_values=True))
            headers = {k.lower(): v for k, v in self.headers.items()}
            req = Request(self.command, url.path, query, headers, body)
            resp_or_stream = self.kube.route(req)
        except ApiError as exc:
            resp_or_stream = Response.of(exc.code, exc.status())
        except (ConnectionError, socket.timeout):
            self.close_connection = True
            return
        except Exception as exc:  # a bug must answer 500, not hang the client
            log.exception("kube_api_internal_error", path=self.path, reason=str(exc))
            resp_or_stream = _status(500, "InternalError", f"internal error: {exc}")
        if isinstance(resp_or_stream, Response):
            self._send(resp_or_stream)
        else:
            self._stream(resp_or_stream)

    def _stream(self, chunks: Any) -> None:
        try:
            first = next(chunks)  # errors before the stream starts are plain Status replies
        except ApiError as exc:
            self._send(Response.of(exc.code, exc.status()))
            return
        except StopIteration:
            first = None
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            if first:
                self._chunk(first)
            self.wfile.flush()
            if first is not None:
                for c in chunks:
                    if c:
                        self._chunk(c)
                    elif self._client_gone():
                        self.close_connection = True
                        return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            chunks.close()

    def _client_gone(self) -> bool:
        """True once the client closed its end. A watch client sends nothing while the
        stream runs, so a readable socket means EOF (or a TLS close_notify before it)."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            return bool(r)
        except (OSError, ValueError):
            return True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class KubeServer:
    """A Kubernetes API server on ``host:port`` (0 = a free port), with controllers.

    ``pod_start_delay_s`` is the time from a pod's binding to Ready (the vLLM cold start);
    ``pod_stop_s`` caps how long a deleted pod lingers (None: its whole grace period, as a
    process that ignores SIGTERM would); ``token`` turns on bearer-token auth, and with it
    TLS by default (``tls``), since kubectl sends a token only over https."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None, *,
                 tls: bool | None = None, pod_start_delay_s: float = 0.5, pod_stop_s: float | None = None,
                 bookmark_interval_s: float = 1.0, event_log_size: int = 50_000,
                 controllers: bool = True) -> None:
        self.host = host
        self._port = port
        self.token = token
        self.store = Store(event_log_size=event_log_size)
        self.settings = Settings(bookmark_interval_s=bookmark_interval_s)
        self.api = Api(self.store, self.settings)
        self.controllers = Controllers(self.store, pod_start_delay_s=pod_start_delay_s, pod_stop_s=pod_stop_s) \
            if controllers else None
        self.tls = bool(token) if tls is None else tls
        self._ca_pem: bytes | None = None
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "KubeServer":
        handler = type("Handler", (_Handler,), {"kube": self})
        self._httpd = _HTTPServer((self.host, self._port), handler)
        if self.tls:
            import ssl
            import tempfile

            from gpu_bridge_lab.sandbox.kube.tls import self_signed
            with tempfile.TemporaryDirectory(prefix="gpu-bridge-kube-tls-") as d:
                cert, key = self_signed(self.host, Path(d))
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                ctx.load_cert_chain(cert, key)
                self._ca_pem = cert.read_bytes()
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        self._port = self._httpd.server_address[1]
        self.settings.server_address = f"{self.host}:{self._port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="kube-api-http", daemon=True)
        self._thread.start()
        if self.controllers is not None:
            self.controllers.start()
        log.info("kube_api_started", url=self.url)
        return self

    def stop(self) -> None:
        if self.controllers is not None:
            self.controllers.stop()
        self.store.close_watchers()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "KubeServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def ca_pem(self) -> bytes | None:
        """The server certificate (PEM) when serving TLS, for clients to trust."""
        return self._ca_pem

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self._port}"

    def write_kubeconfig(self, path: str | Path, *, context: str = "gpu-bridge-sandbox",
                         namespace: str = "default") -> Path:
        """A kubeconfig for kubectl and ``kubernetes.config.load_kube_config`` (token if set)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        cluster: dict[str, Any] = {"server": self.url}
        if self._ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(self._ca_pem).decode()
        doc = {
            "apiVersion": "v1", "kind": "Config", "preferences": {}, "current-context": context,
            "clusters": [{"name": context, "cluster": cluster}],
            "users": [{"name": context, "user": user}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context,
                                                       "namespace": namespace}}],
        }
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(p)
        return p

    # --- routing -----------------------------------------------------------------------------
    def _authorized(self, req: Request) -> bool:
        if not self.token:
            return True
        return req.headers.get("authorization", "") == f"Bearer {self.token}"

    def route(self, req: Request) -> Any:
        path = req.path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return Response(200, b"ok", "text/plain")
        if not self._authorized(req):
            return _status(401, "Unauthorized", "Unauthorized")
        parts = [p for p in path.split("/") if p]
        if path == "/version":
            return Response.of(200, {"major": "1", "minor": "32", "gitVersion": self.settings.git_version,
                                     "gitCommit": "0000000000000000000000000000000000000000",
                                     "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                                     "goVersion": "go1.23", "compiler": "gc", "platform": "linux/amd64"})
        if path == "/api":
            return Response.of(200, res_mod.api_versions(self.settings.server_address))
        if path == "/apis":
            return Response.of(200, res_mod.api_group_list())
        if parts[:2] == ["openapi", "v3"]:
            if len(parts) == 2:
                return Response.of(200, res_mod.openapi_v3_root())
            rest = parts[2:]
            doc = None
            if rest[:1] == ["api"] and len(rest) == 2:
                doc = res_mod.openapi_v3_gv("", rest[1])
            elif rest[:1] == ["apis"] and len(rest) == 3:
                doc = res_mod.openapi_v3_gv(rest[1], rest[2])
            if doc is not None:
                return Response.of(200, doc)
        if parts == ["openapi", "v2"]:
            if "protobuf" in req.headers.get("accept", ""):
                # kubectl asks for application/com.github.proto-openapi.spec.v2@v1.0+protobuf; the
                # apiserver answers octet-stream (Go's mime parser rejects the '@' in a reply)
                return Response(200, res_mod.openapi_v2_protobuf(), "application/octet-stream")
            return Response.of(200, res_mod.openapi_v2_json())
        if parts[:1] == ["openapi"]:
            return _status(404, "NotFound", "the server could not find the requested resource")
        group, version, target, legacy_watch = parse_target(parts)
        if target is None:
            if parts[:1] == ["api"] and len(parts) == 2:
                doc = res_mod.resource_list("", parts[1])
            elif parts[:1] == ["apis"] and len(parts) == 2:
                doc = res_mod.api_group(parts[1])
            elif parts[:1] == ["apis"] and len(parts) == 3:
                doc = res_mod.resource_list(parts[1], parts[2])
            else:
                doc = None
            if doc is None:
                return _status(404, "NotFound", "the server could not find the requested resource")
            return Response.of(200, doc)
        return self._verb(target, req, legacy_watch)

    def _verb(self, t: Any, req: Request, legacy_watch: bool) -> Any:
        m = req.method
        if m in ("GET", "HEAD"):
            if legacy_watch and t.name and not t.subresource:  # /api/v1/watch/namespaces/N/pods/NAME
                sel = f"metadata.name={t.name}"
                fs = req.param("fieldSelector")
                req.query["fieldSelector"] = f"{fs},{sel}" if fs else sel
                t = type(t)(t.resource, t.namespace, "", "")
                return self.api.watch(t, req)
            if not t.name:
                if legacy_watch or req.flag("watch"):
                    return self.api.watch(t, req)
                return self.api.list(t, req)
            return self.api.get(t, req)
        if m == "POST":
            return self.api.create(t, req)
        if m == "PUT":
            return self.api.update(t, req)
        if m == "PATCH":
            return self.api.patch(t, req)
        if m == "DELETE":
            if not t.name:
                return self.api.delete_collection(t, req)
            return self.api.delete(t, req)
        return _status(405, "MethodNotAllowed", f"the server does not allow the method {m}")
