"""Leader election logic with controlled clocks, over an in-memory stand-in for the client's
CoordinationV1Api (same methods, Status codes and resourceVersion rules as the API server):
acquire, renew, standby waits a full lease duration of *its own* clock, takeover, 409 = lost
race, fencing once renewals fail past the renew deadline, release hands over at once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from bridge.adapters.kube.lease import LeaderElector


class Resp:
    def __init__(self, obj: Any) -> None:
        self.data = json.dumps(obj).encode()

    def release_conn(self) -> None:
        return None


class LeaseStore:
    """The Lease semantics of the API server: 404, 409 AlreadyExists, 409 Conflict on a stale rv."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.rv = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ApiException(status=503, reason="Service Unavailable")

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Resp:
        self._check()
        if self.obj is None:
            raise ApiException(status=404, reason="Not Found")
        return Resp(self.obj)

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> Resp:
        self._check()
        if self.obj is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> Resp:
        self._check()
        rv = body["metadata"].get("resourceVersion")
        if rv is None:
            raise ApiException(status=422, reason="Invalid")
        if self.obj is None or rv != self.obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> Resp:
        self.rv += 1
        self.obj = json.loads(json.dumps(body))
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        return Resp(self.obj)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(store: LeaseStore, clock: Clock, identity: str) -> LeaderElector:
    e = LeaderElector(object(), namespace="gpu-bridge", identity=identity, lease_duration_s=15, renew_deadline_s=10, retry_period_s=1, monotonic=clock, wall=lambda: 1.8e9)  # type: ignore[arg-type]
    e._api = store  # type: ignore[assignment]  # the stand-in for CoordinationV1Api
    return e


@pytest.fixture
def setup() -> tuple[LeaseStore, Clock, LeaderElector, LeaderElector]:
    store, clock = LeaseStore(), Clock()
    return store, clock, elector(store, clock, "a"), elector(store, clock, "b")


def test_first_acquires_second_waits(setup: tuple[LeaseStore, Clock, LeaderElector, LeaderElector]) -> None:
    store, clock, a, b = setup
    assert a.try_acquire_or_renew() and a.is_leader
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "a"
    assert store.obj["spec"]["leaseDurationSeconds"] == 15
    assert not b.try_acquire_or_renew() and b.holder == "a"


def test_standby_takes_over_only_after_a_full_lease_of_its_own_clock(setup: tuple[LeaseStore, Clock, LeaderElector, LeaderElector]) -> None:
    store, clock, a, b = setup
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    for _ in range(14):  # a dies (stops renewing); b polls every second
        clock.t += 1
        assert not b.try_acquire_or_renew()
    clock.t += 1.5
    assert b.try_acquire_or_renew() and b.is_leader
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "b" and store.obj["spec"]["leaseTransitions"] == 1
    assert not a.is_leader  # a's own deadline passed long ago (fencing)


def test_renewing_keeps_the_standby_out(setup: tuple[LeaseStore, Clock, LeaderElector, LeaderElector]) -> None:
    store, clock, a, b = setup
    for _ in range(40):
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
        clock.t += 1
    assert a.calls.snapshot()[("update", "leases")] >= 39  # renew = one PUT with the known rv


def test_fencing_when_renewals_fail_past_the_deadline(setup: tuple[LeaseStore, Clock, LeaderElector, LeaderElector]) -> None:
    store, clock, a, _ = setup
    assert a.try_acquire_or_renew()
    store.down = True
    clock.t += 5
    assert a.try_acquire_or_renew()  # within the renew deadline: still leader
    assert a.last_error is not None and "HTTP 503" in a.last_error
    clock.t += 5.5
    assert not a.try_acquire_or_renew() and not a.is_leader and a.valid_for_s() == 0
    store.down = False
    clock.t += 1
    assert a.try_acquire_or_renew()  # the Lease is still ours: re-acquired


def test_conflict_means_lost_race(setup: tuple[LeaseStore, Clock, LeaderElector, LeaderElector]) -> None:
    store, clock, a, b = setup
    assert a.try_acquire_or_renew()
    assert store.obj is not None
    store.obj["spec"]["holderIdentity"] = "b"  # someone wrote the Lease behind a's back
    store.rv += 1
    store.obj["metadata"]["resourceVersion"] = str(store.rv)
    clock.t += 1
    assert not a.try_acquire_or_renew() and a.holder == "b"


