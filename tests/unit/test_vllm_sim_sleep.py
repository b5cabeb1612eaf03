"""The vLLM simulator's sleep mode: the pure state and memory model (levels, tags, wake time),
the simulation (a sleeping replica takes no requests; sleep refused with requests in flight),
and vLLM's dev endpoints over real HTTP (404 without VLLM_SERVER_DEV_MODE=1 or
--enable-sleep-mode, /sleep?level=, /wake_up?tags=, /is_sleeping, calls that return when the
copy is done) with the metrics they move (vllm:engine_sleep_state, DCGM_FI_DEV_FB_USED/FREE,
host memory)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.trace import Trace
from gpu_bridge_lab.sandbox.vllm.server import SimServer
from gpu_bridge_lab.sandbox.vllm.sim import SimError, Simulation
from gpu_bridge_lab.sandbox.vllm.sleep import AWAKE, DISCARD_ALL, WEIGHTS_OFFLOADED, SleepParams, SleepState

FLAT = Trace((0.0, 600.0), (5.0, 5.0), (1.0, 1.0), 600.0, "flat")
IDLE = Trace((0.0, 600.0), (0.0, 0.0), (1.0, 1.0), 600.0, "idle")
# small and fast: 4 GPUs, 8 GiB of weights, wake from host in 0.2 + 2048 MiB / 8 GiB/s = 0.45 s
FAST = SleepParams(gpu_total_mib=16384, weights_mib=8192, cuda_context_mib=500, host_base_mib=1000,
                   h2d_gib_per_s=8, load_gib_per_s=4, wake_overhead_s=0.2, sleep_overhead_s=0.1)


# --- the pure model ---------------------------------------------------------------------------

def test_defaults_model_a_70b_replica_on_four_80gb_gpus() -> None:
    p = SleepParams()
    st = SleepState(p)
    awake_used = st.gpu_used_mib()
    assert awake_used == pytest.approx(0.9 * 81559)
    st.sleep(0.0, 1)
    assert st.gpu_used_mib() == p.cuda_context_mib  # all but the CUDA context freed
    assert st.host_mib() == p.host_base_mib + p.weights_mib  # ~130 GiB of weights in host memory
    assert 1.5 < p.wake_s(1) < 5  # seconds: a host -> device copy of one shard per GPU
    assert 60 < p.wake_s(2) < 120  # level 2 reads the weights again
    assert p.wake_s(1) * 50 < 300  # vs a ~300 s cold start


def test_level_1_offloads_level_2_discards() -> None:
    st = SleepState(FAST)
    assert (st.sleep_state(), st.is_sleeping, st.host_mib()) == (AWAKE, False, 1000)
    done = st.sleep(10.0, 1)
    assert done == pytest.approx(10.0 + FAST.offload_s())
    assert (st.sleep_state(), st.is_sleeping) == (WEIGHTS_OFFLOADED, True)
    assert st.host_mib() == 1000 + 8192
    assert st.gpu_used_mib() == 500
    done = st.wake(20.0)
    assert done == pytest.approx(20.0 + 0.2 + 2048 / 1024 / 8)
    assert (st.sleep_state(), st.is_sleeping, st.host_mib()) == (AWAKE, False, 1000)
    assert st.gpu_used_mib() == pytest.approx(0.9 * 16384)

    st.sleep(30.0, 2)
    assert (st.sleep_state(), st.host_mib(), st.gpu_used_mib()) == (DISCARD_ALL, 1000, 500)
    assert st.wake(40.0) == pytest.approx(40.0 + 0.2 + 8192 / 1024 / 4)  # read again: slower


def test_wake_by_tags_like_vllm() -> None:
    """Still sleeping until every part is awake; the weights first, then the KV cache."""
    st = SleepState(FAST)
    st.sleep(0.0, 1)
    st.wake(1.0, ["weights"])
    assert st.is_sleeping and st.sleep_state() == AWAKE  # weights back: the gauge says awake
    assert st.gpu_used_mib() == pytest.approx(500 + 2048)  # no KV cache yet
    st.wake(2.0, ["kv_cache"])
    assert not st.is_sleeping
    with pytest.raises(ValueError, match="tags: unknown"):
        st.wake(3.0, ["everything"])


def test_bad_params_are_named() -> None:
    with pytest.raises(ValueError, match="weights_mib"):
        SleepParams(gpu_total_mib=1000, weights_mib=8000)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        SleepParams(gpu_memory_utilization=1.5)


# --- the simulation ---------------------------------------------------------------------------

def test_a_sleeping_replica_takes_no_requests_and_wakes_to_serve() -> None:
    sim = Simulation(FLAT, ["m"], seed=1, sleep_params=FAST)
    sim.add_replica("r0", "m")
    sim.advance(2.0)
    with pytest.raises(SimError, match="Cannot put engine to sleep while requests are being processed"):
        sim.sleep_replica("r0", 1)
    sim.set_load({"rate": 0})
    sim.advance(30.0)  # in-flight requests finish
    sim.sleep_replica("r0", 1)
    arrived, rejected = sim.models["m"].arrived_total, sim.models["m"].rejected_total
    sim.set_load({"rate": 5})
    sim.advance(5.0)
    assert sim.models["m"].arrived_total > arrived
    assert sim.models["m"].rejected_total - rejected == sim.models["m"].arrived_total - arrived  # all refused
    done = sim.wake_replica("r0")
    assert sim.replicas["r0"].accepting is False  # the copy takes time
    sim.advance(done - sim.t + 0.2)
    assert sim.replicas["r0"].accepting is True
    rejected = sim.models["m"].rejected_total
    sim.advance(3.0)
    assert sim.models["m"].rejected_total == rejected  # serving again


def test_without_sleep_mode_there_is_no_such_endpoint() -> None:
    sim = Simulation(FLAT, ["m"], seed=1)
    sim.add_replica("r0", "m")
    with pytest.raises(SimError) as exc:
        sim.sleep_replica("r0", 1)
    assert exc.value.status == 404


# --- over HTTP ----------------------------------------------------------------------------------

def _server(dev_mode: bool, sleep: SleepParams | None, replicas: int = 1) -> SimServer:
    sim = Simulation(IDLE, ["m"], seed=4, sleep_params=sleep)
    for i in range(replicas):
        sim.add_replica(f"r{i}", "m", f"gpu-node-0{i + 1}")
    return SimServer(sim, "127.0.0.1", 0, tick_s=0.02, dev_mode=dev_mode).start()


@pytest.fixture
def server() -> Iterator[SimServer]:
    srv = _server(True, FAST)
    yield srv
    srv.stop()


def call(srv: SimServer, method: str, path: str) -> tuple[int, Any]:
    req = urllib.request.Request(srv.url + path, data=b"" if method == "POST" else None, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    return status, (json.loads(raw) if raw else None)


def _metrics(srv: SimServer) -> dict[str, list[Any]]:
    with urllib.request.urlopen(srv.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize(("dev_mode", "sleep"), [(False, FAST), (True, None), (False, None)],
                         ids=["no-dev-mode", "no-sleep-mode", "neither"])
def test_404_unless_dev_mode_and_sleep_mode(dev_mode: bool, sleep: SleepParams | None) -> None:
    srv = _server(dev_mode, sleep)
    try:
        for method, path in (("POST", "/sleep?level=1"), ("POST", "/wake_up"), ("GET", "/is_sleeping"),
                             ("POST", "/replicas/r0/sleep")):
            assert call(srv, method, path) == (404, {"detail": "Not Found"}), path
        # the gauge belongs to the engine's sleep mode, not to the dev endpoints
        assert ("vllm:engine_sleep_state" in _metrics(srv)) == (sleep is not None)
    finally:
        srv.stop()


def test_dev_mode_comes_from_the_environment_like_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = Simulation(IDLE, ["m"], sleep_params=FAST)
    for value, expected in (("1", True), ("0", False)):
        monkeypatch.setenv("VLLM_SERVER_DEV_MODE", value)
        srv = SimServer(sim, "127.0.0.1", 0).start()
        try:
            assert srv.dev_mode is expected
        finally:
            srv.stop()


def test_sleep_and_wake_over_http_with_metrics(server: SimServer) -> None:
    assert call(server, "GET", "/is_sleeping") == (200, {"is_sleeping": False})
    m = _metrics(server)
    state = {s.labels["sleep_state"]: s.value for s in m["vllm:engine_sleep_state"]}
    assert state == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    used = [s for s in m["DCGM_FI_DEV_FB_USED"]]
    assert len(used) == 4 and {s.labels["Hostname"] for s in used} == {"gpu-node-01"}
    assert used[0].value == round(0.9 * 16384)

    t0 = time.monotonic()
    assert call(server, "POST", "/sleep?level=1") == (200, None)
    assert time.monotonic() - t0 >= FAST.offload_s() * 0.8  # returns once the offload is done
    assert call(server, "GET", "/is_sleeping") == (200, {"is_sleeping": True})
    m = _metrics(server)
    state = {s.labels["sleep_state"]: s.value for s in m["vllm:engine_sleep_state"]}
    assert state == {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}
    assert {s.value for s in m["DCGM_FI_DEV_FB_USED"]} == {500}
    assert {s.value for s in m["DCGM_FI_DEV_FB_FREE"]} == {16384 - 500}
    assert m["vllm_sim_host_memory_bytes"][0].value == (1000 + 8192) * 1024 * 1024

    t0 = time.monotonic()
    assert call(server, "POST", "/wake_up") == (200, None)
    took = time.monotonic() - t0
    assert FAST.wake_s(1) * 0.8 <= took < FAST.wake_s(1) + 2.0
    assert call(server, "GET", "/is_sleeping") == (200, {"is_sleeping": False})
    assert {s.value for s in _metrics(server)["DCGM_FI_DEV_FB_USED"]} == {round(0.9 * 16384)}


def test_level_2_and_tags_over_http(server: SimServer) -> None:
    assert call(server, "POST", "/replicas/r0/sleep?level=2")[0] == 200
    state = {s.labels["sleep_state"]: s.value for s in _metrics(server)["vllm:engine_sleep_state"]}
    assert state["discard_all"] == 1.0
    assert _metrics(server)["vllm_sim_host_memory_bytes"][0].value == 1000 * 1024 * 1024
    assert call(server, "POST", "/replicas/r0/wake_up?tags=weights")[0] == 200
    assert call(server, "GET", "/replicas/r0/is_sleeping") == (200, {"is_sleeping": True})
    assert call(server, "POST", "/replicas/r0/wake_up?tags=kv_cache")[0] == 200
    assert call(server, "GET", "/replicas/r0/is_sleeping") == (200, {"is_sleeping": False})


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/sleep?level=3", 400),
        ("POST", "/sleep?level=deep", 400),
        ("POST", "/wake_up?tags=all", 400),
        ("GET", "/sleep", 405),
        ("POST", "/replicas/nope/sleep", 404),
    ],
)
def test_bad_calls_are_refused(server: SimServer, method: str, path: str, status: int) -> None:
    assert call(server, method, path)[0] == status


def test_the_root_paths_need_exactly_one_replica() -> None:
    srv = _server(True, FAST, replicas=2)
    try:
        status, body = call(srv, "GET", "/is_sleeping")
        assert status == 404 and "/replicas/{name}/is_sleeping" in body["error"]
        assert call(srv, "GET", "/replicas/r1/is_sleeping") == (200, {"is_sleeping": False})
    finally:
        srv.stop()


def _put_faults(srv: SimServer, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(srv.url + "/faults", data=json.dumps(body).encode(), method="PUT",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_an_injected_wake_failure_answers_500_and_leaves_the_engine_asleep() -> None:
    """The lab's fault knob (the reliability harness' failed-wake row): ``PUT /faults``
    ``{"wake_fails": [...]}`` makes those replicas' ``/wake_up`` fail until cleared; others wake."""
    srv = _server(True, FAST, replicas=2)
    try:
        assert call(srv, "GET", "/faults") == (200, NO_FAULTS)
        for r in ("r0", "r1"):
            assert call(srv, "POST", f"/replicas/{r}/sleep?level=1")[0] == 200
        assert _put_faults(srv, {"wake_fails": ["r0"]}) == (200, {**NO_FAULTS, "wake_fails": ["r0"]})
        status, body = call(srv, "POST", "/replicas/r0/wake_up")
        assert status == 500 and "wake_up of r0 failed" in body["error"]
        assert call(srv, "GET", "/replicas/r0/is_sleeping") == (200, {"is_sleeping": True})
        assert call(srv, "POST", "/replicas/r1/wake_up")[0] == 200  # only the named replica fails
        assert call(srv, "GET", "/replicas/r1/is_sleeping") == (200, {"is_sleeping": False})
        assert _put_faults(srv, {"wake_fails": []}) == (200, NO_FAULTS)
        assert call(srv, "POST", "/replicas/r0/wake_up")[0] == 200
        assert call(srv, "GET", "/replicas/r0/is_sleeping") == (200, {"is_sleeping": False})
        assert _put_faults(srv, {"wake_fails": "r0"})[0] == 400
        assert _put_faults(srv, {"wake_dies": []})[0] == 400
    finally:
        srv.stop()


