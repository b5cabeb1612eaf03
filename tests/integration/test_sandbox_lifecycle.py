"""`gpu-bridge sandbox up/status/down` as a user runs them: files written, a second `up`
refused, `down` leaves no process whose command line names the directory (even with a job
running), and a failed start shows the daemon's own log lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.errors import SandboxError
from gpu_bridge_lab.sandbox.cluster import Sandbox
from gpu_bridge_lab.sandbox.cluster.procs import find_leftovers

pytestmark = pytest.mark.integration


def gpu_bridge(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=timeout)


def procs_naming(d: Path) -> list[str]:
    me = os.getpid()
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit() or int(e) == me:
            continue
        try:
            cmd = Path(f"/proc/{e}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{e}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(d) in cmd and state != "Z":
            out.append(f"{e} {cmd}")
    return out


def parse_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            env[k] = v
    return env


def test_cli_up_status_down_leaves_nothing(sandbox_dir: Path) -> None:
    d = sandbox_dir
    try:
        up = gpu_bridge("sandbox", "up", "--dir", str(d), "--nodes", "2")
        assert up.returncode == 0, up.stderr
        assert "sandbox up in" in up.stdout
        env = parse_env(d / "env")
        assert env["SLURM_CONF"] == str(d / "etc" / "slurm.conf")
        assert env["PROMETHEUS_URL"].startswith("http://127.0.0.1:")
        state = json.loads((d / "sandbox.json").read_text())
        assert state["status"] == "running" and state["nodes"] == ["gpu-node-01", "gpu-node-02"]
        names = {p["name"] for p in state["processes"]}
        assert {"munged", "slurmctld", "slurmd:gpu-node-01", "slurmd:gpu-node-02", "prometheus"} <= names
        assert state["startup_s"] < 30
        # a second up on the same dir is refused
        again = gpu_bridge("sandbox", "up", "--dir", str(d))
        assert again.returncode != 0 and "already running" in again.stderr
        st = gpu_bridge("sandbox", "status", "--dir", str(d), "--json")
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["nodes"] == {"gpu-node-01": "idle", "gpu-node-02": "idle"}
        # a running job whose script lives in DIR's spool
        senv = {**os.environ, "SLURM_CONF": env["SLURM_CONF"]}
        job = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 300"],
                             env=senv, capture_output=True, text=True, timeout=10)
        assert job.returncode == 0, job.stderr
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i"], env=senv, capture_output=True,
                              text=True, timeout=10).stdout.strip():
                break
            time.sleep(0.2)
        assert procs_naming(d)
    finally:
        down = gpu_bridge("sandbox", "down", "--dir", str(d))
    assert down.returncode == 0, down.stderr
    assert procs_naming(d) == []
    assert find_leftovers(str(d), str(d)) == {}
    assert not (d / "env").exists()
    assert json.loads((d / "sandbox.json").read_text())["status"] == "stopped"
    assert gpu_bridge("sandbox", "status", "--dir", str(d)).returncode == 1


def test_failed_start_names_the_daemon_and_its_log_lines(sandbox_dir: Path) -> None:
    sb = Sandbox(sandbox_dir, nodes=1, vllm=False, prometheus=False, extra_slurm_conf="NoSuchSlurmKey=1", timeout_s=20)
    with pytest.raises(SandboxError) as ei:
        sb.up()
    text = str(ei.value)
    assert "slurmctld" in text
    assert "--- slurmctld" in text  # the log tail, named
    assert "NoSuchSlurmKey" in text  # Slurm's own complaint, not just "timeout"
    assert procs_naming(sandbox_dir) == []
    assert find_leftovers(str(sandbox_dir), str(sandbox_dir)) == {}


def test_slurm_only_sandbox_with_job_submit_lua(sandbox_dir: Path, tmp_path: Path) -> None:
    """`job_submit_lua` lands next to slurm.conf with JobSubmitPlugins=lua and is enforced;
    without Prometheus the sandbox is ready in about a second."""
    lua = tmp_path / "job_submit.lua"
    lua.write_text(
        'function slurm_job_submit(job_desc, part_list, submit_uid)\n'
        '  if job_desc.name == "forbidden" then\n'
        '    slurm.log_user("sandbox test: forbidden name")\n'
        '    return slurm.ERROR\n'
        '  end\n'
        '  return slurm.SUCCESS\n'
        'end\n'
        'function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)\n'
        '  return slurm.SUCCESS\n'
        'end\n'
        'return slurm.SUCCESS\n'
    )
    with Sandbox(sandbox_dir, nodes=2, vllm=False, prometheus=False, job_submit_lua=lua) as sb:
        assert (sandbox_dir / "etc" / "job_submit.lua").read_text() == lua.read_text()
        assert "JobSubmitPlugins=lua" in (sandbox_dir / "etc" / "slurm.conf").read_text()
        assert "PROMETHEUS_URL" not in sb.env and sb.startup_s is not None
        bad = sb.run_slurm(["sbatch", "-J", "forbidden", "-o", "/dev/null", "--wrap", "true"], check=False)
        assert bad.returncode != 0 and "forbidden name" in bad.stderr
        ok = sb.run_slurm(["sbatch", "--parsable", "-J", "fine", "-o", "/dev/null", "--wrap", "true"])
        assert ok.stdout.strip()
    assert procs_naming(sandbox_dir) == []


def test_dir_under_a_private_parent(tmp_path: Path) -> None:
    """DIR inside a 0700 directory (mkdtemp, /root): munged, which runs as user munge, gets a
    /tmp directory of its own, recorded in sandbox.json and removed by down."""
    import shutil
    import tempfile

    parent = Path(tempfile.mkdtemp(prefix="gbpriv-", dir="/tmp"))  # mode 0700
    try:
        sb = Sandbox(parent / "sb", nodes=1, vllm=False, prometheus=False)
        with sb:
            assert sb.munge_dir.parent == Path("/tmp") and sb.munge_dir.name.startswith("gbmunge-")
            assert any("cannot reach" in n for n in sb.notes)
            doc = json.loads((parent / "sb" / "sandbox.json").read_text())
            assert doc["paths"]["munge_dir"] == str(sb.munge_dir)
            assert Sandbox.attach(parent / "sb").munge_dir == sb.munge_dir
            assert set(sb.run_slurm(["sinfo", "-h", "-o", "%T"]).stdout.split()) == {"idle"}
        assert not sb.munge_dir.exists()
        assert procs_naming(parent) == []
    finally:
        shutil.rmtree(parent, ignore_errors=True)