def test_create_race_loses_with_already_exists(setup: tuple[LeaseStore, Clock, LeaderElector, LeaderElector]) -> None:
    store, clock, a, b = setup
    b.try_acquire_or_renew()
    store.obj = None  # a sees 404 then loses the create race to b
    real_create = store.create_namespaced_lease

    def racing_create(namespace: str, body: dict[str, Any], **kw: Any) -> Resp:
        real_create(namespace, {**body, "spec": {**body["spec"], "holderIdentity": "b"}})
        return real_create(namespace, body, **kw)

    store.create_namespaced_lease = racing_create  # type: ignore[method-assign]
    assert not a.try_acquire_or_renew()


def test_release_hands_over_at_once(setup: tuple[LeaseStore, Clock, LeaderElector, LeaderElector]) -> None:
    store, clock, a, b = setup
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release() and not a.is_leader
    assert store.obj is not None and store.obj["spec"]["holderIdentity"] == ""
    clock.t += 1
    assert b.try_acquire_or_renew()
    assert not a.release()  # not ours any more: nothing to release


def test_bad_deadline_is_rejected() -> None:
    with pytest.raises(ValueError, match="renew_deadline_s: expected 0 < value < lease_duration_s"):
        LeaderElector(object(), namespace="x", lease_duration_s=5, renew_deadline_s=5)  # type: ignore[arg-type]


def test_a_garbled_lease_is_an_error_not_a_crash(setup: tuple[LeaseStore, Clock, LeaderElector, LeaderElector]) -> None:
    store, clock, a, b = setup
    a.try_acquire_or_renew()
    assert store.obj is not None
    store.obj["spec"]["leaseDurationSeconds"] = "fifteen"
    assert not b.try_acquire_or_renew()
    assert b.last_error is not None and b.last_error.startswith("bad Lease object: ValueError")


# --- LeaseKeeper: renewals from their own thread ----------------------------------------

import threading  # noqa: E402
import time  # noqa: E402

from bridge.adapters.kube.lease import LeaseKeeper  # noqa: E402


def real_elector(store: LeaseStore, identity: str, *, lease_s: int = 3, deadline_s: float = 2.0) -> LeaderElector:
    e = LeaderElector(object(), namespace="gpu-bridge", identity=identity, lease_duration_s=lease_s,  # type: ignore[arg-type]
                      renew_deadline_s=deadline_s, retry_period_s=0.1, wall=lambda: 1.8e9)
    e._api = store  # type: ignore[assignment]
    return e


def test_the_keeper_holds_the_lease_through_a_slow_tick_and_never_acquires() -> None:
    store = LeaseStore()
    a, b = real_elector(store, "a"), real_elector(store, "b")
    assert a.try_acquire_or_renew()
    keeper = LeaseKeeper(a, alive=lambda: True, period_s=0.1).start()
    try:
        # a "tick" of 3.5 s, longer than the renew deadline (2 s) and the lease (3 s):
        # without the keeper a would be fenced and b would take over
        end = time.monotonic() + 3.5
        while time.monotonic() < end:
            assert not b.try_acquire_or_renew()
            time.sleep(0.1)
        assert a.is_leader and keeper.renewals >= 10
        assert store.obj is not None and store.obj["spec"]["holderIdentity"] == "a"
        a.release()  # SIGTERM: the keeper must not take the Lease back
        time.sleep(0.5)
        assert store.obj["spec"]["holderIdentity"] == "" and not a.is_leader
        assert b.try_acquire_or_renew()
    finally:
        keeper.stop()


def test_a_stalled_loop_lets_the_lease_lapse_so_a_standby_takes_over() -> None:
    store = LeaseStore()
    a, b = real_elector(store, "a"), real_elector(store, "b")
    assert a.try_acquire_or_renew()
    alive = threading.Event()
    alive.set()
    keeper = LeaseKeeper(a, alive=alive.is_set, period_s=0.1).start()
    try:
        time.sleep(0.5)
        alive.clear()  # the daemon's loop wedges
        assert not b.try_acquire_or_renew()
        deadline = time.monotonic() + 10.0
        while not b.try_acquire_or_renew() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert b.is_leader and not a.is_leader
        assert keeper.skipped_stalled > 0
    finally:
        keeper.stop()