NO_FAULTS = {"wake_fails": [], "wake_hangs": [], "sleep_fails": [], "no_sleep_mode": [], "unreachable": [],
             "wake_hang_s": 60.0}


def test_an_injected_sleep_failure_answers_500_and_leaves_the_engine_awake() -> None:
    srv = _server(True, FAST, replicas=2)
    try:
        assert _put_faults(srv, {"sleep_fails": ["r0"]}) == (200, {**NO_FAULTS, "sleep_fails": ["r0"]})
        status, body = call(srv, "POST", "/replicas/r0/sleep?level=1")
        assert status == 500 and "sleep of r0 failed" in body["error"]
        assert call(srv, "GET", "/replicas/r0/is_sleeping") == (200, {"is_sleeping": False})
        assert call(srv, "POST", "/replicas/r1/sleep?level=1")[0] == 200  # only the named replica fails
        assert _put_faults(srv, {"sleep_fails": []}) == (200, NO_FAULTS)
        assert call(srv, "POST", "/replicas/r0/sleep?level=1")[0] == 200
        assert call(srv, "GET", "/replicas/r0/is_sleeping") == (200, {"is_sleeping": True})
    finally:
        srv.stop()


def test_an_engine_without_sleep_mode_answers_vllms_404_on_every_sleep_route() -> None:
    """``no_sleep_mode``: the replica answers as vLLM started without --enable-sleep-mode (an
    engine restarted so): 404 ``{"detail": "Not Found"}`` on /sleep, /wake_up, /is_sleeping,
    whatever the method; the others keep their sleep mode; cleared, it has its own again."""
    srv = _server(True, FAST, replicas=2)
    try:
        assert call(srv, "POST", "/replicas/r0/sleep?level=1")[0] == 200
        assert _put_faults(srv, {"no_sleep_mode": ["r0"]})[1]["no_sleep_mode"] == ["r0"]
        for method, action in (("POST", "sleep?level=1"), ("POST", "wake_up"), ("GET", "is_sleeping"),
                               ("GET", "wake_up")):
            assert call(srv, method, f"/replicas/r0/{action}") == (404, {"detail": "Not Found"})
        assert call(srv, "GET", "/replicas/r1/is_sleeping") == (200, {"is_sleeping": False})
        _put_faults(srv, {"no_sleep_mode": []})
        assert call(srv, "GET", "/replicas/r0/is_sleeping") == (200, {"is_sleeping": True})
    finally:
        srv.stop()


