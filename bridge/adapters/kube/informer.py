"""An informer-like watch cache: list, then watch from the list's resourceVersion.

One thread per watched collection. A 410 Gone (compacted rv) triggers a re-list; any other
error a reconnect with exponential backoff. ``synced`` is true only while the cache is known
to follow the server (after a complete list, and while a watch is connected or being
re-opened after a clean server-side timeout); it is false from an error until the next
successful (re)list or watch start, so the daemon fails closed on a stale cache.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kubernetes.watch.watch import iter_resp_lines

from bridge import logs

from .calls import ApiCalls, KubeApiError, read_json, sanitize

log = logs.get(__name__)

T = TypeVar("T")

LIST_PAGE = 500


@dataclass(frozen=True, slots=True)
class InformerStatus:
    name: str
    synced: bool
    last_event_age_s: float | None  # since the last list, watch (re)start, event or bookmark
    relists: int
    errors: int
    last_error: str | None


class _Gone(Exception):
    """The watch's resourceVersion was compacted away: re-list."""


def rv_newer(a: str, b: str) -> bool:
    """Is rv ``a`` newer than ``b``? rvs are opaque, but every apiserver uses integers; if not
    integers, treat ``a`` as newer (the later write wins)."""
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return True


class Informer(Generic[T]):
    """Cache of one collection. ``list_fn`` is a client list method with its selectors bound
    (e.g. ``partial(core.list_node, label_selector=...)``); ``parse`` turns an object's JSON
    into a snapshot; ``key`` names an object in the store."""

    def __init__(self, name: str, resource: str, list_fn: Callable[..., Any], parse: Callable[[Mapping[str, Any]], T],
                 *, calls: ApiCalls, key: Callable[[Mapping[str, Any]], str] = lambda o: str(o["metadata"]["name"]),
                 watch_timeout_s: int = 60, request_timeout_s: float = 10.0, backoff_initial_s: float = 0.2,
                 backoff_max_s: float = 10.0, on_change: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.resource = resource
        self._list_fn = list_fn
        self._parse = parse
        self._key = key
        self._calls = calls
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._store: dict[str, T] = {}
        self._rvs: dict[str, str] = {}
        self._synced = False
        self._ever_synced = threading.Event()
        self._last_contact: float | None = None
        self._relists = 0
        self._errors = 0
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None

    # --- reading ------------------------------------------------------------------------
    def items(self) -> tuple[T, ...]:
        with self._lock:
            return tuple(self._store[k] for k in sorted(self._store))

    def get(self, key: str) -> T | None:
        with self._lock:
            return self._store.get(key)

    def status(self) -> InformerStatus:
        with self._lock:
            age = None if self._last_contact is None else max(0.0, self._clock() - self._last_contact)
            return InformerStatus(self.name, self._synced, age, self._relists, self._errors, self._last_error)

    @property
    def synced(self) -> bool:
        with self._lock:
            return self._synced

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until the first list completed (or timeout); then report ``synced``."""
        self._ever_synced.wait(timeout_s)
        return self.synced

    def write_through(self, obj: Mapping[str, Any]) -> None:
        """Store an object a write of ours returned, so our next read sees our own write
        before its watch event arrives (never replaces a newer one)."""
        key = self._key(obj)
        rv = str(obj.get("metadata", {}).get("resourceVersion", ""))
        with self._lock:
            old = self._rvs.get(key)
            if old is not None and not rv_newer(rv, old):
                return
            self._store[key] = self._parse(obj)
            self._rvs[key] = rv

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.signal_stop()
        self.join(timeout_s)

    def signal_stop(self) -> None:
        """Ask the thread to end and unblock its watch read; does not wait."""
        self._stop.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()
            except Exception:  # noqa: BLE001 - closing a socket another thread reads may fail; it ends that read
                pass

    def join(self, timeout_s: float = 5.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    # --- the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        rv: str | None = None
        backoff = self._backoff_initial_s
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                rv = self._watch(rv)
                backoff = self._backoff_initial_s
            except _Gone:
                log.info("watch_gone_relist", informer=self.name)
                self._set_unsynced("410 Gone: resourceVersion compacted")
                rv = None
            except Exception as e:  # noqa: BLE001 - any failure: mark unsynced, back off, retry
                if self._stop.is_set():
                    break
                msg = sanitize(str(e) if isinstance(e, KubeApiError) else f"{type(e).__name__}: {e}")
                self._set_unsynced(msg)
                with self._lock:
                    self._errors += 1
                log.warning("watch_failed", informer=self.name, error=msg, retry_in_s=round(backoff, 2))
                if isinstance(e, KubeApiError) and e.status == 410:
                    rv = None
                    continue
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max_s)

    def _set_unsynced(self, why: str) -> None:
        with self._lock:
            self._synced = False
            self._last_error = why

    def _touch(self) -> None:
        with self._lock:
            self._last_contact = self._clock()

    def _relist(self) -> str:
        items: dict[str, T] = {}
        rvs: dict[str, str] = {}
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": LIST_PAGE, "_preload_content": False, "_request_timeout": self._request_timeout_s}
            if cont:
                kwargs["_continue"] = cont
            doc = read_json(self._calls.run("list", self.resource, "", self._list_fn, **kwargs))
            for obj in doc.get("items") or ():
                self._absorb(items, rvs, obj)
            meta = doc.get("metadata") or {}
            cont = meta.get("continue") or None
            if not cont:
                list_rv = str(meta.get("resourceVersion", ""))
                break
        with self._lock:
            self._store = items
            self._rvs = rvs
            self._synced = True
            self._relists += 1
            self._last_contact = self._clock()
        self._ever_synced.set()
        self._changed()
        log.debug("informer_listed", informer=self.name, items=len(items), rv=list_rv)
        return list_rv

    def _absorb(self, items: dict[str, T], rvs: dict[str, str], obj: Mapping[str, Any]) -> None:
        try:
            key = self._key(obj)
            items[key] = self._parse(obj)
            rvs[key] = str(obj.get("metadata", {}).get("resourceVersion", ""))
        except (KeyError, TypeError, ValueError) as e:
            log.warning("object_unparsable", informer=self.name, error=sanitize(str(e)))

    def _watch(self, rv: str) -> str:
        timeouts = (self._request_timeout_s, self._watch_timeout_s + self._request_timeout_s)
        resp = self._calls.run("watch", self.resource, "", self._list_fn, watch=True, resource_version=rv,
                               allow_watch_bookmarks=True, timeout_seconds=self._watch_timeout_s,
                               _preload_content=False, _request_timeout=timeouts)
        self._resp = resp
        with self._lock:
            self._synced = True
            self._last_contact = self._clock()
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line:
                    continue
                rv = self._handle(json.loads(line), rv)
        finally:
            self._resp = None
            resp.release_conn()
        return rv

    def _handle(self, event: Mapping[str, Any], rv: str) -> str:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise RuntimeError(f"watch ERROR event: {obj.get('code')} {obj.get('message', '')}")
        new_rv = str((obj.get("metadata") or {}).get("resourceVersion", "")) or rv
        if kind == "BOOKMARK":
            self._touch()
            return new_rv
        key = self._key(obj)
        with self._lock:
            old = self._rvs.get(key)
            if kind in ("ADDED", "MODIFIED") and old is not None and old != new_rv and not rv_newer(new_rv, old):
                pass  # older than what a write of ours already stored: never go back in time
            elif kind in ("ADDED", "MODIFIED"):
                try:
                    self._store[key] = self._parse(obj)
                    self._rvs[key] = new_rv
                except (KeyError, TypeError, ValueError) as e:
                    log.warning("object_unparsable", informer=self.name, error=sanitize(str(e)))
            elif kind == "DELETED":
                self._store.pop(key, None)
                self._rvs.pop(key, None)
            self._last_contact = self._clock()
        self._changed()
        return new_rv

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()
