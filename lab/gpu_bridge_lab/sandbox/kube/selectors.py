"""Label selectors (equality- and set-based, as in ``kubectl -l``) and field selectors
(``spec.nodeName=N``, ``metadata.name=N``, ``involvedObject.name=N``...), parsed once per
request and matched against plain JSON objects."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A selector that does not parse, or names a field the resource cannot select on."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        v = labels.get(self.key)
        if self.op == "=":
            return has and v == self.values[0]
        if self.op == "!=":
            return not has or v != self.values[0]
        if self.op == "in":
            return has and v in self.values
        if self.op == "notin":
            return not has or v not in self.values
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("gt", "lt"):
            try:
                lv, rv = int(v or ""), int(self.values[0])
            except ValueError:
                return False
            return lv > rv if self.op == "gt" else lv < rv
        raise AssertionError(self.op)


_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(r"^\s*(!?)\s*(" + _KEY + r")\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*(" + _KEY + r")\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)\s*$")


def _split_top(s: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_label_selector(text: str | None) -> tuple[Requirement, ...]:
    """``app=vllm,tier!=x,env in (a,b),!legacy,gpu`` -> requirements (all must hold)."""
    if not text or not text.strip():
        return ()
    reqs: list[Requirement] = []
    for part in _split_top(text):
        if not part.strip():
            raise SelectorError(f"labelSelector: empty requirement in {text!r}")
        m = _EQ_RE.match(part)
        if m:
            op = "!=" if m.group(3) == "!=" else "="
            reqs.append(Requirement(m.group(1), op, (m.group(4),)))
            continue
        m = _SET_RE.match(part)
        if m:
            neg, key, op, vals = m.group(1), m.group(2), m.group(4), m.group(5)
            if op:
                if neg:
                    raise SelectorError(f"labelSelector: unable to parse requirement {part.strip()!r}")
                values = tuple(v.strip() for v in vals.split(",") if v.strip())
                reqs.append(Requirement(key, op, values))
            else:
                reqs.append(Requirement(key, "!" if neg else "exists"))
            continue
        raise SelectorError(f"labelSelector: unable to parse requirement {part.strip()!r}")
    return tuple(reqs)


def labels_match(reqs: tuple[Requirement, ...], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


def from_label_selector_object(sel: Mapping[str, Any] | None) -> tuple[Requirement, ...] | None:
    """A ``metav1.LabelSelector`` (matchLabels + matchExpressions); None selects nothing,
    an empty selector selects everything (as Deployments/PDBs treat them)."""
    if sel is None:
        return None
    reqs = [Requirement(k, "=", (str(v),)) for k, v in (sel.get("matchLabels") or {}).items()]
    for e in sel.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(e.get("operator", ""))
        if op is None:
            raise SelectorError(f"selector.matchExpressions.operator: unsupported {e.get('operator')!r}")
        reqs.append(Requirement(e.get("key", ""), op, tuple(e.get("values") or ())))
    return tuple(reqs)


def node_selector_requirement(e: Mapping[str, Any]) -> Requirement:
    """A NodeSelectorRequirement (node affinity): In/NotIn/Exists/DoesNotExist/Gt/Lt."""
    op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!", "Gt": "gt", "Lt": "lt"}.get(
        e.get("operator", ""))
    if op is None:
        raise SelectorError(f"nodeSelectorTerms.matchExpressions.operator: unsupported {e.get('operator')!r}")
    return Requirement(e.get("key", ""), op, tuple(e.get("values") or ()))


# --- field selectors ----------------------------------------------------------------------

def _path(*keys: str) -> Callable[[Mapping[str, Any]], str]:
    def get(obj: Mapping[str, Any]) -> str:
        cur: Any = obj
        for k in keys:
            if not isinstance(cur, Mapping):
                return ""
            cur = cur.get(k)
        if cur is None:
            return ""
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return str(cur)
    return get


_COMMON = {"metadata.name": _path("metadata", "name"), "metadata.namespace": _path("metadata", "namespace")}
_CORE_EVENT = {f"involvedObject.{k}": _path("involvedObject", k)
               for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")}
_CORE_EVENT.update({"reason": _path("reason"), "type": _path("type"), "source": _path("source", "component"),
                    "reportingComponent": _path("reportingComponent")})
_NEW_EVENT = {f"regarding.{k}": _path("regarding", k)
              for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")}
_NEW_EVENT.update({"reason": _path("reason"), "type": _path("type"),
                   "reportingController": _path("reportingController")})

FIELDS: dict[str, dict[str, Callable[[Mapping[str, Any]], str]]] = {
    "/pods": {"spec.nodeName": _path("spec", "nodeName"), "spec.restartPolicy": _path("spec", "restartPolicy"),
              "spec.schedulerName": _path("spec", "schedulerName"),
              "spec.serviceAccountName": _path("spec", "serviceAccountName"),
              "spec.hostNetwork": lambda o: "true" if (o.get("spec") or {}).get("hostNetwork") else "false",
              "status.phase": _path("status", "phase"), "status.podIP": _path("status", "podIP"),
              "status.nominatedNodeName": _path("status", "nominatedNodeName")},
    "/nodes": {"spec.unschedulable": lambda o: "true" if (o.get("spec") or {}).get("unschedulable") else "false"},
    "/events": _CORE_EVENT,
    "events.k8s.io/events": _NEW_EVENT,
    "/namespaces": {"status.phase": _path("status", "phase")},
    "apps/replicasets": {"status.replicas": _path("status", "replicas")},
}


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    getter: Callable[[Mapping[str, Any]], str]
    negate: bool
    value: str
    field: str = ""

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (self.getter(obj) == self.value) != self.negate


def parse_field_selector(text: str | None, resource_key: str, kind: str) -> tuple[FieldRequirement, ...]:
    """``spec.nodeName=n1,status.phase!=Failed``; an unknown field is the real 400 message."""
    if not text or not text.strip():
        return ()
    allowed = dict(_COMMON)
    allowed.update(FIELDS.get(resource_key, {}))
    out: list[FieldRequirement] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        for op in ("!=", "==", "="):
            if op in part:
                f, v = part.split(op, 1)
                break
        else:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        f = f.strip()
        getter = allowed.get(f)
        if getter is None:
            raise SelectorError(f'field label not supported: {f}')
        out.append(FieldRequirement(getter, op == "!=", v.strip(), f))
    return tuple(out)


def fields_match(reqs: tuple[FieldRequirement, ...], obj: Mapping[str, Any]) -> bool:
    return all(r.matches(obj) for r in reqs)
