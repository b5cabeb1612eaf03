"""The daemon's own Prometheus metrics, defined once, on a registry the daemon passes around.

No metric is registered on prometheus_client's global default registry, so tests (and the
simulator) can create as many ``BridgeMetrics`` as they like. Every name starts with
``gpu_bridge_``; docs/metrics.md documents each one, and deploy/prometheus and deploy/grafana
query them by these names (tests/unit/test_metrics.py keeps the three in sync).

Only the leader records cluster facts (nodes, pools, lends, reclaims, decisions); a standby
exports ``gpu_bridge_leader 0``, its ticks and its adapter errors, so sums over instances do
not double count.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

from bridge import __version__
from bridge.model import Calibration, ClusterView, Governor, NodeState, Phase, Plan, ReclaimMode, SlurmJob, Tier
from bridge.policy.victims import saves_within_grace

# Reclaim latency is seconds (a node whose jobs checkpoint fast and a warm vLLM start) to
# many minutes (GraceTime plus a cold model load).
RECLAIM_BUCKETS_S: tuple[float, ...] = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 300, 450, 600, 900, 1200, 1800)
# The measured delays a restart rebuilds from, each at its bucket's upper bound: seconds for
# wakes, at most 15 s wide to 2 min, 30 s (the default tick, which the horizon is rounded up to
# anyway) to 10 min (grace + cold start); 38 series per pool, tier and mode.
MEASURED_DELAY_BUCKETS_S: tuple[float, ...] = (
    1, 2, 3, 5, 7, 10, 15, 20, 30, 45, 60, 75, 90, 105, 120, *range(150, 601, 30), 720, 900, 1200, 1800, 2700, 3600,
)
# One tick observes, plans and starts actions; it should take well under a second.
TICK_BUCKETS_S: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# How long a job had been running (since its current run started) when a reclaim preempted it:
# the first buckets count jobs preempted within minutes of (re)starting.
RUNTIME_BUCKETS_S: tuple[float, ...] = (30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 48 * 3600)
API_BUCKETS_S: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

SYSTEMS: tuple[str, ...] = ("slurm", "kubernetes", "prometheus", "vllm")  # vllm: warm lending, direct reads
_M = TypeVar("_M", Counter, Gauge, Histogram)


class BridgeMetrics:
    """All of gpu-bridge's metrics on one registry; the attributes are the prometheus_client
    objects (for direct use) and the ``record_*`` methods are what the daemon calls."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Info("gpu_bridge_build", "Version of the running gpu-bridge.", registry=r)
        self.build_info.info({"version": __version__})

        # --- nodes and pools (leader only) -------------------------------------------------
        self.nodes = self._pool(Gauge, "gpu_bridge_nodes", "Nodes of each pool by lifecycle phase.", "phase")
        self.nodes_held = self._pool(
            Gauge, "gpu_bridge_nodes_held",
            "Nodes the daemon refuses to move (pinned, administrator drain, bad state).")
        self.demand = self._pool(
            Gauge, "gpu_bridge_pool_demand_replicas",
            "Serving replicas the current load needs (NaN: signals missing or stale).")
        self.forecast = self._pool(
            Gauge, "gpu_bridge_pool_forecast_peak_replicas",
            "Serving replicas needed at the peak of the forecast horizon.")
        self.lendable_forecast = self._pool(
            Gauge, "gpu_bridge_pool_lendable_nodes_forecast",
            "Nodes expected lendable in the clock hour hours_ahead from now (0 = this hour); NaN: no history for it.",
            "hours_ahead")
        self.demand_forecast = self._pool(
            Gauge, "gpu_bridge_pool_demand_forecast_replicas",
            "Serving replicas the forecast expects at the peak of the clock hour hours_ahead; NaN: no history for it.",
            "hours_ahead")
        self.serving_ready = self._pool(
            Gauge, "gpu_bridge_pool_serving_ready_replicas", "Ready serving replicas of the pool's Deployment.")
        self.desired_serving = self._pool(
            Gauge, "gpu_bridge_pool_desired_serving_nodes", "Serving nodes the policy wants in the pool.")
        self.min_serving = self._pool(
            Gauge, "gpu_bridge_pool_min_serving_nodes",
            "Configured floor of serving nodes (alerts compare Ready with it).")
        self.reclaim_budget = self._pool(
            Gauge, "gpu_bridge_pool_reclaim_budget_seconds",
            "Configured reclaim latency budget (alerts compare with it).")
        self.planned_horizon = self._pool(
            Gauge, "gpu_bridge_pool_planned_horizon_seconds",
            "Reclaim horizon the policy plans with: configured delays, or a high quantile of measured ones.")
        self.calibrated_margin = self._pool(
            Gauge, "gpu_bridge_pool_calibrated_margin",
            "Safety margin calibrated on the pool's history to spend its SLO budget (NaN: not enough history).")
        self.slo_budget_spent = self._pool(
            Gauge, "gpu_bridge_pool_slo_budget_spent_ratio",
            "Avoidable minutes with demand above Ready replicas in the calibration window, over what the budget allows.")
        self.slo_budget_left = self._pool(
            Gauge, "gpu_bridge_pool_slo_budget_left_minutes",
            "The governor's SLO budget left over its rolling window (policy.governor.window_s): "
            "budget minus avoidable violation minutes.")
        self.slo_incident = self._pool(
            Gauge, "gpu_bridge_pool_slo_incident_minutes",
            "Minutes one incident could cost from now (every lent node reclaimed); "
            "lending is held while the budget left is below it.")
        self.reclaim_in_progress = self._pool(
            Gauge, "gpu_bridge_pool_reclaim_in_progress_seconds",
            "Age of the oldest reclaim still under way (node reclaiming or returning); 0 when none.")
        self.signal_staleness = self._pool(
            Gauge, "gpu_bridge_pool_signal_staleness_seconds", "Age of the newest vLLM load sample the policy used.")

        # --- transitions (leader only) -------------------------------------------------------
        self.lent_gpu_hours = self._pool(
            Counter, "gpu_bridge_lent_gpu_hours",
            "GPU-hours the pool's nodes spent lent to Slurm.")
        self.lends = self._pool(Counter, "gpu_bridge_lends", "Nodes lent to Slurm (lend completed).")
        self.reclaims = self._pool(
            Counter, "gpu_bridge_reclaims", "Nodes reclaimed for serving (reclaim completed), by reason.", "reason")
        self.reclaim_failures = self._pool(
            Counter, "gpu_bridge_reclaim_failures", "Reclaims abandoned (node never became Ready in time), by reason.",
            "reason")
        self.lend_failures = self._pool(
            Counter, "gpu_bridge_lend_failures",
            "Lends abandoned (the serving pod outlived policy.lend_timeout_s), by reason.", "reason")
        self.reclaim_latency = self._pool(
            Histogram, "gpu_bridge_reclaim_duration_seconds",
            "From the load change that called for a node to its Ready replica, by the tier the node was lent to "
            "and mode (warm: its replica woken, cold: cold-started).",
            "tier", "mode", buckets=RECLAIM_BUCKETS_S)
        self.reclaim_phase_latency = self._pool(
            Histogram, "gpu_bridge_reclaim_phase_duration_seconds",
            "Reclaim latency by phase: detection, slurm_release, kubernetes_ready; tier (normal, fast) and mode (warm, cold).",
            "phase", "tier", "mode", buckets=RECLAIM_BUCKETS_S)
        self.measured_delay = self._pool(
            Histogram, "gpu_bridge_reclaim_measured_delay_seconds",
            "Measured reclaims, decision to Ready replica: the delays the reclaim horizon uses (rebuilt from here at start).",
            "tier", "mode", buckets=MEASURED_DELAY_BUCKETS_S)
        self.preempted_jobs = self._pool(
            Counter, "gpu_bridge_preempted_jobs",
            "Slurm jobs preempted (requeued) by reclaims.")
        self.preempted_runtime = self._pool(
            Histogram, "gpu_bridge_preempted_job_runtime_seconds",
            "How long a job preempted by a reclaim had been running since its current run started; "
            "rerun=yes: it had been requeued before.",
            "rerun", buckets=RUNTIME_BUCKETS_S)
        self.lost_gpu_hours = self._pool(
            Counter, "gpu_bridge_lost_gpu_hours",
            "GPU-hours of research work lost by preemption (since each job's last published checkpoint).")
        self.slurm_repairs = self._pool(
            Counter, "gpu_bridge_slurm_repairs",
            "What gpu-bridge undid of Slurm's own reactions to a controller crash: job_released (a job Slurm "
            "held after a failed launch), clear_slurm_drain / take_over_drain (Slurm's own drain on a node).",
            "kind")
        self.lent_unusable = self._pool(
            Gauge, "gpu_bridge_lent_nodes_unusable",
            "Nodes in phase lent that Slurm cannot use (drained by someone else, or down).")
        self.decisions = Counter(
            "gpu_bridge_decisions", "Policy decisions by action (lend, reclaim, hold) and reason code.",
            ["action", "reason"], registry=r,
        )

        # --- the daemon itself (every instance) -----------------------------------------------
        self.adapter_errors = Counter(
            "gpu_bridge_adapter_errors", "Failed calls to an outside system.", ["system"], registry=r)
        self.api_calls = Counter(
            "gpu_bridge_api_calls", "Calls to an outside system by verb.", ["system", "verb"], registry=r)
        self.api_call_latency = Histogram(
            "gpu_bridge_api_call_duration_seconds", "Latency of calls to an outside system.", ["system"],
            buckets=API_BUCKETS_S, registry=r,
        )
        self.tick_duration = Histogram(
            "gpu_bridge_tick_duration_seconds", "Duration of one observe-plan-act tick.", buckets=TICK_BUCKETS_S, registry=r,
        )
        self.last_successful_tick = Gauge(
            "gpu_bridge_last_successful_tick_timestamp_seconds", "Unix time of the last tick that completed.", registry=r,
        )
        self.leader = Gauge("gpu_bridge_leader", "1 while this instance holds the leader Lease, else 0.", registry=r)
        self.dry_run = Gauge("gpu_bridge_dry_run", "1 when the instance plans without acting (--dry-run).", registry=r)
        self.leader.set(0)
        self.dry_run.set(0)
        for system in SYSTEMS:  # so rate() sees a zero before the first error
            self.adapter_errors.labels(system=system)

        self._lock = threading.Lock()
        self._last_view_t: float | None = None

    def _pool(self, kind: type[_M], name: str, doc: str, *labels: str, **kw: Any) -> _M:
        """A metric of this registry labelled by pool (then ``labels``)."""
        return kind(name, doc, ["pool", *labels], registry=self.registry, **kw)

    # --- what the daemon calls -------------------------------------------------------------------
    def record_view(self, view: ClusterView) -> None:
        """Nodes by pool and phase (every phase, zeros included), held nodes, Ready replicas,
        the age of the oldest reclaim under way (from the nodes' phase-since), signal staleness;
        and lent GPU-hours accrued since the previous call (by the nodes lent now)."""
        pools = sorted({n.pool for n in view.nodes} | set(view.pools))
        for pool in pools:
            members = [n for n in view.nodes if n.pool == pool]
            for phase in Phase:
                self.nodes.labels(pool=pool, phase=phase.value).set(sum(1 for n in members if n.phase is phase))
            self.nodes_held.labels(pool=pool).set(sum(1 for n in members if n.problem is not None or n.pin is not None))
            self.lent_unusable.labels(pool=pool).set(
                sum(1 for n in members if n.phase is Phase.LENT and n.slurm_state in ("drained", "draining", "down"))
            )
            ages = [view.now - n.phase_since for n in members if n.phase in (Phase.RECLAIMING, Phase.RETURNING)]
            self.reclaim_in_progress.labels(pool=pool).set(max([0.0, *ages]))
        for name, state in view.pools.items():
            self.serving_ready.labels(pool=name).set(state.ready_replicas)
            s = state.signals
            values = () if s is None else (s.running, s.waiting, s.kv_cache_usage_sum, s.tokens_per_s)
            age = max(0.0, view.now - s.t) if s is not None and any(v is not None for v in values) else float("inf")
            self.signal_staleness.labels(pool=name).set(age)
        with self._lock:
            last, self._last_view_t = self._last_view_t, view.now
        if last is not None and view.now > last:
            self._accrue_lent(view.nodes, view.now - last)

    def _accrue_lent(self, nodes: Iterable[NodeState], dt_s: float) -> None:
        for node in nodes:
            if node.phase is Phase.LENT:
                self.lent_gpu_hours.labels(pool=node.pool).inc(node.gpus * dt_s / 3600.0)

    def record_plan(self, plan: Plan) -> None:
        """Per-pool demand/forecast/desired gauges and one decision count per action and held node."""
        for d in plan.pools:
            self.demand.labels(pool=d.pool).set(float("nan") if d.demand_now is None else d.demand_now)
            self.forecast.labels(pool=d.pool).set(float("nan") if d.forecast_peak is None else d.forecast_peak)
            self.desired_serving.labels(pool=d.pool).set(d.desired_serving)
        for action in plan.actions:
            self.decisions.labels(action=action.kind.value, reason=action.reason).inc()
        for _node, why in plan.held.items():
            self.decisions.labels(action="hold", reason=_reason_code(why)).inc()

    def record_outlook(self, pool: str, outlook: Iterable[Any] | None, hours: int) -> None:
        """The lendable-capacity outlook (``bridge.policy.outlook.lendable_outlook``); None
        (history unavailable) sets every hour to NaN, never to 0 nodes or 0 demand."""
        rows = list(outlook) if outlook is not None else []
        for k in range(hours):
            h = rows[k] if k < len(rows) else None
            lend = h.lendable_nodes if h is not None and h.lendable_nodes is not None else float("nan")
            dem = h.demand if h is not None and h.demand is not None else float("nan")
            self.lendable_forecast.labels(pool=pool, hours_ahead=str(k)).set(lend)
            self.demand_forecast.labels(pool=pool, hours_ahead=str(k)).set(dem)

    def record_settings(self, *, pool: str, min_serving: int, reclaim_budget_s: float) -> None:
        """Configured thresholds, exported so alert rules need no copy of the config; the
        measured delays' series at zero, so ``increase()`` counts a new series' first reclaim."""
        self.min_serving.labels(pool=pool).set(min_serving)
        self.reclaim_budget.labels(pool=pool).set(reclaim_budget_s)
        for tier in Tier:
            for mode in ReclaimMode:
                self.measured_delay.labels(pool=pool, tier=str(tier), mode=str(mode))

    def record_horizon(self, *, pool: str, horizon_s: float) -> None:
        """The reclaim horizon the policy plans with (the slow-reclaim alert compares with it)."""
        self.planned_horizon.labels(pool=pool).set(horizon_s)

    def record_calibration(self, *, pool: str, calibration: Calibration) -> None:
        """The calibrated margin and the share of the SLO budget spent over its window."""
        m = calibration.margin
        self.calibrated_margin.labels(pool=pool).set(float("nan") if m is None else m)
        self.slo_budget_spent.labels(pool=pool).set(calibration.spent / max(calibration.allowed, 1e-9))

    def record_governor(self, *, pool: str, governor: Governor) -> None:
        """The budget left over the governor's window and one incident's minutes (the alert
        and the dashboard compare them)."""
        self.slo_budget_left.labels(pool=pool).set(governor.left_min)
        self.slo_incident.labels(pool=pool).set(governor.incident_min)

    def record_lend(self, pool: str) -> None:
        self.lends.labels(pool=pool).inc()

    def record_reclaim(
        self, *, pool: str, reason: str, detection_s: float, slurm_release_s: float, kubernetes_ready_s: float,
        tier: str = "normal", mode: str = "cold",
    ) -> None:
        """A completed reclaim: total latency is the sum of its three phases; ``tier``: the
        partition tier the node was lent to (its grace bounds ``slurm_release``); ``mode``: warm
        when its replica was woken, cold when one cold-started (bounds ``kubernetes_ready``)."""
        phases = {"detection": detection_s, "slurm_release": slurm_release_s, "kubernetes_ready": kubernetes_ready_s}
        for phase, seconds in phases.items():
            if seconds < 0:
                raise ValueError(f"record_reclaim: {phase}_s must be >= 0, got {seconds}")
            self.reclaim_phase_latency.labels(pool=pool, phase=phase, tier=tier, mode=mode).observe(seconds)
        self.reclaim_latency.labels(pool=pool, tier=tier, mode=mode).observe(sum(phases.values()))
        self.reclaims.labels(pool=pool, reason=reason).inc()

    def record_measured_delay(self, *, pool: str, seconds: float, tier: str, mode: str) -> None:
        """A measured reclaim, the value ``PoolMemory.add_delay`` got (``policy_memory`` reads it back)."""
        self.measured_delay.labels(pool=pool, tier=tier, mode=mode).observe(seconds)

    def record_slurm_repair(self, *, kind: str, pool: str) -> None:
        self.slurm_repairs.labels(pool=pool, kind=kind).inc()

    def record_lend_failure(self, *, pool: str, reason: str) -> None:
        self.lend_failures.labels(pool=pool, reason=reason).inc()

    def record_reclaim_failure(self, *, pool: str, reason: str) -> None:
        self.reclaim_failures.labels(pool=pool, reason=reason).inc()

    def record_preemption(self, *, pool: str, job: SlurmJob, now: float, grace_s: float | None = None) -> float:
        """A job requeued by a reclaim; returns (and counts) the GPU-hours of work it loses:
        since its last published checkpoint, or since its start when it published none;
        nothing if it checkpoints on the preemption signal within ``grace_s``."""
        self.preempted_jobs.labels(pool=pool).inc()
        if job.start_time is not None and now >= job.start_time:
            rerun = "yes" if job.restart_count > 0 else "no"
            self.preempted_runtime.labels(pool=pool, rerun=rerun).observe(now - job.start_time)
        lost = 0.0
        saves = saves_within_grace(job, grace_s)
        since = job.checkpoint_time if job.checkpoint_time is not None else job.start_time
        if not saves and since is not None and now > since:
            lost = (now - since) * job.gpus_per_node * max(1, len(job.nodes)) / 3600.0
        self.lost_gpu_hours.labels(pool=pool).inc(lost)
        return lost

    @contextmanager
    def api_call(self, system: str, verb: str) -> Iterator[None]:
        """Count and time one call; an exception counts as an adapter error and propagates."""
        self.api_calls.labels(system=system, verb=verb).inc()
        t0 = time.monotonic()
        try:
            yield
        except Exception:
            self.adapter_errors.labels(system=system).inc()
            raise
        finally:
            self.api_call_latency.labels(system=system).observe(time.monotonic() - t0)

    def record_tick(self, *, duration_s: float, ok: bool, now: float) -> None:
        self.tick_duration.observe(duration_s)
        if ok:
            self.last_successful_tick.set(now)

    def set_leader(self, is_leader: bool) -> None:
        self.leader.set(1 if is_leader else 0)

    def set_dry_run(self, dry_run: bool) -> None:
        self.dry_run.set(1 if dry_run else 0)


