"""The pool's own vLLM replicas read directly, for the ticks Prometheus cannot answer.

A Prometheus outage leaves the policy blind, and blind minutes with nodes lent are charged to
the SLO budget (``bridge.policy.governor``): one long outage can spend a month's budget and
hold lending until it leaves the window. The daemon knows the pool's pods (its Deployment's,
from the Kubernetes watch cache) and each serves the metrics Prometheus scrapes on
``/metrics``. With ``prometheus.direct_fallback`` on, a tick whose Prometheus query fails
reads every Ready pod of the pool instead and sums the same signals with the same checks
(``signals_from_step``): fail closed, never a partial sum (a Ready pod that does not answer,
or answers garbage, fails the whole reading), and only the pool's model (``model_name``; the
namespace and ``prometheus_matchers`` are Prometheus's target labels, absent here, and the pod
is the pool's by construction).

A counter has no rate in one read: the token rate is taken against this reader's previous read
of the same pod (at most ``RATE_MAX_AGE`` x ``rate_window_s`` old, no reset in between); the first
read after a restart or a long gap has none (``tokens_per_s`` None, said why). Bounded: the pods
are read in parallel (``MAX_PARALLEL``), each with a connect timeout and the query timeout, a
body of at most ``BODY_CAP`` bytes; after a read where no pod answered, the next waits
``RETRY_S`` (a daemon that cannot reach pod IPs loses no tick to it). What it reads is not in
Prometheus: a restart counts the outage blind again (conservatively).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import requests
from prometheus_client.parser import text_string_to_metric_families

from bridge import logs
from bridge.config import Config
from bridge.errors import AdapterError

from .prom.signals import _Step, signals_from_step
from .prom.types import GAUGES, GENERATION, POD_LABEL, PROMPT, SignalsReading, _float, _replica_key

if TYPE_CHECKING:
    from .kube.objects import PodInfo

log = logs.get(__name__)

SYSTEM = "vllm"
MAX_PARALLEL = 8
CONNECT_TIMEOUT_S = 1.0
BODY_CAP = 4 << 20  # bytes of one /metrics answer (a vLLM server's is tens of KiB)
RETRY_S = 60.0
RATE_MAX_AGE = 5.0  # x rate_window_s: an older previous read gives no rate
_COUNTERS = {PROMPT: "rate:prompt", GENERATION: "rate:generation"}


@dataclass(frozen=True, slots=True)
class _PodRead:
    """One pod's answer: each wanted sample by its labels (``pod`` added), at ``t``."""

    t: float
    values: dict[str, dict[frozenset[tuple[str, str]], float]]


def parse_metrics(text: str, *, pod: str, model: str) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """vLLM's text exposition -> metric name -> labels (with ``pod``) -> value, the pool's model
    only (pure). Unparseable text raises ValueError."""
    wanted = {*GAUGES, *_COUNTERS}
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in wanted or sample.labels.get("model_name") != model:
                continue
            key = _replica_key({**sample.labels, POD_LABEL: pod})
            out.setdefault(sample.name, {})[key] = _float(sample.value)
    return out


