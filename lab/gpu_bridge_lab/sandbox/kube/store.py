"""The object store: every object as plain JSON, one global resourceVersion counter, an
event log (with compaction, so 410 Gone can be exercised) and the watchers fed from it.

Stored objects are never mutated in place: a write replaces the object, so readers and
watch streams may serialise what they hold without copying (each entry caches its JSON)."""

from __future__ import annotations

import bisect
import json
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from gpu_bridge_lab.sandbox.kube import resources as res_mod
from gpu_bridge_lab.sandbox.kube.resources import Resource


def now_rfc3339(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return datetime.fromtimestamp(int(t), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def deepcopy_json(obj: Any) -> Any:
    """Copy of a JSON document (faster than copy.deepcopy for plain JSON)."""
    return json.loads(json.dumps(obj))


class ApiError(Exception):
    """An error the API answers with a ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            body["details"] = self.details
        return body


def _qualified(r: Resource) -> str:
    return f"{r.name}.{r.group}" if r.group else r.name


def not_found(r: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(r)} "{name}" not found',
                    {"name": name, "group": r.group, "kind": r.name})


def conflict(r: Resource, name: str, why: str = "the object has been modified; please apply your changes "
                                              "to the latest version and try again") -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(r)} "{name}": {why}',
                    {"name": name, "group": r.group, "kind": r.name})


def invalid(r: Resource, name: str, field_path: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f'{r.kind} "{name}" is invalid: {field_path}: {message}',
                    {"name": name, "group": r.group, "kind": r.kind,
                     "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field_path}]})


class Entry:
    """One stored object and its cached JSON encoding."""

    __slots__ = ("obj", "_raw")

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self._raw: bytes | None = None

    def raw(self) -> bytes:
        r = self._raw
        if r is None:
            r = self._raw = json.dumps(self.obj, separators=(",", ":")).encode()
        return r


@dataclass(slots=True)
class WatchEvent:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    key: str  # resource key, "group/plural"
    namespace: str
    entry: Entry
    prev: Entry | None = None  # the object before a MODIFIED/DELETED


@dataclass(eq=False)
class Watcher:
    """A registered watch: the store pushes matching-resource events; the stream pops them."""

    key: str
    namespace: str | None
    events: deque[WatchEvent] = field(default_factory=deque)
    cond: threading.Condition = field(default_factory=threading.Condition)
    closed: bool = False

    def push(self, ev: WatchEvent) -> None:
        with self.cond:
            self.events.append(ev)
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def pop_all(self, timeout: float) -> list[WatchEvent]:
        with self.cond:
            if not self.events and not self.closed:
                self.cond.wait(timeout)
            out = list(self.events)
            self.events.clear()
            return out


_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the real generateName suffix uses
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class Store:
    """All objects, keyed by resource then (namespace, name); thread-safe via one RLock."""

    def __init__(self, event_log_size: int = 50_000) -> None:
        self.lock = threading.RLock()
        self.rv = 0
        self.objects: dict[str, dict[tuple[str, str], Entry]] = {r.key: {} for r in res_mod.RESOURCES}
        self.log: deque[WatchEvent] = deque()
        self.event_log_size = event_log_size
        self.compacted_rv = 0
        self.watchers: dict[str, set[Watcher]] = {r.key: set() for r in res_mod.RESOURCES}
        self.listeners: list[Callable[[WatchEvent], None]] = []
        self._sorted: dict[str, list[tuple[str, str]] | None] = {r.key: None for r in res_mod.RESOURCES}
        self.pods_by_node: dict[str, set[tuple[str, str]]] = {}  # spec.nodeName -> pod keys (drain's list)
        # pods being deleted gracefully: (namespace, name) -> (uid, time.monotonic() deadline)
        self.deadlines: dict[tuple[str, str], tuple[str, float]] = {}
        ns = res_mod.core("namespaces")
        for n in SYSTEM_NAMESPACES:
            self.create(ns, {"metadata": {"name": n}})

    # --- reading ---------------------------------------------------------------------------
    def get_entry(self, r: Resource, namespace: str, name: str) -> Entry | None:
        return self.objects[r.key].get((namespace if r.namespaced else "", name))

    def get(self, r: Resource, namespace: str, name: str) -> dict[str, Any]:
        """The stored object (read-only: copy before changing it). 404 if absent."""
        e = self.get_entry(r, namespace, name)
        if e is None:
            raise not_found(r, name)
        return e.obj

    def sorted_keys(self, r: Resource) -> list[tuple[str, str]]:
        """All keys of a resource in etcd order (cached until an object comes or goes)."""
        with self.lock:
            keys = self._sorted[r.key]
            if keys is None:
                keys = self._sorted[r.key] = sorted(self.objects[r.key])
            return keys

    def entries(self, r: Resource, namespace: str | None = None, after: tuple[str, str] | None = None,
                keys: list[tuple[str, str]] | None = None) -> list[Entry]:
        """Entries in key order (namespace, name), as etcd lists them; ``after`` starts past a
        key (paging); ``keys`` restricts to an index's candidates."""
        with self.lock:
            objs = self.objects[r.key]
            if keys is not None:
                ks = sorted(k for k in keys if k in objs)
            else:
                ks = self.sorted_keys(r)
            lo, hi = 0, len(ks)
            if namespace is not None and r.namespaced:
                lo, hi = bisect.bisect_left(ks, (namespace, "")), bisect.bisect_left(ks, (namespace + "\x00", ""))
            if after is not None:
                lo = max(lo, bisect.bisect_right(ks, after))
            return [objs[k] for k in ks[lo:hi]]

    def objs(self, r: Resource, namespace: str | None = None) -> list[dict[str, Any]]:
        return [e.obj for e in self.entries(r, namespace)]

    # --- events ----------------------------------------------------------------------------
    def _emit(self, typ: str, r: Resource, entry: Entry, prev: Entry | None) -> None:
        if typ != "MODIFIED":
            self._sorted[r.key] = None
        if r.key == "/pods":
            self._index_pod(typ, entry, prev)
        ev = WatchEvent(self.rv, typ, r.key, entry.obj["metadata"].get("namespace", ""), entry, prev)
        self.log.append(ev)
        while len(self.log) > self.event_log_size:
            self.compacted_rv = self.log.popleft().rv
        for w in self.watchers[r.key]:
            if w.namespace is None or w.namespace == ev.namespace:
                w.push(ev)
        for fn in self.listeners:
            fn(ev)

    def _index_pod(self, typ: str, entry: Entry, prev: Entry | None) -> None:
        m = entry.obj["metadata"]
        key = (m.get("namespace", ""), m["name"])
        old_node = ((prev.obj.get("spec") or {}).get("nodeName") or "") if prev is not None else ""
        new_node = "" if typ == "DELETED" else ((entry.obj.get("spec") or {}).get("nodeName") or "")
        if old_node != new_node or typ == "DELETED":
            if old_node in self.pods_by_node:
                self.pods_by_node[old_node].discard(key)
        if typ != "DELETED":
            self.pods_by_node.setdefault(new_node, set()).add(key)

    def compact(self, rv: int | None = None) -> int:
        """Forget events up to ``rv`` (default: all): a watch from an older rv gets 410."""
        with self.lock:
            target = self.rv if rv is None else rv
            while self.log and self.log[0].rv <= target:
                self.log.popleft()
            self.compacted_rv = max(self.compacted_rv, target)
            return self.compacted_rv

    def events_since(self, key: str, rv: int) -> list[WatchEvent]:
        """Events of one resource newer than rv; caller checked ``rv >= compacted_rv``."""
        out = []
        for ev in reversed(self.log):
            if ev.rv <= rv:
                break
            if ev.key == key:
                out.append(ev)
        out.reverse()
        return out

    def add_watcher(self, w: Watcher) -> None:
        self.watchers[w.key].add(w)

    def remove_watcher(self, w: Watcher) -> None:
        with self.lock:
            self.watchers[w.key].discard(w)

    def close_watchers(self) -> None:
        with self.lock:
            for ws in self.watchers.values():
                for w in ws:
                    w.close()

    # --- writing ---------------------------------------------------------------------------
    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def create(self, r: Resource, body: Mapping[str, Any], *, keep_status: bool = False) -> dict[str, Any]:
        """POST semantics: name or generateName, uid, creationTimestamp, rv, generation."""
        obj = deepcopy_json(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata: must be an object")
        obj["apiVersion"] = r.api_version
        obj["kind"] = r.kind
        with self.lock:
            if not meta.get("name"):
                gen = meta.get("generateName")
                if not gen:
                    raise invalid(r, "", "metadata.name", "Required value: name or generateName is required")
                for _ in range(100):
                    cand = gen + "".join(random.choice(_NAME_ALPHABET) for _ in range(5))
                    if (meta.get("namespace", "") if r.namespaced else "", cand) not in self.objects[r.key]:
                        break
                meta["name"] = cand
            name = meta["name"]
            ns = ""
            if r.namespaced:
                ns = meta.get("namespace") or "default"
                meta["namespace"] = ns
                if (("", ns)) not in self.objects["/namespaces"]:
                    raise ApiError(404, "NotFound", f'namespaces "{ns}" not found',
                                   {"name": ns, "kind": "namespaces"})
                nsobj = self.objects["/namespaces"][("", ns)].obj
                if nsobj["metadata"].get("deletionTimestamp"):
                    raise ApiError(403, "Forbidden", f'{_qualified(r)} "{name}" is forbidden: unable to create new '
                                   f'content in namespace {ns} because it is being terminated')
            else:
                meta.pop("namespace", None)
            if (ns, name) in self.objects[r.key]:
                raise ApiError(409, "AlreadyExists", f'{_qualified(r)} "{name}" already exists',
                               {"name": name, "group": r.group, "kind": r.name})
            for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
                meta.pop(k, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            if r.has_generation:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            if r.has_status and r.reset_status_on_create and not keep_status:
                obj["status"] = dict(res_mod.ZERO_STATUS.get(r.kind, {}))
            if r.kind == "Namespace":
                obj.setdefault("spec", {"finalizers": ["kubernetes"]})
                obj["status"] = {"phase": "Active"}
                meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            meta["resourceVersion"] = self._next_rv()
            e = Entry(obj)
            self.objects[r.key][(ns, name)] = e
            self._emit("ADDED", r, e, None)
            return obj

    def update(self, r: Resource, body: Mapping[str, Any], *, subresource: str | None = None,
               namespace: str = "", name: str = "", create_if_missing: bool = False,
               require_rv: bool | None = None) -> tuple[dict[str, Any], bool]:
        """PUT semantics. Returns (object, created). A stale ``metadata.resourceVersion`` is 409;
        ``.status`` is ignored unless ``subresource == "status"`` (then only status changes);
        a write that changes nothing keeps the rv and emits no event."""
        new = deepcopy_json(body)
        if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object with metadata")
        meta = new.setdefault("metadata", {})
        name = name or meta.get("name", "")
        if meta.get("name") and meta["name"] != name:
            raise ApiError(400, "BadRequest", "the name of the object (%s) does not match the name on the URL (%s)"
                           % (meta["name"], name))
        ns = (namespace or meta.get("namespace") or "default") if r.namespaced else ""
        if r.namespaced and meta.get("namespace") and meta["namespace"] != ns:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                           "sent on the request")
        with self.lock:
            old_e = self.objects[r.key].get((ns, name))
            if old_e is None:
                if create_if_missing or (r.allow_create_on_update and subresource is None):
                    meta["name"] = name
                    if r.namespaced:
                        meta["namespace"] = ns
                    return self.create(r, new), True
                raise not_found(r, name)
            old = old_e.obj
            sent_rv = meta.get("resourceVersion")
            if sent_rv:
                if sent_rv != old["metadata"]["resourceVersion"]:
                    raise conflict(r, name)
            elif (require_rv if require_rv is not None else not r.allow_unconditional_update):
                raise invalid(r, name, "metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update")
            if subresource == "status":
                merged = dict(old)
                merged["status"] = new.get("status", {})
                new = deepcopy_json(merged)
            else:
                if r.has_status:
                    if "status" in old:
                        new["status"] = old["status"]
                    else:
                        new.pop("status", None)
                om = old["metadata"]
                meta = new["metadata"]
                for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                          "generation", "namespace", "name"):
                    if k in om:
                        meta[k] = om[k]
                    else:
                        meta.pop(k, None)
                meta.pop("managedFields", None)
                meta.pop("selfLink", None)
                if r.has_generation and new.get("spec") != old.get("spec"):
                    meta["generation"] = int(om.get("generation", 1)) + 1
            new["apiVersion"] = r.api_version
            new["kind"] = r.kind
            new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            for k in ("labels", "annotations", "finalizers", "ownerReferences"):  # empty == absent, as in Go
                if k in new["metadata"] and not new["metadata"][k]:
                    del new["metadata"][k]
            if new == old:
                return old, False
            nm = new["metadata"]
            if nm.get("deletionTimestamp") and not nm.get("finalizers") and r.kind != "Pod":
                # the last finalizer of an object being deleted is gone: now it goes
                self._remove(r, ns, name)
                return new, False
            nm["resourceVersion"] = self._next_rv()
            e = Entry(new)
            self.objects[r.key][(ns, name)] = e
            self._emit("MODIFIED", r, e, old_e)
            return new, False

    def mutate(self, r: Resource, namespace: str, name: str, fn: Callable[[dict[str, Any]], None],
               *, subresource: str | None = None) -> dict[str, Any]:
        """Read-modify-write under the lock (controllers): ``fn`` edits a copy in place."""
        with self.lock:
            cur = deepcopy_json(self.get(r, namespace, name))
            fn(cur)
            if subresource is None and r.has_status:
                # controllers write spec and status together; do it as two writes' worth in one
                obj, _ = self.update(r, cur, namespace=namespace, name=name)
                if cur.get("status") != obj.get("status"):
                    st = deepcopy_json(obj)
                    st["status"] = cur.get("status", {})
                    obj, _ = self.update(r, st, subresource="status", namespace=namespace, name=name)
                return obj
            obj, _ = self.update(r, cur, subresource=subresource, namespace=namespace, name=name)
            return obj

    def set_meta(self, r: Resource, namespace: str, name: str, **fields: Any) -> dict[str, Any]:
        """Set server-owned metadata (deletionTimestamp...) that API writes cannot change."""
        with self.lock:
            old_e = self.objects[r.key].get((namespace if r.namespaced else "", name))
            if old_e is None:
                raise not_found(r, name)
            new = deepcopy_json(old_e.obj)
            for k, v in fields.items():
                if v is None:
                    new["metadata"].pop(k, None)
                else:
                    new["metadata"][k] = v
            if new == old_e.obj:
                return old_e.obj
            new["metadata"]["resourceVersion"] = self._next_rv()
            e = Entry(new)
            self.objects[r.key][(namespace if r.namespaced else "", name)] = e
            self._emit("MODIFIED", r, e, old_e)
            return new

    def _remove(self, r: Resource, namespace: str, name: str) -> dict[str, Any]:
        old_e = self.objects[r.key].pop((namespace, name))
        obj = deepcopy_json(old_e.obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        e = Entry(obj)
        self._emit("DELETED", r, e, old_e)
        return obj

    def remove(self, r: Resource, namespace: str, name: str, *, uid: str | None = None) -> dict[str, Any] | None:
        """Delete for real (DELETED event). None if absent (or its uid differs)."""
        with self.lock:
            ns = namespace if r.namespaced else ""
            e = self.objects[r.key].get((ns, name))
            if e is None or (uid is not None and e.obj["metadata"].get("uid") != uid):
                return None
            return self._remove(r, ns, name)

    def bulk_load(self, r: Resource, bodies: Iterable[Mapping[str, Any]]) -> int:
        """Fast set-up (tests, benchmarks): create many objects, keeping their status."""
        n = 0
        with self.lock:
            for b in bodies:
                self.create(r, b, keep_status=True)
                n += 1
        return n