class NullMetrics:
    """Metrics no one serves (``status``, ``plan``, the web view): every call is a no-op."""

    def __getattr__(self, _name: str) -> Any:
        return self

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        return self


def _reason_code(text: str) -> str:
    """Held-node reasons are sentences; keep label cardinality bounded with their first word."""
    word = text.strip().split(" ", 1)[0].split(":", 1)[0] if text.strip() else "unknown"
    code = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in word.lower())[:40]
    return code or "unknown"


@dataclass
class MetricsServer:
    """A running /metrics HTTP endpoint; ``port`` is the bound port (useful with port 0)."""

    port: int
    addr: str
    _server: object
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()  # type: ignore[attr-defined]
        self._thread.join(timeout=5)


METRICS_PATH = "/metrics"
CLIENT_TIMEOUT_S = 10.0  # a scrape sends its request at once; a client silent this long is dropped
MAX_CLIENTS = 128  # connections served at once (a thread each); more are closed unanswered

_WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def serve(registry: CollectorRegistry, *, port: int, addr: str = "127.0.0.1", timeout_s: float = CLIENT_TIMEOUT_S,
          max_clients: int = MAX_CLIENTS) -> MetricsServer:
    """Serve ``registry`` at http://addr:port/metrics in a daemon thread; port 0 picks a free one.
    Not prometheus_client's ``start_http_server``: it answered every path with the metrics, named
    the Python version in ``Server``, and gave each connection a thread for as long as the client
    kept it open, with no bound (slow clients could pile up the daemon's threads)."""
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
    server = _Server(addr, port, family=family, timeout_s=timeout_s, max_clients=max_clients)
    server.set_app(_metrics_only(make_wsgi_app(registry)))
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(port=int(server.server_address[1]), addr=addr, _server=server, _thread=thread)


