"""Sandbox state files without daemons: sandbox.json round trip through attach(), the env
file, "already running" detection by (pid, start time), argument checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bridge.errors import SandboxError
from gpu_bridge_lab.sandbox.cluster import Sandbox
from gpu_bridge_lab.sandbox.cluster import procs
from gpu_bridge_lab.sandbox.cluster.procs import ProcRecord
from gpu_bridge_lab.sandbox.cluster.sandbox import MungeComponent, PrometheusComponent, SlurmComponent


def fake_sandbox(d: Path, pid: int, ticks: int) -> Sandbox:
    sb = Sandbox(d, nodes=2, grace_s=7)
    sb.ports = {"slurmctld": 7000, "prometheus": 9090}
    sb.node_ports = {"gpu-node-01": 7001, "gpu-node-02": 7002}
    sb.components = [MungeComponent(), PrometheusComponent(), SlurmComponent()]
    sb.records = {"slurmctld": ProcRecord("slurmctld", pid, ticks, str(d / "log" / "slurmctld.out"), ("slurmctld", "-D"))}
    return sb


def test_state_round_trip_and_env(sandbox_dir: Path) -> None:
    d = sandbox_dir
    sb = fake_sandbox(d, 999999, 1)
    sb.startup_s = 5.5
    sb._save_state("running")
    sb._write_env()
    doc = json.loads((d / "sandbox.json").read_text())
    assert doc["version"] == 1 and doc["status"] == "running" and doc["grace_s"] == 7
    assert doc["ports"] == {"slurmctld": 7000, "prometheus": 9090, "slurmd": {"gpu-node-01": 7001, "gpu-node-02": 7002}}
    assert doc["paths"]["slurm_conf"] == str(d / "etc" / "slurm.conf")
    assert doc["urls"] == {"prometheus": "http://127.0.0.1:9090"}
    assert doc["env"]["SLURM_CONF"] == str(d / "etc" / "slurm.conf")
    env_lines = [ln for ln in (d / "env").read_text().splitlines() if not ln.startswith("#")]
    assert f"SLURM_CONF={d / 'etc' / 'slurm.conf'}" in env_lines
    assert "PROMETHEUS_URL=http://127.0.0.1:9090" in env_lines
    back = Sandbox.attach(d)
    assert back.node_names == ("gpu-node-01", "gpu-node-02") and back.grace_s == 7
    assert back.ports == sb.ports and back.node_ports == sb.node_ports
    assert back.records == sb.records and back.startup_s == 5.5
    assert back.slurm_env()["SLURM_CONF"] == str(d / "etc" / "slurm.conf")


def test_running_is_judged_by_pid_and_start_time(sandbox_dir: Path) -> None:
    d = sandbox_dir
    me = os.getpid()
    ticks = procs.start_ticks(me)
    assert ticks is not None
    fake_sandbox(d, me, ticks)._save_state("running")
    assert Sandbox(d).running()  # a live recorded process: `up` must refuse
    with pytest.raises(SandboxError, match="already running"):
        Sandbox(d).up()
    fake_sandbox(d, me, ticks + 1)._save_state("running")  # same pid, another process
    assert not Sandbox(d).running()


def test_attach_errors(sandbox_dir: Path) -> None:
    tmp_path = sandbox_dir
    with pytest.raises(SandboxError, match="no sandbox"):
        Sandbox.attach(tmp_path)
    (tmp_path / "sandbox.json").write_text("{not json")
    with pytest.raises(SandboxError, match="unreadable"):
        Sandbox.attach(tmp_path)
    (tmp_path / "sandbox.json").write_text(json.dumps({"version": 99}))
    with pytest.raises(SandboxError, match="version 99"):
        Sandbox.attach(tmp_path)
    (tmp_path / "sandbox.json").write_text(json.dumps({"version": 1}))
    with pytest.raises(SandboxError, match="bad content"):
        Sandbox.attach(tmp_path)


def test_argument_checks(sandbox_dir: Path) -> None:
    tmp_path = sandbox_dir
    with pytest.raises(SandboxError, match="too long"):
        Sandbox("/tmp/" + "x" * 80)
    with pytest.raises(SandboxError, match="job_submit_lua"):
        Sandbox(tmp_path, job_submit_lua=tmp_path / "missing.lua")
    with pytest.raises(ValueError, match="bad address"):
        Sandbox(tmp_path, scrape_targets=["daemon=localhost"])
    with pytest.raises(ValueError, match="nodes"):
        Sandbox(tmp_path, nodes=0)
