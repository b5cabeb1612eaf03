"""bridge.adapters.vllm.VllmSleepClient against the lab's vLLM simulator over real HTTP (its
sleep endpoints are vLLM's paths and answers, docs/vllm-simulator.md), and against a server
that answers garbage: every answer that is not vLLM's raises AdapterError saying what came
back; a server without sleep mode raises SleepModeUnavailable."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bridge.adapters.protocols import SleepControl
from bridge.adapters.vllm import SleepModeUnavailable, VllmSleepClient
from bridge.errors import AdapterError
from bridge.trace import Trace
from gpu_bridge_lab.sandbox.vllm.server import SimServer
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from gpu_bridge_lab.sandbox.vllm.sleep import SleepParams

IDLE = Trace((0.0, 600.0), (0.0, 0.0), (1.0, 1.0), 600.0, "idle")
FAST = SleepParams(gpu_total_mib=16384, weights_mib=8192, cuda_context_mib=500, host_base_mib=1000,
                   h2d_gib_per_s=8, load_gib_per_s=4, wake_overhead_s=0.2, sleep_overhead_s=0.1)


def _sim_server(*, dev_mode: bool = True, sleep: SleepParams | None = FAST) -> SimServer:
    sim = Simulation(IDLE, ["m"], seed=1, sleep_params=sleep)
    sim.add_replica("r0", "m", "gpu-node-01")
    sim.add_replica("r1", "m", "gpu-node-02")
    return SimServer(sim, "127.0.0.1", 0, tick_s=0.02, dev_mode=dev_mode).start()


@pytest.fixture
def sim() -> Iterator[SimServer]:
    srv = _sim_server()
    yield srv
    srv.stop()


def test_the_client_is_a_sleep_control(sim: SimServer) -> None:
    assert isinstance(VllmSleepClient(f"{sim.url}/replicas/r0"), SleepControl)


def test_sleep_wake_round_trip_on_one_replica(sim: SimServer) -> None:
    r0, r1 = VllmSleepClient(f"{sim.url}/replicas/r0/"), VllmSleepClient(f"{sim.url}/replicas/r1")
    assert r0.is_sleeping() is False
    r0.sleep(1)
    assert (r0.is_sleeping(), r1.is_sleeping()) == (True, False)  # one server, not the other
    assert sim.sim.sleep["r0"].sleep_state() == "weights_offloaded"
    t0 = time.monotonic()
    r0.wake_up()
    assert time.monotonic() - t0 >= FAST.wake_s(1) * 0.8  # returned once awake
    assert r0.is_sleeping() is False and sim.sim.replicas["r0"].accepting


def test_level_2_and_tags(sim: SimServer) -> None:
    c = VllmSleepClient(f"{sim.url}/replicas/r1")
    c.sleep(2)
    assert sim.sim.sleep["r1"].sleep_state() == "discard_all"
    c.wake_up(["weights"])
    assert c.is_sleeping() is True
    c.wake_up(["kv_cache"])
    assert c.is_sleeping() is False


def test_bad_arguments_never_reach_the_server(sim: SimServer) -> None:
    c = VllmSleepClient(f"{sim.url}/replicas/r0")
    with pytest.raises(ValueError, match="level"):
        c.sleep(3)
    with pytest.raises(ValueError, match="tags"):
        c.wake_up(["everything"])
    with pytest.raises(ValueError, match="base_url"):
        VllmSleepClient("localhost:8000")
    assert c.is_sleeping() is False


@pytest.mark.parametrize(("dev_mode", "sleep"), [(False, FAST), (True, None)], ids=["no-dev-mode", "no-sleep-mode"])
def test_no_sleep_mode_is_told(dev_mode: bool, sleep: SleepParams | None) -> None:
    srv = _sim_server(dev_mode=dev_mode, sleep=sleep)
    try:
        c = VllmSleepClient(f"{srv.url}/replicas/r0")
        with pytest.raises(SleepModeUnavailable, match="VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode"):
            c.sleep(1)
        with pytest.raises(SleepModeUnavailable):
            c.is_sleeping()
    finally:
        srv.stop()


def test_refusals_of_the_server_are_errors(sim: SimServer) -> None:
    with pytest.raises(AdapterError, match="HTTP 404"):  # not the sleep 404: the replica is unknown
        VllmSleepClient(f"{sim.url}/replicas/nope").sleep(1)
    sim.sim.set_load({"rate": 50})
    deadline = time.monotonic() + 10
    while sim.sim.replicas["r0"].load == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(AdapterError, match="HTTP 500: .*Cannot put engine to sleep"):
        VllmSleepClient(f"{sim.url}/replicas/r0").sleep(1)


class _Garbage(BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, bytes]] = {}

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return None

    def _answer(self) -> None:
        status, body = self.answers.get(self.path.split("?")[0], (200, b""))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # noqa: N815


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        ((200, b"not json"), "expected JSON"),
        ((200, json.dumps({"is_sleeping": "yes"}).encode()), "expected {\"is_sleeping\": true|false}"),
        ((200, json.dumps([True]).encode()), "expected {\"is_sleeping\""),
        ((200, b"{}"), "expected {\"is_sleeping\""),
        ((503, b"x" * 1000), r"HTTP 503: x{200}\.\.\.$"),
        # an answer far larger than any of vLLM's is not read whole: what was read is not JSON
        ((200, b'{"is_sleeping": true}' + b" " * 5_000_000), "expected JSON"),
        ((503, b"y" * 5_000_000), r"HTTP 503: y{200}\.\.\.$"),
    ],
    ids=["not-json", "string", "list", "missing", "503-capped", "huge-200", "huge-503"],
)
def test_garbage_is_an_error_never_a_state(answer: tuple[int, bytes], match: str) -> None:
    _Garbage.answers = {"/is_sleeping": answer}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    th = threading.Thread(target=httpd.serve_forever, daemon=True)
    th.start()
    try:
        with pytest.raises(AdapterError, match=match):
            VllmSleepClient(f"http://127.0.0.1:{httpd.server_address[1]}").is_sleeping()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_unreachable_server_is_an_error() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    port = httpd.server_address[1]
    httpd.server_close()  # nothing listens there now
    with pytest.raises(AdapterError, match="ConnectionError"):
        VllmSleepClient(f"http://127.0.0.1:{port}", timeout_s=2).wake_up()
