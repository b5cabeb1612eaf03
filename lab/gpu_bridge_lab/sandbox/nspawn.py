"""Debian trees booted under ``systemd-nspawn``: a real systemd for the unit, a Debian 13 Slurm.

PID 1 on these machines is not systemd, and Debian 12 ships Slurm 22.05 only. A tree built by
``debootstrap`` from the machine's own Debian mirror gives both: ``bookworm`` boots systemd 252
(the unit under a real service manager), ``trixie`` carries Slurm 24.11 and its munge. Trees are
built once and cached outside the checkout under
``${GPU_BRIDGE_CACHE:-/var/cache/gpu-bridge}/trees/<suite>-<hash of suite and packages>``
(so a changed package list builds a new tree), atomically and under a lock.

A container runs with ``--volatile=overlay`` (writes go to a tmpfs overlay, the cached tree
stays pristine and several containers may share it), ``--register=no --keep-unit`` (no machined
or system bus on the host) and the host's network; commands enter it with ``nsenter``
(``Container.prefix``). See /work/shared/notes/systemd-and-debian13.md.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from bridge.errors import SandboxError

SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
SOURCES_LIST = Path("/etc/apt/sources.list")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
VARIANT = "minbase"
READY_MARK = ".gpu-bridge-tree"

# What each tree carries: systemd (to boot it), python3 (the daemon's venv: the same minor as
# the host's Debian) and that release's Slurm clients (the host's sandbox controller is the same
# release); trixie also Debian 13's Slurm daemons and munge (the 24.11 sandbox on a Debian 12 host).
TREES: Mapping[str, tuple[str, ...]] = {
    "bookworm": ("systemd", "systemd-sysv", "dbus", "python3", "slurm-client"),
    "trixie": ("systemd", "systemd-sysv", "dbus", "python3", "munge", "slurmctld", "slurmd", "slurm-client"),
}


def host_suite(os_release: Path = Path("/etc/os-release")) -> str | None:
    """This machine's Debian codename (``bookworm``, ``trixie``), or None."""
    try:
        for line in os_release.read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"') or None
    except OSError:
        pass
    return None


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("GPU_BRIDGE_CACHE") or "/var/cache/gpu-bridge")


def tree_key(suite: str, packages: Iterable[str]) -> str:
    """Stable short hash of what makes a tree: suite, variant and the sorted package list."""
    text = "\n".join([suite, VARIANT, *sorted(set(packages))])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def tree_path(suite: str, packages: Iterable[str] | None = None, *, environ: Mapping[str, str] | None = None) -> Path:
    pkgs = TREES[suite] if packages is None else tuple(packages)
    return cache_dir(environ) / "trees" / f"{suite}-{tree_key(suite, pkgs)}"


def debian_mirror(sources: Path = SOURCES, sources_list: Path = SOURCES_LIST) -> str:
    """The machine's configured Debian mirror (the first ``deb`` URI whose suites are not
    -security), from deb822 ``debian.sources`` or the one-line ``sources.list``."""
    try:
        text = sources.read_text()
    except OSError:
        text = ""
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            k, _, v = line.partition(":")
            fields[k.strip().lower()] = v.strip()
        if "deb" not in fields.get("types", "").split() or not fields.get("uris"):
            continue
        if any(s.endswith("-security") for s in fields.get("suites", "").split()):
            continue
        return fields["uris"].split()[0]
    try:
        for line in sources_list.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and not parts[2].endswith("-security"):
                return next(p for p in parts[1:] if not p.startswith("["))
    except (OSError, StopIteration):
        pass
    return DEFAULT_MIRROR


def _say(msg: str) -> None:
    print(f"[nspawn] {msg}", file=sys.stderr, flush=True)


