"""Leader election on a coordination.k8s.io/v1 Lease, one non-blocking step per daemon tick.

Why our own ~200 lines and not ``kubernetes.leaderelection``: that module runs a blocking loop
with callbacks in its own thread; the daemon needs ``try_acquire_or_renew() -> bool`` inside
its tick, ``release()`` on SIGTERM, and a leadership that lapses by itself (fencing).

Rules (those of client-go's leaderelection):
- Expiry is judged on the local monotonic clock, never by comparing our wall clock with the
  holder's ``renewTime``: a Lease held by another is taken over only after its record has not
  changed for ``leaseDurationSeconds`` since we first saw that record.
- Every write carries the Lease's resourceVersion; a 409 means another instance won the race.
- Fencing: ``is_leader`` turns false once no renewal succeeded for ``renew_deadline_s``
  (< lease duration), so a partitioned leader stops acting before anyone may take over.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from bridge import logs
from bridge import wellknown as wk
from bridge.adapters.kube.calls import ApiCalls, KubeApiError, read_json, send_json
from bridge.config import RENEW_DEADLINE_FRACTION
from bridge.errors import AdapterError

log = logs.get(__name__)


def default_identity() -> str:
    """hostname + pid + a random suffix: unique per process, readable in ``kubectl get lease``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _micro_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str  # "" = released
    lease_duration_s: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LeaseRecord:
        spec = obj.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((obj.get("metadata") or {}).get("resourceVersion", "")),
        )

    def same_record(self, other: LeaseRecord | None) -> bool:
        """Unchanged since ``other`` was seen: any write (a renewal) changes the rv."""
        mine = (self.resource_version, self.holder, self.renew_time)
        return other is not None and mine == (other.resource_version, other.holder, other.renew_time)


