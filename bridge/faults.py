"""Crash injection for the reliability tests: SIGKILL the daemon right after a chosen write.

Off unless BOTH are set in the daemon's environment (read once, at the first write):

    GPU_BRIDGE_FAULTS=1                 the explicit opt-in (never set in production units)
    GPU_BRIDGE_CRASH_AT=<point>:<n>     kill the process right after the n-th (1-based)
                                        write of <point> (n defaults to 1)

``<point>`` is a ``bridge.lifecycle.Step`` value (``fence``, ``resume``, ``drain``, ...), or
``scale`` (the pool's Deployment scale write), or ``start_lending`` / ``start_reclaiming``
(the policy's initial phase mark). A write is counted only when it changed something.

Why a real SIGKILL (not an exception): the point is to leave the outside world exactly as a
crash would, with no ``finally`` or atexit handler tidying up. ``GPU_BRIDGE_CRASH_AT`` alone
(without ``GPU_BRIDGE_FAULTS=1``) is refused with a logged error and nothing happens; a
malformed value is refused the same way.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from bridge import logs

log = logs.get(__name__)

ENABLE_ENV = "GPU_BRIDGE_FAULTS"
CRASH_ENV = "GPU_BRIDGE_CRASH_AT"
SCALE = "scale"
START_LENDING = "start_lending"
START_RECLAIMING = "start_reclaiming"


def parse_crash_at(value: str) -> tuple[str, int]:
    """``"fence:2"`` -> ("fence", 2); ``"fence"`` -> ("fence", 1). ValueError names the problem."""
    point, _, count = value.strip().partition(":")
    if not point:
        raise ValueError(f"{CRASH_ENV}: empty injection point in {value!r} (expected <point>:<n>)")
    try:
        n = int(count) if count else 1
    except ValueError:
        raise ValueError(f"{CRASH_ENV}: count {count!r} is not an integer (expected <point>:<n>)") from None
    if n < 1:
        raise ValueError(f"{CRASH_ENV}: count must be >= 1, got {n}")
    return point, n


class CrashInjector:
    """Counts writes per point; kills the process at the armed one. Inert when not armed."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.point: str | None = None
        self.n = 0
        self._seen = 0
        raw = env.get(CRASH_ENV)
        if not raw:
            return
        if env.get(ENABLE_ENV) != "1":
            log.error("fault_injection_refused", reason=f"{CRASH_ENV} is set but {ENABLE_ENV}=1 is not: ignored")
            return
        try:
            self.point, self.n = parse_crash_at(raw)
        except ValueError as exc:
            log.error("fault_injection_refused", reason=str(exc))
            return
        log.warning("fault_injection_armed", point=self.point, n=self.n)

    def after_write(self, point: str) -> None:
        if self.point is None or point != self.point:
            return
        self._seen += 1
        if self._seen >= self.n:
            log.warning("fault_injection_crash", point=point, n=self._seen)
            os.kill(os.getpid(), signal.SIGKILL)


_injector: CrashInjector | None = None


def after_write(point: str) -> None:
    """Called by the actuator after each write that changed something (cheap when unarmed)."""
    global _injector
    if _injector is None:
        _injector = CrashInjector(os.environ)
    _injector.after_write(point)
