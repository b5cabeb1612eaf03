"""The sandbox's generated configuration (pure rendering) and its process helpers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bridge import wellknown
from gpu_bridge_lab.sandbox.cluster import procs
from gpu_bridge_lab.sandbox.cluster.procs import ProcRecord
from gpu_bridge_lab.sandbox.cluster.prometheus import ScrapeTarget, parse_target, render_config
from gpu_bridge_lab.sandbox.cluster.slurm import SlurmLayout, node_names, render_gres_conf, render_slurm_conf


def layout(**kw: object) -> SlurmLayout:
    nodes = node_names(3)
    base: dict[str, object] = dict(
        dir=Path("/tmp/sb"), nodes=nodes, ctld_port=7000, node_ports={n: 7001 + i for i, n in enumerate(nodes)},
        munge_socket=Path("/tmp/sb/munge/munge.sock"),
    )
    base.update(kw)
    return SlurmLayout(**base)  # type: ignore[arg-type]


def conf_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_node_names() -> None:
    assert node_names(4) == ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04")
    assert node_names(100)[-1] == "gpu-node-100" and node_names(100)[0] == "gpu-node-001"
    with pytest.raises(ValueError, match="nodes"):
        node_names(0)


def test_slurm_conf_has_the_notes_settings_and_one_line_per_node() -> None:
    lines = conf_lines(render_slurm_conf(layout()))
    for want in (
        "SlurmctldPort=7000",
        "AuthInfo=socket=/tmp/sb/munge/munge.sock,cred_expire=10",
        "StateSaveLocation=/tmp/sb/spool/ctld",
        "SlurmdSpoolDir=/tmp/sb/spool/d/%n",
        "SchedulerParameters=bf_interval=1,sched_interval=2",
        "ReturnToService=1", "SlurmdTimeout=15", "KillWait=10",
        "AccountingStorageType=accounting_storage/none",
        "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE", "JobRequeue=1",
        "SlurmctldParameters=preempt_send_user_signal", "SlurmdParameters=config_overrides",
        "GresTypes=gpu", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
    ):
        assert want in lines, want
    nodes = [ln for ln in lines if ln.startswith("NodeName=")]
    assert nodes == [
        f"NodeName=gpu-node-0{i} NodeHostname=localhost NodeAddr=127.0.0.1 Port={7000 + i} "
        "CPUs=8 RealMemory=16000 Gres=gpu:4 State=UNKNOWN"
        for i in (1, 2, 3)
    ]
    assert not any(ln.startswith("JobSubmitPlugins") for ln in lines)
    # every key once (Slurm keeps the last of duplicates silently)
    keys = [ln.split("=", 1)[0] for ln in lines if not ln.startswith(("NodeName=", "PartitionName="))]
    assert len(keys) == len(set(keys))


def test_partitions_follow_the_reclaim_design() -> None:
    lines = conf_lines(render_slurm_conf(layout(grace_s=7, hold_group="bridgeops")))
    parts = {ln.split()[0]: ln for ln in lines if ln.startswith("PartitionName=")}
    pre = parts[f"PartitionName={wellknown.SLURM_PREEMPT_PARTITION}"]
    hold = parts[f"PartitionName={wellknown.SLURM_HOLD_PARTITION}"]
    nodes = "Nodes=gpu-node-01,gpu-node-02,gpu-node-03"
    for want in (nodes, "Default=YES", "PriorityTier=1", "PreemptMode=REQUEUE", "GraceTime=7"):
        assert want in pre.split()
    for want in (nodes, "PriorityTier=100", "PreemptMode=OFF", "OverSubscribe=EXCLUSIVE", "AllowGroups=bridgeops"):
        assert want in hold.split()
    assert "Default=YES" not in hold


def test_the_fast_grace_partition_is_made_only_when_asked() -> None:
    """fast_grace_s: `preempt-fast` over the same nodes as `preempt`, same tier, REQUEUE, its own
    GraceTime (what slurm_conf/slurm.conf.snippet's commented line says); none by default."""
    def parts(**kw: object) -> dict[str, str]:
        lines = conf_lines(render_slurm_conf(layout(**kw)))
        return {ln.split()[0]: ln for ln in lines if ln.startswith("PartitionName=")}

    assert "PartitionName=preempt-fast" not in parts(grace_s=20)
    got = parts(grace_s=20, fast_grace_s=3)
    fast = got["PartitionName=preempt-fast"].split()
    for want in ("Nodes=gpu-node-01,gpu-node-02,gpu-node-03", "PriorityTier=1", "PreemptMode=REQUEUE", "GraceTime=3",
                 f"OverTimeLimit={wellknown.SLURM_PREEMPT_OVER_TIME_LIMIT_MIN}"):
        assert want in fast
    assert "Default=YES" not in fast  # `preempt` stays the default partition
    assert "GraceTime=20" in got[f"PartitionName={wellknown.SLURM_PREEMPT_PARTITION}"].split()
    for bad in (0, 20, 25):
        with pytest.raises(ValueError, match="fast_grace_s"):
            render_slurm_conf(layout(grace_s=20, fast_grace_s=bad))


def test_job_submit_and_extra_conf() -> None:
    text = render_slurm_conf(layout(job_submit_lua=True, extra="MaxJobCount=5000\n"))
    lines = conf_lines(text)
    assert "JobSubmitPlugins=lua" in lines
    assert lines[-1] == "MaxJobCount=5000"
    assert layout().job_submit_path == Path("/tmp/sb/etc/job_submit.lua")  # next to slurm.conf


def test_cli_filter_and_job_requeue() -> None:
    lines = conf_lines(render_slurm_conf(layout(cli_filter_lua=True, job_requeue=0)))
    assert "CliFilterPlugins=cli_filter/lua" in lines and "JobRequeue=0" in lines
    assert "JobRequeue=1" in conf_lines(render_slurm_conf(layout()))
    assert layout().cli_filter_path == Path("/tmp/sb/etc/cli_filter.lua")  # where sbatch looks


def test_snippet_replaces_our_settings_and_partitions_but_not_our_nodes() -> None:
    snippet = ("# admin\nPreemptMode=REQUEUE\nKillWait=30\nSelectTypeParameters=CR_Core_Memory\n"
               "PartitionName=preempt Nodes=gpu-node-01 GraceTime=120 State=UP\n")
    lines = conf_lines(render_slurm_conf(layout(snippet=snippet, extra="MaxJobCount=5000")))
    assert lines.count("KillWait=30") == 1 and "KillWait=10" not in lines
    assert "SelectTypeParameters=CR_Core" not in lines and "SelectTypeParameters=CR_Core_Memory" in lines
    assert [ln for ln in lines if ln.startswith("PartitionName=")] == [
        "PartitionName=preempt Nodes=gpu-node-01 GraceTime=120 State=UP"]  # the snippet's only
    assert sum(ln.startswith("NodeName=") for ln in lines) == 3  # ours: the ports are the sandbox's
    assert "JobRequeue=1" in lines  # a setting the snippet does not make stays ours
    assert lines[-1] == "MaxJobCount=5000"


def test_layout_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="node_ports: no port for gpu-node-03"):
        render_slurm_conf(layout(node_ports={"gpu-node-01": 1, "gpu-node-02": 2}))
    with pytest.raises(ValueError, match="bad node name"):
        render_slurm_conf(layout(nodes=("gpu node;rm",), node_ports={"gpu node;rm": 1}))
    with pytest.raises(ValueError, match="grace_s"):
        render_slurm_conf(layout(grace_s=-1))
    with pytest.raises(ValueError, match="hold_group"):
        render_slurm_conf(layout(hold_group="a b"))
    with pytest.raises(ValueError, match="job_requeue: must be 0 or 1, got 2"):
        render_slurm_conf(layout(job_requeue=2))


