"""Serving load for the offline simulator: the trace, scaled to replicas, resolved per minute.

The trace gives a mean request rate and the coefficient of variation (``cv``) of inter-arrival
times per 10-minute window. The simulator works in *replicas at the per-replica target*:

- ``scale``: the trace is scaled so that its busiest window needs ``peak_replicas`` replicas,
  a replica carrying ``replica_rps`` requests/s at its target (so ``scale = peak_replicas *
  replica_rps / peak_rate`` turns the trace's req/s into the simulated pool's req/s);
- burstiness inside a window: the number of arrivals in a minute of a stream with rate
  ``lam`` and inter-arrival CV ``cv`` has variance about ``lam * 60 * cv**2`` (index of
  dispersion of a renewal process; the trace's cv is exactly that of the superposed
  clients). ``lam`` is the *measured* stream's rate, before scaling: scaling multiplies the
  curve, so a minute's relative deviation from its window's mean is the real service's
  (``cv / sqrt(lam * 60)``), whatever ``replica_rps`` converts requests into replicas. (Drawing
  at the scaled rate would thin the stream and make the bursts grow as ``replica_rps``
  shrinks: a unit choice would change the answer.) Each minute's count is drawn from a gamma
  distribution with that mean and variance, then the window's ten minutes are rescaled so
  their mean is the window's rate exactly (the scaled trace keeps its 10-minute means, the
  peak window needs exactly R);
- offered load of minute ``m`` in replicas = arrivals per second / ``replica_rps``.

The signals the policy sees are derived from that load consistently with the policy's own
per-replica targets (``TargetConfig``): requests running + waiting = load x
``concurrency_per_replica`` (Little's law: a replica at target holds that many requests);
each Ready replica runs at most ``1 / kv_cache_usage`` replicas' worth (KV cache full), the
rest waits; KV-cache usage and token throughput follow what runs. So a policy dividing
the signals by its targets reads back exactly the offered load, and an overloaded pool shows
a full KV cache and a growing queue, as vLLM does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from bridge.config import TargetConfig
from bridge.model import LoadSignals
from bridge.trace import Trace

MINUTE_S = 60.0
# Nominal values for signals whose target is disabled (they are still reported, as vLLM does).
NOMINAL_CONCURRENCY = 24.0
NOMINAL_KV = 0.8
NOMINAL_TOKENS_PER_S = 2000.0


@dataclass(frozen=True, slots=True)
class Workload:
    """Offered load of one pool, in replicas at the per-replica target, per minute."""

    load: np.ndarray  # replicas needed in minute m (float64)
    window_load: np.ndarray  # the 10-minute means, replicas (as scaled from the trace)
    minute_s: float
    window_s: float  # the trace's window
    scale: float  # factor applied to the trace's req/s
    replica_rps: float  # requests/s one replica carries at its target
    peak_rate: float  # busiest window of the trace, req/s (before scaling)
    peak_replicas: float
    source: str = ""
    usable: np.ndarray | None = None  # per minute: measured (True) or a bridged gap (history)

    @property
    def minutes(self) -> int:
        return int(self.load.shape[0])

    @property
    def duration_s(self) -> float:
        return self.minutes * self.minute_s

    def at(self, t: float) -> float:
        """Offered load (replicas) at simulation time ``t`` (seconds since the trace start)."""
        m = int(t // self.minute_s)
        if m < 0 or m >= self.minutes:
            return 0.0
        return float(self.load[m])

    def describe_scale(self) -> str:
        return (
            f"trace scale {self.scale:.5f}: busiest 10-min window {self.peak_rate:.1f} req/s -> "
            f"{self.peak_rate * self.scale:.1f} req/s = {self.peak_replicas:g} replicas at "
            f"{self.replica_rps:g} req/s per replica; peak minute {float(self.load.max()):.1f} replicas"
        )


def build_workload(
    trace: Trace, *, peak_replicas: float, replica_rps: float = 4.0, days: float | None = None, seed: int = 1,
    burst: bool = True, max_cv: float | None = None,
) -> Workload:
    """Scale ``trace`` and draw the per-minute load (deterministic for a seed). ``max_cv``
    caps the trace's cv (``None``: as measured); ``burst=False`` keeps the window means flat."""
    if not (peak_replicas > 0 and math.isfinite(peak_replicas)):
        raise ValueError(f"peak_replicas: must be > 0, got {peak_replicas!r}")
    if not (replica_rps > 0 and math.isfinite(replica_rps)):
        raise ValueError(f"replica_rps: must be > 0, got {replica_rps!r}")
    w_s = trace.window_s
    per_window = w_s / MINUTE_S
    if abs(per_window - round(per_window)) > 1e-9 or per_window < 1:
        raise ValueError(f"{trace.source or 'trace'}: window must be a whole number of minutes, got {w_s:g} s")
    k = int(round(per_window))
    rates = np.asarray(trace.rates, dtype=float)
    cvs = np.asarray(trace.cvs, dtype=float)
    n_windows = len(rates)
    if days is not None:
        if not days > 0:
            raise ValueError(f"days: must be > 0, got {days!r}")
        n_windows = min(n_windows, max(1, int(math.ceil(days * 86400.0 / w_s))))
    peak_rate = float(rates.max())
    if peak_rate <= 0:
        raise ValueError(f"{trace.source or 'trace'}: every rate is 0, nothing to scale")
    scale = peak_replicas * replica_rps / peak_rate
    if max_cv is not None:
        if not max_cv > 0:
            raise ValueError(f"max_cv: must be > 0, got {max_cv!r}")
        cvs = np.minimum(cvs, max_cv)
    rates = rates[:n_windows]
    cvs = cvs[:n_windows]
    window_load = rates * scale / replica_rps  # replicas
    lam = rates  # req/s of the measured stream: the bursts are drawn in its units, then scaled
    if burst:
        rng = np.random.default_rng(seed)
        mean = np.repeat(lam * MINUTE_S, k)  # arrivals per minute
        cv2 = np.repeat(np.maximum(cvs, 1e-6) ** 2, k)
        counts = np.zeros_like(mean)
        pos = mean > 0
        shape = mean[pos] / cv2[pos]  # gamma: mean = shape * theta, var = shape * theta**2
        counts[pos] = rng.gamma(shape, mean[pos] / shape)
        by_window = counts.reshape(n_windows, k)
        sums = by_window.sum(axis=1, keepdims=True)
        target = (lam * MINUTE_S * k)[:, None]
        by_window = np.where(sums > 0, by_window * np.divide(target, sums, out=np.zeros_like(sums), where=sums > 0), target / k)
        load = by_window.reshape(-1) / MINUTE_S * scale / replica_rps
    else:
        load = np.repeat(window_load, k)
    if days is not None:
        load = load[: max(1, int(math.ceil(days * 86400.0 / MINUTE_S)))]
    return Workload(
        load=np.ascontiguousarray(load, dtype=float), window_load=window_load, minute_s=MINUTE_S, window_s=w_s,
        scale=scale, replica_rps=replica_rps, peak_rate=peak_rate, peak_replicas=float(peak_replicas),
        source=trace.source,
    )