class ReplicaMetrics:
    """``ReplicaReader`` over HTTP: the pool's Ready pods at ``http://<pod IP>:<pools[].vllm_port>/metrics``."""

    def __init__(self, config: Config, *, session: requests.Session | None = None) -> None:
        self.config = config
        self._pools = {p.name: p for p in config.pools}
        self._session = session if session is not None else requests.Session()
        self._last: dict[str, _PodRead] = {}  # pod -> its previous read (for the token rate)
        self._retry_at: dict[str, float] = {}  # pool -> no direct read before

    def read(self, pool: str, pods: Sequence[PodInfo], now: float) -> SignalsReading:
        """The pool's signals from its Ready pods, or AdapterError saying which pod failed how."""
        cfg = self._pools.get(pool)
        if cfg is None:
            raise AdapterError(SYSTEM, f"pool {pool}: not configured")
        if now < self._retry_at.get(pool, -math.inf):
            raise AdapterError(SYSTEM, f"pool {pool}: direct reads paused for {self._retry_at[pool] - now:.0f} s more "
                                       "(no pod answered the last one)")
        ready = sorted((p for p in pods if p.ready and p.deletion_timestamp is None), key=lambda p: p.name)
        if not ready:
            raise AdapterError(SYSTEM, f"pool {pool}: no Ready pod to read")
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(ready))) as pool_exec:
            answers = list(pool_exec.map(lambda p: self._get(p, cfg.vllm_port, cfg.model), ready))
        failed = [a for a in answers if isinstance(a, str)]
        if failed:
            if len(failed) == len(ready):
                self._retry_at[pool] = now + RETRY_S
            raise AdapterError(SYSTEM, f"pool {pool}: {len(failed)} of {len(ready)} Ready pods unread: " + "; ".join(failed[:3]))
        self._retry_at.pop(pool, None)
        return self._reading(pool, [(p.name, a) for p, a in zip(ready, answers, strict=True) if not isinstance(a, str)], now)

    def _get(self, pod: PodInfo, port: int, model: str) -> dict[str, dict[frozenset[tuple[str, str]], float]] | str:
        """One pod's samples, or why not (a string: the caller fails the whole reading)."""
        if not pod.ip:
            return f"{pod.name}: no IP"
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
        url = f"http://{host}:{port}/metrics"
        try:
            with self._session.get(url, timeout=(CONNECT_TIMEOUT_S, self.config.prometheus.timeout_s), stream=True,
                                   allow_redirects=False) as resp:  # a pod sends the daemon nowhere else
                if resp.status_code != 200:
                    return f"{pod.name}: GET {url}: HTTP {resp.status_code}"
                body = resp.raw.read(BODY_CAP + 1, decode_content=True)
        except requests.RequestException as e:
            return f"{pod.name}: GET {url}: {type(e).__name__}"
        if len(body) > BODY_CAP:
            return f"{pod.name}: GET {url}: answer larger than {BODY_CAP} bytes"
        try:
            return parse_metrics(body.decode("utf-8"), pod=pod.name, model=model)
        except (ValueError, UnicodeDecodeError) as e:
            return f"{pod.name}: GET {url}: not the Prometheus text format ({str(e)[:80]})"

    def _reading(self, pool: str, reads: Sequence[tuple[str, dict[str, dict[frozenset[tuple[str, str]], float]]]],
                 now: float) -> SignalsReading:
        """Sum the pods' samples as ``signals_from_step`` does; the token rate against each pod's previous read."""
        step = _Step()
        no_rate: list[str] = []
        max_age = RATE_MAX_AGE * self.config.prometheus.rate_window_s
        for pod, values in reads:
            for metric in GAUGES:
                step.values.setdefault(metric, {}).update(values.get(metric, {}))
            prev = self._last.get(pod)
            for counter, tag in _COUNTERS.items():
                for key, v in values.get(counter, {}).items():
                    pv = prev.values.get(counter, {}).get(key) if prev is not None else None
                    if prev is None or pv is None or not 0 < now - prev.t <= max_age or not pv <= v:
                        no_rate.append(pod)
                        continue
                    step.values.setdefault(tag, {})[key] = (v - pv) / (now - prev.t)
            self._last[pod] = _PodRead(now, values)
        for gone in set(self._last) - {pod for pod, _ in reads}:
            if now - self._last[gone].t > max_age:
                del self._last[gone]  # a pod gone: its previous read is of no use
        inflight: dict[str, float] = {}
        signals, problems = signals_from_step(step, t=now, staleness_s=None, check_timestamps=False, inflight=inflight)
        if no_rate:
            signals = dataclasses.replace(signals, tokens_per_s=None)
            problems["tokens_per_s"] = (f"no token rate yet from {', '.join(sorted(set(no_rate))[:3])} "
                                        "(a direct read needs a previous one of the same pod)")
        log.info("direct_read", pool=pool, pods=len(reads), reporting=signals.replicas_reporting)
        return SignalsReading(pool=pool, signals=signals, problems=problems, inflight_by_pod=inflight)


def replica_reader(config: Config) -> ReplicaMetrics | None:
    """The direct reader when ``prometheus.direct_fallback`` is on, else None."""
    return ReplicaMetrics(config) if config.prometheus.direct_fallback else None
