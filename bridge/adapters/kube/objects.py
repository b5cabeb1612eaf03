"""Plain snapshots of Kubernetes objects, parsed from API JSON with validation.

Input is the API's JSON shape (what the server sends, and what
``ApiClient().sanitize_for_serialization`` produces): camelCase dicts. Output is frozen data.
A label or annotation of ours with an invalid value never becomes a guess: the snapshot keeps
the field ``None`` and names the key, the bad value and what was expected in ``problem``, so
the daemon holds that node (fail closed).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from bridge import wellknown as wk
from bridge.model import Phase, Pin, WarmRecord, WarmState

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node of a pool as the watch cache last saw it."""

    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    allocatable_gpus: int | None = None  # status.allocatable[nvidia.com/gpu]; None = not reported
    ready: bool = False  # the kubelet's Ready condition
    pool: str | None = None  # label gpu-bridge.io/pool
    phase: Phase | None = None  # label gpu-bridge.io/phase; None = never set (not yet adopted) or invalid
    phase_since: float | None = None  # annotation gpu-bridge.io/phase-since (unix seconds)
    reason: str | None = None  # annotation gpu-bridge.io/reason
    owner: str | None = None  # annotation gpu-bridge.io/owner
    pin: Pin | None = None  # label gpu-bridge.io/pin
    fenced: bool = False  # our NoSchedule taint is present
    cordoned_by_bridge: bool = False  # annotation gpu-bridge.io/cordoned: we set unschedulable
    warm: WarmRecord | None = None  # annotation gpu-bridge.io/warm (warm lending's record)
    problem: str | None = None  # every invalid value of ours, "; "-joined; None = all valid


@dataclass(frozen=True, slots=True)
class PodInfo:
    """One serving pod of a pool's Deployment."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    pool: str
    node: str | None = None  # spec.nodeName; None = not scheduled
    phase: str = "Unknown"  # status.phase: Pending | Running | Succeeded | Failed | Unknown
    ready: bool = False  # the Ready condition
    awake: bool | None = None  # condition gpu-bridge.io/awake (warm lending's readiness gate); None = not set
    ip: str | None = None  # status.podIP
    deletion_timestamp: str | None = None  # set = terminating (graceful deletion under way)
    deletion_cost: int | None = None  # annotation controller.kubernetes.io/pod-deletion-cost
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    problem: str | None = None

    @property
    def terminating(self) -> bool:
        return self.deletion_timestamp is not None


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    """A pool's serving Deployment: desired replicas and rollout status."""

    name: str
    namespace: str
    resource_version: str
    replicas: int  # spec.replicas (the scale subresource's spec.replicas)
    generation: int = 0
    observed_generation: int = 0
    status_replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0
    updated_replicas: int = 0
    match_labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # spec.selector.matchLabels
    problem: str | None = None  # a field the API always sets is missing or invalid: hold the pool


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """A core/v1 Event about a node: what ``kubectl describe node`` lists."""

    node: str
    reason: str
    message: str
    t: float  # unix s: its last (or only) occurrence


@dataclass(frozen=True, slots=True)
class ScaleInfo:
    """The autoscaling/v1 Scale of a Deployment (shares the Deployment's resourceVersion)."""

    namespace: str
    name: str
    replicas: int  # spec.replicas
    status_replicas: int
    selector: str  # status.selector, a label selector string
    resource_version: str


class EvictOutcome(enum.StrEnum):
    EVICTED = "evicted"  # 201: the pod is being deleted gracefully
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget allows no disruption now; retry later
    GONE = "gone"  # 404: the pod no longer exists


