"""A minimal real Slurm cluster for the slurm_conf tests: a private munged, one slurmctld and
N slurmd on 127.0.0.1 with free ports, in a temp dir, following
/work/shared/notes/slurm-local-cluster.md. It carries gpu-bridge's two partitions (`preempt`,
`gpu-bridge`), and optionally job_submit.lua and cli_filter.lua.

Used when the project sandbox (gpu_bridge_lab.sandbox.cluster) is not available, and by the
job_submit.lua test, which needs settings of its own (JobRequeue=0 proves the script sets it).
Every process is started in the foreground by us and stopped by its pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SBIN = Path("/usr/sbin")


def have_slurm() -> bool:
    return all((SBIN / b).exists() for b in ("slurmctld", "slurmd", "slurmstepd", "munged")) and bool(
        shutil.which("sbatch")
    )


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class MiniSlurm:
    """``with MiniSlurm(nodes=2, grace_s=5, ...) as c: c.run(["sbatch", ...])``.

    Lives in its own world-traversable temp dir (munged runs as user munge, and pytest's
    tmp_path is private to root), removed by ``down()``."""

    def __init__(
        self,
        *,
        nodes: int = 2,
        grace_s: int = 5,
        job_submit_lua: str | None = None,
        cli_filter_lua: str | None = None,
        job_requeue: int = 1,
        extra_conf: str = "",
        snippet: str | None = None,
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gb-mini-slurm-"))
        self.root.chmod(0o755)
        self.nodes = [f"gpu-node-{i:02d}" for i in range(1, nodes + 1)]
        self.grace_s = grace_s
        self.job_submit_lua = job_submit_lua
        self.cli_filter_lua = cli_filter_lua
        self.job_requeue = job_requeue
        self.extra_conf = extra_conf
        self.snippet = snippet
        self.procs: list[subprocess.Popen[bytes]] = []
        self.etc = self.root / "etc"
        self.conf = self.etc / "slurm.conf"
        self.work = self.root / "work"

    # --- helpers -----------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, argv: list[str], *, timeout: float = 20, user: str | None = None) -> subprocess.CompletedProcess[str]:
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False,
                              cwd=self.work)

    def log_tail(self, n: int = 40) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*.log")):
            lines = f.read_text(errors="replace").splitlines()[-n:]
            out.append(f"== {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # --- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> MiniSlurm:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        r = self.root
        for d in ("munge", "etc", "bin", "dev", "log", "state", "work"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o755)
        self.work.chmod(0o777)
        shutil.chown(r / "munge", "munge", "munge")
        for b in ("slurmctld", "slurmd", "slurmstepd"):  # argv[0] must be exactly these names
            (r / "bin" / b).symlink_to(os.path.realpath(SBIN / b))
        for i in range(4):
            (r / "dev" / f"nvidia{i}").symlink_to("/dev/null")
        sock = r / "munge" / "munge.sock"
        subprocess.run(["runuser", "-u", "munge", "--", "mungekey", "-c", "-k", str(r / "munge" / "munge.key")],
                       check=True, capture_output=True, timeout=20)
        self._start(["runuser", "-u", "munge", "--", str(SBIN / "munged"), "-F", f"--socket={sock}",
                     f"--key-file={r / 'munge' / 'munge.key'}", f"--pid-file={r / 'munge' / 'munged.pid'}",
                     f"--log-file={r / 'log' / 'munged.log'}", f"--seed-file={r / 'munge' / 'seed'}"])
        self._wait(lambda: sock.exists(), 10, "munged socket")

        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        self._write_conf(sock, ctld_port, node_ports)
        for n in self.nodes:
            (r / "state" / n).mkdir()
        self._start([str(r / "bin" / "slurmctld"), "-D", "-f", str(self.conf)])
        self._wait(lambda: self.run(["scontrol", "ping"], timeout=5).stdout.count("UP") > 0, 20, "slurmctld")
        for n in self.nodes:
            self._start([str(r / "bin" / "slurmd"), "-D", "-N", n, "-f", str(self.conf), "-d", str(r / "bin" / "slurmstepd")])
        self._wait(self._all_idle, 30, "nodes idle")

    def _write_conf(self, sock: Path, ctld_port: int, node_ports: list[int]) -> None:
        r = self.root
        nodes = ",".join(self.nodes)
        lines = [
            "ClusterName=gbmini",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={sock},cred_expire=10",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'state'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'state'}/slurmd-%n.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1,sched_interval=2",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "ReturnToService=1",
            "SlurmdTimeout=15",
            "KillWait=5",
            "MinJobAge=300",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            f"JobRequeue={self.job_requeue}",
            "SlurmctldParameters=preempt_send_user_signal",
            "SlurmdParameters=config_overrides",
        ]
        if self.job_submit_lua is not None:
            (self.etc / "job_submit.lua").write_text(self.job_submit_lua)
            lines.append("JobSubmitPlugins=lua")
        if self.cli_filter_lua is not None:
            (self.etc / "cli_filter.lua").write_text(self.cli_filter_lua)
            lines.append("CliFilterPlugins=cli_filter/lua")
        for n, port in zip(self.nodes, node_ports, strict=True):
            lines.append(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=8 "
                         "RealMemory=4000 Gres=gpu:4 State=UNKNOWN")
        if self.snippet is not None:
            # An administrator's snippet: its settings and partitions replace ours.
            keys = {ln.split("=", 1)[0] for ln in self.snippet.splitlines() if "=" in ln and not ln.startswith("#")}
            lines = [ln for ln in lines if ln.split("=", 1)[0] not in keys or ln.startswith("NodeName=")]
            lines.append(self.snippet)
            self.conf.write_text("\n".join(lines) + "\n")
            (self.etc / "gres.conf").write_text(
                f"AutoDetect=off\nNodeName={nodes} Name=gpu File={r / 'dev'}/nvidia[0-3]\n"
            )
            return
        lines += [
            f"PartitionName=preempt Nodes={nodes} Default=YES PriorityTier=1 PreemptMode=REQUEUE "
            f"GraceTime={self.grace_s} MaxTime=INFINITE State=UP",
            f"PartitionName=gpu-bridge Nodes={nodes} PriorityTier=100 PreemptMode=OFF OverSubscribe=EXCLUSIVE "
            "AllowGroups=root MaxTime=INFINITE State=UP",
            f"PartitionName=batch Nodes={nodes} PriorityTier=1 PreemptMode=OFF MaxTime=INFINITE State=UP",
        ]
        if self.extra_conf:
            lines.append(self.extra_conf)
        self.conf.write_text("\n".join(lines) + "\n")
        (self.etc / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={nodes} Name=gpu File={r / 'dev'}/nvidia[0-3]\n"
        )

    def _all_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-p", "preempt", "-o", "%N %T"], timeout=5).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n) == "idle" for n in self.nodes)

    def _start(self, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{Path(argv[0]).name}-{len(self.procs)}.stderr.log", "wb")  # noqa: SIM115
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                           start_new_session=True))
        log.close()

    def _wait(self, cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if cond():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"mini slurm: timed out waiting for {what}\n{self.log_tail()}")

    def down(self) -> None:
        """Cancel every job (so no slurmstepd outlives us), then stop daemons newest first."""
        if self.procs and self.conf.exists():
            try:
                self.run(["scancel", "--full", "-u", "root"], timeout=10)
                self.run(["scancel", "--full", "-u", "nobody"], timeout=10)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    if not self.run(["squeue", "-h", "-t", "R,CG", "-o", "%i"], timeout=5).stdout.strip():
                        break
                    time.sleep(0.3)
            except (OSError, subprocess.SubprocessError):
                pass
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)
