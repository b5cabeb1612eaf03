"""The daemon's whole configuration: YAML -> frozen dataclasses, validated up front.

Every key is a dataclass field whose metadata carries its documentation and its bounds, so
the loader, the ``check-config`` output and ``docs/config.md`` agree. The loader collects
*every* problem before failing (``ConfigError.problems``), each naming the file, the key path,
the bad value and what was expected, e.g.::

    bridge.yaml: pools[0].target.waiting_per_replica: must be > 0, got -1
    bridge.yaml: policy.tick: unknown key; did you mean "tick_s"?

Adding a section (for the daemon's owners): write a frozen dataclass whose fields use
``setting(...)``, add it as a field of ``Config`` with ``default_factory``, document it in
docs/config.md. Cross-field checks go into a ``_check(self)`` method returning
``[(relative key path, message), ...]``.

Units are suffixes: ``_s`` seconds; fractions are 0..1. Node counts are whole 4-GPU nodes.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import math
import operator
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bridge import wellknown
from bridge.errors import ConfigError
from bridge.model import EVICT_AFTER_S

_MISSING = dataclasses.MISSING
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def setting(
    default: Any = _MISSING,
    *,
    doc: str,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    default_factory: Any = _MISSING,
) -> Any:
    """A config field: its default, a one-line meaning (rendered by ``check-config --keys``)
    and numeric bounds checked by the loader."""
    md = {"doc": doc, "gt": gt, "ge": ge, "lt": lt, "le": le}
    if default_factory is not _MISSING:
        return field(default_factory=default_factory, metadata=md)
    if default is _MISSING:
        return field(metadata=md)
    return field(default=default, metadata=md)


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """Per-replica targets: a signal at its target means one replica is exactly busy enough.

    Demand in replicas = max over the enabled signals of (pool total / target), as HPA and
    AIBrix do with several metrics. ``null`` disables a signal.
    """

    concurrency_per_replica: float | None = setting(
        24.0, gt=0, doc="requests running + waiting one replica should carry (vllm:num_requests_running + _waiting)"
    )
    kv_cache_usage: float | None = setting(
        0.8, gt=0, le=1, doc="KV-cache usage (0..1) one replica should run at (vllm:kv_cache_usage_perc)"
    )
    tokens_per_s_per_replica: float | None = setting(
        None, gt=0, doc="prompt + generation tokens/s one replica should carry; null = signal not used"
    )
    waiting_per_replica: float | None = setting(
        None, gt=0, doc="queued requests per replica (KEDA-style, vllm:num_requests_waiting); null = not used"
    )

    def _check(self) -> list[tuple[str, str]]:
        if all(
            v is None
            for v in (
                self.concurrency_per_replica,
                self.kv_cache_usage,
                self.tokens_per_s_per_replica,
                self.waiting_per_replica,
            )
        ):
            return [("", "at least one target must be set, got all null")]
        return []

    def enabled(self) -> tuple[str, ...]:
        """Names of the signals that count, in a fixed order."""
        return tuple(
            n
            for n in ("concurrency_per_replica", "kv_cache_usage", "tokens_per_s_per_replica", "waiting_per_replica")
            if getattr(self, n) is not None
        )


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One serving pool: one model's vLLM Deployment and the nodes it may use."""

    name: str = setting(doc="pool name; also the value of the node label gpu-bridge.io/pool by default")
    deployment: str = setting("vllm", doc="Deployment of the vLLM replicas")
    namespace: str = setting("default", doc="namespace of that Deployment")
    node_selector: Mapping[str, str] = setting(
        default_factory=dict,
        doc="Kubernetes labels selecting the pool's nodes; empty = {gpu-bridge.io/pool: <name>}",
    )
    model_name: str | None = setting(None, doc="Prometheus model_name label of the vLLM series; null = pool name")
    prometheus_matchers: Mapping[str, str] = setting(
        default_factory=dict, doc="extra Prometheus label matchers (label: value), ANDed with model_name"
    )
    replicas_per_node: int = setting(1, ge=1, doc="vLLM replicas one node carries (1 for TP=4 on a 4-GPU node)")
    target: TargetConfig = setting(default_factory=TargetConfig, doc="per-replica targets")
    min_serving: int = setting(1, ge=0, doc="nodes that always serve, whatever the load")
    max_lent: int | None = setting(None, ge=0, doc="most nodes lent at once; null = no limit")
    blind_serving: int | None = setting(
        None, ge=0, doc="nodes to serve when signals have been missing for policy.blind_after_s; null = all"
    )
    slo_budget: float = setting(
        0.001, gt=0, lt=0.5,
        doc="share of minutes that may see offered load above Ready capacity; the policy calibrates its margin to it",
    )
    headroom: float = setting(
        0.0, ge=0, le=2, doc="optional floor: extra capacity over forecast demand, as a fraction (the calibrated margin applies too)"
    )
    headroom_replicas: float = setting(
        0.0, ge=0, doc="optional floor: extra capacity over forecast demand, in replicas (the calibrated margin applies too)"
    )
    measured_delays: bool = setting(
        True, doc="plan reclaims with a high quantile of measured Slurm release + cold start once known (configured values are a floor)"
    )
    cold_start_s: float = setting(300.0, ge=0, doc="vLLM pod start to Ready on a reclaimed node")
    drain_s: float = setting(60.0, ge=0, doc="time for a serving replica to drain and stop (vLLM --shutdown-timeout)")

    def _check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9_.]*[a-z0-9])?", self.name or ""):
            out.append(("name", f"expected a label value (lowercase letters, digits, - _ .), got {_show(self.name)}"))
        return out

    @property
    def selector(self) -> Mapping[str, str]:
        """The node selector actually used."""
        return dict(self.node_selector) or {wellknown.LABEL_POOL: self.name}

    @property
    def model(self) -> str:
        return self.model_name or self.name


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    preempt_partition: str = setting(
        wellknown.SLURM_PREEMPT_PARTITION, doc="partition research jobs run in (PreemptMode=REQUEUE)"
    )
    hold_partition: str = setting(
        wellknown.SLURM_HOLD_PARTITION, doc="high-PriorityTier partition of the bridge's placeholder jobs"
    )
    grace_s: float = setting(120.0, ge=0, doc="Slurm GraceTime: SIGTERM to SIGKILL of a preempted job")
    min_runtime_s: float = setting(
        900.0, ge=0, doc="a job younger than this is not preempted unless urgent demand needs it"
    )
    command_timeout_s: float = setting(
        5.0, gt=0, doc="timeout of each scontrol/squeue/sinfo call; keep it well below daemon.lease_duration_s"
    )
    slurm_conf: str | None = setting(None, doc="slurm.conf the Slurm commands use (SLURM_CONF); null = $SLURM_CONF or Slurm's default")
    command_prefix: tuple[str, ...] = setting(
        (), doc="argv list put before every Slurm command (e.g. [ssh, login1]); empty = run them on this host"
    )
    state_save_s: float = setting(
        6.0, ge=0, doc="how long slurmctld may keep an acknowledged write unsaved (its SAVE_MAX_WAIT, 5 s, plus the "
                       "save): a reclaimed node is unfenced only once gpu-bridge's drain is this old, so a slurmctld "
                       "crash cannot undo the drain under a serving pod"
    )
    release_launch_failed: bool = setting(
        True, doc="release preempt-partition jobs Slurm itself held after a failed launch "
                  "(launch_failed_requeued_held) once that run is gone (docs/slurm-adapter.md)"
    )
    own_drain_reasons: tuple[str, ...] = setting(
        ("Duplicate jobid",), doc="drain reasons Slurm sets itself that gpu-bridge clears (lent) or takes over "
                                  "(otherwise) on its nodes once Slurm has nothing allocated there; [] = never"
    )

    def _check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for i, arg in enumerate(self.command_prefix):
            if not arg or _CONTROL_CHARS.search(arg):
                out.append((f"command_prefix[{i}]", f"expected a non-empty argument without control characters, got {_show(arg)}"))
        if self.command_prefix and (len(self.command_prefix[0].split()) != 1):
            out.append(("command_prefix[0]", f"expected a program (an argv list, not a shell command line), got {_show(self.command_prefix[0])}"))
        return out


