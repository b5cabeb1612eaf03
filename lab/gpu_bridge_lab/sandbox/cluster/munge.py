"""A private munged: fresh key, private socket, run as user munge (no systemd needed)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import SandboxError

MUNGE_USER = "munge"


@dataclass(frozen=True, slots=True)
class MungePaths:
    dir: Path

    @property
    def socket(self) -> Path:
        return self.dir / "munge.sock"

    @property
    def key(self) -> Path:
        return self.dir / "munge.key"

    @property
    def log(self) -> Path:
        return self.dir / "munged.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / "munged.pid"

    @property
    def seed(self) -> Path:
        return self.dir / "munged.seed"


def binary(name: str) -> str:
    for cand in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise SandboxError(f"{name} not found: install the Debian package 'munge' (scripts/setup.sh)")


def reachable_by_munge(path: Path) -> bool:
    """Whether user munge can traverse every directory down to ``path`` (munged runs as munge;
    a DIR under a 0700 mkdtemp directory or /root is not reachable)."""
    try:
        pw = pwd.getpwnam(MUNGE_USER)
    except KeyError:
        return False
    groups = set(os.getgrouplist(MUNGE_USER, pw.pw_gid))
    p = path.absolute()
    for d in [p, *p.parents]:
        try:
            st = d.stat()
        except OSError:
            return False
        if st.st_uid == pw.pw_uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            return False
    return True


def prepare(paths: MungePaths) -> None:
    """Create the munge dir (owned by munge, mode 0755, as munged insists) and a fresh key."""
    try:
        pw = pwd.getpwnam(MUNGE_USER)
    except KeyError as e:
        raise SandboxError("user 'munge' does not exist: install the Debian package 'munge'") from e
    paths.dir.mkdir(parents=True, exist_ok=True)
    os.chown(paths.dir, pw.pw_uid, pw.pw_gid)
    os.chmod(paths.dir, 0o755)
    if paths.key.exists():
        paths.key.unlink()
    res = subprocess.run(
        [binary("mungekey"), "-c", "-k", str(paths.key)],
        user=MUNGE_USER,
        group=MUNGE_USER,
        capture_output=True,
        timeout=30,
        check=False,
    )
    if res.returncode != 0:
        raise SandboxError(
            "mungekey failed (rc %d): %s" % (res.returncode, res.stderr.decode(errors="replace")[-500:])
        )


def argv(paths: MungePaths) -> list[str]:
    return [
        binary("munged"),
        "--foreground",
        f"--socket={paths.socket}",
        f"--key-file={paths.key}",
        f"--pid-file={paths.pid_file}",
        f"--log-file={paths.log}",
        f"--seed-file={paths.seed}",
    ]


def setpriv_argv() -> list[str]:
    """``setpriv`` to the host's munge uid/gid by number (for a munged run in another tree)."""
    pw = pwd.getpwnam(MUNGE_USER)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]


def works(paths: MungePaths) -> bool:
    """``munge -n -S SOCK | unmunge -S SOCK`` without a shell."""
    if not paths.socket.exists():
        return False
    try:
        cred = subprocess.run(
            ["munge", "-n", "-S", str(paths.socket)], capture_output=True, timeout=5, check=False
        )
        if cred.returncode != 0:
            return False
        res = subprocess.run(
            ["unmunge", "-S", str(paths.socket)], input=cred.stdout, capture_output=True, timeout=5, check=False
        )
        return res.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