def _parts(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]]:
    """An object's metadata (required), spec and status (empty when absent)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ValueError("object without metadata")
    return meta, _mapping(obj.get("spec")), _mapping(obj.get("status"))


def _required(meta: Mapping[str, Any], problems: list[str], keys: tuple[str, ...] = ("name", "uid", "resourceVersion")) -> None:
    """Fields every object from the API has: without a name it cannot be addressed, without
    a resourceVersion a write would not be guarded by optimistic concurrency."""
    for key in keys:
        value = meta.get(key)
        if not isinstance(value, str) or not value:
            problems.append(f"metadata.{key}: missing (every API object has it)")


def _mapping(value: Any) -> Mapping[str, Any]:
    """A sub-object, or empty when absent or not an object (garbage is never a crash)."""
    return value if isinstance(value, Mapping) else _EMPTY


def _str_map(value: Any) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        return _EMPTY
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


def parse_quantity_int(text: str) -> int:
    """An integer resource quantity ("4", "4000m" is 4); anything fractional is an error."""
    s = str(text).strip()
    if s.endswith("m"):
        milli = int(s[:-1])
        if milli % 1000:
            raise ValueError("not a whole number")
        return milli // 1000
    suffixes = {"k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, mult in sorted(suffixes.items(), key=lambda kv: -len(kv[0])):
        if s.endswith(suffix):
            return int(s[: -len(suffix)]) * mult
    return int(s)


def _quote(value: str) -> str:
    return '"' + value.replace('"', '\\"')[:100] + '"'


def _enum_value(kind: str, key: str, raw: str | None, enum_type: type[enum.StrEnum], problems: list[str]) -> Any:
    if raw is None:
        return None
    try:
        return enum_type(raw)
    except ValueError:
        allowed = "|".join(m.value for m in enum_type)
        problems.append(f"{kind} {key}: expected one of {allowed}, got {_quote(raw)}")
        return None


def parse_since(raw: str | None, problems: list[str]) -> float | None:
    """Annotation phase-since: unix seconds (float), finite, not negative, and a date (by year
    9999: milliseconds, 1.8e12, made ``gpu-bridge status`` and the web view raise)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not wk.is_date(value):
        problems.append(f"annotation {wk.ANNOTATION_PHASE_SINCE}: expected unix seconds (a number >= 0 up to "
                        f"{wk.LAST_UNIX_S:.0f}), got {_quote(raw)}")
        return None
    return value


def parse_node(obj: Mapping[str, Any]) -> NodeInfo:
    """A Node's JSON -> NodeInfo; our labels/annotations validated (see ``problem``)."""
    meta, spec, status = _parts(obj)
    labels = _str_map(meta.get("labels"))
    annotations = _str_map(meta.get("annotations"))
    problems: list[str] = []
    _required(meta, problems)

    phase = _enum_value("label", wk.LABEL_PHASE, labels.get(wk.LABEL_PHASE), Phase, problems)
    pin = _enum_value("label", wk.LABEL_PIN, labels.get(wk.LABEL_PIN), Pin, problems)
    since = parse_since(annotations.get(wk.ANNOTATION_PHASE_SINCE), problems)
    if wk.LABEL_PHASE in labels and wk.ANNOTATION_PHASE_SINCE not in annotations:
        problems.append(f"annotation {wk.ANNOTATION_PHASE_SINCE}: missing while label {wk.LABEL_PHASE} is set")

    cordoned = annotations.get(wk.ANNOTATION_CORDONED)
    if cordoned not in (None, "true"):
        problems.append(f"annotation {wk.ANNOTATION_CORDONED}: expected \"true\", got {_quote(str(cordoned))}")

    taints = tuple(
        Taint(key=str(t.get("key", "")), value=str(t.get("value") or ""), effect=str(t.get("effect") or ""))
        for t in (spec.get("taints") or ())
        if isinstance(t, Mapping)
    )

    warm = parse_warm(annotations.get(wk.ANNOTATION_WARM), problems)

    gpus: int | None = None
    raw_gpus = _mapping(status.get("allocatable")).get(wk.GPU_RESOURCE)
    if raw_gpus is not None:
        try:
            gpus = parse_quantity_int(raw_gpus)
        except ValueError:
            problems.append(f"status.allocatable[{wk.GPU_RESOURCE}]: expected a whole number, got {_quote(str(raw_gpus))}")

    return NodeInfo(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        labels=labels,
        annotations=annotations,
        unschedulable=bool(spec.get("unschedulable") or False),
        taints=taints,
        allocatable_gpus=gpus,
        ready=_condition(status, "Ready") is True,
        pool=labels.get(wk.LABEL_POOL),
        phase=phase,
        phase_since=since,
        reason=annotations.get(wk.ANNOTATION_REASON),
        owner=annotations.get(wk.ANNOTATION_OWNER),
        pin=pin,
        fenced=any(t.key == wk.TAINT_KEY and t.effect == wk.TAINT_EFFECT for t in taints),
        cordoned_by_bridge=cordoned == "true",
        warm=warm,
        problem="; ".join(problems) or None,
    )


