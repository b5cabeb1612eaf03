"""Processes of the sandbox: spawn detached, identify by (pid, start time), stop by PID.

A PID alone can be reused after a process dies, so every process the sandbox starts is
recorded with its kernel start time (``/proc/PID/stat`` field 22) and only signalled while
both still match. Every daemon gets ``GPU_BRIDGE_SANDBOX_PROC`` in its environment, which its
children (slurmstepd, job scripts) inherit: ``sweep`` finds what a daemon left behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bridge import logs



def _log() -> Any:
    # Resolved at call time, so the CLI's logs.configure() (made after import) applies.
    return logs.get(__name__)

# Not GPU_BRIDGE_SANDBOX_DIR (which DIR/env exports to users): a shell that sourced DIR/env
# and what it started must never be swept by `down`.
MARKER_ENV = "GPU_BRIDGE_SANDBOX_PROC"


@dataclass(frozen=True, slots=True)
class ProcRecord:
    """One process the sandbox started: enough to find it again from another process."""

    name: str  # "munged", "slurmctld", "slurmd:gpu-node-01", "prometheus", ...
    pid: int
    start_ticks: int  # /proc/PID/stat starttime, guards against PID reuse
    log: str  # the file its stdout/stderr (or its own log) goes to
    argv: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["argv"] = list(self.argv)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> ProcRecord:
        try:
            return cls(
                name=str(d["name"]),
                pid=int(d["pid"]),  # type: ignore[call-overload]
                start_ticks=int(d["start_ticks"]),  # type: ignore[call-overload]
                log=str(d.get("log", "")),
                argv=tuple(str(a) for a in d.get("argv", ()) or ()),  # type: ignore[union-attr]
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"sandbox.json: bad process record {d!r}: {e}") from e


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) is in parentheses and may contain spaces: split after the last ')'.
    rparen = raw.rfind(")")
    return [raw[: raw.find(" ")], raw[raw.find("(") + 1 : rparen]] + raw[rparen + 2 :].split()


def start_ticks(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[21]) if f else None


def _ppid(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[3]) if f else None


def is_alive(pid: int, ticks: int | None = None) -> bool:
    """Running (not a zombie) and, if ``ticks`` is given, still the same process."""
    f = _stat_fields(pid)
    if f is None or f[2] in ("Z", "X"):
        return False
    return ticks is None or int(f[21]) == ticks


def record_alive(rec: ProcRecord) -> bool:
    return is_alive(rec.pid, rec.start_ticks)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def spawn(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    *,
    marker: str,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], ProcRecord]:
    """Start ``argv`` in its own session (it survives the CLI that started it), output to ``log_path``."""
    full_env = dict(os.environ if env is None else env)
    full_env[MARKER_ENV] = marker
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=str(cwd) if cwd else None,
            start_new_session=True,
            user=user,
            group=user,
            close_fds=True,
        )
    ticks = start_ticks(proc.pid) or 0
    rec = ProcRecord(name=name, pid=proc.pid, start_ticks=ticks, log=str(log_path), argv=tuple(argv))
    _log().debug("sandbox_spawned", proc=name, pid=proc.pid)
    return proc, rec


def wait_for(
    check: Callable[[], bool], timeout_s: float, *, interval_s: float = 0.05, what: str = "condition"
) -> float:
    """Poll ``check`` until true; returns the seconds waited, raises TimeoutError naming ``what``."""
    t0 = time.monotonic()
    while True:
        if check():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return ""


def _cmdline_is_ours(cmd: str, dir_text: str) -> bool:
    """A daemon started from DIR/bin, or a job script in DIR/spool. Not just "names DIR":
    a user's `tail -f DIR/log/slurmctld.log` is not the sandbox's to kill."""
    d = dir_text.rstrip("/")
    return cmd.startswith(d + "/bin/") or (d + "/spool/") in cmd


def find_leftovers(marker: str, dir_text: str, roots: Iterable[int] = ()) -> dict[int, str]:
    """Live processes that belong to this sandbox: the marker in their environment, a command
    line run from ``dir_text``/bin or naming ``dir_text``/spool (job scripts), or a descendant
    of one of those (or of ``roots``)."""
    me = os.getpid()
    needle = f"{MARKER_ENV}={marker}".encode()
    parents: dict[int, int] = {}
    found: set[int] = set(r for r in roots if is_alive(r))
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        f = _stat_fields(pid)
        if f is None or f[2] in ("Z", "X"):
            continue
        parents[pid] = int(f[3])
        if _environ_has(pid, needle) or _cmdline_is_ours(cmdline(pid), dir_text):
            found.add(pid)
    # never ourselves or our ancestors (e.g. `timeout 60 gpu-bridge sandbox down --dir DIR`)
    ancestor = _ppid(me)
    while ancestor is not None and ancestor > 1:
        found.discard(ancestor)
        ancestor = parents.get(ancestor)
    # descendants of anything found
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if pid not in found and ppid in found:
                found.add(pid)
                changed = True
    found.discard(me)
    return {pid: cmdline(pid) for pid in sorted(found)}


def terminate(pids: Mapping[int, int | None], timeout_s: float = 10.0) -> list[int]:
    """SIGTERM each (pid -> start ticks or None), wait, SIGKILL what is left; returns the PIDs
    that had to be killed."""
    live = {p: t for p, t in pids.items() if is_alive(p, t)}
    for pid in live:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while live and time.monotonic() < deadline:
        live = {p: t for p, t in live.items() if is_alive(p, t)}
        if live:
            time.sleep(0.05)
    killed = list(live)
    for pid in killed:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while live and time.monotonic() < deadline:
        live = {p: t for p, t in live.items() if is_alive(p, t)}
        if live:
            time.sleep(0.05)
    return killed


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path | str, lines: int = 20) -> list[str]:
    """The last ``lines`` lines of a log file (empty if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError:
        return []
    return data.splitlines()[-lines:]
