"""One Event, two APIs: core/v1 events and events.k8s.io/v1 events are the same objects
(stored in the core form, as the real API server does), converted on the way in and out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NEW_API = "events.k8s.io/v1"


def _micro(ts: Any) -> Any:
    """A metav1.Time ("...Z") as a MicroTime ("....000000Z")."""
    if isinstance(ts, str) and ts.endswith("Z") and "." not in ts:
        return ts[:-1] + ".000000Z"
    return ts


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None and v != {} and v != ""}


def to_events_v1(core: Mapping[str, Any]) -> dict[str, Any]:
    """core/v1 Event -> events.k8s.io/v1 Event."""
    src = core.get("source") or {}
    meta = core.get("metadata") or {}
    out: dict[str, Any] = {
        "kind": "Event", "apiVersion": NEW_API, "metadata": meta,
        # as the real apiserver: a core/v1 event written without eventTime has none here either
        "eventTime": core.get("eventTime"),
        # as the real apiserver: not derived from the deprecated source
        "reportingController": core.get("reportingComponent"),
        "reportingInstance": core.get("reportingInstance"),
        "action": core.get("action"), "reason": core.get("reason"), "type": core.get("type"),
        "regarding": core.get("involvedObject"), "related": core.get("related"), "note": core.get("message"),
        "deprecatedSource": src or None, "deprecatedFirstTimestamp": core.get("firstTimestamp"),
        "deprecatedLastTimestamp": core.get("lastTimestamp"), "deprecatedCount": core.get("count"),
    }
    if core.get("series"):
        out["series"] = core["series"]
    elif int(core.get("count") or 0) > 1:
        out["series"] = {"count": int(core["count"]), "lastObservedTime": _micro(core.get("lastTimestamp"))}
    return _clean(out)


def to_core(new: Mapping[str, Any]) -> dict[str, Any]:
    """events.k8s.io/v1 Event -> core/v1 Event."""
    out: dict[str, Any] = {
        "kind": "Event", "apiVersion": "v1", "metadata": dict(new.get("metadata") or {}),
        "involvedObject": new.get("regarding") or {}, "related": new.get("related"),
        "reason": new.get("reason"), "message": new.get("note"), "type": new.get("type"),
        "action": new.get("action"), "eventTime": new.get("eventTime"), "series": new.get("series"),
        "reportingComponent": new.get("reportingController"), "reportingInstance": new.get("reportingInstance"),
        "source": new.get("deprecatedSource") or _clean({"component": new.get("reportingController"),
                                                          "host": new.get("reportingInstance")}),
        "firstTimestamp": new.get("deprecatedFirstTimestamp"), "lastTimestamp": new.get("deprecatedLastTimestamp"),
        "count": new.get("deprecatedCount"),
    }
    core = _clean(out)
    core.setdefault("involvedObject", {})
    return core
