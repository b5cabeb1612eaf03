"""The simulator at each pod's own address (``--pod-port``): ``http://<pod IP>:<port>`` answers
vLLM's sleep routes for that pod's replica, through the real sleep client the daemon uses; a
pod gone closes its address. Pod IPs are loopback addresses here, as in the sandbox."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
import requests

from bridge.adapters.vllm import VllmSleepClient
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


def test_each_pod_ip_reaches_its_own_replica() -> None:
    sim = Simulation(IDLE, ["m"], seed=1, sleep_params=FAST)
    for name in ("vllm-a", "vllm-b"):
        sim.add_replica(name, "m")
    server = SimServer(sim, "127.0.0.1", 0, tick_s=0.02, dev_mode=True).start()
    port = _free_port()
    ports = PodPorts(server, port)
    session = requests.Session()
    try:
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
    finally:
        session.close()
        ports.stop()
        server.stop()


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