class CalendarEffect(enum.StrEnum):
    NO_LEND = "no_lend"  # nothing lent inside the window (lent nodes back, Ready at its start)
    LEND_ONLY = "lend_only"  # lending allowed only inside such windows
    MIN_SERVING = "min_serving"  # a higher serving floor inside the window


DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HHMM = re.compile(r"([01]\d|2[0-3]):([0-5]\d)|24:00")


@dataclass(frozen=True, slots=True)
class CalendarRule:
    """A daily window in a named timezone; ``end`` before ``start`` runs past midnight.

    A window belongs to the day it starts on (``days``)."""

    name: str = setting(doc="name used in reasons")
    effect: CalendarEffect = setting(doc="no_lend | lend_only | min_serving")
    start: str = setting(doc="HH:MM local time the window opens")
    end: str = setting(doc="HH:MM local time it closes (24:00 allowed; before start = next day)")
    days: tuple[str, ...] = setting(DAYS, doc="days the window starts on: mon..sun")
    timezone: str = setting("UTC", doc="IANA timezone, e.g. Europe/Berlin")
    pools: tuple[str, ...] = setting((), doc="pools it applies to; empty = all")
    min_serving: int | None = setting(None, ge=0, doc="serving floor in nodes (effect min_serving only)")

    def _check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for key in ("start", "end"):
            v = getattr(self, key)
            if not _HHMM.fullmatch(v):
                out.append((key, f"expected a time HH:MM (00:00..24:00), got {_show(v)}"))
        if self.start == self.end:
            out.append(("end", f"must differ from start, got {_show(self.end)} for both"))
        for i, d in enumerate(self.days):
            if d not in DAYS:
                out.append((f"days[{i}]", f"expected one of {', '.join(DAYS)}, got {_show(d)}{_hint(d, DAYS)}"))
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            out.append(("timezone", f"unknown IANA timezone, got {_show(self.timezone)}"))
        if self.effect is CalendarEffect.MIN_SERVING and self.min_serving is None:
            out.append(("min_serving", "required when effect is min_serving"))
        if self.effect is not CalendarEffect.MIN_SERVING and self.min_serving is not None:
            out.append(("min_serving", f"only allowed with effect min_serving, got effect {_show(str(self.effect))}"))
        return out

    def applies_to(self, pool: str) -> bool:
        return not self.pools or pool in self.pools