def parse_warm(raw: str | None, problems: list[str]) -> WarmRecord | None:
    """``<asleep|awake|cold>/<pod>``; an invalid value is a problem (the node is held, never guessed)."""
    if raw is None:
        return None
    state, _, pod = raw.partition("/")
    if state in {s.value for s in WarmState} and pod:
        return WarmRecord(WarmState(state), pod)
    problems.append(f"annotation {wk.ANNOTATION_WARM}: expected <asleep|awake|cold>/<pod>, got {_quote(raw)}")
    return None


def _condition(status: Mapping[str, Any], kind: str) -> bool | None:
    """A condition's status: True, False, or None when absent (or Unknown)."""
    for cond in status.get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return {"True": True, "False": False}.get(str(cond.get("status")))
    return None


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def parse_pod(obj: Mapping[str, Any], pool: str) -> PodInfo:
    meta, spec, status = _parts(obj)
    annotations = _str_map(meta.get("annotations"))
    problems: list[str] = []
    _required(meta, problems, ("name", "namespace", "uid", "resourceVersion"))
    cost: int | None = None
    raw_cost = annotations.get(wk.POD_DELETION_COST)
    if raw_cost is not None:
        try:
            cost = int(raw_cost)
            if not INT32_MIN <= cost <= INT32_MAX:
                raise ValueError("out of int32 range")
        except ValueError:
            cost = None
            problems.append(f"annotation {wk.POD_DELETION_COST}: expected an int32, got {_quote(raw_cost)}")
    return PodInfo(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        pool=pool,
        node=spec.get("nodeName") or None,
        phase=str(status.get("phase") or "Unknown"),
        ready=_condition(status, "Ready") is True,
        awake=_condition(status, wk.CONDITION_AWAKE),
        ip=str(status.get("podIP")) if status.get("podIP") else None,
        deletion_timestamp=meta.get("deletionTimestamp") or None,
        deletion_cost=cost,
        labels=_str_map(meta.get("labels")),
        problem="; ".join(problems) or None,
    )


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_deployment(obj: Mapping[str, Any]) -> DeploymentInfo:
    meta, spec, status = _parts(obj)
    selector = _mapping(spec.get("selector"))
    problems: list[str] = []
    _required(meta, problems, ("name", "namespace", "resourceVersion"))
    raw_replicas = spec.get("replicas")
    if isinstance(raw_replicas, bool) or not isinstance(raw_replicas, int) or raw_replicas < 0:
        # the API defaults an absent spec.replicas to 1 on write: absent on read is garbage
        problems.append(f"spec.replicas: expected an integer >= 0, got {_quote(str(raw_replicas))}")
    return DeploymentInfo(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        replicas=_int(spec.get("replicas"), 1),  # the API defaults an absent spec.replicas to 1
        generation=_int(meta.get("generation")),
        observed_generation=_int(status.get("observedGeneration")),
        status_replicas=_int(status.get("replicas")),
        ready_replicas=_int(status.get("readyReplicas")),
        available_replicas=_int(status.get("availableReplicas")),
        updated_replicas=_int(status.get("updatedReplicas")),
        match_labels=_str_map(selector.get("matchLabels")),
        problem="; ".join(problems) or None,
    )


def parse_scale(obj: Mapping[str, Any]) -> ScaleInfo:
    meta, spec, status = _parts(obj)
    return ScaleInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        replicas=_int(spec.get("replicas")),
        status_replicas=_int(status.get("replicas")),
        selector=str(status.get("selector") or ""),
        resource_version=str(meta.get("resourceVersion", "")),
    )


def selector_from_match_labels(match_labels: Mapping[str, str]) -> str:
    """``{"app": "vllm"}`` -> ``"app=vllm"`` (sorted, for a stable watch URL)."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))
