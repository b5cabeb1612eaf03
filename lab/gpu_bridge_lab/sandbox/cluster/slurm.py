"""slurm.conf / gres.conf for the sandbox (pure rendering) and the Slurm daemons' argv/readiness.

The conf follows /work/shared/notes/slurm-local-cluster.md: one ``slurmd -N`` per node on
its own loopback port, fake GPUs as symlinks to /dev/null, ``config_overrides`` so a node may
claim more CPUs than the host has, settings that make requeue/preemption take seconds, and the
two partitions of the reclaim design (README "How a node moves"): ``preempt`` (research jobs,
REQUEUE with GraceTime) and ``gpu-bridge`` (hold jobs, higher PriorityTier, bridge's group only).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bridge import wellknown
from bridge.errors import SandboxError

DAEMONS = ("slurmctld", "slurmd", "slurmstepd")
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def node_names(n: int, prefix: str = "gpu-node-") -> tuple[str, ...]:
    """``gpu-node-01`` .. (two digits up to 99 nodes, more digits beyond)."""
    if not 1 <= n <= 999:
        raise ValueError(f"nodes: must be between 1 and 999, got {n}")
    width = max(2, len(str(n)))
    return tuple(f"{prefix}{i:0{width}d}" for i in range(1, n + 1))


# The fast-grace tier's partition as slurm_conf/ names it (gpu-bridge.yaml slurm.fast_partition).
FAST_PARTITION = "preempt-fast"


@dataclass(frozen=True, slots=True)
class SlurmLayout:
    """Everything slurm.conf needs to know; paths all inside the sandbox dir."""

    dir: Path
    nodes: tuple[str, ...]
    ctld_port: int
    node_ports: Mapping[str, int]
    munge_socket: Path
    grace_s: int = 10
    # GraceTime of the fast-grace tier `preempt-fast` (same nodes as `preempt`); None: no such partition.
    fast_grace_s: int | None = None
    cpus: int = 8
    real_memory_mb: int = 16000
    gpus: int = 4
    hold_group: str = "root"
    cluster_name: str = "gpubridge"
    extra: str = ""
    job_submit_lua: bool = False
    cli_filter_lua: bool = False
    # JobRequeue: 0 lets a test prove that job_submit.lua itself makes `preempt` jobs requeueable.
    job_requeue: int = 1
    # An administrator's slurm.conf lines (slurm_conf/slurm.conf.snippet): every setting it makes
    # replaces ours, and its partitions replace the sandbox's two; node lines stay ours.
    snippet: str = ""
    slurm_user: str = "root"
    extra_partitions: Sequence[str] = field(default_factory=tuple)
    # Slurm from another tree (Debian 13's 24.11 under systemd-nspawn, gpu_bridge_lab.sandbox.nspawn):
    # every daemon and client runs through ``command_prefix``; binaries are looked up in ``root``.
    command_prefix: tuple[str, ...] = ()
    root: Path | None = None

    @property
    def etc(self) -> Path:
        return self.dir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def job_submit_path(self) -> Path:
        return self.etc / "job_submit.lua"

    @property
    def cli_filter_path(self) -> Path:
        """Where sbatch/srun look for cli_filter.lua: next to the slurm.conf they read."""
        return self.etc / "cli_filter.lua"

    @property
    def state_dir(self) -> Path:
        return self.dir / "spool" / "ctld"

    def spool_dir(self, node: str) -> Path:
        return self.dir / "spool" / "d" / node

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    def ctld_log(self) -> Path:
        return self.log_dir / "slurmctld.log"

    def slurmd_log(self, node: str) -> Path:
        return self.log_dir / f"slurmd-{node}.log"

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def dev_dir(self) -> Path:
        return self.dir / "dev"

    def device_files(self) -> list[Path]:
        return [self.dev_dir / f"nvidia{i}" for i in range(self.gpus)]

    def validate(self) -> None:
        problems = []
        for n in self.nodes:
            if not _NAME_OK.match(n):
                problems.append(f"nodes: bad node name {n!r}")
        missing = [n for n in self.nodes if n not in self.node_ports]
        if missing:
            problems.append(f"node_ports: no port for {', '.join(missing)}")
        if self.grace_s < 0:
            problems.append(f"grace_s: must be >= 0, got {self.grace_s}")
        if self.fast_grace_s is not None and not 0 < self.fast_grace_s < self.grace_s:
            problems.append(f"fast_grace_s: must be > 0 and < grace_s ({self.grace_s}), got {self.fast_grace_s}")
        if self.gpus < 1:
            problems.append(f"gpus: must be >= 1, got {self.gpus}")
        if not _NAME_OK.match(self.hold_group):
            problems.append(f"hold_group: bad group name {self.hold_group!r}")
        if self.job_requeue not in (0, 1):
            problems.append(f"job_requeue: must be 0 or 1, got {self.job_requeue}")
        if problems:
            raise ValueError("; ".join(problems))


def render_slurm_conf(lay: SlurmLayout) -> str:
    """The whole slurm.conf of the sandbox (pure)."""
    lay.validate()
    all_nodes = ",".join(lay.nodes)
    lines = [
        "# Generated by gpu-bridge sandbox: do not edit (rewritten by `gpu-bridge sandbox up`).",
        f"ClusterName={lay.cluster_name}",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={lay.ctld_port}",
        f"SlurmUser={lay.slurm_user}",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire=10: a requeued job may start again after ~11 s instead of ~122 s.
        f"AuthInfo=socket={lay.munge_socket},cred_expire=10",
        f"StateSaveLocation={lay.state_dir}",
        f"SlurmdSpoolDir={lay.dir / 'spool' / 'd'}/%n",
        f"SlurmctldPidFile={lay.dir / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={lay.dir / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={lay.ctld_log()}",
        f"SlurmdLogFile={lay.log_dir}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1,sched_interval=2",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "ReturnToService=1",
        "SlurmdTimeout=15",
        "KillWait=10",
        "MinJobAge=300",
        "InactiveLimit=0",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        # Reclaim design: hold jobs in the high tier preempt research jobs with REQUEUE.
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        f"JobRequeue={lay.job_requeue}",
        "SlurmctldParameters=preempt_send_user_signal",
        # A job that saved on the signal exits with this code: Slurm requeues it at any time.
        f"RequeueExit={wellknown.SLURM_REQUEUE_EXIT}",
        "SlurmdParameters=config_overrides",
    ]
    if lay.job_submit_lua:
        lines.append("JobSubmitPlugins=lua")
    if lay.cli_filter_lua:
        lines.append("CliFilterPlugins=cli_filter/lua")
    for n in lay.nodes:
        lines.append(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={lay.node_ports[n]} "
            f"CPUs={lay.cpus} RealMemory={lay.real_memory_mb} Gres=gpu:{lay.gpus} State=UNKNOWN"
        )
    if lay.snippet.strip():
        return _with_snippet(lines, lay.snippet, lay.extra)
    lines += [
        f"PartitionName={wellknown.SLURM_PREEMPT_PARTITION} Nodes={all_nodes} Default=YES PriorityTier=1 "
        f"PreemptMode=REQUEUE GraceTime={lay.grace_s} OverTimeLimit={wellknown.SLURM_PREEMPT_OVER_TIME_LIMIT_MIN} "
        "MaxTime=INFINITE State=UP",
    ]
    if lay.fast_grace_s is not None:  # slurm_conf/slurm.conf.snippet's preempt-fast line
        lines.append(
            f"PartitionName={FAST_PARTITION} Nodes={all_nodes} PriorityTier=1 PreemptMode=REQUEUE "
            f"GraceTime={lay.fast_grace_s} OverTimeLimit={wellknown.SLURM_PREEMPT_OVER_TIME_LIMIT_MIN} "
            "MaxTime=INFINITE State=UP"
        )
    lines += [
        f"PartitionName={wellknown.SLURM_HOLD_PARTITION} Nodes={all_nodes} PriorityTier=100 PreemptMode=OFF "
        f"OverSubscribe=EXCLUSIVE AllowGroups={lay.hold_group} MaxTime=INFINITE State=UP",
    ]
    lines += list(lay.extra_partitions)
    if lay.extra.strip():
        lines += ["# --- extra_slurm_conf ---", lay.extra.strip()]
    return "\n".join(lines) + "\n"


def _setting_key(line: str) -> str | None:
    """``Key`` of a ``Key=value`` line (None for comments and blank lines)."""
    s = line.strip()
    if not s or s.startswith("#") or "=" not in s:
        return None
    return s.split("=", 1)[0]


def _with_snippet(lines: list[str], snippet: str, extra: str) -> str:
    """Our settings minus those the snippet makes, our node lines, then the snippet as given."""
    keys = {k for k in map(_setting_key, snippet.splitlines()) if k is not None}
    kept = [ln for ln in lines if _setting_key(ln) not in keys or _setting_key(ln) == "NodeName"]
    kept += ["# --- administrator's snippet ---", snippet.strip()]
    if extra.strip():
        kept += ["# --- extra_slurm_conf ---", extra.strip()]
    return "\n".join(kept) + "\n"


def render_gres_conf(lay: SlurmLayout) -> str:
    """gres.conf: fixed device files (symlinks to /dev/null), no autodetection."""
    files = lay.device_files()
    spec = str(files[0]) if len(files) == 1 else f"{lay.dev_dir}/nvidia[0-{len(files) - 1}]"
    return (
        "# Generated by gpu-bridge sandbox.\n"
        "AutoDetect=off\n" + "".join(f"NodeName={n} Name=gpu File={spec}\n" for n in lay.nodes)
    )


def parse_version(text: str) -> tuple[int, int]:
    """``slurm-wlm 22.05.8`` / ``slurm 24.11.5`` -> (22, 5); (0, 0) if unrecognised."""
    m = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def installed_version(lay: SlurmLayout | None = None) -> tuple[int, int]:
    """The installed slurmd's (major, minor), from ``slurmd -V`` (the layout's tree's, if any)."""
    prefix = lay.command_prefix if lay is not None else ()
    root = lay.root if lay is not None else None
    try:
        res = subprocess.run([*prefix, str(real_binary("slurmd", root)), "-V"], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return (0, 0)
    return parse_version(res.stdout + res.stderr)


def render_cgroup_conf(version: tuple[int, int]) -> str | None:
    """cgroup.conf for Slurm >= 23.02 (Debian 13 ships 24.11): ``CgroupPlugin=disabled``, so
    slurmd does not try to set up cgroups (we use proctrack/linuxproc, task/none) in a
    container. 22.05 has no "disabled" value and loads no cgroup plugin here: no file."""
    if version >= (23, 2):
        return "# Generated by gpu-bridge sandbox.\nCgroupPlugin=disabled\n"
    return None


def _resolve_in(root: Path, path: str) -> Path | None:
    """``path`` resolved as seen from inside ``root`` (absolute links stay in the tree)."""
    p = path
    for _ in range(40):
        full = root / p.lstrip("/")
        if full.is_symlink():
            target = os.readlink(full)
            p = target if target.startswith("/") else os.path.normpath(os.path.join(os.path.dirname(p), target))
            continue
        return Path(p) if full.exists() else None
    return None


def real_binary(name: str, root: Path | None = None) -> Path:
    """The real file behind /usr/sbin/NAME (alternatives link), so our symlink can carry the name.
    With ``root``: the path inside that tree (where the daemons run, through a prefix)."""
    if root is not None:
        found = _resolve_in(root, f"/usr/sbin/{name}")
        if found is None:
            raise SandboxError(f"{name} not found in {root}")
        return found
    for cand in (shutil.which(name), f"/usr/sbin/{name}"):
        if cand and os.path.exists(cand):
            return Path(os.path.realpath(cand))
    raise SandboxError(f"{name} not found: install the Debian packages slurmctld, slurmd (scripts/setup.sh)")


def write_files(lay: SlurmLayout, job_submit_lua: Path | None = None, cli_filter_lua: Path | None = None) -> None:
    """Conf files, device files, spool dirs and the argv[0]-named daemon symlinks."""
    for d in (lay.etc, lay.state_dir, lay.log_dir, lay.bin_dir, lay.dev_dir, lay.dir / "run"):
        d.mkdir(parents=True, exist_ok=True)
    for n in lay.nodes:
        lay.spool_dir(n).mkdir(parents=True, exist_ok=True)
    for f in lay.device_files():
        if f.is_symlink() or f.exists():
            f.unlink()
        f.symlink_to("/dev/null")
    # Slurm keys daemon logic on argv[0]: started as slurmctld-wlm it drops Gres=.
    for name in DAEMONS:
        link = lay.bin_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(real_binary(name, lay.root))
    lay.slurm_conf.write_text(render_slurm_conf(lay))
    lay.gres_conf.write_text(render_gres_conf(lay))
    cgroup = render_cgroup_conf(installed_version(lay))
    if cgroup is not None:
        (lay.etc / "cgroup.conf").write_text(cgroup)
    if job_submit_lua is not None:
        shutil.copyfile(job_submit_lua, lay.job_submit_path)
    if cli_filter_lua is not None:
        shutil.copyfile(cli_filter_lua, lay.cli_filter_path)


def ctld_argv(lay: SlurmLayout) -> list[str]:
    return [*lay.command_prefix, str(lay.bin_dir / "slurmctld"), "-D", "-f", str(lay.slurm_conf)]


def slurmd_argv(lay: SlurmLayout, node: str) -> list[str]:
    return [
        *lay.command_prefix,
        str(lay.bin_dir / "slurmd"),
        "-D",
        "-N",
        node,
        "-f",
        str(lay.slurm_conf),
        "-d",
        str(lay.bin_dir / "slurmstepd"),
    ]


def client_env(lay: SlurmLayout, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["SLURM_CONF"] = str(lay.slurm_conf)
    return env


def run_client(lay: SlurmLayout, argv: Sequence[str], timeout_s: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*lay.command_prefix, *argv], env=client_env(lay), capture_output=True, text=True, timeout=timeout_s,
        check=False,
    )


def ctld_up(lay: SlurmLayout) -> bool:
    try:
        res = run_client(lay, ["scontrol", "ping"], timeout_s=5)
    except subprocess.TimeoutExpired:
        return False
    return res.returncode == 0 and "is UP" in res.stdout


def node_states(lay: SlurmLayout) -> dict[str, str]:
    """node -> sinfo long state (``idle``, ``drained``, ``idle*``...); empty if sinfo fails."""
    try:
        res = run_client(lay, ["sinfo", "-h", "-N", "-o", "%N %T"], timeout_s=5)
    except subprocess.TimeoutExpired:
        return {}
    if res.returncode != 0:
        return {}
    out: dict[str, str] = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1].lower()
    return out


def all_idle(lay: SlurmLayout, nodes: Sequence[str] | None = None) -> bool:
    states = node_states(lay)
    return all(states.get(n) == "idle" for n in (nodes or lay.nodes))