@dataclass(frozen=True, slots=True)
class ForecastConfig:
    enabled: bool = setting(True, doc="use the seasonal/trend forecast; false = current load only (reactive)")
    seasonal_lags_s: tuple[float, ...] = setting(
        (), gt=0, doc="optional: seasonal lags, the same time this long ago (e.g. [86400, 604800]); the margin is calibrated by hour of the day instead"
    )
    compare_window_s: float = setting(
        1800.0, gt=0, doc="window before now (and before now - lag) whose mean load scales the seasonal profile"
    )
    ratio_min: float = setting(0.5, gt=0, doc="lower clamp of today / then")
    ratio_max: float = setting(3.0, gt=0, doc="upper clamp of today / then")
    burst_window_s: float = setting(600.0, gt=0, doc="recent window whose peak demand stands for 'now' (reclaims)")
    lend_lookback_s: float = setting(
        3600.0, gt=0, doc="recent window whose peak a lend must fit under (times the learned rise)"
    )
    trend_window_s: float = setting(1200.0, gt=0, doc="recent window of the least-squares trend (only rises count)")
    margin_s: float = setting(120.0, ge=0, doc="safety margin added to the horizon")
    burst_history_s: float = setting(
        0.0, ge=0, doc="optional floor: history from which a burst factor is learned (0 = off; the calibrated margin replaces it)"
    )
    burst_step_s: float = setting(300.0, gt=0, doc="resolution of that history (max per step)")
    burst_quantile: float = setting(
        0.95, gt=0, le=1, doc="quantile of (peak over next horizon) / (recent peak) seen in that history"
    )
    burst_smoothing_replicas: float = setting(
        1.0, ge=0, doc="added to both sides of that ratio so near-zero load does not give wild ratios"
    )

    def _check(self) -> list[tuple[str, str]]:
        if self.ratio_min > self.ratio_max:
            return [("ratio_min", f"must be <= ratio_max ({_show(self.ratio_max)}), got {_show(self.ratio_min)}")]
        return []


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    """How the safety margin is calibrated on the pool's history (``bridge.policy.calibrate``)."""

    enabled: bool = setting(True, doc="calibrate the margin to pools[].slo_budget; false = headroom settings only")
    window_s: float = setting(
        1209600.0, gt=0, doc="history the margin is calibrated on (14 days, within Prometheus' default 15 d retention; query_range at start-up)"
    )
    step_s: float = setting(60.0, gt=0, doc="resolution of that history (peak demand, fewest Ready replicas per step)")
    interval_s: float = setting(600.0, gt=0, doc="how often the margin is re-estimated")
    min_history_s: float = setting(
        10800.0, ge=0, doc="history needed before anything is lent; with less than 1/slo_budget steps the largest rise seen is the margin"
    )
    by_time_of_day: bool = setting(
        True, doc="a margin per hour of the day (each hour's typical rise plus one conformal rank over all hours)"
    )
    delay_quantile: float = setting(0.95, gt=0, lt=1, doc="quantile of measured reclaim delays the horizon uses")
    delay_min_samples: int = setting(5, ge=1, doc="measured reclaims needed before they replace the configured delays")


