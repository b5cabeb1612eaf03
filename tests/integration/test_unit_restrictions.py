"""The daemon's Slurm commands, and the daemon's Python imports, keep working under the
restrictions of systemd/gpu-bridge.service, emulated without systemd (this machine has no
systemd as PID 1): read-only file system (ProtectSystem=strict) including the munge socket's
directory, NoNewPrivileges, the unit's own RestrictAddressFamilies list, and
MemoryDenyWriteExecute, through unit_restrictions_exec.py in a private mount namespace.

Why it matters: the Slurm client tools open AF_NETLINK sockets (glibc's address lookups),
which the unit forbids, and they talk to munged over a unix socket on a path the unit makes
read-only. Both are shown harmless here, and the emulation is shown to bite (a netlink socket
and a W+X mapping fail under it).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_fixtures import SlurmOnly, slurm_only

ROOT = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).with_name("unit_restrictions_exec.py")
UNIT = ROOT / "systemd" / "gpu-bridge.service"


def unit_families() -> str:
    for line in UNIT.read_text().splitlines():
        if line.startswith("RestrictAddressFamilies="):
            return ",".join(line.split("=", 1)[1].split())
    raise AssertionError("RestrictAddressFamilies= not in the unit")


def can_unshare() -> bool:
    if platform.machine() != "x86_64" or shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, timeout=10,
                       check=False)
    return r.returncode == 0


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_unshare(), reason="needs root, x86_64 and mount namespaces"),
    pytest.mark.timeout(120),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmOnly]:
    with slurm_only(nodes=1) as c:
        yield c


def restricted(c: SlurmOnly, cmd: list[str]) -> subprocess.CompletedProcess[str]:
    argv = ["unshare", "-m", "--propagation", "private", sys.executable, str(HELPER),
            "--families", unit_families(), "--ro", "/", "--ro", str(c.root), "--ro", str(c.sb.munge_dir), "--", *cmd]
    return c.run(argv, timeout=30)


def test_emulation_bites(cluster: SlurmOnly) -> None:
    probe = "import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)"
    r = restricted(cluster, [sys.executable, "-c", probe])
    assert r.returncode != 0 and "Address family not supported" in r.stderr
    wx = "import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)"
    r = restricted(cluster, [sys.executable, "-c", wx])
    assert r.returncode != 0 and "Operation not permitted" in r.stderr
    r = restricted(cluster, ["touch", str(cluster.root / "x")])
    assert r.returncode != 0 and "Read-only file system" in r.stderr


@pytest.mark.parametrize(
    "cmd",
    [
        ["scontrol", "ping"],
        ["sinfo", "--json"],
        ["squeue", "--json"],
        ["scontrol", "-o", "show", "node", "gpu-node-01"],
    ],
    ids=["ping", "sinfo-json", "squeue-json", "show-node"],
)
def test_slurm_reads_work_restricted(cluster: SlurmOnly, cmd: list[str]) -> None:
    r = restricted(cluster, cmd)
    assert r.returncode == 0, r.stderr


def test_slurm_writes_work_restricted(cluster: SlurmOnly) -> None:
    """The daemon's write sequence: drain, hold job, cancel it, resume."""
    steps = [
        ["scontrol", "update", "NodeName=gpu-node-01", "State=DRAIN", "Reason=gpu-bridge: serving"],
        ["sbatch", "--parsable", "-p", "gpu-bridge", "-J", "gpu-bridge-hold:gpu-node-01", "-w", "gpu-node-01",
         "-o", "/dev/null", "--hold", "--wrap", "sleep 60"],
        ["scancel", "--name", "gpu-bridge-hold:gpu-node-01"],
        ["scontrol", "update", "NodeName=gpu-node-01", "State=RESUME"],
    ]
    for cmd in steps:
        r = restricted(cluster, cmd)
        assert r.returncode == 0, (cmd, r.stderr)
    node = cluster.run(["scontrol", "-o", "show", "node", "gpu-node-01"]).stdout
    state = node.split("State=", 1)[1].split()[0]
    assert state.startswith("IDLE") and "DRAIN" not in state, node


def test_daemon_python_imports_work_restricted(cluster: SlurmOnly) -> None:
    """MemoryDenyWriteExecute breaks code that needs W+X memory (some JITs, old libffi)."""
    code = (
        "import kubernetes.client, kubernetes.config, prometheus_api_client, yaml, structlog, ssl, json;"
        "import bridge.cli, bridge.metrics, bridge.sdnotify;"
        "from bridge.metrics import BridgeMetrics, serve;"
        "m = BridgeMetrics(); s = serve(m.registry, port=0); s.close(); print('ok')"
    )
    r = restricted(cluster, [sys.executable, "-c", code])
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
