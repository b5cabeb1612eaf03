"""The watch cache against a scripted HTTP server speaking the list/watch protocol, through
the real official client: list then watch from the list's rv, events applied in order,
ERROR 410 -> re-list, a failing watch -> unsynced, backoff, then synced again; call counts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client as k8s

from bridge import wellknown as wk
from bridge.adapters.kube.calls import ApiCalls
from bridge.adapters.kube.informer import Informer
from bridge.adapters.kube.objects import NodeInfo, parse_node


def node(name: str, rv: str, phase: str | None = None) -> dict[str, Any]:
    labels = {wk.LABEL_POOL: "llama"}
    annotations = {}
    if phase:
        labels[wk.LABEL_PHASE] = phase
        annotations[wk.ANNOTATION_PHASE_SINCE] = "1"
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels, "annotations": annotations}, "spec": {}, "status": {}}


class Script:
    """What the server answers: ``lists`` in order, ``watches`` in order; each watch is a list
    of events, or an int status code to fail with; after the events the stream stays open
    until ``release`` is set (or closes at once if ``close`` is true)."""

    def __init__(self, lists: list[dict[str, Any]], watches: list[list[dict[str, Any]] | int]) -> None:
        self.lists = lists
        self.watches = watches
        self.requests: list[dict[str, list[str]]] = []
        self.release = threading.Event()
        self.lock = threading.Lock()


def serve(script: Script) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            q = parse_qs(urlparse(self.path).query)
            with script.lock:
                script.requests.append(q)
                if q.get("watch") == ["true"]:
                    step: list[dict[str, Any]] | int = script.watches.pop(0) if script.watches else []
                    is_watch = True
                else:
                    listing = script.lists.pop(0) if len(script.lists) > 1 else script.lists[0]
                    is_watch = False
            if not is_watch:
                body = json.dumps({"kind": "NodeList", "metadata": {"resourceVersion": listing["rv"]}, "items": listing["items"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if isinstance(step, int):
                body = json.dumps({"kind": "Status", "code": step, "message": "scripted failure"}).encode()
                self.send_response(step)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for ev in step:
                line = (json.dumps(ev) + "\n").encode()
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            if not any(ev["type"] == "ERROR" for ev in step):
                script.release.wait(5)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def make() -> Iterator[Callable[[Script], tuple[Informer[NodeInfo], ApiCalls]]]:
    made: list[tuple[ThreadingHTTPServer, Informer[NodeInfo], Script]] = []

    def _make(script: Script) -> tuple[Informer[NodeInfo], ApiCalls]:
        server = serve(script)
        cfg = k8s.Configuration()
        cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
        api = k8s.CoreV1Api(k8s.ApiClient(cfg))
        calls = ApiCalls()
        inf: Informer[NodeInfo] = Informer(
            "nodes", "nodes", partial(api.list_node, label_selector=f"{wk.LABEL_POOL}=llama"), parse_node,
            calls=calls, watch_timeout_s=5, request_timeout_s=2, backoff_initial_s=0.05, backoff_max_s=0.2,
        )
        made.append((server, inf, script))
        inf.start()
        return inf, calls

    yield _make
    for server, inf, script in made:
        script.release.set()
        inf.stop()
        server.shutdown()
        server.server_close()


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def names(inf: Informer[NodeInfo]) -> list[str]:
    return [n.name for n in inf.items()]


def test_list_then_watch_from_the_lists_rv(make: Callable[[Script], tuple[Informer[NodeInfo], ApiCalls]]) -> None:
    script = Script(
        lists=[{"rv": "10", "items": [node("n1", "9")]}],
        watches=[[
            {"type": "ADDED", "object": node("n2", "11")},
            {"type": "MODIFIED", "object": node("n1", "12", phase="lent")},
            {"type": "DELETED", "object": node("n2", "13")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "14"}}},
        ]],
    )
    inf, calls = make(script)
    assert inf.wait_synced(5)
    wait_for(lambda: (n := inf.get("n1")) is not None and n.phase is not None and inf.get("n2") is None)
    assert names(inf) == ["n1"]
    first_watch = next(q for q in script.requests if q.get("watch") == ["true"])
    assert first_watch["resourceVersion"] == ["10"] and first_watch["allowWatchBookmarks"] == ["true"]
    assert first_watch["labelSelector"] == [f"{wk.LABEL_POOL}=llama"]
    assert calls.snapshot() == {("list", "nodes"): 1, ("watch", "nodes"): 1}
    st = inf.status()
    assert st.synced and st.relists == 1 and st.errors == 0 and st.last_event_age_s is not None and st.last_event_age_s < 5


def test_410_gone_relists(make: Callable[[Script], tuple[Informer[NodeInfo], ApiCalls]]) -> None:
    script = Script(
        lists=[{"rv": "10", "items": [node("n1", "9")]}, {"rv": "50", "items": [node("n1", "40"), node("n3", "45")]}],
        watches=[[{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}], []],
    )
    inf, calls = make(script)
    wait_for(lambda: names(inf) == ["n1", "n3"])
    wait_for(lambda: len([q for q in script.requests if q.get("watch") == ["true"]]) == 2)
    watches = [q for q in script.requests if q.get("watch") == ["true"]]
    assert watches[1]["resourceVersion"] == ["50"]
    assert inf.status().relists == 2 and inf.synced


def test_failing_watch_unsyncs_then_recovers(make: Callable[[Script], tuple[Informer[NodeInfo], ApiCalls]]) -> None:
    script = Script(lists=[{"rv": "10", "items": [node("n1", "9")]}], watches=[500, 500, []])
    inf, calls = make(script)
    wait_for(lambda: inf.status().errors >= 1)
    wait_for(lambda: len([q for q in script.requests if q.get("watch") == ["true"]]) == 3 and inf.synced)
    st = inf.status()
    assert st.errors == 2 and st.relists == 1  # a plain error resumes the watch from the same rv
    assert st.last_error is not None and "HTTP 500" in st.last_error
    assert calls.errors() == {("watch", "nodes", "500"): 2}


def test_write_through_never_goes_back_in_time(make: Callable[[Script], tuple[Informer[NodeInfo], ApiCalls]]) -> None:
    inf, _ = make(Script(lists=[{"rv": "10", "items": [node("n1", "9")]}], watches=[[]]))
    assert inf.wait_synced(5)
    inf.write_through(node("n1", "20", phase="lent"))
    inf.write_through(node("n1", "15", phase="serving"))
    n = inf.get("n1")
    assert n is not None and n.resource_version == "20" and n.phase is not None and n.phase.value == "lent"


def test_an_event_older_than_our_write_does_not_roll_the_cache_back(make: Callable[[Script], tuple[Informer[NodeInfo], ApiCalls]]) -> None:
    script = Script(lists=[{"rv": "10", "items": [node("n1", "9")]}], watches=[[]])
    inf, _ = make(script)
    assert inf.wait_synced(5)
    inf.write_through(node("n1", "30", phase="lent"))  # our PATCH's answer
    inf._handle({"type": "MODIFIED", "object": node("n1", "20", phase="serving")}, "10")  # an earlier change, late
    n = inf.get("n1")
    assert n is not None and n.resource_version == "30" and n.phase is not None and n.phase.value == "lent"
    inf._handle({"type": "MODIFIED", "object": node("n1", "31", phase="reclaiming")}, "20")
    n = inf.get("n1")
    assert n is not None and n.resource_version == "31"
