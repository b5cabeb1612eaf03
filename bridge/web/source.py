"""What the web view reads, and only reads: the same adapters as ``gpu-bridge status`` (a
dry-run daemon's ``observe``), the Slurm jobs of the preemptible partition, the daemon's
``GpuBridgeJobPreempted`` Events, ``forecast``'s outlook and the daemon's metrics history.
Each reading is reused for ``web.cache_s`` (the outlook for a minute), so a burst of page
loads costs one squeue."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from bridge import logs
from bridge.adapters.kube.client import api_client_from_config
from bridge.adapters.kube.events import NodeEventReader
from bridge.adapters.kube.objects import NodeEvent
from bridge.adapters.prom.types import DaemonHistory, PromPool
from bridge.adapters.slurm.types import SlurmJobInfo
from bridge.config import Config, replace
from bridge.daemon import Daemon
from bridge.cli.daemon import status_rows
from bridge.errors import AdapterError
from bridge.cli.forecast import NoHistoryError, PoolOutlook, read_outlook
from bridge.preemption import EVENT_REASON, Preemption, parse_preemption
from bridge.wiring import Adapters, build_adapters

log = logs.get(__name__)
T = TypeVar("T")
OUTLOOK_CACHE_S = 60.0
OUTLOOK_HOURS = 24
HISTORY_CACHED = 16  # history windows kept (each ?days= value is its own reading)


def web_identity(config: Config) -> Config:
    """The config the web view's adapters use: its own kubeconfig (``web.kubeconfig``), never
    the daemon's (``kubernetes.kubeconfig``)."""
    k = replace(config.kubernetes, kubeconfig=config.web.kubeconfig)
    return replace(config, kubernetes=k)


