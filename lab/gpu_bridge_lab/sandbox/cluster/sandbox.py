"""The sandbox as a list of components (munged, vLLM simulator, Kubernetes API server,
Prometheus, Slurm) started in one private directory, with a Python API for tests and demos.

    with Sandbox("/tmp/gpu-bridge-sandbox") as sb:
        subprocess.run(["sinfo"], env=sb.slurm_env())

State lives in ``DIR/sandbox.json`` (pids with their start times, ports, paths), so ``down``
and ``status`` work from another process (``Sandbox.attach(DIR)``). ``DIR/env`` is the
shell-sourceable summary (``set -a; . DIR/env; set +a``).

Adding a component: implement the ``Component`` protocol below and put it in
``Sandbox._components()``; ``kube=True`` adds the real Kubernetes control plane
(gpu_bridge_lab.sandbox.realkube).
"""

from __future__ import annotations

import argparse
import grp
import importlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from bridge import logs, wellknown
from bridge.errors import SandboxError
from gpu_bridge_lab.sandbox.cluster import munge, procs, slurm
from gpu_bridge_lab.sandbox.cluster import prometheus as prom
from gpu_bridge_lab.sandbox.cluster.procs import ProcRecord
from gpu_bridge_lab.sandbox.cluster.prometheus import ScrapeTarget



def _log() -> Any:
    # Resolved at call time, so the CLI's logs.configure() (made after import) applies.
    return logs.get(__name__)

DEFAULT_DIR = Path("/tmp/gpu-bridge-sandbox")
STATE_FILE = "sandbox.json"
ENV_FILE = "env"
STATE_VERSION = 1
# Subdirectories the sandbox creates (and removes on a fresh `up`): never anything else in DIR.
_OWNED_SUBDIRS = ("munge", "etc", "spool", "log", "run", "bin", "dev", "prometheus", "kube")


class Component(Protocol):
    """One part of the sandbox. ``start`` spawns (through ``sb.spawn``) and may block on what
    it depends on; ``wait_ready`` blocks until usable; ``env`` adds lines to DIR/env."""

    name: str

    def start(self, sb: Sandbox) -> None: ...

    def wait_ready(self, sb: Sandbox, timeout_s: float) -> None: ...

    def env(self, sb: Sandbox) -> dict[str, str]: ...

    def logs(self, sb: Sandbox) -> dict[str, Path]: ...


