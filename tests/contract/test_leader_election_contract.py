"""Leader election with the official client's ``kubernetes.leaderelection`` (LeaseLock)
across two processes: one leads, the other waits; killing the leader hands over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from kube_contract import Kube, wait_for

CANDIDATE = r"""
import sys, time
from kubernetes import config
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock
kubeconfig, ns, identity = sys.argv[1:4]
config.load_kube_config(config_file=kubeconfig)
def lead():
    print("LEADING " + identity, flush=True)
    while True:
        time.sleep(0.2)
lock = LeaseLock("gpu-bridge", ns, identity)
cfg = electionconfig.Config(lock, lease_duration=3, renew_deadline=2, retry_period=1,
                            onstarted_leading=lead, onstopped_leading=lambda: print("STOPPED " + identity, flush=True))
print("CANDIDATE " + identity, flush=True)
leaderelection.LeaderElection(cfg).run()
"""


class Candidate:
    def __init__(self, kube: Kube, ns: str, identity: str) -> None:
        self.identity = identity
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-c", CANDIDATE, str(kube.kubeconfig), ns, identity],
                                     env=kube.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")),
                                        daemon=True)
        self._reader.start()

    def leading(self) -> bool:
        return f"LEADING {self.identity}\n" in self.lines

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.mark.integration
def test_leader_election_takeover_after_the_holder_is_killed(kube: Kube) -> None:
    client, api = kube.client()
    core, coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
    ns = kube.name("le")
    core.create_namespace({"metadata": {"name": ns}})
    a = Candidate(kube, ns, "daemon-a")
    b = None
    try:
        wait_for(a.leading, 15, "daemon-a to lead")
        b = Candidate(kube, ns, "daemon-b")
        wait_for(lambda: "CANDIDATE daemon-b\n" in b.lines, 10, "daemon-b to start")
        lease = coord.read_namespaced_lease("gpu-bridge", ns)
        assert lease.spec.holder_identity == "daemon-a"
        renewed, acquired = lease.spec.renew_time, lease.spec.acquire_time
        wait_for(lambda: coord.read_namespaced_lease("gpu-bridge", ns).spec.renew_time != renewed, 5,
                 "daemon-a to renew its lease")
        assert not b.leading()
        a.kill()
        wait_for(b.leading, 15, "daemon-b to take over")
        lease = coord.read_namespaced_lease("gpu-bridge", ns)
        assert lease.spec.holder_identity == "daemon-b"
        assert lease.spec.acquire_time != acquired  # a new acquisition, not a renewal of a's
    finally:
        a.kill()
        if b is not None:
            b.kill()
        core.delete_namespace(ns)


def test_our_elector_writes_a_renew_time_of_whole_seconds(kube: Kube) -> None:
    """A MicroTime of exactly .000000 (here a whole-second clock): the generated client would
    re-serialize it as "...:00+00:00", which a real apiserver refuses (400); the elector sends
    its Lease body as built (bridge.adapters.kube.calls.send_json)."""
    from bridge.adapters.kube.lease import LeaderElector

    client, api = kube.client()
    core, coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
    ns = kube.name("le-sec")
    core.create_namespace({"metadata": {"name": ns}})
    clock = [1_796_000_000.0]
    try:
        e = LeaderElector(api, namespace=ns, identity="a", lease_duration_s=15, wall=lambda: clock[0],
                          monotonic=lambda: clock[0])
        assert e.try_acquire_or_renew()
        clock[0] += 3.0
        assert e.try_acquire_or_renew()
        lease = coord.read_namespaced_lease(e.name, ns)
        assert lease.spec.holder_identity == "a"
        assert lease.spec.renew_time.timestamp() == clock[0]
        assert e.release()
    finally:
        core.delete_namespace(ns)
