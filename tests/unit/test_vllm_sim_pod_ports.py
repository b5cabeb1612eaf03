"""The simulator at each pod's own address (``--pod-port``): ``http://<pod IP>:<port>`` answers
vLLM's sleep routes for that pod's replica, through the real sleep client the daemon uses; a
pod gone closes its address. Pod IPs are loopback addresses here, as in the sandbox."""

from __future__ import annotations

import socket
from collections.abc import Iterator
import time
import urllib.error
import urllib.request

import pytest
import requests

from bridge.adapters.vllm import SleepModeUnavailable, VllmSleepClient
from bridge.errors import AdapterError
from gpu_bridge_lab.sandbox.vllm.follow_kube import PodView
from gpu_bridge_lab.sandbox.vllm.pod_ports import PodPorts
from gpu_bridge_lab.sandbox.vllm.server import SimServer
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from tests.unit.test_vllm_adapter import FAST, IDLE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


TwoReplicas = tuple[Simulation, PodPorts, int, requests.Session]


@pytest.fixture
def two_replicas() -> Iterator[TwoReplicas]:
    """The simulator with replicas vllm-a and vllm-b in sleep mode, its pod-address listener
    (``PodPorts`` on a free port, no pod synced yet) and a client session; all stopped after."""
    sim = Simulation(IDLE, ["m"], seed=1, sleep_params=FAST)
    for name in ("vllm-a", "vllm-b"):
        sim.add_replica(name, "m")
    server = SimServer(sim, "127.0.0.1", 0, tick_s=0.02, dev_mode=True).start()
    port = _free_port()
    ports = PodPorts(server, port)
    session = requests.Session()
    try:
        yield sim, ports, port, session
    finally:
        session.close()
        ports.stop()
        server.stop()


def test_each_pod_ip_reaches_its_own_replica(two_replicas: TwoReplicas) -> None:
    sim, ports, port, session = two_replicas
    pods = {"vllm-a": PodView("vllm-a", "n1", "m", True, ip="127.1.7.1"),
            "vllm-b": PodView("vllm-b", "n2", "m", True, ip="127.1.7.2"),
            "pending": PodView("pending", "", "m", False)}  # no IP yet: nothing to listen on
    ports.sync(pods)
    assert ports.addresses() == {"127.1.7.1": "vllm-a", "127.1.7.2": "vllm-b"}
    a, b = (VllmSleepClient(f"http://127.1.7.{i}:{port}", timeout_s=10, session=session) for i in (1, 2))
    a.sleep(1)
    assert a.is_sleeping() and not b.is_sleeping()
    assert sim.is_sleeping("vllm-a") and not sim.is_sleeping("vllm-b")
    a.wake_up()
    assert not a.is_sleeping() and not sim.is_sleeping("vllm-a")
    with pytest.raises(urllib.error.HTTPError) as err:  # only the sleep routes and /health are served
        urllib.request.urlopen(f"http://127.1.7.1:{port}/replicas", timeout=5)
    assert err.value.code == 404
    err.value.close()
    with urllib.request.urlopen(f"http://127.1.7.1:{port}/health", timeout=5) as resp:
        assert resp.status == 200
    # the pod gone: its address refuses, as a deleted pod's would; the other one still answers
    ports.sync({"vllm-b": pods["vllm-b"]})
    assert ports.addresses() == {"127.1.7.2": "vllm-b"}
    with pytest.raises(AdapterError):  # its kept-alive connection: an answer of no pod, then closed
        a.is_sleeping()
    with pytest.raises(AdapterError, match="ConnectionError"):  # a new one: refused
        a.is_sleeping()
    with pytest.raises(AdapterError, match="ConnectionError"):
        VllmSleepClient(f"http://127.1.7.1:{port}", timeout_s=5, session=session).is_sleeping()
    assert b.is_sleeping() is False


def test_a_pod_address_not_on_this_machine_is_skipped() -> None:
    sim = Simulation(IDLE, ["m"], seed=1, sleep_params=FAST)
    server = SimServer(sim, "127.0.0.1", 0, tick_s=0.02, dev_mode=True).start()
    ports = PodPorts(server, _free_port())
    try:
        ports.sync({"far": PodView("far", "n1", "m", True, ip="192.0.2.10")})  # TEST-NET-1: never local
        assert ports.addresses() == {}
    finally:
        ports.stop()
        server.stop()
    with pytest.raises(ValueError, match="port"):
        PodPorts(server, 0)


def test_each_lab_fault_is_what_the_daemons_client_sees_at_the_pod_address(two_replicas: TwoReplicas) -> None:
    """The fault knobs the reliability harness' warm-fallback rows use, through the daemon's
    own client at the pod's address: a wake that hangs past the client's timeout (ReadTimeout),
    a sleep answering 500, an engine without sleep mode (SleepModeUnavailable), an engine that
    is unreachable (its address refuses connections until the fault is cleared)."""
    sim, ports, port, session = two_replicas
    pods = {"vllm-a": PodView("vllm-a", "n1", "m", True, ip="127.1.7.11"),
            "vllm-b": PodView("vllm-b", "n2", "m", True, ip="127.1.7.12")}
    ports.sync(pods)
    a = VllmSleepClient(f"http://127.1.7.11:{port}", timeout_s=0.5)  # no session: a new connection each call

    def fresh() -> VllmSleepClient:  # as the daemon asks: a client, so a connection, per call
        return VllmSleepClient(f"http://127.1.7.11:{port}", timeout_s=5)
    b = VllmSleepClient(f"http://127.1.7.12:{port}", timeout_s=10, session=session)

    sim.set_faults({"sleep_fails": ["vllm-a"]})
    with pytest.raises(AdapterError, match="HTTP 500") as failed:
        a.sleep(1)
    assert not isinstance(failed.value, SleepModeUnavailable)
    assert a.is_sleeping() is False
    sim.set_faults({"sleep_fails": []})
    a.sleep(1)
    b.sleep(1)

    sim.set_faults({"wake_hangs": ["vllm-a"], "wake_hang_s": 2.0})
    with pytest.raises(AdapterError, match="ReadTimeout"):
        a.wake_up()
    assert a.is_sleeping() is True  # not woken while it hangs
    b.wake_up()  # only the named replica hangs
    assert b.is_sleeping() is False
    sim.set_faults({"wake_hangs": []})
    time.sleep(2.5)  # the hung wake answers nobody but still wakes the engine, late
    assert fresh().is_sleeping() is False
    fresh().sleep(1)

    sim.set_faults({"no_sleep_mode": ["vllm-a"]})
    for call in (fresh().is_sleeping, fresh().wake_up, lambda: fresh().sleep(1)):
        with pytest.raises(SleepModeUnavailable):
            call()
    sim.set_faults({"no_sleep_mode": []})
    assert fresh().is_sleeping() is True  # its state kept: only the routes were missing

    sim.set_faults({"unreachable": ["vllm-a"]})
    assert ports.addresses() == {"127.1.7.12": "vllm-b"}
    for call in (fresh().is_sleeping, fresh().wake_up):
        with pytest.raises(AdapterError, match="ConnectionError") as refused:
            call()
        assert "refused" in str(refused.value)
    assert b.is_sleeping() is False  # the other pod still answers
    assert sim.is_sleeping("vllm-a") is True  # the lab's view of the replica is kept
    sim.set_faults({"unreachable": []})
    assert ports.addresses() == {"127.1.7.11": "vllm-a", "127.1.7.12": "vllm-b"}
    assert fresh().is_sleeping() is True