def ensure_tree(suite: str, *, environ: Mapping[str, str] | None = None, quiet: bool = False) -> Path:
    """The cached tree of ``suite`` (``TREES``), built by debootstrap on first use (~1 min)."""
    if suite not in TREES:
        raise SandboxError(f"suite: unknown tree {suite!r} (known: {', '.join(TREES)})")
    path = tree_path(suite, environ=environ)
    if (path / READY_MARK).exists():
        return path
    for tool in ("debootstrap", "systemd-nspawn"):
        if shutil.which(tool) is None:
            raise SandboxError(f"{tool} not found: install Debian's debootstrap and systemd-container (scripts/setup.sh)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:  # noqa: PTH123 - a lock file, kept open
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be building the same tree
        if (path / READY_MARK).exists():
            return path
        tmp = path.with_name(path.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)
        mirror = debian_mirror()
        argv = ["debootstrap", f"--variant={VARIANT}", "--include=" + ",".join(TREES[suite]), suite, str(tmp), mirror]
        if not quiet:
            _say(f"building the {suite} tree once ({' '.join(argv)}); cached in {path}")
        t0 = time.monotonic()
        res = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
        if res.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SandboxError(f"debootstrap {suite} failed (rc {res.returncode}): {(res.stdout + res.stderr)[-1500:]}")
        (tmp / READY_MARK).write_text("\n".join([suite, VARIANT, mirror, *sorted(TREES[suite])]) + "\n")
        tmp.rename(path)
        if not quiet:
            _say(f"{suite} tree built in {time.monotonic() - t0:.0f} s")
    return path


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


class Container:
    """One container over a cached tree; ``with Container(tree, binds=[...]) as c: c.run([...])``.

    ``boot=True`` boots the tree's systemd as PID 1; otherwise PID 1 is ``sleep infinity`` and
    commands enter it with ``nsenter`` (still a private PID namespace and the tree's root)."""

    def __init__(
        self,
        tree: Path,
        *,
        binds: Sequence[str | Path] = (),
        ro_binds: Sequence[str | Path] = (),
        boot: bool = False,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.tree = Path(tree)
        self.binds = [str(b) for b in binds]
        self.ro_binds = [str(b) for b in ro_binds]
        self.boot = boot
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader: int | None = None
        self._host_proc = False

    def argv(self) -> list[str]:
        out = [
            "systemd-nspawn", "--quiet", "-D", str(self.tree), "--register=no", "--keep-unit",
            "--volatile=overlay", "--console=passive" if self.boot else "--console=pipe",
        ]
        # the host's network, so the host's /etc/hosts (debootstrap writes none: "localhost" would
        # go to DNS, and every lookup of a Slurm node's NodeHostname took 0.25-0.5 s)
        hosts = ["--bind-ro=/etc/hosts"] if os.path.exists("/etc/hosts") else []
        out += hosts + [f"--bind={b}" for b in self.binds] + [f"--bind-ro={b}" for b in self.ro_binds] + self.extra_args
        out += ["--boot"] if self.boot else ["--as-pid2", "/bin/sleep", "infinity"]
        return out

    @property
    def prefix(self) -> list[str]:
        """argv prefix that runs a command inside: its mounts, PID namespace, UTS/IPC/cgroup."""
        if self.leader is None:
            raise SandboxError("container: not started")
        return ["nsenter", "-t", str(self.leader), "-m", "-u", "-i", "-p", "-C", "--"]

    def host_pid_prefix(self) -> list[str]:
        """argv prefix that runs a command on the tree's file system but in the host's PID
        namespace (``nsenter -m``, which execs without forking): its PID is the daemon's own, so
        signals and process tracking work from the host. The container's /proc is replaced once
        by one of the host's PID namespace, so tools inside (Slurm's proctrack/linuxproc,
        /proc/self) see the processes they run with."""
        if self.leader is None:
            raise SandboxError("container: not started")
        prefix = ["nsenter", "-t", str(self.leader), "-m", "--"]
        if not self._host_proc:
            res = subprocess.run([*prefix, "mount", "-t", "proc", "proc", "/proc"], capture_output=True, text=True,
                                 timeout=30, check=False)
            if res.returncode != 0:
                raise SandboxError(f"container: cannot mount the host's /proc: {res.stderr.strip()[-300:]}")
            self._host_proc = True
        return prefix

    def start(self, timeout_s: float = 60.0) -> Container:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if log is not subprocess.DEVNULL:
            log.close()
        try:
            deadline = time.monotonic() + timeout_s
            self.leader = self._find_leader(deadline)
            if self.boot:
                self._wait_running(deadline)
            else:
                # --as-pid2 execs the payload (sleep) only once the container is set up (root
                # pivoted, /proc mounted): entering it earlier would see the host's file system
                while not self._payload_started():
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise SandboxError(f"container: not set up after {timeout_s:g} s: {self._log_tail()}")
                    time.sleep(0.02)
        except BaseException:
            self.stop()  # never leave a container (or its Popen) behind a failed start
            raise
        return self

    def _payload_started(self) -> bool:
        for kid in _children(self.leader or 0):
            try:
                if Path(f"/proc/{kid}/comm").read_text().strip() == "sleep":
                    return True
            except OSError:
                continue
        return False

    def _find_leader(self, deadline: float) -> int:
        """The container's PID 1: nspawn's child in a PID namespace of its own. nspawn first
        forks an "outer child" (host PID namespace) that clones the real one and exits, so the
        first child seen may not be it."""
        assert self.proc is not None
        own = os.readlink("/proc/self/ns/pid")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SandboxError(f"systemd-nspawn exited (rc {self.proc.returncode}): {self._log_tail()}")
            for kid in _children(self.proc.pid):
                try:
                    if os.readlink(f"/proc/{kid}/ns/pid") != own:
                        return kid
                except OSError:
                    continue  # gone meanwhile (the outer child)
            time.sleep(0.02)
        raise SandboxError(f"systemd-nspawn: no container after the start timeout: {self._log_tail()}")

    def _wait_running(self, deadline: float) -> None:
        state = ""
        while time.monotonic() < deadline:
            res = self.run(["systemctl", "is-system-running"], timeout_s=10, check=False)
            state = res.stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.2)
        raise SandboxError(f"container systemd not running (state {state!r}): {self._log_tail()}")

    def _log_tail(self) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def run(
        self, argv: Sequence[str], *, timeout_s: float = 60.0, check: bool = True, env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [*self.prefix, *argv], capture_output=True, text=True, timeout=timeout_s, check=False, input=input,
            env=dict(os.environ if env is None else env),
        )
        if check and res.returncode != 0:
            raise SandboxError(f"in container: {' '.join(argv)} failed (rc {res.returncode}): {(res.stderr or res.stdout)[-800:]}")
        return res

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM to nspawn halts the container (systemd powers off; the stub PID 1 exits)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def __enter__(self) -> Container:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpu_bridge_lab.sandbox.nspawn build [SUITE...]``: build (or find) the cached trees."""
    ap = argparse.ArgumentParser(prog="python -m gpu_bridge_lab.sandbox.nspawn")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the cached Debian trees (once)")
    b.add_argument("suites", nargs="*", default=list(TREES))
    p = sub.add_parser("path", help="print where a tree is (or would be) cached")
    p.add_argument("suite", choices=list(TREES))
    args = ap.parse_args(argv)
    if args.cmd == "path":
        print(tree_path(args.suite))
        return 0
    try:
        for s in args.suites:
            print(ensure_tree(s))
    except SandboxError as e:
        print(f"gpu-bridge: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
