"""Leader election across two real processes on the real control plane (``kube_plane``; each
test's Lease in a namespace of its own): one
leader at a time; the standby takes over within the lease duration after the holder is
SIGKILLed; after SIGTERM (release) it takes over at its next step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from test_kube_adapter_support import Corner, corner, ensure_namespace  # noqa: F401 (corner: fixture)

pytestmark = pytest.mark.integration

LEASE_S = 3

CANDIDATE = r"""
import json, signal, sys, time
from bridge import logs
logs.configure(json=True, stream=sys.stderr)  # stdout carries only our JSON lines
from bridge.adapters.kube import api_client_from_config
from bridge.adapters.kube.lease import LeaderElector
kubeconfig, identity, lease_s, namespace = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
e = LeaderElector(api_client_from_config(kubeconfig=kubeconfig), namespace=namespace, identity=identity,
                  lease_duration_s=lease_s, renew_deadline_s=lease_s * 2 / 3, retry_period_s=0.2)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
last = None
while not stop:
    now = e.try_acquire_or_renew()
    if now != last:
        print(json.dumps({"t": time.time(), "leader": now}), flush=True)
        last = now
    time.sleep(0.1)
e.release()
print(json.dumps({"t": time.time(), "leader": False, "released": True}), flush=True)
"""


class Candidate:
    def __init__(self, kubeconfig: Path, namespace: str, identity: str, script: Path, log_dir: Path) -> None:
        self.identity = identity
        self.lines: list[dict[str, Any]] = []
        self._log = (log_dir / f"{identity}.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(kubeconfig), identity, str(LEASE_S), namespace],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(json.loads(line))

    @property
    def leader(self) -> bool:
        return bool(self.lines) and bool(self.lines[-1]["leader"])

    def became_leader_at(self) -> float | None:
        return next((ln["t"] for ln in reversed(self.lines) if ln["leader"]), None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._reader.join(5)
        self._log.close()


@pytest.fixture
def lease_ns(corner: Corner) -> str:
    ns = corner.name("gpu-bridge")
    ensure_namespace(corner.api, ns, corner)
    return ns


@pytest.fixture
def candidates(corner: Corner, lease_ns: str, tmp_path: Path) -> Iterator[tuple[Candidate, Candidate]]:
    script = tmp_path / "candidate.py"
    script.write_text(CANDIDATE)
    kubeconfig = corner.kubeconfig
    a = Candidate(kubeconfig, lease_ns, "cand-a", script, tmp_path)
    deadline = time.monotonic() + 20
    while not a.leader:  # a first, so the roles are known
        assert time.monotonic() < deadline, "first candidate never became leader"
        time.sleep(0.05)
    b = Candidate(kubeconfig, lease_ns, "cand-b", script, tmp_path)
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def wait_until(cond: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def test_one_leader_then_takeover_after_sigkill(candidates: tuple[Candidate, Candidate]) -> None:
    a, b = candidates
    assert wait_until(lambda: bool(b.lines), 15)
    time.sleep(LEASE_S + 1)  # longer than a lease: b must still not lead while a renews
    assert a.leader and not b.leader
    a.proc.send_signal(signal.SIGKILL)
    killed_at = time.time()
    a.proc.wait(5)
    assert wait_until(lambda: b.leader, LEASE_S + 3), "standby never took over"
    took = b.became_leader_at()
    assert took is not None
    # b first sees a's last record at most one retry period before the kill; it takes over
    # one lease duration of its own clock after that (plus one step).
    print(f"takeover {took - killed_at:.2f} s after SIGKILL (lease {LEASE_S} s)")
    assert took - killed_at <= LEASE_S + 2.0, f"takeover after {took - killed_at:.2f} s"


def test_release_on_sigterm_hands_over_at_once(candidates: tuple[Candidate, Candidate]) -> None:
    a, b = candidates
    assert wait_until(lambda: bool(b.lines), 15)
    a.proc.send_signal(signal.SIGTERM)
    stopped_at = time.time()
    assert a.proc.wait(10) == 0
    assert a.lines[-1].get("released") is True
    assert wait_until(lambda: b.leader, LEASE_S)
    took = b.became_leader_at()
    assert took is not None and took - stopped_at < 1.5
    assert took >= a.lines[-1]["t"]  # never two leaders: b leads only after a let go
    print(f"takeover {took - stopped_at:.2f} s after SIGTERM")
