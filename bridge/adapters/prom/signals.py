"""Prometheus adapter: the vLLM load signals of each pool, now and over a past window.

Thin on purpose: build one PromQL query per pool, send it with ``PrometheusConnect`` (with a
timeout, no retries: the daemon's next tick is the retry), parse and validate the result.

One query per pool and instant, a union (``or``) of terms each tagged with a ``bridge_q``
label, so every signal is evaluated at the same instant in one round trip:

- ``value:<metric>``: each gauge per series (running, waiting, V1 and V0 KV-cache usage);
- ``ts:<metric>``: ``timestamp(<metric>{...})``, the sample's own time, for staleness;
- ``rate:prompt`` / ``rate:generation``: ``rate(<counter>{...}[w])`` per series.

Validation, fail closed: a signal whose series include one that is stale (sample older than
``staleness_s``), NaN, infinite or negative (KV usage also > 1) becomes None, with the reason
in ``SignalsReading.problems``; a signal with no series at all is None too. A partial sum is
never reported, since it would read as less load than there is. A failed query raises
AdapterError: never "no load".

Only the pool's own series count: the query matches ``model_name``, the pool's namespace (on
``PromPool.namespace_label``) and the configured matchers; the current reading further drops
every series whose ``pod`` is not one of the pool's pods in Kubernetes (``own_pods_only``), so
another workload exporting ``vllm:*{model_name=...}`` (NaN, or any value) can neither blind
nor steer the pool. Dropped series are listed in ``SignalsReading.ignored``.

An https Prometheus is always verified (``PromAccess``: a CA bundle, a client certificate, a
bearer token); there is no switch to turn verification off.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit
from typing import Any, Literal, TypeVar

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from bridge import logs
from bridge.errors import AdapterError
from bridge.model import LoadSignals

from .gpu import build_gpu_query, parse_gpu_free
from .history import (
    MAX_RANGE_POINTS, REQUEST_CHUNK_STEPS, build_daemon_query, build_delay_query, build_request_query, parse_daemon_history,
    parse_delay_buckets, parse_request_range,
)
from .types import (
    ERROR_CAP, GAUGES, GENERATION, KV_V0, KV_V1, POD_LABEL, PROMPT, RUNNING, TAG, WAITING, DaemonHistory, DelayCount, PromPool,
    RequestHistory, SignalsReading, _bad, _describe, _escape, _float, _pod_key, _replica_key, _tag, _window, selector,
)

log = logs.get(__name__)
T = TypeVar("T")
BODY_CAP = 64 * 1024 * 1024
"""Most bytes of one Prometheus answer (decoded). A 28-day range read of a large pool is a few
MB; a proxy or a broken server sending more is refused rather than held whole in memory."""


@dataclass(frozen=True, slots=True)
class PromAccess:
    """How to reach an https Prometheus: ``ca_file`` a PEM bundle that verifies its
    certificate (None = the system's CAs; verification is never off), ``cert_file`` /
    ``key_file`` a client certificate, ``bearer_token`` sent as ``Authorization: Bearer``."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    bearer_token: str | None = field(default=None, repr=False)

    def session(self) -> requests.Session:
        s = requests.Session()
        s.verify = self.ca_file or True
        if self.cert_file:
            s.cert = (self.cert_file, self.key_file) if self.key_file else self.cert_file
        if self.bearer_token:
            s.headers["Authorization"] = f"Bearer {self.bearer_token}"
        s.hooks["response"].append(_read_capped)
        return s


def _read_capped(resp: requests.Response, *_args: Any, **kwargs: Any) -> requests.Response:
    """Read the answer's body here, at most ``BODY_CAP`` bytes: the hook runs before requests
    would read it all (``prometheus_api_client`` sends no ``stream``), and what it keeps is the
    body the client parses."""
    if kwargs.get("stream"):
        return resp
    body = resp.raw.read(BODY_CAP + 1, decode_content=True)
    if len(body) > BODY_CAP:
        resp.close()
        raise requests.RequestException(f"answer larger than {BODY_CAP} bytes (HTTP {resp.status_code})")
    resp._content = body  # what requests' own read leaves (its attributes since 2012)
    resp._content_consumed = True  # type: ignore[attr-defined]
    return resp


# --- query building ---------------------------------------------------------------------------


def build_query(pool: PromPool, *, rate_window_s: float, gauge_window_s: float | None = None) -> str:
    """The one query of a pool. ``gauge_window_s`` set = each gauge as ``max_over_time`` over
    that window (history: the peak of each step) and no timestamps."""
    sel = selector(pool)
    terms = []
    for g in GAUGES:
        expr = f"{g}{{{sel}}}" if gauge_window_s is None else f"max_over_time({g}{{{sel}}}[{_window(gauge_window_s)}])"
        terms.append(_tag(expr, f"value:{g}"))
    if gauge_window_s is None:
        terms += [_tag(f"timestamp({g}{{{sel}}})", f"ts:{g}") for g in GAUGES]
    w = _window(rate_window_s)
    terms.append(_tag(f"rate({PROMPT}{{{sel}}}[{w}])", "rate:prompt"))
    terms.append(_tag(f"rate({GENERATION}{{{sel}}}[{w}])", "rate:generation"))
    return "\n  or ".join(terms)


# --- result parsing ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Step:
    """Everything the query returned for one evaluation instant, keyed by replica."""

    values: dict[str, dict[frozenset[tuple[str, str]], float]] = field(default_factory=dict)
    stamps: dict[str, dict[frozenset[tuple[str, str]], float]] = field(default_factory=dict)
    # (metric, replica) given more than once: which sample is the reading? (the last one won)
    twice: set[tuple[str, frozenset[tuple[str, str]]]] = field(default_factory=set)

    def put(self, table: dict[str, dict[frozenset[tuple[str, str]], float]], name: str,
            key: frozenset[tuple[str, str]], value: float) -> None:
        series = table.setdefault(name, {})
        if key in series:
            self.twice.add((name, key))
        series[key] = value


class _Signal:
    """One signal's valid values grouped by replica, or the reason it cannot be trusted."""

    def __init__(self) -> None:
        self.by_replica: dict[frozenset[tuple[str, str]], list[float]] = {}
        self.problem: str | None = None

    def add(self, key: frozenset[tuple[str, str]], value: float, what: str, *, upper: float | None = None) -> None:
        why = _bad(value, upper=upper)
        if why is not None:
            self.problem = self.problem or f"{what} {why}"
            return
        self.by_replica.setdefault(_pod_key(key), []).append(value)

    @property
    def replicas(self) -> int:
        return len(self.by_replica)

    def result(self, empty: str, *, mean_per_replica: bool = False) -> float | None:
        """The sum over replicas (of each replica's mean over its engines if asked)."""
        if self.problem is None and not self.by_replica:
            self.problem = empty
        if self.problem is not None:
            return None
        if mean_per_replica:
            total = sum(sum(v) / len(v) for v in self.by_replica.values())
        else:
            total = sum(sum(v) for v in self.by_replica.values())
        if not math.isfinite(total):  # finite values (1e308 each) whose sum overflows: said, not a bare inf
            self.problem = f"the sum over {len(self.by_replica)} replicas is not a finite number (each value finite)"
            return None
        return total


def signals_from_step(step: _Step, *, t: float, staleness_s: float | None, check_timestamps: bool,
                      live_pods: Collection[str] | None = None, dropped: list[str] | None = None,
                      inflight: dict[str, float] | None = None) -> tuple[LoadSignals, dict[str, str]]:
    """Validate and sum one instant's series into LoadSignals (pure).

    A stale series fails its signal (fail closed), except when ``live_pods`` is given and the
    series' ``pod`` label names none of them: a pod deleted while Prometheus could not
    scrape (or was down) gets no staleness marker, so its last sample lingers for the lookback
    delta (5 min). Such a series is dropped (named in ``dropped``); the pool's own pods still
    have to report, or ``replicas_reporting < Ready`` blocks lending. ``inflight``, if given,
    receives running + waiting per pod (see ``SignalsReading.inflight_by_pod``)."""
    problems: dict[str, str] = {}

    def gauge(metric: str, replicas: Iterable[frozenset[tuple[str, str]]], *, upper: float | None = None, sig: _Signal | None = None) -> _Signal:
        sig = sig or _Signal()
        values = step.values.get(metric, {})
        stamps = step.stamps.get(metric, {})
        for key in replicas:
            what = f"{metric}{_describe(key)}"
            if check_timestamps and staleness_s is not None:
                ts = stamps.get(key)
                if ts is None:
                    sig.problem = sig.problem or f"{what} has no sample timestamp"
                    continue
                if not math.isfinite(ts):  # garbage is never read as "fresh"
                    sig.problem = sig.problem or f"{what} has an invalid sample timestamp ({ts})"
                    continue
                age = t - ts
                if age > staleness_s and live_pods is not None and _gone(key, live_pods):
                    if dropped is not None:
                        dropped.append(f"{what}: stale ({age:.0f} s) and its pod no longer exists")
                    continue
                if age > staleness_s:
                    sig.problem = sig.problem or f"{what} is stale: last sample {age:.0f} s old (limit {staleness_s:g} s)"
                    continue
            if (metric, key) in step.twice:
                sig.problem = sig.problem or f"{what} appears more than once in one answer"
                continue
            sig.add(key, values[key], what, upper=upper)
        return sig

    running = gauge(RUNNING, sorted(step.values.get(RUNNING, {}), key=_describe))
    waiting = gauge(WAITING, sorted(step.values.get(WAITING, {}), key=_describe))
    v1 = step.values.get(KV_V1, {})
    replicas_v1 = {_pod_key(k) for k in v1}
    v0_only = [k for k in step.values.get(KV_V0, {}) if _pod_key(k) not in replicas_v1]
    kv = gauge(KV_V1, sorted(v1, key=_describe), upper=1.0)
    kv = gauge(KV_V0, sorted(v0_only, key=_describe), upper=1.0, sig=kv)

    tokens = _Signal()
    for name, tag in ((PROMPT, "rate:prompt"), (GENERATION, "rate:generation")):
        series = step.values.get(tag, {})
        if not series and tokens.problem is None:
            tokens.problem = f"no series of {name}"
        for key in sorted(series, key=_describe):
            if (tag, key) in step.twice:
                tokens.problem = tokens.problem or f"rate({name}{_describe(key)}) appears more than once in one answer"
                continue
            tokens.add(key, series[key], f"rate({name}{_describe(key)})")

    r = running.result(f"no series of {RUNNING}")
    w = waiting.result(f"no series of {WAITING}")
    k = kv.result(f"no series of {KV_V1} or {KV_V0}", mean_per_replica=True)
    tok = tokens.result(f"no series of {PROMPT} / {GENERATION}")
    for name, sig in (("running", running), ("waiting", waiting), ("kv_cache_usage_sum", kv), ("tokens_per_s", tokens)):
        if sig.problem is not None:
            problems[name] = sig.problem
    if inflight is not None and r is not None and w is not None:
        for sig in (running, waiting):
            for key, values in sig.by_replica.items():
                pod = dict(key).get(POD_LABEL)
                if pod is not None:
                    inflight[pod] = inflight.get(pod, 0.0) + sum(values)
    # How many replicas the sums cover: those in the KV sum when it is known, else those in running.
    reporting = kv.replicas if k is not None else (running.replicas if r is not None else 0)
    return LoadSignals(t=t, running=r, waiting=w, kv_cache_usage_sum=k, tokens_per_s=tok, replicas_reporting=reporting), problems


def _gone(key: frozenset[tuple[str, str]], live_pods: Collection[str]) -> bool:
    """The series names a pod (label ``pod``) that Kubernetes no longer has."""
    pod = dict(key).get(POD_LABEL)
    return pod is not None and pod not in live_pods


def _absorb(step: _Step, metric: Mapping[str, str], raw: Any, pool: PromPool, ignored: set[str],
            own_pods: Collection[str] | None = None) -> None:
    tag = metric.get(TAG, "")
    key = _replica_key(metric)
    why = pool.foreign(metric)
    if why is None and own_pods is not None and metric.get(POD_LABEL) not in own_pods:
        pod = metric.get(POD_LABEL)
        why = "no pod label" if pod is None else f"pod {pod!r} is not one of the pool's pods"
    if why is not None:
        ignored.add(f"{tag} {_describe(key)}: {why}")
        return
    if tag.startswith("value:"):
        step.put(step.values, tag[len("value:") :], key, _float(raw))
    elif tag.startswith("ts:"):
        step.put(step.stamps, tag[len("ts:") :], key, _float(raw))
    elif tag.startswith("rate:"):
        step.put(step.values, tag, key, _float(raw))


def parse_instant(result: Sequence[Mapping[str, Any]], *, pool: PromPool, staleness_s: float, at: float | None,
                  live_pods: Collection[str] | None = None) -> SignalsReading:
    """An instant-query result (a vector) -> SignalsReading (pure). ``live_pods``: the
    pool's pods in Kubernetes (see ``signals_from_step``); None = every stale series counts.
    With ``pool.own_pods_only`` and ``live_pods`` given, only series of those pods count."""
    step = _Step()
    ignored: set[str] = set()
    t = at
    own = live_pods if pool.own_pods_only else None
    for item in result:
        metric = item.get("metric") or {}
        ts, raw = item["value"]
        t = float(ts) if t is None else t
        _absorb(step, metric, raw, pool, ignored, own)
    if t is None:
        raise ValueError("an empty result needs the evaluation time")
    dropped: list[str] = []
    inflight: dict[str, float] = {}
    signals, problems = signals_from_step(step, t=t, staleness_s=staleness_s, check_timestamps=True,
                                          live_pods=live_pods, dropped=dropped, inflight=inflight)
    return SignalsReading(pool=pool.name, signals=signals, problems=problems,
                          ignored=tuple(sorted(ignored | set(dropped))), inflight_by_pod=inflight)


def parse_range(result: Sequence[Mapping[str, Any]], *, pool: PromPool, start: float, end: float, step_s: float) -> tuple[LoadSignals, ...]:
    """A range-query result (a matrix) -> one LoadSignals per step, oldest first (pure).
    Steps where nothing was recorded come out with every signal None."""
    n = int(math.floor((end - start) / step_s + 1e-9)) + 1
    steps = [_Step() for _ in range(n)]
    ignored: set[str] = set()
    for item in result:
        metric = item.get("metric") or {}
        for ts, raw in item.get("values") or ():
            i = round((float(ts) - start) / step_s)
            if 0 <= i < n:
                _absorb(steps[i], metric, raw, pool, ignored)
    out = [signals_from_step(st, t=start + i * step_s, staleness_s=None, check_timestamps=False)[0] for i, st in enumerate(steps)]
    return tuple(out)


def _parsed(kind: str, pool: PromPool, parse: Callable[[], T]) -> T:
    """``parse()`` of a ``kind`` result; a result of an unexpected shape is an AdapterError."""
    try:
        return parse()
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ArithmeticError) as e:  # OverflowError: int(inf)
        raise AdapterError("prometheus", f"pool {pool.name}: unexpected {kind} result: {str(e)[:ERROR_CAP]}") from None


