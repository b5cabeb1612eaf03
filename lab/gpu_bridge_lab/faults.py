"""Crash injection for the reliability tests: SIGKILL the daemon right after a chosen write.

The product's actuator has an ``after_write`` hook that does nothing; ``python -m gpu_bridge_lab.faults
run --config ...`` starts the daemon with this module's injector in it. Even then it is off
unless BOTH are set in the daemon's environment (read once, at the first write):

    GPU_BRIDGE_FAULTS=1                 the explicit opt-in (never set in production units)
    GPU_BRIDGE_CRASH_AT=<point>:<n>     kill the process right after the n-th (1-based)
                                        write of <point> (n defaults to 1)

``<point>`` is a ``bridge.lifecycle.Step`` value (``fence``, ``resume``, ``drain``, ...), or
``scale`` (the pool's Deployment scale write), or ``start_lending`` / ``start_reclaiming``
(the policy's initial phase mark), or ``set_tier`` (a lend's partition, with a fast tier). A write is counted only when it changed something.

Why a real SIGKILL (not an exception): the point is to leave the outside world exactly as a
crash would, with no ``finally`` or atexit handler tidying up. ``GPU_BRIDGE_CRASH_AT`` alone
(without ``GPU_BRIDGE_FAULTS=1``) is refused with a logged error and nothing happens; a
malformed value is refused the same way.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence

from bridge import logs

log = logs.get(__name__)

ENABLE_ENV = "GPU_BRIDGE_FAULTS"
CRASH_ENV = "GPU_BRIDGE_CRASH_AT"
SCALE = "scale"  # = bridge.actuate.SCALE_POINT
START_LENDING = "start_lending"  # = bridge.actuate.START_POINTS values
START_RECLAIMING = "start_reclaiming"
SET_TIER = "set_tier"  # = bridge.actuate.TIER_POINT (only with slurm.fast_partition)


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


class LazyInjector:
    """The actuator's ``after_write`` hook: arms a CrashInjector from the environment at the
    first write (after the daemon has configured its logs, so the armed/refused line is seen)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        self._injector: CrashInjector | None = None

    def __call__(self, point: str) -> None:
        if self._injector is None:
            self._injector = CrashInjector(self._env)
        self._injector.after_write(point)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpu_bridge_lab.faults run --config ...``: ``gpu-bridge`` with the crash injector
    hooked into the daemon's actuator. Only the reliability harness starts the daemon so."""
    from bridge.cli import build_parser

    args = build_parser().parse_args(argv)
    args.after_write = LazyInjector(os.environ)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