def bridge_subcommand_registered(module: str, command: str) -> bool:
    """Whether ``module`` registers ``gpu-bridge sandbox <command>`` (an import error propagates)."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module).register_cli(sub)  # a broken module fails `up`, loudly
    return command in sub.choices


def _http_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - loopback only
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


class MungeComponent:
    name = "munged"

    def start(self, sb: Sandbox) -> None:
        munge.prepare(sb.munge_paths)
        if sb.slurm_command_prefix:
            # Slurm from another tree: that tree's munged too, as the host's munge uid (which owns
            # the key and the socket dir; the tree's own munge user may have another uid)
            sb.spawn("munged", [*sb.slurm_command_prefix, *munge.setpriv_argv(), *munge.argv(sb.munge_paths)],
                     sb.log_dir / "munged.out")
            return
        sb.spawn("munged", munge.argv(sb.munge_paths), sb.log_dir / "munged.out", user=munge.MUNGE_USER)

    def wait_ready(self, sb: Sandbox, timeout_s: float) -> None:
        sb.wait(lambda: munge.works(sb.munge_paths), timeout_s, "munged to answer on its socket", "munged")

    def env(self, sb: Sandbox) -> dict[str, str]:
        return {}

    def logs(self, sb: Sandbox) -> dict[str, Path]:
        return {"munged": sb.munge_paths.log, "munged stdout": sb.log_dir / "munged.out"}


class BridgeSubprocessComponent:
    """A `gpu-bridge sandbox <command>` of another lab module, run as a subprocess of this
    Python (its own process: it is stopped and restarted like the daemons)."""

    def __init__(self, name: str, module: str, command: str, port_key: str, extra_args: Sequence[str] = ()) -> None:
        self.name = name
        self.module = module
        self.command = command
        self.port_key = port_key
        self.extra_args = tuple(extra_args)

    def available(self) -> bool:
        return bridge_subcommand_registered(self.module, self.command)

    def argv(self, sb: Sandbox) -> list[str]:
        return [
            sys.executable, "-m", "bridge", "sandbox", self.command,
            "--host", "127.0.0.1", "--port", str(sb.ports[self.port_key]), *self.extra_args,
        ]

    def start(self, sb: Sandbox) -> None:
        sb.spawn(self.name, self.argv(sb), sb.log_dir / f"{self.name}.log")

    def url(self, sb: Sandbox) -> str:
        return f"http://127.0.0.1:{sb.ports[self.port_key]}"

    def wait_ready(self, sb: Sandbox, timeout_s: float) -> None:
        sb.wait(lambda: _http_ok(self.url(sb) + "/metrics"), timeout_s, f"{self.name} to serve /metrics", self.name)

    def env(self, sb: Sandbox) -> dict[str, str]:
        return {}

    def logs(self, sb: Sandbox) -> dict[str, Path]:
        return {self.name: sb.log_dir / f"{self.name}.log"}


class VllmSimComponent(BridgeSubprocessComponent):
    def __init__(self, extra_args: Sequence[str] = ()) -> None:
        super().__init__("vllm-sim", "gpu_bridge_lab.sandbox.vllm", "vllm", "vllm", extra_args)

    def env(self, sb: Sandbox) -> dict[str, str]:
        return {"VLLM_SIM_URL": self.url(sb)}


class PrometheusComponent:
    name = "prometheus"

    def start(self, sb: Sandbox) -> None:
        sb.prometheus_dir.mkdir(parents=True, exist_ok=True)
        sb.prometheus_config.write_text(prom.render_config(sb.scrape_targets()))
        argv = prom.argv(sb.prometheus_config, sb.prometheus_dir / "data", sb.ports["prometheus"])
        sb.spawn("prometheus", argv, sb.log_dir / "prometheus.log")

    def wait_ready(self, sb: Sandbox, timeout_s: float) -> None:
        jobs = [t.job for t in sb.scrape_targets()]
        own = [j for j in jobs if j in ("prometheus", "vllm")]
        sb.wait(lambda: prom.scraped_once(sb.prometheus_url, jobs, own), timeout_s,
                "Prometheus to scrape every target once (" + ", ".join(jobs) + ")", "prometheus")

    def env(self, sb: Sandbox) -> dict[str, str]:
        return {"PROMETHEUS_URL": sb.prometheus_url}

    def logs(self, sb: Sandbox) -> dict[str, Path]:
        return {"prometheus": sb.log_dir / "prometheus.log"}


class SlurmComponent:
    name = "slurm"

    def start(self, sb: Sandbox) -> None:
        lay = sb.slurm
        slurm.write_files(lay, sb.job_submit_lua, sb.cli_filter_lua)
        # slurmctld first: a slurmd that cannot register backs off for 11-25 s.
        sb.wait(lambda: munge.works(sb.munge_paths), 20, "munged to answer on its socket", "munged")
        sb.start_slurmctld()
        sb.wait(lambda: slurm.ctld_up(lay), 30, "slurmctld to answer `scontrol ping`", "slurmctld")
        for node in lay.nodes:
            sb.start_slurmd(node)

    def wait_ready(self, sb: Sandbox, timeout_s: float) -> None:
        sb.wait(lambda: slurm.all_idle(sb.slurm), timeout_s, "every node idle in sinfo", "slurm")

    def env(self, sb: Sandbox) -> dict[str, str]:
        return {"SLURM_CONF": str(sb.slurm.slurm_conf)}

    def logs(self, sb: Sandbox) -> dict[str, Path]:
        out = {"slurmctld": sb.slurm.ctld_log(), "slurmctld stdout": sb.log_dir / "slurmctld.out"}
        for n in sb.slurm.nodes:
            out[f"slurmd {n}"] = sb.slurm.slurmd_log(n)
        return out


def _bridge_group() -> str:
    return grp.getgrgid(os.getgid()).gr_name


class Sandbox:
    """A private Slurm cluster + munged + Prometheus (+ vLLM simulator, + a real Kubernetes control plane)."""

    def __init__(
        self,
        dir: Path | str = DEFAULT_DIR,
        *,
        nodes: int = 4,
        grace_s: int = 10,
        fast_grace_s: int | None = None,
        extra_slurm_conf: str = "",
        job_submit_lua: Path | str | None = None,
        cli_filter_lua: Path | str | None = None,
        job_requeue: int = 1,
        slurm_snippet: str = "",
        scrape_targets: Sequence[ScrapeTarget | str] = (),
        vllm: bool | None = None,
        vllm_args: Sequence[str] = ("--replicas", "1"),
        kube: bool = False,
        prometheus: bool = True,
        kube_args: Sequence[str] = (),
        cpus_per_node: int = 8,
        real_memory_mb: int = 16000,
        gpus_per_node: int = 4,
        timeout_s: float = 60.0,
        slurm_command_prefix: Sequence[str] = (),
        slurm_root: Path | str | None = None,
    ) -> None:
        self.dir = Path(dir).absolute()
        # Slurm of another release in a tree (gpu_bridge_lab.sandbox.nspawn): run through this prefix
        self.slurm_command_prefix = tuple(slurm_command_prefix)
        self.slurm_root = Path(slurm_root) if slurm_root is not None else None
        if len(str(self.dir)) > 60:
            # Slurm's and munge's unix sockets live under DIR; sun_path is limited to 108 bytes.
            raise SandboxError(f"--dir: {self.dir} is too long (max 60 characters: unix socket paths)")
        self.node_names = slurm.node_names(nodes)
        self.grace_s = int(grace_s)
        self.fast_grace_s = int(fast_grace_s) if fast_grace_s is not None else None
        self.extra_slurm_conf = extra_slurm_conf
        self.job_submit_lua = Path(job_submit_lua).absolute() if job_submit_lua else None
        if self.job_submit_lua is not None and not self.job_submit_lua.is_file():
            raise SandboxError(f"job_submit_lua: {self.job_submit_lua} is not a file")
        self.cli_filter_lua = Path(cli_filter_lua).absolute() if cli_filter_lua else None
        if self.cli_filter_lua is not None and not self.cli_filter_lua.is_file():
            raise SandboxError(f"cli_filter_lua: {self.cli_filter_lua} is not a file")
        self.job_requeue = job_requeue
        self.slurm_snippet = slurm_snippet
        self.extra_targets = tuple(t if isinstance(t, ScrapeTarget) else prom.parse_target(t) for t in scrape_targets)
        self.vllm_requested = vllm
        self.vllm_args = tuple(vllm_args)
        self.kube_enabled = kube
        self.prometheus_enabled = prometheus  # False: a Slurm-only sandbox, ready in about 1 s
        self.kube_args = tuple(kube_args)
        self.cpus_per_node = cpus_per_node
        self.real_memory_mb = real_memory_mb
        self.gpus_per_node = gpus_per_node
        self.timeout_s = timeout_s
        self.ports: dict[str, int] = {}
        self.node_ports: dict[str, int] = {}
        self.records: dict[str, ProcRecord] = {}
        self._popens: dict[str, subprocess.Popen[bytes]] = {}
        self.components: list[Any] = []
        self.notes: list[str] = []
        self.startup_s: float | None = None
        self.started_at: float | None = None
        self._slurm: slurm.SlurmLayout | None = None
        # DIR/munge, unless user munge cannot reach DIR (a 0700 parent): then a /tmp dir of its own
        self.munge_dir = self.dir / "munge"

    # ---- paths -------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.dir / STATE_FILE

    @property
    def env_file(self) -> Path:
        return self.dir / ENV_FILE

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    @property
    def munge_paths(self) -> munge.MungePaths:
        return munge.MungePaths(self.munge_dir)

    @property
    def prometheus_dir(self) -> Path:
        return self.dir / "prometheus"

    @property
    def prometheus_config(self) -> Path:
        return self.prometheus_dir / "prometheus.yml"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    @property
    def vllm_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ports['vllm']}" if "vllm" in self.ports else None

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kube" / "kubeconfig"

    @property
    def daemon_kubeconfig(self) -> Path:
        """The kubeconfig the daemon uses: its ServiceAccount's (bound token, exactly
        deploy/kubernetes/rbac.yaml); the admin's until the control plane has written it."""
        real = self.dir / "kube" / "kubeconfig-daemon"
        return real if "etcd" in self.ports and real.exists() else self.kubeconfig

    @property
    def web_kubeconfig(self) -> Path | None:
        """The kubeconfig of ``gpu-bridge web``'s read-only ServiceAccount (exactly
        deploy/kubernetes/web-rbac.yaml); None until the control plane has written it."""
        real = self.dir / "kube" / "kubeconfig-web"
        return real if "etcd" in self.ports and real.exists() else None

    @property
    def kube_tls(self) -> tuple[Path, Path] | None:
        """The real apiserver's serving (certificate, key), for a proxy that answers in its name."""
        pki = self.dir / "kube" / "pki"
        if "etcd" in self.ports and (pki / "apiserver.crt").exists():
            return pki / "apiserver.crt", pki / "apiserver.key"
        return None

    @property
    def slurm(self) -> slurm.SlurmLayout:
        if self._slurm is None:
            self._slurm = slurm.SlurmLayout(
                dir=self.dir,
                nodes=self.node_names,
                ctld_port=self.ports["slurmctld"],
                node_ports=dict(self.node_ports),
                munge_socket=self.munge_paths.socket,
                grace_s=self.grace_s,
                fast_grace_s=self.fast_grace_s,
                cpus=self.cpus_per_node,
                real_memory_mb=self.real_memory_mb,
                gpus=self.gpus_per_node,
                hold_group=_bridge_group(),
                extra=self.extra_slurm_conf,
                job_submit_lua=self.job_submit_lua is not None,
                cli_filter_lua=self.cli_filter_lua is not None,
                job_requeue=self.job_requeue,
                snippet=self.slurm_snippet,
                command_prefix=self.slurm_command_prefix,
                root=self.slurm_root,
            )
        return self._slurm

    def scrape_targets(self) -> list[ScrapeTarget]:
        out = [ScrapeTarget("prometheus", (f"127.0.0.1:{self.ports['prometheus']}",))]
        if "vllm" in self.ports:
            # the namespace of the pods the simulator follows, as Kubernetes service discovery
            # labels a pod's series: the daemon selects its pool's series by it
            out.append(ScrapeTarget("vllm", (f"127.0.0.1:{self.ports['vllm']}",), labels={"namespace": self.vllm_namespace}))
        return out + list(self.extra_targets)

    @property
    def vllm_namespace(self) -> str:
        """The simulator's ``--namespace`` (its default: ``default``)."""
        args = list(self.vllm_args)
        for i, a in enumerate(args):
            if a == "--namespace" and i + 1 < len(args):
                return args[i + 1]
            if a.startswith("--namespace="):
                return a.split("=", 1)[1]
        return "default"

    # ---- environment -------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """What DIR/env holds: SLURM_CONF, PROMETHEUS_URL, VLLM_SIM_URL, KUBECONFIG, ..."""
        out = {"GPU_BRIDGE_SANDBOX_DIR": str(self.dir)}
        for c in self.components:
            out.update(c.env(self))
        return out

    def slurm_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for running scontrol/sbatch/squeue against this sandbox."""
        return slurm.client_env(self.slurm, base)

    def run_slurm(self, argv: Sequence[str], timeout_s: float = 15.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against the sandbox; ``check`` raises SandboxError with its stderr."""
        res = slurm.run_client(self.slurm, argv, timeout_s)
        if check and res.returncode != 0:
            raise SandboxError(f"{shlex.join(argv)} failed (rc {res.returncode}): {res.stderr.strip()[-800:]}")
        return res

    # ---- processes ---------------------------------------------------------------------
    def spawn(self, name: str, argv: Sequence[str], log_path: Path, user: str | None = None) -> ProcRecord:
        env = self.slurm_env() if self._slurm is not None else dict(os.environ)
        popen, rec = procs.spawn(name, argv, log_path, marker=str(self.dir), env=env, user=user, cwd=self.dir)
        self._popens[name] = popen
        self.records[name] = rec
        self._save_state("starting" if self.startup_s is None else "running")
        return rec

    def start_slurmctld(self) -> ProcRecord:
        """(Re)start slurmctld; its state (drains, jobs) survives in StateSaveLocation."""
        return self.spawn("slurmctld", slurm.ctld_argv(self.slurm), self.log_dir / "slurmctld.out")

    def start_slurmd(self, node: str) -> ProcRecord:
        if node not in self.node_names:
            raise SandboxError(f"node: {node!r} is not a sandbox node ({', '.join(self.node_names)})")
        return self.spawn(f"slurmd:{node}", slurm.slurmd_argv(self.slurm, node), self.log_dir / f"slurmd-{node}.out")

    def stop_process(self, name: str, timeout_s: float = 10.0) -> None:
        """Stop one daemon by name ("slurmctld", "slurmd:gpu-node-01", ...), e.g. to test restarts."""
        rec = self.records.get(name)
        if rec is None:
            raise SandboxError(f"no sandbox process named {name!r} ({', '.join(self.records)})")
        procs.terminate({rec.pid: rec.start_ticks}, timeout_s)
        self._reap(name)
        del self.records[name]
        self._save_state("running")

    def kill_process(self, name: str) -> None:
        """SIGKILL one daemon by name, as a crash would (no clean shutdown), and forget it;
        ``ensure_daemons`` starts it again."""
        rec = self.records.get(name)
        if rec is None:
            raise SandboxError(f"no sandbox process named {name!r} ({', '.join(self.records)})")
        procs._signal(rec.pid, signal.SIGKILL)
        self._reap(name)
        del self.records[name]
        self._save_state("running")

    def wait_job_state_saved(self, since: float, timeout_s: float = 20.0) -> float:
        """Wait until slurmctld has written its job state (StateSaveLocation/job_state) after the
        wall-clock time ``since``; returns that write's time. slurmctld saves at most every 5 s,
        so a SIGKILL loses what changed in the last seconds: a test that means "the controller
        dies after X" waits for X to be saved first."""
        js = self.slurm.state_dir / "job_state"

        def saved() -> bool:
            try:
                return js.stat().st_mtime > since
            except FileNotFoundError:
                return False

        self.wait(saved, timeout_s, f"slurmctld to save its job state after {since:.1f}", "slurmctld")
        return js.stat().st_mtime

    def signal_process(self, name: str, sig: int) -> None:
        """Send a signal to one daemon by name (SIGSTOP/SIGCONT: pause and resume it)."""
        rec = self.records.get(name)
        if rec is None:
            raise SandboxError(f"no sandbox process named {name!r} ({', '.join(self.records)})")
        procs._signal(rec.pid, sig)

    def _reap(self, name: str) -> None:
        p = self._popens.pop(name, None)
        if p is not None:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def wait(self, check: Any, timeout_s: float, what: str, component: str | None = None) -> float:
        """Poll ``check``; on timeout (or a daemon dying) raise SandboxError with the logs."""

        def guarded() -> bool:
            dead = [n for n, r in self.records.items() if not procs.record_alive(r)]
            if dead:
                raise SandboxError(self._failure_text(f"{', '.join(dead)} exited while waiting for {what}", dead))
            return bool(check())

        try:
            return procs.wait_for(guarded, timeout_s, what=what)
        except TimeoutError as e:
            raise SandboxError(self._failure_text(str(e), [component] if component else [])) from None

    def _failure_text(self, headline: str, names: Sequence[str]) -> str:
        """The headline plus the tails of the logs that matter (the named components' first)."""
        lines = [headline]
        all_logs: dict[str, Path] = {}
        for c in self.components:
            all_logs.update(c.logs(self))
        ordered = sorted(all_logs.items(), key=lambda kv: not any(kv[0].startswith(n.split(":")[0]) for n in names))
        for label, path in ordered:
            t = procs.tail(path, 12)
            if t:
                lines.append(f"--- {label}: {path} (last {len(t)} lines) ---")
                lines += ["  " + x for x in t]
        return "\n".join(lines)

    # ---- lifecycle ---------------------------------------------------------------------
    def _components(self) -> list[Any]:
        comps: list[Any] = [MungeComponent()]
        if self.kube_enabled:  # etcd, kube-apiserver, controllers, scheduler, kwok
            from gpu_bridge_lab.sandbox.realkube import RealKubeComponent

            comps.append(RealKubeComponent(self.kube_args))
        vllm = VllmSimComponent(self.vllm_args)
        if self.vllm_requested is not False:
            if not vllm.available():
                raise SandboxError("vllm: `gpu-bridge sandbox vllm` is not available (gpu_bridge_lab.sandbox.vllm registers no command)")
            comps.append(vllm)
        # Prometheus after the things it scrapes, Slurm last (it blocks on munged).
        if self.prometheus_enabled:
            comps.append(PrometheusComponent())
        comps.append(SlurmComponent())
        return comps

    def running(self) -> bool:
        """Whether a sandbox recorded in DIR/sandbox.json has a live process."""
        try:
            doc = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return False
        for d in doc.get("processes", []):
            try:
                if procs.record_alive(ProcRecord.from_json(d)):
                    return True
            except ValueError:
                continue
        return False

    def up(self) -> Sandbox:
        """Start everything; returns when all nodes are idle and Prometheus has scraped once."""
        if self.running():
            raise SandboxError(f"a sandbox is already running in {self.dir} (gpu-bridge sandbox down --dir {self.dir})")
        t0 = time.monotonic()
        self.started_at = time.time()
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)  # munged (user munge) must reach its socket dir
        self.munge_dir = self.dir / "munge"
        if not munge.reachable_by_munge(self.dir):
            self.munge_dir = Path(tempfile.mkdtemp(prefix="gbmunge-", dir="/tmp"))
            self.notes.append(f"user munge cannot reach {self.dir} (a parent directory is not searchable): "
                              f"munged's socket and key are in {self.munge_dir}, removed by down")
        for sub in _OWNED_SUBDIRS:
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        for f in (self.state_file, self.env_file):
            f.unlink(missing_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.components = self._components()
        names = [c.name for c in self.components]
        ports = procs.free_ports(2 + len(self.node_names) + ("vllm-sim" in names)
                                 + 3 * ("kube" in names))
        self.ports = {"slurmctld": ports.pop()}
        if "prometheus" in names:
            self.ports["prometheus"] = ports.pop()
        if "vllm-sim" in names:
            self.ports["vllm"] = ports.pop()
        if "kube" in names:  # kube-apiserver, etcd (client, peer)
            self.ports["kube"] = ports.pop()
            self.ports["etcd"], self.ports["etcd-peer"] = ports.pop(), ports.pop()
            self.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        self.node_ports = {n: ports.pop() for n in self.node_names}
        self._slurm = None
        try:
            for c in self.components:
                c.start(self)
                if getattr(c, "ready_before_next", False):  # e.g. the vLLM simulator follows the kube API
                    c.wait_ready(self, max(1.0, t0 + self.timeout_s - time.monotonic()))
            deadline = t0 + self.timeout_s
            for c in self.components:
                c.wait_ready(self, max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.down()
            raise
        self.startup_s = time.monotonic() - t0
        self._write_env()
        self._save_state("running")
        _log().info("sandbox_up", dir=str(self.dir), nodes=len(self.node_names), startup_s=round(self.startup_s, 2))
        return self

    def down(self, timeout_s: float = 10.0) -> dict[int, str]:
        """Stop every recorded process (SIGTERM, SIGKILL after ``timeout_s``), then sweep what
        they left behind (slurmstepd, job scripts); returns the PIDs swept."""
        for c in self.components:  # a component may stop its own processes first (in order)
            before = getattr(c, "before_down", None)
            if before is not None:
                before(self)
        pids = {r.pid: r.start_ticks for r in self.records.values()}
        procs.terminate(pids, timeout_s)
        for name in list(self._popens):
            self._reap(name)
        swept: dict[int, str] = {}
        for _ in range(3):
            left = procs.find_leftovers(str(self.dir), str(self.dir))
            if not left:
                break
            swept.update(left)
            procs.terminate({p: procs.start_ticks(p) for p in left}, timeout_s=1.0)
        self.records.clear()
        if self.munge_dir.parent != self.dir and self.munge_dir.name.startswith("gbmunge-"):
            shutil.rmtree(self.munge_dir, ignore_errors=True)
        if self.state_file.exists():
            self._save_state("stopped")
        self.env_file.unlink(missing_ok=True)
        _log().info("sandbox_down", dir=str(self.dir), swept=len(swept))
        return swept

    def __enter__(self) -> Sandbox:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ---- state files -------------------------------------------------------------------
    def _write_env(self) -> None:
        lines = [f"# gpu-bridge sandbox in {self.dir}: `set -a; . {self.env_file}; set +a`"]
        lines += [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        self.env_file.write_text("\n".join(lines) + "\n")

    def state(self, status: str = "running") -> dict[str, Any]:
        """The content of DIR/sandbox.json."""
        paths: dict[str, Any] = {"dir": str(self.dir), "env": str(self.env_file), "logs": {}}
        if self.ports:
            lay = self.slurm
            paths.update(
                slurm_conf=str(lay.slurm_conf), gres_conf=str(lay.gres_conf), state_save=str(lay.state_dir),
                munge_socket=str(self.munge_paths.socket), munge_dir=str(self.munge_dir),
                prometheus_config=str(self.prometheus_config),
                prometheus_data=str(self.prometheus_dir / "data"),
            )
            if self.job_submit_lua is not None:
                paths["job_submit_lua"] = str(lay.job_submit_path)
            if "kube" in self.ports:
                paths["kubeconfig"] = str(self.kubeconfig)
            for c in self.components:
                paths["logs"].update({k: str(v) for k, v in c.logs(self).items()})
        return {
            "version": STATE_VERSION,
            "status": status,
            "dir": str(self.dir),
            "started_at": self.started_at,
            "startup_s": self.startup_s,
            "nodes": list(self.node_names),
            "grace_s": self.grace_s,
            "fast_grace_s": self.fast_grace_s,
            "partitions": {"preempt": wellknown.SLURM_PREEMPT_PARTITION, "hold": wellknown.SLURM_HOLD_PARTITION},
            "ports": {**self.ports, "slurmd": dict(self.node_ports)},
            "urls": {k: v for k, v in (("prometheus", "prometheus" in self.ports and self.prometheus_url), ("vllm", self.vllm_url)) if v},
            "env": self.env if self.components else {},
            "components": [c.name for c in self.components],
            "processes": [r.to_json() for r in self.records.values()],
            "paths": paths,
            "notes": list(self.notes),
        }

    def _save_state(self, status: str) -> None:
        tmp = self.state_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.state(status), indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_file)

    @classmethod
    def attach(cls, dir: Path | str = DEFAULT_DIR) -> Sandbox:
        """A handle on the sandbox recorded in DIR/sandbox.json (for down/status from another process)."""
        d = Path(dir).absolute()
        try:
            doc = json.loads((d / STATE_FILE).read_text())
        except FileNotFoundError:
            raise SandboxError(f"no sandbox in {d} ({STATE_FILE} not found)") from None
        except (OSError, ValueError) as e:
            raise SandboxError(f"{d / STATE_FILE}: unreadable: {e}") from None
        if doc.get("version") != STATE_VERSION:
            raise SandboxError(f"{d / STATE_FILE}: version {doc.get('version')!r}, expected {STATE_VERSION}")
        try:
            fast = doc.get("fast_grace_s")
            sb = cls(d, nodes=len(doc["nodes"]), grace_s=int(doc["grace_s"]),
                     fast_grace_s=int(fast) if fast is not None else None)
            ports = dict(doc["ports"])
            sb.node_ports = {str(k): int(v) for k, v in ports.pop("slurmd", {}).items()}
            sb.ports = {str(k): int(v) for k, v in ports.items()}
            sb.records = {p["name"]: ProcRecord.from_json(p) for p in doc.get("processes", [])}
            sb.startup_s = doc.get("startup_s")
            sb.started_at = doc.get("started_at")
            sb.notes = list(doc.get("notes", []))
            munge_dir = (doc.get("paths") or {}).get("munge_dir")
            if munge_dir:
                sb.munge_dir = Path(munge_dir)
        except (KeyError, TypeError, ValueError) as e:
            raise SandboxError(f"{d / STATE_FILE}: bad content: {e}") from None
        names = set(doc.get("components", []))
        sb.components = [MungeComponent()]
        if "vllm-sim" in names:
            sb.components.append(VllmSimComponent())
        if "kube" in names:
            from gpu_bridge_lab.sandbox.realkube import RealKubeComponent

            sb.components.insert(1, RealKubeComponent())
        if "prometheus" in names:
            sb.components.append(PrometheusComponent())
        sb.components.append(SlurmComponent())
        return sb

    def status(self) -> dict[str, Any]:
        """Liveness of each process, node states from sinfo, Prometheus targets."""
        out: dict[str, Any] = {"dir": str(self.dir), "processes": {}}
        for name, rec in self.records.items():
            out["processes"][name] = {"pid": rec.pid, "alive": procs.record_alive(rec)}
        out["all_alive"] = bool(self.records) and all(p["alive"] for p in out["processes"].values())
        out["nodes"] = slurm.node_states(self.slurm) if self.ports else {}
        if "prometheus" in self.ports:
            out["targets"] = {
                str((t.get("labels") or {}).get("job")): t.get("health")  # type: ignore[union-attr]
                for t in prom.targets_state(self.prometheus_url)
            }
        return out

    # ---- helpers for tests and the demo ------------------------------------------------
    def add_scrape_target(self, target: ScrapeTarget | str) -> None:
        """Scrape one more job (e.g. the daemon's metrics endpoint): rewrite the config, reload."""
        t = target if isinstance(target, ScrapeTarget) else prom.parse_target(target)
        self.extra_targets = tuple(x for x in self.extra_targets if x.job != t.job) + (t,)
        self.prometheus_config.write_text(prom.render_config(self.scrape_targets()))
        prom.reload(self.prometheus_url)

    def ensure_daemons(self) -> list[str]:
        """Restart any Slurm daemon a test stopped; returns the names restarted."""
        restarted = []
        if "slurmctld" not in self.records or not procs.record_alive(self.records["slurmctld"]):
            self.start_slurmctld()
            restarted.append("slurmctld")
            self.wait(lambda: slurm.ctld_up(self.slurm), 30, "slurmctld to answer `scontrol ping`", "slurmctld")
        for n in self.node_names:
            name = f"slurmd:{n}"
            if name not in self.records or not procs.record_alive(self.records[name]):
                self.start_slurmd(n)
                restarted.append(name)
        return restarted

    def reset(self, timeout_s: float = 60.0) -> None:
        """Back to a clean cluster for the next test: daemons up, no active job, every node idle
        (drains lifted, down nodes resumed)."""
        self.ensure_daemons()
        ids = self.run_slurm(["squeue", "-h", "-o", "%i"]).stdout.split()
        if ids:
            self.run_slurm(["scancel", *ids], check=False)
        self.wait(lambda: not self.run_slurm(["squeue", "-h", "-o", "%i"]).stdout.split(), timeout_s,
                  "every job to leave squeue", "slurm")
        for node, st in slurm.node_states(self.slurm).items():
            if st != "idle":
                self.run_slurm(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
        self.wait(lambda: slurm.all_idle(self.slurm), timeout_s, "every node idle in sinfo", "slurm")
