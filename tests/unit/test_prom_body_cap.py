"""A Prometheus answer is read up to ``BODY_CAP`` bytes (decoded), never whole into memory: an
answer beyond it (plain, chunked, or a small gzip body that inflates past it) fails the query
with an error naming the size; answers within it parse as before, on a kept-alive connection."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bridge.adapters.prom import signals
from bridge.adapters.prom.signals import PromAdapter
from bridge.adapters.prom.types import PromPool
from bridge.errors import AdapterError

POOL = PromPool("llama", "llama")
CAP = 20_000
T = 1_800_000_000.0


def _answer(replicas: int) -> bytes:
    """A valid instant-query answer: ``replicas`` replicas, one request running on each, with its
    sample's timestamp (about 300 bytes a replica)."""
    result = [{"metric": {"model_name": "llama", "pod": f"llama-{i}", "bridge_q": f"{tag}:vllm:num_requests_running"},
               "value": [T, value]} for i in range(replicas) for tag, value in (("value", "1"), ("ts", str(T)))]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


@contextmanager
def _prometheus(body: bytes, *, how: str) -> Iterator[tuple[str, list[int]]]:
    """A local Prometheus answering every query with ``body``: ``how`` is "length" (a
    Content-Length), "chunked" or "gzip" (gzip-encoded, with its Content-Length). Yields its URL
    and the client ports it saw (one per connection)."""
    ports: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the session reuses its connection

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.client_address[1] not in ports:
                ports.append(self.client_address[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if how == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(0, len(body), 4096):
                    part = body[i:i + 4096]
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
                return
            data = gzip.compress(body) if how == "gzip" else body
            if how == "gzip":
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", ports
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("how", ["length", "chunked", "gzip"])
def test_an_answer_larger_than_the_cap_fails_the_query_naming_the_size(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signals, "BODY_CAP", CAP)
    big = _answer(400)
    assert len(big) > 2 * CAP and (how != "gzip" or len(gzip.compress(big)) < CAP)  # the gzip one is small on the wire
    with _prometheus(big, how=how) as (url, _):
        with pytest.raises(AdapterError, match=f"answer larger than {CAP} bytes"):
            PromAdapter(url, timeout_s=5).current(POOL)


@pytest.mark.parametrize("how", ["length", "chunked", "gzip"])
def test_an_answer_within_the_cap_is_read_and_the_connection_kept(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signals, "BODY_CAP", CAP)
    body = _answer(50)
    assert CAP // 2 < len(body) < CAP
    with _prometheus(body, how=how) as (url, ports):
        prom = PromAdapter(url, timeout_s=5)
        for _ in range(3):
            reading = prom.current(POOL, at=T)
            assert reading.signals.running == 50  # every series parsed: the whole body was kept
        assert len(ports) == 1  # one connection for the three queries: the body was read to its end