def _metrics_only(app: _WSGIApp) -> _WSGIApp:
    """/metrics only (any other path is a 404), HEAD as GET without the body, and a ``Server``
    header naming no version (wsgiref's adds its own and Python's otherwise)."""

    def serve_metrics(environ: dict[str, Any], respond: Callable[..., Any]) -> Iterable[bytes]:
        def start_response(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            return respond(status, [*headers, ("Server", _Handler.server_version)], *exc_info)

        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"# HTTP 404: only {METRICS_PATH} is served here\n".encode()]
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        got: list[Any] = []
        body = b"".join(app({**environ, "REQUEST_METHOD": "GET"}, lambda status, headers, *_: got.extend((status, headers))))
        start_response(got[0], [*got[1], ("Content-Length", str(len(body)))])
        return []

    return serve_metrics


class _Handler(WSGIRequestHandler):
    """No access log, no Python version in ``Server`` (the errors it answers itself, 400 and
    414, included); a client too slow to send its request or read the answer is dropped."""

    server_version = "gpu-bridge"

    def version_string(self) -> str:
        return self.server_version

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # timed out or reset by the client: nothing left to answer
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class _Server(ThreadingWSGIServer):
    """A thread per connection, at most ``max_clients`` at once (one more is closed at once),
    each connection's socket with a ``timeout_s`` timeout."""

    def __init__(self, addr: str, port: int, *, family: int, timeout_s: float, max_clients: int) -> None:
        self.address_family = family
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_clients)
        super().__init__((addr, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            request.settimeout(self.timeout_s)
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def metric_names(registry: CollectorRegistry) -> Mapping[str, str]:
    """Exposed sample-family names -> type, as Prometheus sees them (counters get ``_total``)."""
    out: dict[str, str] = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        name = name + ("_info" if family.type == "info" else "")
        out[name] = family.type
    return out