class VictimRule(enum.StrEnum):
    LEAST_LOST_WORK = "least_lost_work"  # idle first, then fewest GPU-hours since checkpoint
    NEWEST_FIRST = "newest_first"  # naive baseline: most recently started job first


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    tick_s: float = setting(30.0, gt=0, doc="seconds between two policy runs")
    scale_down_window_s: float = setting(
        300.0, ge=0, doc="demand must stay low this long before a lend (HPA stabilization window)"
    )
    min_lend_s: float = setting(
        600.0, ge=0, doc="a node stays lent at least this long unless load exceeds Ready capacity"
    )
    lend_timeout_s: float = setting(
        600.0, gt=0, doc="a lend whose serving pod is still running after this long is abandoned: the node serves again"
    )
    max_lends_per_tick: int = setting(2, ge=0, doc="most lends started in one tick, all pools together")
    max_reclaims_per_tick: int = setting(8, ge=1, doc="most reclaims started in one tick, all pools together")
    signal_max_age_s: float = setting(90.0, gt=0, doc="a sample older than this is stale (blocks lending)")
    blind_after_s: float = setting(
        300.0, gt=0, doc="after this long without a valid sample, reclaim toward pools[].blind_serving"
    )
    require_pending_jobs: bool = setting(False, doc="lend only while research jobs wait in the preempt partition")
    victims: VictimRule = setting(VictimRule.LEAST_LOST_WORK, doc="least_lost_work | newest_first (baseline)")
    forecast: ForecastConfig = setting(default_factory=ForecastConfig, doc="forecast settings")
    calibration: CalibrationConfig = setting(default_factory=CalibrationConfig, doc="calibration of the safety margin")
    calendar: tuple[CalendarRule, ...] = setting((), doc="calendar rules, constraints on top of the forecast")


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    url: str = setting("http://127.0.0.1:9090", doc="Prometheus base URL")
    timeout_s: float = setting(10.0, gt=0, doc="HTTP timeout of one query")
    step_s: float = setting(60.0, gt=0, doc="resolution of history range queries (max_over_time per step)")
    scrape_interval_s: float = setting(15.0, gt=0, doc="Prometheus scrape interval of vLLM (part of the horizon)")
    rate_window_s: float = setting(60.0, gt=0, doc="rate() window of the token counters")


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    in_cluster: bool = setting(False, doc="use the pod's service account instead of a kubeconfig")
    kubeconfig: str | None = setting(None, doc="path of a kubeconfig; null = $KUBECONFIG or ~/.kube/config")
    context: str | None = setting(None, doc="kubeconfig context; null = current")
    timeout_s: float = setting(10.0, gt=0, doc="timeout of one API call")


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    dry_run: bool = setting(False, doc="decide and log, never write to Slurm or Kubernetes")
    metrics_host: str = setting("0.0.0.0", doc="bind address of the /metrics endpoint")
    metrics_port: int = setting(9808, ge=0, le=65535, doc="port of the /metrics endpoint (0 = any free port)")
    lease_name: str = setting(wellknown.LEASE_NAME, doc="Kubernetes Lease used for leader election")
    lease_namespace: str = setting("gpu-bridge", doc="namespace of that Lease")
    lease_duration_s: float = setting(15.0, gt=0, doc="a leader that has not renewed for this long is replaced")
    log_level: LogLevel = setting(LogLevel.INFO, doc="debug | info | warning | error")