def test_gres_conf_uses_fixed_device_files() -> None:
    lines = conf_lines(render_gres_conf(layout()))
    assert lines[0] == "AutoDetect=off"
    assert lines[1:] == [f"NodeName=gpu-node-0{i} Name=gpu File=/tmp/sb/dev/nvidia[0-3]" for i in (1, 2, 3)]
    assert conf_lines(render_gres_conf(layout(gpus=1)))[1] == "NodeName=gpu-node-01 Name=gpu File=/tmp/sb/dev/nvidia0"


def test_prometheus_config() -> None:
    cfg = yaml.safe_load(render_config([ScrapeTarget("prometheus", ("127.0.0.1:9090",)), parse_target("vllm=127.0.0.1:8000")]))
    assert cfg["global"]["scrape_interval"] == "1000ms"
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["prometheus", "vllm"]
    assert cfg["scrape_configs"][1]["static_configs"] == [{"targets": ["127.0.0.1:8000"]}]
    assert parse_target("127.0.0.1:9464").job == "extra"
    assert parse_target("gpu-bridge=127.0.0.1:1,127.0.0.1:2").targets == ("127.0.0.1:1", "127.0.0.1:2")
    with pytest.raises(ValueError, match="bad address"):
        parse_target("x=127.0.0.1")
    with pytest.raises(ValueError, match="bad name"):
        parse_target("bad job=127.0.0.1:1")
    with pytest.raises(ValueError, match="given twice"):
        render_config([parse_target("a=h:1"), parse_target("a=h:2")])


