"""Each followed pod's own vLLM server address: ``http://<pod IP>:<port>``, as on a site.

On a site every vLLM pod is a server of its own at its pod IP; gpu-bridge's warm lending calls
``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping`` there (``pools[].vllm_port``), and reads
``GET /metrics`` there while Prometheus cannot answer (``prometheus.direct_fallback``). The
simulator is one process serving every replica under ``/replicas/{name}/...``. ``PodPorts``
listens on ``(pod IP, port)`` for every pod the follower sees with an IP and answers those
routes for the replica of that pod (replica name = pod name, follow-kube mode), through the
simulator's own handler, so the answers are the same as at ``/replicas/{name}/...``; its
``/metrics`` is the simulator's exposition of that replica alone, ``vllm:*`` families only and
without the ``pod`` and ``node`` labels (Prometheus adds those when it scrapes a pod; a vLLM
server does not know them).

It can listen only on addresses local to this machine: the sandbox's kwok gives pods loopback
IPs (``127.1.0.0/16``; all of ``127.0.0.0/8`` is local on Linux). A pod whose IP cannot be
bound (another host's address) is logged and skipped: the bridge then sees its engine as not
answering, as it would an unreachable pod. A pod that is gone closes its listener, so calls to
its IP are refused, as they would be; so is a pod whose replica the lab's fault knob makes
``unreachable`` (``PUT /faults``: a dead engine's port), until the fault is cleared.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from bridge import logs
from gpu_bridge_lab.sandbox.vllm.follow_kube import PodView
from gpu_bridge_lab.sandbox.vllm.server import SLEEP_ACTIONS, SimServer, _make_handler

log = logs.get(__name__)


class PodPorts:
    """Listeners at ``(pod IP, port)`` for the pods given to ``sync`` (a ``PodTracker.on_pods``)."""

    def __init__(self, server: SimServer, port: int) -> None:
        if not 0 < port < 65536:
            raise ValueError(f"port: expected 1-65535, got {port}")
        self.server = server
        self.port = port
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one sync at a time (the follower's, a fault change's)
        self._pods: dict[str, str] = {}  # pod IP -> pod name (the replica's name)
        self._listeners: dict[str, ThreadingHTTPServer] = {}
        self._refused: set[str] = set()  # IPs that could not be bound (logged once)
        self._views: dict[str, PodView] = {}  # the pods of the last sync (re-applied when the faults change)
        self._handler = _pod_handler(server, self)
        server.sim.on_faults.append(self._faults_changed)

    def pod_at(self, ip: str) -> str | None:
        with self._lock:
            return self._pods.get(ip)

    def addresses(self) -> dict[str, str]:
        """Pod IP -> pod name, for every IP listened on."""
        with self._lock:
            return {ip: self._pods[ip] for ip in self._listeners if ip in self._pods}

    def sync(self, pods: Mapping[str, PodView]) -> None:
        """Listen at each pod's IP, stop listening at the IPs no pod has any more (or whose
        replica is ``unreachable``)."""
        with self._sync_lock:
            self._sync(pods)

    def _sync(self, pods: Mapping[str, PodView]) -> None:
        with self.server.sim.lock:
            dead = set(self.server.sim.unreachable)
        want = {pv.ip: pv.name for pv in pods.values() if pv.ip and pv.name not in dead}
        with self._lock:
            self._views = dict(pods)
            self._pods = want
            gone = [ip for ip in self._listeners if ip not in want]
            new = [ip for ip in want if ip not in self._listeners and ip not in self._refused]
            stopped = [self._listeners.pop(ip) for ip in gone]
        for httpd in stopped:
            httpd.shutdown()
            httpd.server_close()
        for pv in pods.values():
            if pv.ip and pv.name in dead and pv.ip in {str(h.server_address[0]) for h in stopped}:
                log.warning("pod_port_closed", pod=pv.name, reason=f"{pv.ip}:{self.port}: unreachable (PUT /faults)")
        for ip in new:
            try:
                httpd = ThreadingHTTPServer((ip, self.port), self._handler)
            except OSError as exc:
                with self._lock:
                    self._refused.add(ip)
                log.warning("pod_port_unavailable", pod=want[ip], reason=f"{ip}:{self.port}: {exc.strerror or exc}")
                continue
            httpd.daemon_threads = True
            threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                             name=f"vllm-sim-pod-{ip}", daemon=True).start()
            with self._lock:
                self._listeners[ip] = httpd
            log.info("pod_port_listening", pod=want[ip], reason=f"http://{ip}:{self.port}")

    def _faults_changed(self) -> None:
        """The lab's faults changed: close the addresses of replicas now unreachable, reopen the others."""
        with self._lock:
            views = dict(self._views)
        self.sync(views)

    def stop(self) -> None:
        try:
            self.server.sim.on_faults.remove(self._faults_changed)
        except ValueError:
            pass
        with self._lock:
            listeners = list(self._listeners.values())
            self._listeners.clear()
        for httpd in listeners:
            httpd.shutdown()
            httpd.server_close()


class _OnePod(Collector):
    """The simulator's ``vllm:*`` series of one replica, labelled as its own server would."""

    def __init__(self, registry: CollectorRegistry, pod: str) -> None:
        self.registry, self.pod = registry, pod

    def collect(self) -> Any:
        for fam in self.registry.collect():
            if not fam.name.startswith("vllm:"):
                continue
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples = [s._replace(labels={k: v for k, v in s.labels.items() if k not in ("pod", "node")})
                           for s in fam.samples if s.labels.get("pod") == self.pod]
            if out.samples:
                yield out


def pod_metrics(server: SimServer, pod: str) -> bytes:
    """What ``GET /metrics`` answers at ``pod``'s address."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_OnePod(server.registry, pod))
    return generate_latest(reg)


def _pod_handler(server: SimServer, ports: PodPorts) -> Any:
    base: Any = _make_handler(server)

    class PodHandler(base):  # type: ignore[misc]
        """The simulator's handler at one pod's address: its sleep routes, /health and /metrics, for
        the replica of the pod whose IP the connection arrived at."""

        def _route(self, method: str) -> None:
            parts = urlsplit(str(getattr(self, "path")))
            path = parts.path.rstrip("/") or "/"
            pod = ports.pod_at(self.connection.getsockname()[0])
            if pod is not None and path.lstrip("/") in SLEEP_ACTIONS:
                self.path = f"/replicas/{quote(pod, safe='')}{path}" + (f"?{parts.query}" if parts.query else "")
                super()._route(method)
            elif pod is not None and path in ("/health", "/healthz"):
                super()._route(method)
            elif pod is not None and path == "/metrics" and method == "GET":
                self._send(200, pod_metrics(server, pod), CONTENT_TYPE_LATEST)
            elif pod is not None:  # a route this stand-in does not serve
                self._error(404, f"no such path {path} at this pod")
            else:  # the pod is gone (a connection kept alive from before): answer, then hang up
                self.close_connection = True
                self._error(404, "no pod at this address")

    return PodHandler