@dataclass(frozen=True, slots=True)
class Config:
    """The whole daemon configuration."""

    pools: tuple[PoolConfig, ...] = setting(doc="serving pools (at least one)")
    slurm: SlurmConfig = setting(default_factory=SlurmConfig, doc="Slurm side")
    policy: PolicyConfig = setting(default_factory=PolicyConfig, doc="lending policy")
    prometheus: PrometheusConfig = setting(default_factory=PrometheusConfig, doc="Prometheus")
    kubernetes: KubernetesConfig = setting(default_factory=KubernetesConfig, doc="Kubernetes API access")
    daemon: DaemonConfig = setting(default_factory=DaemonConfig, doc="the daemon process")

    def _check(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not self.pools:
            out.append(("pools", "must list at least one pool, got none"))
        seen: dict[str, int] = {}
        for i, p in enumerate(self.pools):
            if p.name in seen:
                out.append((f"pools[{i}].name", f"duplicate pool name {_show(p.name)} (also pools[{seen[p.name]}])"))
            seen.setdefault(p.name, i)
        names = tuple(seen)
        for i, p in enumerate(self.pools):
            # a lend takes the pod's drain plus the eviction fallback; less would abandon every lend
            least = p.drain_s + EVICT_AFTER_S
            if self.policy.lend_timeout_s <= least:
                out.append((
                    "policy.lend_timeout_s",
                    f"must be > pools[{i}].drain_s + {EVICT_AFTER_S:g} s ({_show(least)}), got {_show(self.policy.lend_timeout_s)}",
                ))
        for i, r in enumerate(self.policy.calendar):
            for j, pn in enumerate(r.pools):
                if pn not in seen:
                    out.append(
                        (f"policy.calendar[{i}].pools[{j}]", f"no pool named {_show(pn)}{_hint(pn, names)}")
                    )
        return out

    def pool(self, name: str) -> PoolConfig:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


DEFAULT_POOL = "default"


def default_config(*pool_names: str, **pool_overrides: Any) -> Config:
    """A valid config with the documented defaults and one pool per name (default: "default").

    ``pool_overrides`` are applied to every pool, e.g. ``default_config(cold_start_s=300)``.
    Tweak further with ``dataclasses.replace``.
    """
    names = pool_names or (DEFAULT_POOL,)
    return Config(pools=tuple(PoolConfig(name=n, **pool_overrides) for n in names))


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML file; raises ``ConfigError`` listing every problem."""
    import yaml

    p = Path(path)
    src = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{src}: cannot read: {exc.strerror or exc}"]) from exc
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except _DuplicateKey as exc:
        raise ConfigError([f"{src}: {exc}"]) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{src}: invalid YAML{where}: {problem}"]) from exc
    return parse_config(data, source=src)


def parse_config(data: Any, *, source: str = "bridge.yaml") -> Config:
    """Validate already-parsed YAML (a mapping); raises ``ConfigError`` listing every problem."""
    problems: list[str] = []
    if data is None:
        data = {}
    cfg = _convert(data, Config, "", source, problems)
    if problems:
        raise ConfigError(problems)
    assert isinstance(cfg, Config)
    return cfg


def _build_loader() -> tuple[type[Any], type[Exception]]:
    import yaml

    class DuplicateKey(Exception):
        pass

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, typing.Hashable) and key in seen:
                    raise DuplicateKey(
                        f"duplicate key {_show(key)} at line {key_node.start_mark.line + 1}"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader, DuplicateKey


_UniqueKeyLoader, _DuplicateKey = _build_loader()


class _Bad:
    """Marker of a value that failed conversion (its problem is already recorded)."""


_BAD = _Bad()


def _show(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v)) if not math.isinf(v) else str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_show(k)}: {_show(x)}" for k, x in v.items()) + "}"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _hint(word: str, choices: typing.Iterable[str]) -> str:
    m = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f'; did you mean "{m[0]}"?' if m else ""


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")


def _key(key: Any) -> str:
    """A key as shown in a problem: plain keys as they are, anything else quoted (an empty
    key, spaces, control characters) so the path stays readable and one line."""
    text = str(key)
    return text if _PLAIN_KEY.fullmatch(text) else _show(text)


def _join(path: str, key: str) -> str:
    if not key:
        return path
    if key.startswith("["):
        return path + key
    return f"{path}.{key}" if path else key


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is tuple:
        return "a list"
    if origin in (Mapping, dict) or tp is dict:
        return "a mapping"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in tp)
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return str(tp)


def _check_bounds(v: float, md: Mapping[str, Any], where: str, source: str, problems: list[str]) -> bool:
    for key, ok, op in (
        ("gt", operator.gt, ">"),
        ("ge", operator.ge, ">="),
        ("lt", operator.lt, "<"),
        ("le", operator.le, "<="),
    ):
        bound = md.get(key)
        if bound is not None and not ok(v, bound):
            problems.append(f"{source}: {where}: must be {op} {_show(bound)}, got {_show(v)}")
            return False
    return True


def _convert(value: Any, tp: Any, where: str, source: str, problems: list[str], md: Mapping[str, Any] | None = None) -> Any:
    md = md or {}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(value, args[0], where, source, problems, md)
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(value, tp, where, source, problems)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        names = [str(m.value) for m in tp]
        if isinstance(value, str) and value in names:
            return tp(value)
        problems.append(
            f"{source}: {where}: expected one of {', '.join(names)}, got {_show(value)}"
            + (_hint(value, names) if isinstance(value, str) else "")
        )
        return _BAD
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            problems.append(f"{source}: {where}: expected a list, got {_show(value)}")
            return _BAD
        items = [_convert(v, item_tp, f"{where}[{i}]", source, problems, md) for i, v in enumerate(value)]
        return _BAD if any(i is _BAD for i in items) else tuple(items)
    if origin in (Mapping, dict):
        if not isinstance(value, Mapping):
            problems.append(f"{source}: {where}: expected a mapping, got {_show(value)}")
            return _BAD
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, str):
                problems.append(f"{source}: {_join(where, _key(k))}: expected a string, got {_show(v)}")
                continue
            out[k] = v
        return out
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.append(f"{source}: {where}: expected true or false, got {_show(value)}")
        return _BAD
    if tp in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{source}: {where}: expected {_type_name(tp)}, got {_show(value)}")
            return _BAD
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{source}: {where}: expected a finite number, got {_show(value)}")
            return _BAD
        if tp is int:
            if isinstance(value, float):
                if not value.is_integer():
                    problems.append(f"{source}: {where}: expected an integer, got {_show(value)}")
                    return _BAD
                value = int(value)
        else:
            value = float(value)
        if not _check_bounds(value, md, where, source, problems):
            return _BAD
        return value
    if tp is str:
        if isinstance(value, str):
            return value
        problems.append(f"{source}: {where}: expected a string, got {_show(value)}")
        return _BAD
    raise TypeError(f"config type {tp!r} not supported at {where}")  # a bug in this module


def _convert_dataclass(value: Any, cls: Any, where: str, source: str, problems: list[str]) -> Any:
    if not isinstance(value, Mapping):
        problems.append(f"{source}: {where or '(top level)'}: expected a mapping, got {_show(value)}")
        return _BAD
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    bad = False
    for key in value:
        if key not in fields:
            problems.append(f"{source}: {_join(where, _key(key))}: unknown key{_hint(str(key), fields) or _known(fields)}")
            bad = True
    for name, f in fields.items():
        if name not in value:
            if f.default is _MISSING and f.default_factory is _MISSING:
                problems.append(f"{source}: {_join(where, name)}: required, expected {_type_name(hints[name])}")
                bad = True
            continue
        v = _convert(value[name], hints[name], _join(where, name), source, problems, f.metadata)
        if v is _BAD:
            bad = True
        else:
            kwargs[name] = v
    if bad:
        return _BAD
    obj = cls(**kwargs)
    check = getattr(obj, "_check", None)
    if check is not None:
        found = check()
        for rel, msg in found:
            problems.append(f"{source}: {_join(where, rel) or '(top level)'}: {msg}")
        if found:
            return _BAD
    return obj


def _known(fields: Mapping[str, Any]) -> str:
    return "; expected one of " + ", ".join(fields)


# --------------------------------------------------------------------------- rendering


def to_dict(obj: Any) -> Any:
    """The resolved config as plain YAML-able data (enums as strings, tuples as lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


def describe_keys(cls: Any = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key path, default, meaning) of every key, for docs and ``check-config --keys``."""
    rows: list[tuple[str, str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = _join(prefix, f.name)
        tp = hints[f.name]
        origin = typing.get_origin(tp)
        inner = typing.get_args(tp)[0] if origin is tuple else None
        if f.default is not _MISSING:
            default = _show(to_dict(f.default))
        elif f.default_factory is not _MISSING:
            d = f.default_factory()
            default = "" if dataclasses.is_dataclass(d) else _show(to_dict(d))
        else:
            default = "(required)"
        rows.append((path, default, f.metadata.get("doc", "")))
        if dataclasses.is_dataclass(tp):
            rows.extend(describe_keys(tp, path))
        elif inner is not None and dataclasses.is_dataclass(inner):
            rows.extend(describe_keys(inner, path + "[]"))
    return rows