class _Leases:
    """The three Lease calls of ``CoordinationV1Api``; the writes send their body as built
    (``calls.send_json``): the generated client would rewrite a renewTime of .000000 into a
    form a real apiserver refuses."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._client = api_client
        self._typed = k8s.CoordinationV1Api(api_client)

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> Any:
        return self._typed.read_namespaced_lease(name, namespace, **kw)

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **kw: Any) -> Any:
        return send_json(self._client, "POST", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases", body, **kw)

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any], **kw: Any) -> Any:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        return send_json(self._client, "PUT", path, body, **kw)


class LeaderElector:
    """Call ``try_acquire_or_renew()`` every tick; act only while ``is_leader``."""

    def __init__(self, api_client: k8s.ApiClient, *, namespace: str, identity: str | None = None,
                 name: str = wk.LEASE_NAME, lease_duration_s: float = 15.0, renew_deadline_s: float | None = None,
                 retry_period_s: float | None = None, request_timeout_s: float | None = None,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.identity = identity or default_identity()
        self.namespace = namespace
        self.name = name
        self.lease_duration_s = max(1, round(lease_duration_s))
        self.renew_deadline_s = renew_deadline_s if renew_deadline_s is not None else self.lease_duration_s * RENEW_DEADLINE_FRACTION
        if not 0 < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(f"renew_deadline_s: expected 0 < value < lease_duration_s ({self.lease_duration_s}), got {self.renew_deadline_s}")
        self.retry_period_s = retry_period_s if retry_period_s is not None else min(2.0, self.renew_deadline_s / 3)
        self.request_timeout_s = request_timeout_s if request_timeout_s is not None else max(0.5, min(5.0, self.renew_deadline_s / 3))
        self.calls = ApiCalls()
        self._api = _Leases(api_client)
        self._monotonic = monotonic
        self._wall = wall
        self._held = False
        self._last_renew: float | None = None  # monotonic time of our last successful write
        self._last_attempt: float | None = None
        self._mine: LeaseRecord | None = None  # the record we last wrote
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self.last_error: str | None = None
        self._lock = threading.RLock()  # the tick and the LeaseKeeper's thread both step it

    # --- state --------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """True only while our last renewal is younger than the renew deadline."""
        return self._held and self._last_renew is not None and self._monotonic() - self._last_renew < self.renew_deadline_s

    def valid_for_s(self) -> float:
        """How long leadership holds without another successful renewal (0 = not leader)."""
        if not self.is_leader or self._last_renew is None:
            return 0.0
        return max(0.0, self.renew_deadline_s - (self._monotonic() - self._last_renew))

    def hold_for(self, seconds: float) -> bool:
        """True if leadership lasts at least ``seconds`` more, renewing first (past the retry
        throttle) when it would not: a Slurm command that may take ``seconds`` is started only
        if it ends while we still lead, so no standby can have taken over before it lands."""
        with self._lock:
            if self.valid_for_s() >= seconds:
                return True
            if not (self._held and self._mine is not None and self.is_leader):
                return False
            self._last_attempt = None  # this renewal is needed now, not at the next retry period
            self._step()
            return self.valid_for_s() >= seconds

    @property
    def holder(self) -> str | None:
        """The holder last seen on the Lease ("" = released, None = not read yet)."""
        return self._observed.holder if self._observed is not None else None

    # --- the step -----------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """One non-blocking step: renew if leader, acquire if free or expired. Returns
        ``is_leader``. API errors are logged and kept in ``last_error``, never raised."""
        with self._lock:
            return self._step()

    def renew_if_held(self) -> bool:
        """Renew only if we hold the Lease and still lead (the LeaseKeeper's step): never
        acquires, so it cannot take the Lease back after ``release()`` or a lapse."""
        with self._lock:
            if not (self._held and self._mine is not None and self.is_leader):
                return False
            return self._step()

    def _step(self) -> bool:
        now = self._monotonic()
        if self._last_attempt is not None and now - self._last_attempt < self.retry_period_s and (self.is_leader or not self._held):
            return self.is_leader
        self._last_attempt = now
        try:
            if self._held and self._mine is not None:
                self._renew()
            else:
                self._acquire()
            self.last_error = None
        except (AdapterError, KeyError, TypeError, ValueError) as e:  # never raise into the tick
            self.last_error = str(e) if isinstance(e, AdapterError) else f"bad Lease object: {type(e).__name__}: {e}"
            log.warning("lease_step_failed", lease=self.name, identity=self.identity, error=self.last_error, leader=self.is_leader)
        if self._held and not self.is_leader:
            log.warning("leadership_lapsed", lease=self.name, identity=self.identity, reason="renew_deadline_passed")
            self._held = False
        return self.is_leader

    def release(self) -> bool:
        """Give the Lease up (SIGTERM): stop acting first, then clear the holder so a standby
        takes over at once. Returns True if the Lease was released by this call."""
        with self._lock:
            return self._release()

    def _release(self) -> bool:
        was_held, mine = self._held, self._mine
        self._held = False
        self._last_renew = None
        if not was_held or mine is None:
            return False
        body = self._body(holder="", acquire_time=mine.acquire_time, transitions=mine.transitions,
                          rv=mine.resource_version, duration_s=1)
        try:
            self._call("update", self._api.replace_namespaced_lease, self.name, self.namespace, body)
        except (AdapterError, KeyError, TypeError, ValueError) as e:
            log.warning("lease_release_failed", lease=self.name, identity=self.identity, error=str(e))
            return False
        log.info("lease_released", lease=self.name, identity=self.identity)
        return True

    # --- internals ----------------------------------------------------------------------
    def _body(self, *, holder: str, acquire_time: str | None, transitions: int, rv: str | None, duration_s: int | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv is not None:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration_s or self.lease_duration_s,
                "acquireTime": acquire_time,
                "renewTime": _micro_time(self._wall()),
                "leaseTransitions": transitions,
            },
        }

    def _call(self, verb: str, fn: Callable[..., Any], *args: Any) -> LeaseRecord:
        """One call on the Lease (a read or a write), the Lease it answers."""
        obj = read_json(self.calls.run(verb, "leases", self.name, fn, *args, _preload_content=False, _request_timeout=self.request_timeout_s))
        return LeaseRecord.from_json(obj)

    def _won(self, rec: LeaseRecord, started: float, *, acquired: bool) -> None:
        self._mine = rec
        self._observed = rec
        self._observed_at = started
        self._last_renew = started  # measured from before the request: conservative
        if acquired or not self._held:
            log.info("lease_acquired", lease=self.name, identity=self.identity, transitions=rec.transitions)
        self._held = True

    def _lost(self, why: str) -> None:
        if self._held:
            log.warning("leadership_lost", lease=self.name, identity=self.identity, reason=why)
        self._held = False
        self._mine = None

    def _renew(self) -> None:
        assert self._mine is not None
        started = self._monotonic()
        body = self._body(holder=self.identity, acquire_time=self._mine.acquire_time, transitions=self._mine.transitions, rv=self._mine.resource_version)
        try:
            rec = self._call("update", self._api.replace_namespaced_lease, self.name, self.namespace, body)
        except KubeApiError as e:
            if e.status == 409:  # someone wrote the Lease: re-read and judge
                self._lost("conflict")
                self._acquire()
                return
            raise
        self._won(rec, started, acquired=False)

    def _acquire(self) -> None:
        started = self._monotonic()
        try:
            current = self._call("get", self._api.read_namespaced_lease, self.name, self.namespace)
        except KubeApiError as e:
            if e.status != 404:
                raise
            self._create(started)
            return
        if not current.same_record(self._observed):
            self._observed = current
            self._observed_at = started
        if current.holder == self.identity and self._mine is not None and current.resource_version == self._mine.resource_version:
            pass  # still ours (e.g. renewing after a 409 that turned out to be ours)
        elif current.holder and current.holder != self.identity:
            duration = current.lease_duration_s or self.lease_duration_s
            if started - self._observed_at < duration:
                self._lost(f"held by {current.holder}")
                return
            log.info("lease_expired_taking_over", lease=self.name, identity=self.identity, previous=current.holder)
        taking_over = current.holder != self.identity
        body = self._body(
            holder=self.identity,
            acquire_time=_micro_time(self._wall()) if taking_over else current.acquire_time,
            transitions=current.transitions + (1 if taking_over and current.holder else 0),
            rv=current.resource_version,
        )
        self._claim(started, taking_over, lambda: self._call("update", self._api.replace_namespaced_lease, self.name,
                                                               self.namespace, body))

    def _create(self, started: float) -> None:
        body = self._body(holder=self.identity, acquire_time=_micro_time(self._wall()), transitions=0, rv=None)
        create = self._api.create_namespaced_lease
        self._claim(started, True, lambda: self._call("create", create, self.namespace, body))

    def _claim(self, started: float, acquired: bool, write: Callable[[], LeaseRecord]) -> None:
        """Take the Lease with ``write``; a 409 (another instance wrote it, or created it, first)
        loses the race."""
        try:
            rec = write()
        except KubeApiError as e:
            if e.status == 409:
                self._lost("lost the race")
                return
            raise
        self._won(rec, started, acquired=acquired)


class LeaseKeeper:
    """Renews a held Lease from its own thread, so a slow tick (Slurm commands near their
    timeout, many chained steps) does not lose the leadership half-way and hand the cluster
    to a standby for nothing. It renews only while ``alive()`` (the daemon's loop made
    progress recently), so a wedged loop still lets the Lease lapse and a standby take over;
    it never acquires (the tick does). Writes stay fenced on ``is_leader`` either way."""

    def __init__(self, elector: LeaderElector, alive: Callable[[], bool], *, period_s: float | None = None) -> None:
        self.elector = elector
        self.alive = alive
        self.period_s = period_s if period_s is not None else elector.retry_period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0
        self.skipped_stalled = 0

    def start(self) -> LeaseKeeper:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, self.elector.request_timeout_s + 1.0))
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            if not self.elector.is_leader:
                continue
            if not self.alive():
                self.skipped_stalled += 1
                if self.skipped_stalled == 1:
                    log.warning("lease_keeper_loop_stalled", lease=self.elector.name, identity=self.elector.identity)
                continue
            self.skipped_stalled = 0
            try:
                if self.elector.renew_if_held():
                    self.renewals += 1
            except Exception as exc:  # a renewal error must not kill the thread; the tick retries
                log.warning("lease_keeper_error", lease=self.elector.name, error=f"{type(exc).__name__}: {exc}")
