"""A tiny sd_notify(3) client, so systemd's Type=notify and WatchdogSec= work without libsystemd.

systemd passes ``$NOTIFY_SOCKET`` (a filesystem path, or ``@name`` for the abstract namespace)
to a Type=notify service; the service sends newline-separated ``KEY=VALUE`` datagrams there.
When the variable is unset (not under systemd, tests, the sandbox) every call is a no-op that
returns False, so the daemon calls these unconditionally.

Daemon contract: ``ready()`` once the first tick succeeded, ``watchdog()`` after every
successful tick (at least twice per ``watchdog_interval_s()``), ``status(text)`` with a
one-line summary, ``stopping()`` when SIGTERM is received.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

ENV_SOCKET = "NOTIFY_SOCKET"
ENV_WATCHDOG_USEC = "WATCHDOG_USEC"
ENV_WATCHDOG_PID = "WATCHDOG_PID"
_STATUS_MAX = 200  # systemctl status shows one line; keep datagrams small


def _address(raw: str) -> str | bytes:
    """systemd's convention: a leading '@' means the Linux abstract namespace (NUL byte)."""
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    return raw


def notify(message: str, *, environ: Mapping[str, str] | None = None) -> bool:
    """Send one raw sd_notify message (e.g. ``"READY=1\\nSTATUS=ok"``).

    Returns True when sent, False when no notify socket is configured. Raises OSError when
    a socket is configured but sending fails: under systemd that is a real problem."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_SOCKET, "")
    if not raw:
        return False
    if not raw.startswith(("/", "@")):
        raise ValueError(f"{ENV_SOCKET}: expected an absolute path or @abstract name, got {raw!r}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(_address(raw))
        sock.sendall(message.encode())
    return True


def _clean(text: str) -> str:
    """One line, capped: a newline would start a new KEY=VALUE assignment."""
    return " ".join(text.split())[:_STATUS_MAX]


def ready(status: str | None = None, *, environ: Mapping[str, str] | None = None) -> bool:
    """Tell systemd start-up is complete (Type=notify units stay 'activating' until then)."""
    msg = "READY=1" if status is None else f"READY=1\nSTATUS={_clean(status)}"
    return notify(msg, environ=environ)


def watchdog(*, environ: Mapping[str, str] | None = None) -> bool:
    """Pet the watchdog: systemd restarts the service when this stops for WatchdogSec."""
    return notify("WATCHDOG=1", environ=environ)


def status(text: str, *, environ: Mapping[str, str] | None = None) -> bool:
    """Free-form one-line status shown by ``systemctl status gpu-bridge``."""
    return notify(f"STATUS={_clean(text)}", environ=environ)


def stopping(status: str | None = None, *, environ: Mapping[str, str] | None = None) -> bool:
    """Tell systemd the daemon is shutting down on purpose (no watchdog kill meanwhile)."""
    msg = "STOPPING=1" if status is None else f"STOPPING=1\nSTATUS={_clean(status)}"
    return notify(msg, environ=environ)


def watchdog_interval_s(*, environ: Mapping[str, str] | None = None) -> float | None:
    """The watchdog timeout systemd set for this process, in seconds, or None when disabled.

    Pet at least twice per interval (sd_watchdog_enabled(3)); ignores a WATCHDOG_PID meant
    for another process."""
    env = os.environ if environ is None else environ
    usec = env.get(ENV_WATCHDOG_USEC, "")
    if not usec:
        return None
    pid = env.get(ENV_WATCHDOG_PID, "")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        raise ValueError(f"{ENV_WATCHDOG_USEC}: expected an integer number of microseconds, got {usec!r}") from None
    return value / 1e6 if value > 0 else None
