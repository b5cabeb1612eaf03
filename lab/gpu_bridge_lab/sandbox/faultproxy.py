"""A small TCP/HTTP fault proxy in front of the sandbox's Kubernetes API server (plain HTTP,
or TLS: given the apiserver's serving certificate and key, the proxy terminates TLS itself to
answer 500/429, and passes the encrypted bytes through untouched otherwise).

Modes, switchable at any time (``set_mode``; open connections are cut so that clients,
including long-lived watches, reconnect into the new mode):

- ``pass``: forward bytes both ways.
- ``500`` / ``429``: answer every request with that HTTP status (429 with ``Retry-After: 1``)
  and close.
- ``hang``: accept and read, never answer (the client's request timeout fires).
- ``refuse``: stop listening: connections are refused.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from pathlib import Path

MODES = ("pass", "500", "429", "hang", "refuse")



def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes from ``src`` to ``dst`` until either side closes, then close both."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.close()
            except OSError:
                pass

class FaultProxy:
    def __init__(self, target_port: int, tls: tuple[Path, Path] | None = None, *, echo_headers: bool = False) -> None:
        self._target = ("127.0.0.1", target_port)
        # echo the request's headers (Authorization included) in the injected error's message,
        # as a careless debugging proxy might: the secrets tests check the daemon redacts them
        self._echo = echo_headers
        self._tls: ssl.SSLContext | None = None
        if tls is not None:  # (cert, key): the client's CA trusts it, as it trusts the apiserver
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(str(tls[0]), str(tls[1]))
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._listener: socket.socket | None = None
        self.mode = "pass"
        self.port = 0
        self.counts: dict[str, int] = {m: 0 for m in MODES}
        self._listen()

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _stop_listening(self) -> None:
        if self._listener is None:
            return
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._listener = None

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        old, self.mode = self.mode, mode
        if mode == "refuse":
            self._stop_listening()
        elif old == "refuse" and not self._closed:
            self._listen()
        self.cut_connections()

    def cut_connections(self) -> None:
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass
            self._socks.clear()

    def close(self) -> None:
        self._closed = True
        self._stop_listening()
        self.cut_connections()

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            mode = self.mode
            self.counts[mode] = self.counts.get(mode, 0) + 1
            with self._lock:
                self._socks.append(client)
            if mode == "pass":
                try:
                    upstream = socket.create_connection(self._target, timeout=5)
                    upstream.settimeout(None)
                except OSError:
                    client.close()
                    continue
                with self._lock:
                    self._socks.append(upstream)
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=pipe, args=(a, b), daemon=True).start()
            else:
                threading.Thread(target=self._fault, args=(client, mode), daemon=True).start()

    def _fault(self, client: socket.socket, mode: str) -> None:
        try:
            client.settimeout(30)
            if self._tls is not None and mode != "hang":
                client = self._tls.wrap_socket(client, server_side=True)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = client.recv(65536)
                if not chunk:
                    return
                buf += chunk
            if mode == "hang":
                while client.recv(65536):
                    pass
                return
            status = {"500": "500 Internal Server Error", "429": "429 Too Many Requests"}[mode]
            message = f"injected {mode}"
            if self._echo:
                headers = buf.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
                message += " for request with headers " + "; ".join(headers)
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                               "code": int(mode)}).encode()
            head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                    + ("Retry-After: 1\r\n" if mode == "429" else "") + "Connection: close\r\n\r\n").encode()
            client.sendall(head + body)
        except OSError:
            pass
        finally:
            try:
                client.close()
            except OSError:
                pass


def proxied_kubeconfig(kubeconfig: Path, proxy_port: int, out: Path) -> Path:
    """The same kubeconfig, pointing at the proxy (mode 0600: the daemon checks)."""
    import os
    import re

    text = re.sub(r"(server:\s*https?://127\.0\.0\.1:)\d+", lambda m: m.group(1) + str(proxy_port),
                  kubeconfig.read_text())
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return out


