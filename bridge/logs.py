"""structlog set-up: JSON lines under systemd or when not on a TTY, console on a TTY.

Events are snake_case facts with stable keys (``node``, ``phase``, ``job``, ``reason``):
``log.info("node_lent", node="gpu-node-07", idle_for_s=912)``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog


def configure(*, json: bool | None = None, level: str = "info", stream: Any = None) -> None:
    """Configure structlog once for the process. ``json=None`` picks JSON unless stderr is a TTY.
    No ``stream``: whatever ``sys.stderr`` is when a line is written (not when configured), so a
    replaced stderr (a test's capture, since closed) is never written to after the fact."""
    stream = stream if stream is not None else _CurrentStderr()
    if json is None:
        json = bool(os.environ.get("JOURNAL_STREAM")) or not getattr(stream, "isatty", lambda: False)()
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer(sort_keys=True)]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=False)]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def get(name: str | None = None) -> Any:
    """A bound structlog logger; ``name`` becomes the ``logger`` key."""
    # Resolved at each call: bind() at import time would freeze the configuration then in
    # force, so a later configure() (JSON, level, stream) would not reach module loggers.
    return _Named(name) if name else structlog.get_logger()


class _Named:
    """A module logger that binds ``logger=<name>`` under the configuration current at call time."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(structlog.get_logger().bind(logger=self._name), attr)


class _CurrentStderr:
    """``sys.stderr`` looked up at each write."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return bool(getattr(sys.stderr, "isatty", lambda: False)())