# --- the adapter ------------------------------------------------------------------------------


class PromAdapter:
    """Queries one Prometheus. ``staleness_s``: a gauge sample older than this is not used.
    ``scrape_interval_s``: history gauge windows span at least two scrapes, so a step shorter
    than the scrape interval still sees a sample."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, staleness_s: float = 60.0, rate_window_s: float = 60.0,
                 scrape_interval_s: float = 15.0, access: PromAccess | None = None,
                 client: PrometheusConnect | None = None) -> None:
        self.url = url
        self.scrape_interval_s = scrape_interval_s
        self.timeout_s = timeout_s
        self.staleness_s = staleness_s
        self.rate_window_s = rate_window_s
        access = access or PromAccess()
        self._secrets = [x for x in (access.bearer_token, urlsplit(url).password) if x]
        self._client = client or PrometheusConnect(url=url, session=access.session(), timeout=timeout_s, retry=Retry(total=0))
        self._lock = threading.Lock()
        self._queries: Counter[str] = Counter()  # "query" | "query_range" -> count
        self._failures: Counter[str] = Counter()

    def calls(self) -> dict[str, int]:
        with self._lock:
            return dict(self._queries)

    def failures(self) -> dict[str, int]:
        with self._lock:
            return dict(self._failures)

    def current(self, pool: PromPool, *, at: float | None = None, live_pods: Collection[str] | None = None) -> SignalsReading:
        """The pool's signals at ``at`` (unix s; None = Prometheus' now). ``live_pods``: the
        pool's pods in Kubernetes, so a deleted pod's lingering stale series is dropped."""
        query = build_query(pool, rate_window_s=self.rate_window_s)
        params = {"time": f"{at:.3f}"} if at is not None else {}
        result = self._query(query, pool, params)
        if not result and at is None:
            at = datetime.now(UTC).timestamp()
        reading = _parsed("query", pool, lambda: parse_instant(result, pool=pool, staleness_s=self.staleness_s, at=at, live_pods=live_pods))
        if reading.problems:
            # the series left out say why, e.g. a Prometheus without the namespace or pod label
            log.info("signals_incomplete", pool=pool.name, problems=dict(reading.problems), ignored=list(reading.ignored[:5]))
        return reading

    def history(self, pool: PromPool, *, start: float, end: float, step_s: float) -> tuple[LoadSignals, ...]:
        """One LoadSignals per ``step_s`` from ``start`` to ``end``, oldest first; gauges are
        each step's peak (``max_over_time`` over the step, at least two scrape intervals),
        token rates over the rate window."""
        if step_s <= 0 or end < start:
            raise ValueError(f"history: need step_s > 0 and end >= start, got start={start} end={end} step_s={step_s}")
        if end - start > (MAX_RANGE_POINTS - 1) * step_s:  # Prometheus refuses > 11,000 points a query
            out: list[LoadSignals] = []
            a = start
            while a <= end:
                b = min(end, a + (MAX_RANGE_POINTS - 1) * step_s)
                out.extend(self.history(pool, start=a, end=b, step_s=step_s))
                a = b + step_s
            return tuple(out)
        # prometheus-api-client sends start/end in whole seconds; Prometheus evaluates at
        # start + k * step, so the steps are computed from the rounded start.
        start, end = float(round(start)), float(round(end))
        window = max(step_s, 2 * self.scrape_interval_s)
        query = build_query(pool, rate_window_s=self.rate_window_s, gauge_window_s=window)
        result = self.query_range(query, pool, start=start, end=end, step_s=step_s)
        return _parsed("query_range", pool, lambda: parse_range(result, pool=pool, start=start, end=end, step_s=step_s))

    def query_range(self, query: str, pool: PromPool, *, start: float, end: float, step_s: float) -> Any:
        """One ``query_range`` (start/end in whole seconds, as the client sends them), errors
        as AdapterError naming the pool."""
        return self._run("query_range", pool, lambda: self._client.custom_query_range(
            query, start_time=datetime.fromtimestamp(start, UTC), end_time=datetime.fromtimestamp(end, UTC),
            step=f"{step_s:g}", timeout=self.timeout_s))  # the step: the API takes a float number of seconds

    def _query(self, query: str, pool: PromPool, params: dict[str, str] | None = None) -> Any:
        """One instant ``query`` (``params``: its evaluation ``time``, else Prometheus' now)."""
        send = self._client.custom_query
        return self._run("query", pool, lambda: send(query, params=params or {}, timeout=self.timeout_s))

    def pool_nodes(self, pool: PromPool) -> int | None:
        """Nodes of the pool as the daemon last exported them (``gpu_bridge_nodes``, summed
        over phases; the largest instance), or None when Prometheus does not have it."""
        q = f'max(sum by (instance) (gpu_bridge_nodes{{pool="{_escape(pool.name)}"}}))'
        result = self._query(q, pool)
        try:
            v = float(result[0]["value"][1]) if result else math.nan
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        return int(v) if math.isfinite(v) and v >= 1 else None

    def gpu_free(self, pool: PromPool, nodes: Collection[str], *, node_label: str, gpus: int,
                 pods: Mapping[str, str] | None = None) -> dict[str, float | None]:
        """Node -> the lowest free MiB over its GPUs (dcgm-exporter's ``DCGM_FI_DEV_FB_FREE``; None:
        unknown, logged with why), for ``nodes`` only: one instant query (``bridge.adapters.prom.gpu``).
        ``pods`` (node -> its sleeping pod, ``wake_gpu_free_mib: auto``): the MiB free beyond what
        the pod's engine allocates at its wake instead."""
        result = self._query(build_gpu_query(nodes, node_label=node_label, pods=(pods or {}).values(), pool=pool), pool)
        now = datetime.now(UTC).timestamp()
        free, problems = _parsed("query", pool, lambda: parse_gpu_free(result, nodes=nodes, node_label=node_label, gpus=gpus,
                                                                       now=now, staleness_s=self.staleness_s, pods=pods))
        for node, (series, why) in problems.items():
            log.error("gpu_free_unknown", node=node, pool=pool.name, field=series, error=why)
        return free

    def reclaim_delays(self, pool: PromPool, *, window_s: float) -> tuple[DelayCount, ...]:
        """The pool's measured reclaims of the last ``window_s`` by bucket, from the daemon's own
        histogram (``gpu_bridge_reclaim_measured_delay_seconds``): what a restart forgot."""
        result = self._query(build_delay_query(pool, window_s=window_s), pool)
        return _parsed("query", pool, lambda: parse_delay_buckets(result))

    def request_history(self, pool: PromPool, *, start: float, end: float, step_s: float = 60.0) -> RequestHistory:
        """The pool's request history (completions, requests in the system, KV usage, e2e
        latency) from ``start`` to ``end`` (unix s, aligned to ``step_s``), in range queries of at
        most ``REQUEST_CHUNK_STEPS`` steps; see ``build_request_query``."""
        if not (step_s > 0 and end > start):
            raise ValueError(f"request_history: need step_s > 0 and end > start, got start={start} end={end} step_s={step_s}")
        start = math.floor(start / step_s) * step_s
        steps = int(math.floor((end - start) / step_s + 1e-9)) + 1
        query = build_request_query(pool, step_s=step_s)
        results = []
        i = 0
        while i < steps:
            n = min(REQUEST_CHUNK_STEPS, steps - i)
            a, b = start + i * step_s, start + (i + n - 1) * step_s
            results.append(self.query_range(query, pool, start=a, end=b, step_s=step_s))
            i += n
        return _parsed("query_range", pool, lambda: parse_request_range(results, pool=pool, start=start, step_s=step_s, steps=steps))

    def daemon_history(self, pool: PromPool, *, start: float, end: float, step_s: float) -> DaemonHistory:
        """The daemon's own metrics for the pool over [start, end] (``gpu-bridge web``'s history):
        per step, lends and reclaims completed in that step (``increase`` of the leader's
        counters), nodes lent, and the SLO budget spent. One range query; read-only."""
        if step_s <= 0 or end < start:
            raise ValueError(f"daemon_history: need step_s > 0 and end >= start, got start={start} end={end} step_s={step_s}")
        start, end = float(round(start)), float(round(end))
        query = build_daemon_query(pool, step_s=step_s)
        result = self.query_range(query, pool, start=start, end=end, step_s=step_s)
        return _parsed("query_range", pool, lambda: parse_daemon_history(result, start=start, end=end, step_s=step_s))

    def _run(self, kind: Literal["query", "query_range"], pool: PromPool, fn: Any) -> Any:
        with self._lock:
            self._queries[kind] += 1
        try:
            result = fn()
        except PrometheusApiClientException as e:
            self._fail(kind)
            raise AdapterError("prometheus", f"pool {pool.name}: {kind} failed: {self._redact(str(e))[:ERROR_CAP]}") from None
        except (requests.RequestException, OSError, ValueError, KeyError, TypeError) as e:
            self._fail(kind)
            # urllib3 puts the whole query URL before the cause: keep the cause (a refused
            # connection, "certificate verify failed") within the cap
            text = str(e)
            text = text.split("(Caused by ", 1)[1].rstrip(")") if "(Caused by " in text else text
            raise AdapterError(
                "prometheus", f"pool {pool.name}: {kind} failed: {type(e).__name__}: {self._redact(text)[:ERROR_CAP]}"
            ) from None
        if not isinstance(result, list):
            self._fail(kind)
            raise AdapterError("prometheus", f"pool {pool.name}: {kind}: expected a list of series, got {type(result).__name__}")
        return result

    def _redact(self, text: str) -> str:
        """An error body may echo the request's headers or URL: never the bearer token or the URL's password."""
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return text

    def _fail(self, kind: str) -> None:
        with self._lock:
            self._failures[kind] += 1