def signals(t: float, load: float, ready_replicas: int, target: TargetConfig) -> LoadSignals:
    """What vLLM's gauges would show for ``load`` replicas of offered load on ``ready_replicas``
    Ready replicas, summed over the pool (see the module docstring). No replica: no series."""
    if ready_replicas <= 0:
        return LoadSignals(t, None, None, None, None, 0)
    c = target.concurrency_per_replica or NOMINAL_CONCURRENCY
    kv = target.kv_cache_usage or NOMINAL_KV
    tok = target.tokens_per_s_per_replica or NOMINAL_TOKENS_PER_S
    served = min(load, ready_replicas / kv)  # replicas' worth that fits in the KV caches
    running = served * c
    waiting = max(0.0, load - served) * c
    return LoadSignals(t=t, running=running, waiting=waiting, kv_cache_usage_sum=served * kv, tokens_per_s=served * tok,
                       replicas_reporting=ready_replicas)


def split_history(w: Workload, days: float) -> tuple[Workload | None, Workload]:
    """The first ``days`` of ``w`` as history (what Prometheus would already hold when the
    daemon starts) and the rest, to simulate. Whole 10-minute windows; ``days`` 0 = no history."""
    if days < 0 or not math.isfinite(days):
        raise ValueError(f"history_days: must be >= 0, got {days!r}")
    if days == 0:
        return None, w
    k = int(round(w.window_s / w.minute_s))
    windows = int(round(days * 86400.0 / w.window_s))
    m = windows * k
    if m >= w.minutes:
        raise ValueError(f"history_days: {days:g} days leave nothing to simulate in a {w.duration_s / 86400:.1f}-day trace")

    def part(lo_w: int, hi_w: int | None) -> Workload:
        lo, hi = lo_w * k, (None if hi_w is None else hi_w * k)
        usable = None if w.usable is None else np.ascontiguousarray(w.usable[lo:hi])
        return replace(w, load=np.ascontiguousarray(w.load[lo:hi]), window_load=w.window_load[lo_w:hi_w], usable=usable)

    return part(0, windows), part(windows, None)
