"""Which 24 hours of the shipped trace the demo replays, and how they are scaled (pure).

The shipped ServeGen trace is not a clean day/night sine: its days differ a lot and some
are nearly flat (see bridge/data/traces/README.md). The default window, day 9 22:00 to
day 10 22:00, is the one with a real night trough (0.17-0.3 of its peak from 00:30 to
07:30) followed by a morning rise and a busy day, so a 4-node pool lends at night and
reclaims in the morning without any shaping of the curve. The busiest 10-minute window of
the replayed day (not of the whole 14 days) is scaled to need ``nodes`` replicas at the
config's per-replica target.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpu_bridge_lab.sandbox.vllm.model import ReplicaParams
from bridge.trace import Trace

DAY_S = 86400.0
DEFAULT_DAY = 9
DEFAULT_START = "22:00"


def parse_clock(text: str) -> float:
    """``HH:MM`` -> seconds after midnight; a clear error otherwise."""
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise ValueError(f"--start: expected HH:MM (00:00-23:59), got {text!r}")
    return int(m.group(1)) * 3600.0 + int(m.group(2)) * 60.0


def replica_rps_at_target(concurrency_per_replica: float, params: ReplicaParams | None = None) -> float:
    """Requests/s one replica carries at the config's concurrency target (Little's law:
    concurrency = rate x latency, latency at light load = mean work / per-sequence rate)."""
    p = params or ReplicaParams()
    latency_s = (p.prompt_tokens_mean * p.prefill_cost + p.gen_tokens_mean) / p.seq_tokens_per_s
    return concurrency_per_replica / latency_s


@dataclass(frozen=True, slots=True)
class DayShape:
    """What the simulator is told, and the numbers the demo explains it with."""

    trace_start_s: float
    speed: float  # trace seconds per wall second
    scale: float  # multiplies the trace's req/s
    peak_rps: float  # busiest window of the replayed day, after scaling
    peak_at_s: float  # trace time of that window
    raw_peak_rps: float  # the same window, unscaled
    trough_rps: float  # quietest window of the replayed day, after scaling
    replica_rps: float  # req/s per replica at the per-replica target
    global_peak_rps: float  # the whole trace's peak after scaling (what --peak-rps means)

    @property
    def peak_replicas(self) -> float:
        return self.peak_rps / self.replica_rps

    @property
    def trough_replicas(self) -> float:
        return self.trough_rps / self.replica_rps


def day_shape(trace: Trace, *, day: int, start: str, minutes: float, nodes: int, replica_rps: float) -> DayShape:
    """Scale so the replayed day's busiest window needs ``nodes`` replicas; ``speed`` so the
    24 hours pass in ``minutes``."""
    if minutes <= 0 or not math.isfinite(minutes):
        raise ValueError(f"--minutes: expected a positive number, got {minutes!r}")
    if nodes < 2:
        raise ValueError(f"--nodes: need at least 2 (one serves, one can be lent), got {nodes}")
    if day < 0:
        raise ValueError(f"--day: expected >= 0, got {day}")
    t0 = day * DAY_S + parse_clock(start)
    windows = [t0 + i * trace.window_s for i in range(int(DAY_S // trace.window_s))]
    rates = [trace.rate_at(t) for t in windows]
    i_peak = max(range(len(rates)), key=rates.__getitem__)
    raw_peak = rates[i_peak]
    scale = nodes * replica_rps / raw_peak
    return DayShape(
        trace_start_s=t0,
        speed=DAY_S / (minutes * 60.0),
        scale=scale,
        peak_rps=raw_peak * scale,
        peak_at_s=windows[i_peak],
        raw_peak_rps=raw_peak,
        trough_rps=min(rates) * scale,
        replica_rps=replica_rps,
        global_peak_rps=trace.peak_rate * scale,
    )


def clock(trace_s: float) -> str:
    """``day 10 03:40`` for a trace time (t=0 is day-0 midnight)."""
    day, rest = divmod(int(trace_s), int(DAY_S))
    return f"day {day} {rest // 3600:02d}:{rest % 3600 // 60:02d}"
