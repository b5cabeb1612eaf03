"""The Prometheus adapter's value types and the vocabulary its two readers share: the vLLM
metric names, a pool's series selection (``PromPool``), the PromQL helpers and series keys."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from bridge.model import LoadSignals, ReclaimMode, Tier

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_V1 = "vllm:kv_cache_usage_perc"
KV_V0 = "vllm:gpu_cache_usage_perc"
PROMPT = "vllm:prompt_tokens_total"
GENERATION = "vllm:generation_tokens_total"
GAUGES = (RUNNING, WAITING, KV_V1, KV_V0)
TAG = "bridge_q"
ENGINE = "engine"
POD_LABEL = "pod"  # the pod of a series (Kubernetes service discovery relabels __meta_kubernetes_pod_name to it)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
ERROR_CAP = 300
SUCCESS = "vllm:request_success_total"
E2E_SUM = "vllm:e2e_request_latency_seconds_sum"
E2E_COUNT = "vllm:e2e_request_latency_seconds_count"


@dataclass(frozen=True, slots=True)
class PromPool:
    """What selects one pool's vLLM series: its ``model_name``, extra exact matchers, its
    ``namespace`` (matched on ``namespace_label``; None = any) and, for the current reading,
    only the pool's own pods (``own_pods_only``: a series' ``pod`` must be one of the
    ``live_pods`` given to ``PromAdapter.current``)."""

    name: str
    model: str
    matchers: Mapping[str, str] = field(default_factory=dict)
    namespace: str | None = None
    namespace_label: str = "namespace"
    own_pods_only: bool = False

    def __post_init__(self) -> None:
        if self.namespace is not None and (not _LABEL_NAME.fullmatch(self.namespace_label) or self.namespace_label.startswith("__")):
            raise ValueError(f"prometheus.namespace_label: {self.namespace_label!r} is not a label name")
        reserved = ("model_name", TAG, *((self.namespace_label,) if self.namespace is not None else ()))
        for key in self.matchers:
            if not _LABEL_NAME.fullmatch(key) or key.startswith("__"):
                raise ValueError(f"pools[{self.name}].prometheus_matchers: {key!r} is not a label name")
            if key in reserved:
                raise ValueError(f"pools[{self.name}].prometheus_matchers: {key!r} is set by gpu-bridge itself")

    @classmethod
    def from_config(cls, pool: PoolSettings, prometheus: SelectionSettings | None = None) -> PromPool:
        """From a ``bridge.config.PoolConfig`` (name, model, namespace, prometheus_matchers) and
        the ``prometheus`` section (``namespace_label``, ``own_pods_only``); without the
        section, model and matchers only."""
        label = prometheus.namespace_label if prometheus is not None else None
        return cls(name=pool.name, model=pool.model, matchers=dict(pool.prometheus_matchers),
                   namespace=pool.namespace if label else None, namespace_label=label or "namespace",
                   own_pods_only=prometheus is not None and prometheus.own_pods_only)

    def foreign(self, metric: Mapping[str, str]) -> str | None:
        """Why a returned series is not this pool's (model, namespace), or None."""
        if metric.get("model_name") != self.model:
            return f"model_name is not {self.model!r}"
        if self.namespace is not None and metric.get(self.namespace_label) != self.namespace:
            return f"{self.namespace_label} is not {self.namespace!r}"
        return None


class PoolSettings(Protocol):
    """What a pool's Prometheus selection needs of its configuration (``bridge.config.PoolConfig``)."""

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def prometheus_matchers(self) -> Mapping[str, str]: ...


class SelectionSettings(Protocol):
    """What series selection needs of the ``prometheus`` section (``bridge.config.PrometheusConfig``)."""

    @property
    def namespace_label(self) -> str | None: ...
    @property
    def own_pods_only(self) -> bool: ...

@dataclass(frozen=True, slots=True)
class SignalsReading:
    """The signals of one pool at one instant, and why any of them is None."""

    pool: str
    signals: LoadSignals
    problems: Mapping[str, str] = field(default_factory=dict)  # signal field -> reason it is None
    ignored: tuple[str, ...] = ()  # series dropped because they are not the pool's model
    # pod -> requests running + waiting on it (label ``pod``), to lend the least busy node
    # first; only when both gauges are valid, and only pods whose series carry a ``pod`` label
    inflight_by_pod: Mapping[str, float] = field(default_factory=dict)

    @property
    def problem(self) -> str | None:
        """The problems on one line, as the snapshot carries them (None: every signal valid)."""
        return "; ".join(f"{k}: {v}" for k, v in self.problems.items()) or None


@dataclass(frozen=True, slots=True)
class DelayCount:
    """Measured reclaims of one tier and mode in one bucket of the daemon's histogram, up to ``le`` s."""

    tier: Tier
    mode: ReclaimMode
    le: float
    count: int


@dataclass(frozen=True, slots=True)
class DaemonHistory:
    """Per step from ``start``: each of ``DAEMON_SERIES`` (NaN where Prometheus has nothing)."""

    start: float
    step_s: float
    series: Mapping[str, tuple[float, ...]]

    def t(self, i: int) -> float:
        return self.start + i * self.step_s


@dataclass(frozen=True, slots=True)
class RequestHistory:
    """A pool's request history at a fixed step, per replica (pure data).

    ``series[signal][replica][i]`` is the value at ``start + i * step_s`` (signals in
    ``REQUEST_SIGNALS``; ``kv`` holds the V1 name, or V0 where a replica has no V1 series).
    A step missing from a replica's mapping had no sample: missing, never zero."""

    pool: str
    start: float
    step_s: float
    steps: int
    series: Mapping[str, Mapping[str, Mapping[int, float]]]
    ignored: tuple[str, ...] = ()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(pool: PromPool) -> str:
    """The label matchers of a pool, e.g. ``model_name="llama",namespace="serving"``."""
    return ",".join([f'model_name="{_escape(pool.model)}"', *scope_matchers(pool)])


def scope_matchers(pool: PromPool) -> list[str]:
    """A pool's matchers besides the model name (its namespace, ``prometheus_matchers``): what
    selects its pods' series that carry no model name, such as ``vllm:cache_config_info``."""
    parts = [f'{pool.namespace_label}="{_escape(pool.namespace)}"'] if pool.namespace is not None else []
    return parts + [f'{k}="{_escape(v)}"' for k, v in sorted(pool.matchers.items())]


def _tag(expr: str, tag: str) -> str:
    return f'label_replace({expr}, "{TAG}", "{tag}", "", "")'


def _window(seconds: float) -> str:
    """A PromQL duration: whole seconds when it is one, else milliseconds (``500ms``)."""
    if seconds >= 1 and abs(seconds - round(seconds)) < 1e-6:
        return f"{round(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"

def _replica_key(metric: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in metric.items() if k not in ("__name__", TAG))


def _describe(key: frozenset[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(key)) + "}"


def _float(raw: Any) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError):
        return math.nan


def _bad(value: float, *, upper: float | None = None) -> str | None:
    if math.isnan(value):
        return "is NaN"
    if math.isinf(value):
        return "is infinite"
    if value < 0:
        return f"is negative ({value:g})"
    if upper is not None and value > upper + 1e-9:
        return f"is above {upper:g} ({value:g})"
    return None


def _pod_key(key: frozenset[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """The serving replica (pod) of a series: its labels without ``engine`` (a vLLM V1 server
    with data parallelism exports one series per engine)."""
    return frozenset((k, v) for k, v in key if k != ENGINE)

