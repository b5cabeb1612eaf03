"""REST semantics of the Kubernetes API over the store, independent of HTTP: routing a
path to a resource, and get/list/watch/create/update/patch/delete plus the status, scale,
eviction and binding subresources. ``http.py`` only moves bytes."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_bridge_lab.sandbox.kube import defaults, events as events_mod, patch as patch_mod, resources as res_mod, selectors, \
    tables
from gpu_bridge_lab.sandbox.kube.eviction import evict
from gpu_bridge_lab.sandbox.kube.resources import Resource
from gpu_bridge_lab.sandbox.kube.store import ApiError, Entry, Store, WatchEvent, Watcher, conflict, deepcopy_json, \
    not_found, now_rfc3339

JSON = "application/json"


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: Mapping[str, str]
    body: bytes = b""

    def param(self, name: str, default: str = "") -> str:
        return self.query.get(name, default)

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("1", "true", "yes")

    def json_body(self) -> Any:
        if not self.body:
            return None
        ct = self.headers.get("content-type", JSON).lower()
        if "protobuf" in ct or "cbor" in ct:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                           f"accepted media types include: application/json (got {ct})")
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"the request body is not JSON: {exc}") from None


@dataclass(slots=True)
class Response:
    code: int
    body: bytes
    content_type: str = JSON

    @classmethod
    def of(cls, code: int, obj: Any) -> "Response":
        return cls(code, json.dumps(obj, separators=(",", ":")).encode())


@dataclass(slots=True)
class Target:
    """What a resource path names."""

    resource: Resource
    namespace: str | None  # None = all namespaces (collection) or cluster-scoped
    name: str = ""
    subresource: str = ""


@dataclass
class Settings:
    """Server behaviour knobs shared by the API and the HTTP layer."""

    bookmark_interval_s: float = 1.0
    default_watch_timeout_s: float = 1800.0
    server_address: str = "127.0.0.1:0"
    git_version: str = "v1.32.0-gpu-bridge-sandbox"


def parse_target(parts: list[str]) -> tuple[str, str, Target | None, bool]:
    """Split ``/api/v1/...`` or ``/apis/G/V/...`` into (group, version, target, legacy watch)."""
    if parts[:1] == ["api"]:
        if len(parts) < 2:
            return "", "", None, False
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return "", "", None, False
    legacy_watch = False
    if rest[:1] == ["watch"]:
        legacy_watch, rest = True, rest[1:]
    if not rest:
        return group, version, None, legacy_watch
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    r = res_mod.lookup(group, version, rest[0])
    if r is None:
        raise ApiError(404, "NotFound", "the server could not find the requested resource",
                       {"group": group, "kind": rest[0]})
    if namespace is not None and not r.namespaced:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if len(rest) > 3:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    if sub and r.subresource(sub) is None:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return group, version, Target(r, namespace, name, sub), legacy_watch


def _check_ns_match(t: Target, body: Mapping[str, Any]) -> None:
    meta = body.get("metadata") or {}
    if t.resource.namespaced and t.namespace and meta.get("namespace") and meta["namespace"] != t.namespace:
        raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace sent "
                       "on the request")


class Api:
    """The verbs on a parsed ``Target``; controllers see the writes through the store."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    # events.k8s.io/v1 Events are core/v1 Events seen another way: stored once, converted.
    @staticmethod
    def _converted(r: Resource) -> bool:
        return r.group == "events.k8s.io"

    def _storage(self, t: Target) -> Target:
        if self._converted(t.resource):
            return Target(res_mod.core("events"), t.namespace, t.name, t.subresource)
        return t

    def _view(self, r: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        return events_mod.to_events_v1(obj) if self._converted(r) else obj

    def _raw(self, r: Resource, e: Entry) -> bytes:
        if self._converted(r):
            return json.dumps(events_mod.to_events_v1(e.obj), separators=(",", ":")).encode()
        return e.raw()

    def _out(self, r: Resource, code: int, obj: dict[str, Any]) -> Response:
        return Response.of(code, self._view(r, obj))

    # --- reads -------------------------------------------------------------------------------
    def get(self, t: Target, req: Request) -> Response:
        api_r, t = t.resource, self._storage(t)
        e = self.store.get_entry(t.resource, t.namespace or "", t.name)
        if e is None:
            raise not_found(t.resource, t.name)
        obj = e.obj
        if t.subresource == "scale":
            return Response.of(200, scale_of(t.resource, obj))
        if t.subresource not in ("", "status"):
            raise ApiError(405, "MethodNotAllowed", f"GET is not supported on {t.resource.name}/{t.subresource}")
        table = tables.wants_table(req.headers.get("accept", ""))
        if table:
            return Response.of(200, tables.table(api_r, [self._view(api_r, obj)], str(self.store.rv), table,
                                                 req.param("includeObject", "PartialObjectMetadata")))
        return Response(200, self._raw(api_r, e))

    def _selectors(self, t: Target, req: Request) -> tuple[Any, Any]:
        try:
            lreqs = selectors.parse_label_selector(req.param("labelSelector"))
            freqs = selectors.parse_field_selector(req.param("fieldSelector"), f"{t.resource.group}/{t.resource.name}",
                                                   t.resource.kind)
        except selectors.SelectorError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from None
        return lreqs, freqs

    def list(self, t: Target, req: Request) -> Response:
        lreqs, freqs = self._selectors(t, req)
        api_r, t = t.resource, self._storage(t)
        limit = int(req.param("limit", "0") or 0)
        cont = req.param("continue")
        start_key: tuple[str, str] | None = None
        with self.store.lock:
            list_rv = self.store.rv
            if cont:
                try:
                    tok = json.loads(base64.urlsafe_b64decode(cont.encode()))
                    list_rv, start_key = int(tok["rv"]), (tok["ns"], tok["name"])
                except (ValueError, KeyError, TypeError):
                    raise ApiError(400, "BadRequest", "continue key is not valid") from None
                if list_rv < self.store.compacted_rv:
                    raise ApiError(410, "Expired", "The provided continue parameter is too old to display a "
                                   "consistent list result. You can start a new list without the continue parameter.")
            keys = None
            if t.resource.key == "/pods":
                node = next((f.value for f in freqs if f.field == "spec.nodeName" and not f.negate), None)
                if node is not None:
                    keys = list(self.store.pods_by_node.get(node, ()))
            entries = self.store.entries(t.resource, t.namespace, after=start_key, keys=keys)
        out: list[Entry] = []
        remaining = 0
        next_key: tuple[str, str] | None = None
        for e in entries:
            m = e.obj["metadata"]
            key = (m.get("namespace", ""), m["name"])
            if not (selectors.labels_match(lreqs, m.get("labels")) and
                    selectors.fields_match(freqs, self._view(api_r, e.obj))):
                continue
            if limit and len(out) >= limit:
                remaining += 1
                continue
            out.append(e)
            next_key = key
        meta: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if remaining and next_key is not None:
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": list_rv, "ns": next_key[0], "name": next_key[1]}).encode()).decode()
            meta["remainingItemCount"] = remaining
        table = tables.wants_table(req.headers.get("accept", ""))
        if table:
            tb = tables.table(api_r, [self._view(api_r, e.obj) for e in out], str(list_rv), table,
                              req.param("includeObject", "PartialObjectMetadata"))
            tb["metadata"].update({k: v for k, v in meta.items() if k != "resourceVersion"})
            return Response.of(200, tb)
        head = json.dumps({"kind": api_r.kind + "List", "apiVersion": api_r.api_version,
                           "metadata": meta}, separators=(",", ":")).encode()
        body = head[:-1] + b',"items":[' + b",".join(self._raw(api_r, e) for e in out) + b"]}"
        return Response(200, body)

    # --- watch -------------------------------------------------------------------------------
    def watch(self, t: Target, req: Request) -> Iterator[bytes]:
        """Lines of a watch stream (each a JSON event), ending at timeoutSeconds."""
        lreqs, freqs = self._selectors(t, req)
        api_r = t.resource
        t = self._storage(t)
        r = t.resource
        view = self._view
        rv_param = req.param("resourceVersion")
        timeout = float(req.param("timeoutSeconds") or go_duration_s(req.param("timeout"))
                        or self.settings.default_watch_timeout_s)
        bookmarks = req.flag("allowWatchBookmarks")
        send_initial = req.flag("sendInitialEvents")
        table = tables.wants_table(req.headers.get("accept", ""))
        include = req.param("includeObject", "PartialObjectMetadata")
        ns = t.namespace if r.namespaced else None
        w = Watcher(r.key, ns)

        def match(obj: dict[str, Any]) -> bool:
            m = obj["metadata"]
            return selectors.labels_match(lreqs, m.get("labels")) and selectors.fields_match(freqs, view(api_r, obj))

        def line(typ: str, entry: Entry | None = None, obj: Any = None) -> bytes:
            if table and typ in ("ADDED", "MODIFIED", "DELETED"):
                o = view(api_r, entry.obj if entry is not None else obj)
                tb = tables.table(api_r, [o], o["metadata"]["resourceVersion"], table, include)
                return json.dumps({"type": typ, "object": tb}, separators=(",", ":")).encode() + b"\n"
            if entry is not None:
                raw = self._raw(api_r, entry)
            else:
                o = view(api_r, obj) if typ in ("ADDED", "MODIFIED", "DELETED") else obj
                raw = json.dumps(o, separators=(",", ":")).encode()
            return b'{"type":"' + typ.encode() + b'","object":' + raw + b"}\n"

        initial: list[bytes] = []
        with self.store.lock:
            if rv_param in ("", "0") or send_initial:
                for e in self.store.entries(r, ns):
                    if match(e.obj):
                        initial.append(line("ADDED", e))
                start_rv = self.store.rv
                if send_initial and bookmarks:
                    initial.append(line("BOOKMARK", obj=self._bookmark(api_r, start_rv, initial_end=True)))
            else:
                try:
                    start_rv = int(rv_param)
                except ValueError:
                    raise ApiError(400, "BadRequest", f"invalid resource version: {rv_param!r}") from None
                if start_rv < self.store.compacted_rv:
                    err = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": f"too old resource version: {start_rv} ({self.store.compacted_rv})",
                           "reason": "Expired", "code": 410}
                    yield line("ERROR", obj=err)
                    return
                for ev in self.store.events_since(r.key, start_rv):
                    if ns is None or ev.namespace == ns:
                        w.events.append(ev)
            self.store.add_watcher(w)
        try:
            for chunk in initial:
                yield chunk
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + self.settings.bookmark_interval_s
            while not w.closed:
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = min(deadline - now, next_bookmark - now if bookmarks else deadline - now)
                evs = w.pop_all(max(0.0, min(wait, 2.0)))
                for ev in evs:
                    out = self._convert(ev, match, line)
                    if out:
                        yield out
                if bookmarks and time.monotonic() >= next_bookmark:
                    with self.store.lock:
                        pending = bool(w.events)
                        bm_rv = self.store.rv
                    if not pending:
                        yield line("BOOKMARK", obj=self._bookmark(api_r, bm_rv))
                    next_bookmark = time.monotonic() + self.settings.bookmark_interval_s
                if not evs:
                    yield b""  # lets the HTTP layer notice a closed client
        finally:
            self.store.remove_watcher(w)

    @staticmethod
    def _bookmark(r: Resource, rv: int, initial_end: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": r.kind, "apiVersion": r.api_version, "metadata": meta}

    @staticmethod
    def _convert(ev: WatchEvent, match: Any, line: Any) -> bytes | None:
        cur = match(ev.entry.obj)
        if ev.type == "ADDED":
            return line("ADDED", ev.entry) if cur else None
        if ev.type == "DELETED":
            return line("DELETED", ev.entry) if (ev.prev is not None and match(ev.prev.obj)) or cur else None
        old = ev.prev is not None and match(ev.prev.obj)
        if cur and old:
            return line("MODIFIED", ev.entry)
        if cur:
            return line("ADDED", ev.entry)
        if old and ev.prev is not None:
            gone = deepcopy_json(ev.prev.obj)
            gone["metadata"]["resourceVersion"] = str(ev.rv)
            return line("DELETED", obj=gone)
        return None

    # --- writes ------------------------------------------------------------------------------
    def create(self, t: Target, req: Request) -> Response:
        api_r, t = t.resource, self._storage(t)
        r = t.resource
        raw = req.json_body()
        if self._converted(api_r) and isinstance(raw, dict):
            raw = events_mod.to_core(raw)
        if t.subresource in ("eviction", "binding"):
            if not isinstance(raw, dict):
                raise ApiError(400, "BadRequest", "the request body must be a JSON object")
            if t.subresource == "eviction":
                return evict(self.store, t.namespace or "default", t.name, raw)
            return self._bind(t, raw)
        body = defaults.check_type(r, raw)
        if t.subresource:
            raise ApiError(405, "MethodNotAllowed", f"POST is not supported on {r.name}/{t.subresource}")
        if t.name:
            raise ApiError(405, "MethodNotAllowed", "POST to an object path is not allowed; POST to the collection")
        _check_ns_match(t, body)
        body = deepcopy_json(body)
        meta = body.setdefault("metadata", {})
        if r.namespaced:
            meta["namespace"] = t.namespace or meta.get("namespace") or "default"
        if r.has_status and r.reset_status_on_create:
            body["status"] = {}
        defaults.on_create(r, body)
        if req.param("dryRun"):
            return self._out(api_r, 201, body)
        obj = self.store.create(r, body, keep_status=True)
        return self._out(api_r, 201, obj)

    def update(self, t: Target, req: Request) -> Response:
        api_r, t = t.resource, self._storage(t)
        r = t.resource
        body = req.json_body()
        if self._converted(api_r) and isinstance(body, dict):
            body = events_mod.to_core(body)
        if t.subresource == "scale":
            return self._write_scale(t, lambda cur: body if isinstance(body, dict) else {}, body)
        body = defaults.check_type(r, body)
        _check_ns_match(t, body)
        exists = self.store.get_entry(r, t.namespace or "", t.name) is not None
        if not exists and r.allow_create_on_update and not t.subresource:
            body = deepcopy_json(body)
            meta = body.setdefault("metadata", {})
            meta.setdefault("name", t.name)
            if r.namespaced:
                meta["namespace"] = t.namespace or "default"
            defaults.on_create(r, body)
        obj, created = self.store.update(r, body, subresource=t.subresource or None, namespace=t.namespace or "",
                                         name=t.name)
        return self._out(api_r, 201 if created else 200, obj)

    def patch(self, t: Target, req: Request) -> Response:
        api_r, t = t.resource, self._storage(t)
        r = t.resource
        body = req.json_body()
        ct = req.headers.get("content-type", "")
        if t.subresource == "scale":
            def apply_scale(cur: dict[str, Any]) -> Any:
                return self._apply_patch(ct, cur, body)
            return self._write_scale(t, apply_scale, None)
        with self.store.lock:
            cur = self.store.get(r, t.namespace or "", t.name)
            new = self._apply_patch(ct, self._view(api_r, cur), body)
            if not isinstance(new, dict):
                raise ApiError(422, "Invalid", "the patch result is not an object")
            if self._converted(api_r):
                new = events_mod.to_core(new)
            nm = new.get("metadata") or {}
            if (nm.get("name") or t.name) != t.name:
                raise ApiError(400, "BadRequest", "metadata.name: the patch may not change the name")
            if r.namespaced and nm.get("namespace") not in (None, t.namespace):
                raise ApiError(400, "BadRequest", "metadata.namespace: the patch may not change the namespace")
            if "resourceVersion" not in nm:
                new.setdefault("metadata", {})["resourceVersion"] = cur["metadata"]["resourceVersion"]
            if req.param("dryRun"):
                return self._out(api_r, 200, new)
            obj, _ = self.store.update(r, new, subresource=t.subresource or None, namespace=t.namespace or "",
                                       name=t.name, require_rv=False)
        return self._out(api_r, 200, obj)

    @staticmethod
    def _apply_patch(ct: str, cur: Mapping[str, Any], body: Any) -> Any:
        try:
            return patch_mod.apply(ct, cur, body)
        except patch_mod.PatchError as exc:
            reason = {400: "BadRequest", 415: "UnsupportedMediaType", 422: "Invalid"}.get(exc.code, "Invalid")
            raise ApiError(exc.code, reason, str(exc)) from None

    def delete(self, t: Target, req: Request) -> Response:
        api_r, t = t.resource, self._storage(t)
        body = req.json_body() or {}
        opts = dict(body) if isinstance(body, dict) else {}
        if req.param("gracePeriodSeconds"):
            opts["gracePeriodSeconds"] = int(req.param("gracePeriodSeconds"))
        if req.param("dryRun"):
            return self._out(api_r, 200, self.store.get(t.resource, t.namespace or "", t.name))
        obj, done = delete_object(self.store, t.resource, t.namespace or "", t.name, opts)
        if t.resource.kind == "Pod" or not done:
            return self._out(api_r, 200, obj)
        return Response.of(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                 "details": {"name": t.name, "group": api_r.group, "kind": api_r.name,
                                             "uid": obj["metadata"].get("uid")}})

    def delete_collection(self, t: Target, req: Request) -> Response:
        lreqs, freqs = self._selectors(t, req)
        api_r, t = t.resource, self._storage(t)
        body = req.json_body() or {}
        opts = dict(body) if isinstance(body, dict) else {}
        deleted = []
        for obj in self.store.objs(t.resource, t.namespace if t.resource.namespaced else None):
            m = obj["metadata"]
            if selectors.labels_match(lreqs, m.get("labels")) and selectors.fields_match(freqs, self._view(api_r, obj)):
                try:
                    o, _ = delete_object(self.store, t.resource, m.get("namespace", ""), m["name"], opts)
                    deleted.append(self._view(api_r, o))
                except ApiError:
                    pass
        return Response.of(200, {"kind": api_r.kind + "List", "apiVersion": api_r.api_version,
                                 "metadata": {"resourceVersion": str(self.store.rv)}, "items": deleted})

    # --- subresources ----------------------------------------------------------------------
    def _write_scale(self, t: Target, compute: Any, _body: Any) -> Response:
        r = t.resource
        with self.store.lock:
            cur = self.store.get(r, t.namespace or "", t.name)
            scale = scale_of(r, cur)
            new = compute(scale)
            if not isinstance(new, dict):
                raise ApiError(400, "BadRequest", "the Scale body must be an object")
            sent_rv = (new.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != cur["metadata"]["resourceVersion"]:
                raise conflict(r, t.name)
            replicas = (new.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise ApiError(422, "Invalid", f'Scale.autoscaling "{t.name}" is invalid: spec.replicas: Invalid '
                               f'value: {replicas!r}: must be greater than or equal to 0')
            obj = deepcopy_json(cur)
            obj["spec"]["replicas"] = replicas
            updated, _ = self.store.update(r, obj, namespace=t.namespace or "", name=t.name)
        return Response.of(200, scale_of(r, updated))

    def _bind(self, t: Target, body: Mapping[str, Any]) -> Response:
        node = ((body.get("target") or {}).get("name")) or ""
        if not node:
            raise ApiError(422, "Invalid", "Binding: target.name: Required value")
        r = t.resource
        with self.store.lock:
            pod = self.store.get(r, t.namespace or "", t.name)
            if (pod.get("spec") or {}).get("nodeName"):
                raise conflict(r, t.name, f"pod {t.name} is already assigned to node "
                                          f"\"{pod['spec']['nodeName']}\"")
            bind_pod(self.store, t.namespace or "", t.name, node)
        return Response.of(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                 "code": 201})


def go_duration_s(text: str) -> float:
    """A Go duration ("32s", "1m30s", "500ms") in seconds; 0 if empty or malformed."""
    import re

    total = 0.0
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    pos = 0
    for m in re.finditer(r"([0-9.]+)(ms|us|µs|ns|h|m|s)", text or ""):
        if m.start() != pos:
            return 0.0
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    return total if pos == len(text or "") else 0.0


def scale_of(r: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The autoscaling/v1 Scale view of a Deployment/ReplicaSet/StatefulSet (shares its rv)."""
    m = obj["metadata"]
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    sel = spec.get("selector") or {}
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": m["name"], "namespace": m.get("namespace", ""), "uid": m.get("uid"),
                         "resourceVersion": m["resourceVersion"], "creationTimestamp": m.get("creationTimestamp")},
            "spec": {"replicas": spec.get("replicas", 0)},
            "status": {"replicas": status.get("replicas", 0), "selector": ",".join(parts)}}


def bind_pod(store: Store, namespace: str, name: str, node: str) -> dict[str, Any]:
    """Assign a pod to a node (the scheduler's Binding): spec.nodeName + PodScheduled=True."""
    r = res_mod.core("pods")

    def edit(p: dict[str, Any]) -> None:
        p["spec"]["nodeName"] = node
        set_condition(p, "PodScheduled", "True")

    with store.lock:
        cur = deepcopy_json(store.get(r, namespace, name))
        edit(cur)
        # nodeName is immutable through the API once set; the binding writes it with status.
        obj, _ = store.update(r, cur, namespace=namespace, name=name)
        st = deepcopy_json(obj)
        st["status"] = cur["status"]
        obj, _ = store.update(r, st, subresource="status", namespace=namespace, name=name)
        return obj


def set_condition(obj: dict[str, Any], typ: str, status: str, reason: str = "", message: str = "",
                  now: str | None = None) -> bool:
    """Set a status condition; lastTransitionTime moves only when the status changes."""
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    ts = now or now_rfc3339()
    for c in conds:
        if c.get("type") == typ:
            if c.get("status") == status and c.get("reason", "") == reason and c.get("message", "") == message:
                return False
            if c.get("status") != status:
                c["lastTransitionTime"] = ts
            c["status"] = status
            for k, v in (("reason", reason), ("message", message)):
                if v:
                    c[k] = v
                else:
                    c.pop(k, None)
            return True
    c = {"type": typ, "status": status, "lastProbeTime": None, "lastTransitionTime": ts}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    conds.append(c)
    return True


def delete_object(store: Store, r: Resource, namespace: str, name: str,
                  opts: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """DELETE semantics. Returns (object, gone now). Scheduled pods with a grace period are
    marked (deletionTimestamp, MODIFIED) and removed by the kubelet when the grace ends;
    objects with finalizers wait for them; everything else goes at once (DELETED)."""
    with store.lock:
        cur = store.get(r, namespace, name)
        meta = cur["metadata"]
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise conflict(r, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
                                    f"{meta.get('uid')}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise conflict(r, name, f"Precondition failed: ResourceVersion in precondition: "
                                    f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                    f"{meta.get('resourceVersion')}")
        if r.kind == "Pod":
            spec = cur.get("spec") or {}
            grace = opts.get("gracePeriodSeconds")
            if grace is None:
                grace = spec.get("terminationGracePeriodSeconds", 30)
            grace = max(0, int(grace))
            phase = (cur.get("status") or {}).get("phase")
            if spec.get("nodeName") and grace > 0 and phase not in ("Succeeded", "Failed"):
                deadline = time.time() + grace
                old_grace = meta.get("deletionGracePeriodSeconds")
                if meta.get("deletionTimestamp") and old_grace is not None and old_grace <= grace:
                    return cur, False  # a second delete may only shorten the grace
                obj = store.set_meta(r, namespace, name, deletionTimestamp=now_rfc3339(deadline),
                                     deletionGracePeriodSeconds=grace)
                store.deadlines[(namespace, name)] = (meta.get("uid", ""), time.monotonic() + grace)
                return obj, False
        elif r.kind == "Namespace":
            if name in ("default", "kube-system", "kube-public"):
                raise ApiError(403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                               {"name": name, "kind": "namespaces"})
            removed = store.remove(r, "", name)
            for other in res_mod.RESOURCES:
                if other.namespaced:
                    for o in store.objs(other, name):
                        store.remove(other, name, o["metadata"]["name"])
            assert removed is not None
            return removed, True
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return cur, False
            return store.set_meta(r, namespace, name, deletionTimestamp=now_rfc3339(),
                                  deletionGracePeriodSeconds=0), False
        removed = store.remove(r, namespace, name)
        assert removed is not None
        return removed, True