def test_a_hung_wake_answers_only_after_wake_hang_s_then_wakes() -> None:
    srv = _server(True, FAST, replicas=1)
    try:
        assert call(srv, "POST", "/replicas/r0/sleep?level=1")[0] == 200
        assert _put_faults(srv, {"wake_hangs": ["r0"], "wake_hang_s": 1.5}) == (
            200, {**NO_FAULTS, "wake_hangs": ["r0"], "wake_hang_s": 1.5})
        req = urllib.request.Request(srv.url + "/replicas/r0/wake_up", data=b"", method="POST")
        with pytest.raises(OSError, match="timed out"):  # a client with a shorter timeout gives up
            urllib.request.urlopen(req, timeout=0.5)
        assert call(srv, "GET", "/replicas/r0/is_sleeping") == (200, {"is_sleeping": True})  # still asleep meanwhile
        t0 = time.monotonic()
        assert call(srv, "POST", "/replicas/r0/wake_up")[0] == 200
        assert time.monotonic() - t0 >= 1.5
        assert call(srv, "GET", "/replicas/r0/is_sleeping") == (200, {"is_sleeping": False})
    finally:
        srv.stop()


@pytest.mark.parametrize(("body", "field"), [
    ({"wake_hangs": "r0"}, "faults.wake_hangs"),
    ({"sleep_fails": ["r0", 3]}, "faults.sleep_fails"),
    ({"no_sleep_mode": [""]}, "faults.no_sleep_mode"),
    ({"unreachable": None}, "faults.unreachable"),
    ({"wake_hang_s": 0}, "faults.wake_hang_s"),
    ({"wake_hang_s": -1}, "faults.wake_hang_s"),
    ({"wake_hang_s": True}, "faults.wake_hang_s"),
    ({"wake_hang_s": "30"}, "faults.wake_hang_s"),
    ({"wake_hang_s": 1e9}, "faults.wake_hang_s"),
    ({"sleep_fail": ["r0"]}, "unknown key(s) sleep_fail"),
    (["r0"], "expected a JSON object"),
])
def test_bad_faults_are_refused_with_400_naming_the_field_and_change_nothing(body: Any, field: str) -> None:
    srv = _server(True, FAST, replicas=1)
    try:
        _put_faults(srv, {"wake_fails": ["r0"]})
        status, doc = _put_faults(srv, {"sleep_fails": ["r0"], **body} if isinstance(body, dict) else body)
        assert status == 400 and field in doc["error"]
        assert call(srv, "GET", "/faults") == (200, {**NO_FAULTS, "wake_fails": ["r0"]})  # all or nothing
    finally:
        srv.stop()