def test_prometheus_target_labels() -> None:
    # the sandbox labels the simulator's series with its pods' namespace, as Kubernetes
    # service discovery would: the daemon selects a pool's series by it (issue 21)
    cfg = yaml.safe_load(render_config([ScrapeTarget("vllm", ("127.0.0.1:8000",), labels={"namespace": "serving"})]))
    assert cfg["scrape_configs"][0]["static_configs"] == [{"targets": ["127.0.0.1:8000"], "labels": {"namespace": "serving"}}]
    with pytest.raises(ValueError, match="bad label name '__x'"):
        render_config([ScrapeTarget("vllm", ("127.0.0.1:8000",), labels={"__x": "y"})])


def test_proc_record_round_trip_and_bad_record() -> None:
    rec = ProcRecord("slurmd:gpu-node-01", 123, 456, "/tmp/x.log", ("slurmd", "-N", "gpu-node-01"))
    assert ProcRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    with pytest.raises(ValueError, match="bad process record"):
        ProcRecord.from_json({"name": "x"})


def test_free_ports_are_distinct() -> None:
    ports = procs.free_ports(6)
    assert len(set(ports)) == 6 and all(1024 < p < 65536 for p in ports)


def test_tail(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_text("".join(f"line {i}\n" for i in range(50)))
    assert procs.tail(f, 3) == ["line 47", "line 48", "line 49"]
    assert procs.tail(tmp_path / "missing") == []


def test_terminate_escalates_to_sigkill_and_pid_reuse_is_guarded(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    ticks = procs.start_ticks(p.pid)
    assert ticks is not None and procs.is_alive(p.pid, ticks)
    assert not procs.is_alive(p.pid, ticks + 1)  # another process with the same pid is not ours
    assert procs.terminate({p.pid: ticks + 1}, timeout_s=0.2) == []  # wrong start time: not signalled
    assert p.poll() is None
    assert procs.terminate({p.pid: ticks}, timeout_s=0.3) == [p.pid]
    assert p.wait(timeout=5) == -signal.SIGKILL
    p.stdout.close()


def test_find_leftovers_by_marker_and_descendants(tmp_path: Path) -> None:
    marker = str(tmp_path / "sb")
    child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    p, rec = procs.spawn("t", [sys.executable, "-c", child], tmp_path / "t.log", marker=marker)
    try:
        deadline = time.monotonic() + 10
        found: dict[int, str] = {}
        while time.monotonic() < deadline:
            found = procs.find_leftovers(marker, "/no/such/dir")
            if len(found) >= 2:
                break
            time.sleep(0.05)
        assert rec.pid in found and len(found) == 2
        procs.terminate({pid: procs.start_ticks(pid) for pid in found}, timeout_s=2)
        assert procs.find_leftovers(marker, "/no/such/dir") == {}
    finally:
        p.kill()
        p.wait()


def test_sweep_spares_a_user_reading_the_logs_and_a_shell_with_the_env(tmp_path: Path) -> None:
    """Only the sandbox's own processes are swept: not `tail -f DIR/log/...`, not a process
    that merely has DIR/env's variables."""
    import os

    d = str(tmp_path / "sb")
    (tmp_path / "sb" / "log").mkdir(parents=True)
    (tmp_path / "sb" / "log" / "x.log").write_text("x\n")
    tail = subprocess.Popen(["tail", "-f", f"{d}/log/x.log"], stdout=subprocess.DEVNULL)
    shell = subprocess.Popen(["sleep", "30"], env={**os.environ, "GPU_BRIDGE_SANDBOX_DIR": d})
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", f"{d}/spool/d/gpu-node-01/job00001/slurm_script"])
    try:
        time.sleep(0.2)
        found = procs.find_leftovers(d, d)
        assert job.pid in found
        assert tail.pid not in found and shell.pid not in found
    finally:
        for p in (tail, shell, job):
            p.kill()
            p.wait()


def test_slurm_version_and_cgroup_conf() -> None:
    from gpu_bridge_lab.sandbox.cluster.slurm import installed_version, parse_version, render_cgroup_conf

    assert parse_version("slurm-wlm 22.05.8") == (22, 5)
    assert parse_version("slurm 24.11.5") == (24, 11)
    assert parse_version("garbage") == (0, 0)
    assert render_cgroup_conf((22, 5)) is None
    assert "CgroupPlugin=disabled" in (render_cgroup_conf((24, 11)) or "")
    assert installed_version() >= (22, 5)