class WebSource:
    """The read side of every page. ``adapters``: from ``build_adapters(web_identity(config),
    leader=False)`` (tests pass their own)."""

    def __init__(
        self,
        config: Config,
        adapters: Adapters,
        *,
        events: Callable[[str], tuple[NodeEvent, ...]] | None = None,
        clock: Callable[[], float] = time.time,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.adapters = adapters
        self.events = events
        self._on_close = on_close
        self.clock = clock
        # writes are refused twice: a dry-run daemon applies none, the RBAC grants none
        self._daemon = Daemon(
            config, kube=adapters.kube, slurm=adapters.slurm, prom=adapters.prom, prom_pools=adapters.prom_pools, dry_run=True,
            replicas=adapters.replicas,
        )
        self._lock = threading.Lock()  # guards the two dicts, held for no reading
        self._reading: dict[str, threading.Lock] = {}  # one reader per key (see _cached)
        self._cache: dict[str, tuple[float, Any]] = {}

    @classmethod
    def open(cls, config: Config) -> WebSource:
        """The real adapters under the web view's own identity (which the RBAC lets write
        nothing), read by a dry-run daemon (which writes nothing); no Lease."""
        web = web_identity(config)
        adapters = build_adapters(web, leader=False)
        k = web.kubernetes
        api = api_client_from_config(kubeconfig=k.kubeconfig, context=k.context, in_cluster=k.in_cluster or None)
        reader = NodeEventReader(api, request_timeout_s=k.timeout_s)
        return cls(config, adapters, events=reader.node_events, on_close=api.close)

    def close(self) -> None:
        self.adapters.close()
        if self._on_close is not None:
            self._on_close()

    def _cached(self, key: str, max_age_s: float, read: Callable[[], T], *, none_max_age_s: float | None = None) -> T:
        """Concurrent page loads of ``key`` share one reading; other keys are read meanwhile (one
        lock over all of them made the job list wait out a Prometheus query's timeout)."""
        with self._lock:
            reading = self._reading.setdefault(key, threading.Lock())
        with reading:  # a reading may use another key (the outlook counts the pool nodes), never its own
            with self._lock:
                hit = self._cache.get(key)
            now = time.monotonic()
            if hit is not None and hit[1] is None and none_max_age_s is not None:
                max_age_s = none_max_age_s
            if hit is not None and now - hit[0] < max_age_s:
                return hit[1]  # type: ignore[no-any-return]
            try:
                value = read()
            except BaseException:
                with self._lock:  # no reading kept, no lock kept (a new ?days= each time: no pile of locks)
                    if key not in self._cache:
                        self._reading.pop(key, None)
                raise
            with self._lock:
                self._cache[key] = (time.monotonic(), value)
                self._prune()
            return value

    def _prune(self) -> None:
        """At most ``HISTORY_CACHED`` history readings, the oldest dropped first: the key holds
        the client's ``days``, so without a bound every distinct value (0.1, 0.11, 0.111 ...)
        stayed in memory for the life of the process."""
        hist = sorted((t, k) for k, (t, _) in self._cache.items() if k.startswith("history:"))
        for _, k in hist[: max(0, len(hist) - HISTORY_CACHED)]:
            del self._cache[k]
            self._reading.pop(k, None)

    def now(self) -> float:
        return self.clock()

    def pool_rows(self) -> list[dict[str, Any]]:
        """``gpu-bridge status --json``'s rows."""
        return self._cached("pool", self.config.web.cache_s, lambda: status_rows(self._daemon.observe(self.clock()), self.config))

    def jobs(self) -> tuple[SlurmJobInfo, ...]:
        """Active jobs of the preemptible partition (squeue)."""
        part = self.config.slurm.preempt_partition
        return self._cached("jobs", self.config.web.cache_s, lambda: self.adapters.slurm.jobs(partition=part))

    def preemptions(self) -> tuple[Preemption, ...]:
        """Every preemption the daemon recorded as an Event (kept for the API server's --event-ttl)."""

        def read() -> tuple[Preemption, ...]:
            if self.events is None:
                return ()
            found = (parse_preemption(e.message, e.t) for e in self.events(EVENT_REASON))
            return tuple(p for p in found if p is not None)

        return self._cached("preemptions", self.config.web.cache_s, read)

    def outlook(self, pool: str) -> PoolOutlook | None:
        """``gpu-bridge forecast``'s outlook for the pool (None: no usable history yet)."""

        def read() -> PoolOutlook | None:
            cfg = self.config
            nodes = sum(1 for r in self.pool_rows() if r["pool"] == pool) or None
            try:
                return read_outlook(cfg, cfg.pool(pool), url=cfg.prometheus.url, now=self.clock(), hours=OUTLOOK_HOURS,
                                    pool_nodes=nodes, pool_nodes_source="the pool's nodes in Kubernetes")
            except NoHistoryError as exc:
                log.info("outlook_unavailable", pool=pool, reason=str(exc))
                return None

        # no history yet: asked again after web.cache_s, not a minute later
        return self._cached(f"outlook:{pool}", OUTLOOK_CACHE_S, read, none_max_age_s=self.config.web.cache_s)

    def history(self, pool: str, days: float) -> DaemonHistory:
        """The daemon's lends, reclaims, lent nodes and SLO budget over the last ``days``."""
        now = self.clock()
        step = max(60.0, round(days * 86400 / 240 / 60) * 60)  # about 240 steps, whole minutes

        def read() -> DaemonHistory:
            start = (now - days * 86400) // step * step
            return self.adapters.prom.daemon_history(PromPool.from_config(self.config.pool(pool)), start=start,
                                                     end=now // step * step, step_s=step)

        return self._cached(f"history:{pool}:{days:g}", max(self.config.web.cache_s, 10.0), read)

    def warm(self) -> None:
        """Read everything once (the first observation rebuilds the load history from
        Prometheus): the first page then answers as fast as the next."""
        try:
            self.pool_rows()
            for p in self.config.pools:
                self.outlook(p.name)
        except AdapterError as exc:
            log.warning("web_warm_up_failed", error=str(exc))
