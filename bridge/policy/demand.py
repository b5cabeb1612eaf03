"""vLLM signals -> replicas needed, the way HPA/AIBrix combine several metrics.

Each enabled signal is divided by its per-replica target; the most demanding one wins.
A value that is ``None``, NaN, infinite or negative is *missing*, never "no load".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bridge.config import TargetConfig
from bridge.model import LoadSignals


def valid(x: float | None) -> bool:
    """A usable gauge value: present, finite, not negative."""
    return x is not None and x >= 0 and math.isfinite(x)


@dataclass(frozen=True, slots=True)
class Demand:
    """Replicas needed by one sample. ``replicas`` is None when no enabled signal is usable;
    ``missing`` names the enabled signals that were not usable (they block lending)."""

    replicas: float | None
    by: str  # the signal that gave the maximum ("" when none)
    missing: tuple[str, ...]


def demand(s: LoadSignals | None, target: TargetConfig) -> Demand:
    """The full breakdown, for the current sample (reasons name the deciding signal)."""
    enabled = target.enabled()
    if s is None:
        return Demand(None, "", enabled)
    best: float | None = None
    by = ""
    missing: list[str] = []
    for name in enabled:
        v = _one(s, name, target)
        if v is None:
            missing.append(name)
        elif best is None or v > best:
            best, by = v, name
    return Demand(best, by, tuple(missing))


def replicas_needed(s: LoadSignals, target: TargetConfig) -> float | None:
    """Fast path for history samples: the maximum over the usable signals, None if none is.

    (Inlined validity checks: ``0 <= x < inf`` is False for None-guarded NaN and infinity.)"""
    best = -1.0
    c = target.concurrency_per_replica
    if c is not None:
        r, w = s.running, s.waiting
        if r is not None and w is not None and 0 <= r < _INF and 0 <= w < _INF:
            best = (r + w) / c
    k = target.kv_cache_usage
    x = s.kv_cache_usage_sum
    if k is not None and x is not None and 0 <= x < _INF and x / k > best:
        best = x / k
    tk = target.tokens_per_s_per_replica
    x = s.tokens_per_s
    if tk is not None and x is not None and 0 <= x < _INF and x / tk > best:
        best = x / tk
    qw = target.waiting_per_replica
    x = s.waiting
    if qw is not None and x is not None and 0 <= x < _INF and x / qw > best:
        best = x / qw
    return best if best >= 0 else None


_INF = math.inf


def _one(s: LoadSignals, name: str, target: TargetConfig) -> float | None:
    if name == "concurrency_per_replica":
        if valid(s.running) and valid(s.waiting):
            return (s.running + s.waiting) / target.concurrency_per_replica  # type: ignore[operator]
        return None
    if name == "kv_cache_usage":
        return s.kv_cache_usage_sum / target.kv_cache_usage if valid(s.kv_cache_usage_sum) else None  # type: ignore[operator]
    if name == "tokens_per_s_per_replica":
        return s.tokens_per_s / target.tokens_per_s_per_replica if valid(s.tokens_per_s) else None  # type: ignore[operator]
    if name == "waiting_per_replica":
        return s.waiting / target.waiting_per_replica if valid(s.waiting) else None  # type: ignore[operator]
    raise ValueError(name)


def nodes_for(replicas: float, *, headroom: float, headroom_replicas: float, replicas_per_node: int) -> int:
    """Nodes needed to carry ``replicas`` with headroom (a fraction and an absolute part)."""
    need = replicas * (1.0 + headroom) + headroom_replicas
    return max(0, math.ceil(need / replicas_per_node - 1e-9))
