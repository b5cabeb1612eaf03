"""bridge.sdnotify against real AF_UNIX datagram sockets: filesystem path, abstract namespace,
no socket configured, and the watchdog interval parsing."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import sdnotify


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(2)
    yield sock, path
    sock.close()


@pytest.fixture
def abstract_socket() -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"gpu-bridge-test-{uuid.uuid4().hex}"
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    yield sock, "@" + name
    sock.close()


def test_ready_over_filesystem_socket(path_socket: tuple[socket.socket, str]) -> None:
    sock, path = path_socket
    assert sdnotify.ready("serving=3 lent=1", environ={"NOTIFY_SOCKET": path}) is True
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving=3 lent=1"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda env: sdnotify.watchdog(environ=env), b"WATCHDOG=1"),
        (lambda env: sdnotify.status("tick 7\nok", environ=env), b"STATUS=tick 7 ok"),
        (lambda env: sdnotify.stopping(environ=env), b"STOPPING=1"),
        (lambda env: sdnotify.stopping("SIGTERM", environ=env), b"STOPPING=1\nSTATUS=SIGTERM"),
        (lambda env: sdnotify.ready(environ=env), b"READY=1"),
    ],
    ids=["watchdog", "status-newline-flattened", "stopping", "stopping-with-status", "ready-bare"],
)
def test_messages_over_abstract_socket(abstract_socket: tuple[socket.socket, str], call, expected: bytes) -> None:
    sock, name = abstract_socket
    assert call({"NOTIFY_SOCKET": name}) is True
    assert sock.recv(4096) == expected


def test_status_is_capped(path_socket: tuple[socket.socket, str]) -> None:
    sock, path = path_socket
    sdnotify.status("x" * 1000, environ={"NOTIFY_SOCKET": path})
    assert sock.recv(4096) == b"STATUS=" + b"x" * 200


def test_uses_process_environment(path_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch) -> None:
    sock, path = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert sdnotify.watchdog() is True
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_no_socket_is_a_noop() -> None:
    assert sdnotify.ready(environ={}) is False
    assert sdnotify.watchdog(environ={"NOTIFY_SOCKET": ""}) is False


def test_relative_socket_is_rejected() -> None:
    with pytest.raises(ValueError, match="NOTIFY_SOCKET: expected an absolute path or @abstract name, got 'relative.sock'"):
        sdnotify.ready(environ={"NOTIFY_SOCKET": "relative.sock"})


def test_missing_socket_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        sdnotify.ready(environ={"NOTIFY_SOCKET": str(tmp_path / "absent.sock")})


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
    ],
    ids=["unset", "set", "our-pid", "other-pid", "zero"],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert sdnotify.watchdog_interval_s(environ=env) == expected


def test_watchdog_interval_garbage() -> None:
    with pytest.raises(ValueError, match="WATCHDOG_USEC: expected an integer number of microseconds, got 'soon'"):
        sdnotify.watchdog_interval_s(environ={"WATCHDOG_USEC": "soon"})
