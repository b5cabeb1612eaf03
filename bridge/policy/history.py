"""Keeping exactly the load history ``plan()`` reads, cheaply (for the simulator and the daemon).

``plan()`` reads ``PoolState.history`` only inside ``forecast.history_windows(config)``, each
at a declared resolution. ``HistoryRecorder`` keeps, per resolution, one merged sample per
step (the field-wise *maximum*, so peaks survive; a field missing in any sample of a step is
missing for the step, so gaps still block lending) and hands out the tuple ``plan()`` needs:
the finest resolution wherever windows overlap, oldest first.

Usage (one recorder per pool)::

    rec = HistoryRecorder(history_windows(config))
    every tick:  rec.add(signals);  PoolState(..., signals=signals, history=rec.history(now))

The daemon can instead rebuild the same windows from Prometheus after a restart with range
queries over each window (``max_over_time(...[step])`` at that step).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence

from bridge.model import LoadSignals
from bridge.policy.forecast import HistoryWindow


def merge_max(a: LoadSignals, b: LoadSignals) -> LoadSignals:
    """Field-wise maximum of two samples (``t`` of the newer; missing wins over present)."""

    def mx(x: float | None, y: float | None) -> float | None:
        if x is None or y is None or not (x >= 0 and y >= 0) or math.isinf(x) or math.isinf(y):
            return None
        return x if x >= y else y

    return LoadSignals(
        t=max(a.t, b.t), running=mx(a.running, b.running), waiting=mx(a.waiting, b.waiting),
        kv_cache_usage_sum=mx(a.kv_cache_usage_sum, b.kv_cache_usage_sum),
        tokens_per_s=mx(a.tokens_per_s, b.tokens_per_s),
        replicas_reporting=min(a.replicas_reporting, b.replicas_reporting),
    )


class _Level:
    """Buckets of one resolution: parallel lists (keys, samples), trimmed lazily."""

    __slots__ = ("keys", "lookback_s", "samples", "start", "step")

    def __init__(self, step: float, lookback_s: float) -> None:
        self.step = step
        self.lookback_s = lookback_s
        self.keys: list[int] = []
        self.samples: list[LoadSignals] = []
        self.start = 0  # index of the oldest live bucket

    def add(self, s: LoadSignals) -> None:
        key = math.floor(s.t / self.step)
        if self.keys and self.keys[-1] == key:
            self.samples[-1] = merge_max(self.samples[-1], s)
        elif self.keys and key < self.keys[-1]:
            raise ValueError(f"samples must be added in time order, got t={s.t} after bucket {self.keys[-1]}")
        else:
            self.keys.append(key)
            self.samples.append(s)
        # trim: drop buckets older than the lookback, compacting now and then
        oldest = math.floor((s.t - self.lookback_s) / self.step) - 1
        while self.start < len(self.keys) and self.keys[self.start] < oldest:
            self.start += 1
        if self.start > 4096 and self.start > len(self.keys) // 2:
            del self.keys[: self.start]
            del self.samples[: self.start]
            self.start = 0

    def between(self, lo: float, hi: float) -> list[LoadSignals]:
        """The buckets with samples in [lo, hi]. A bucket's merged sample carries its newest
        ``t``: one that begins by ``hi`` but ends after it is given ``t = hi``, or a peak in its
        first part would drop out of the history for up to a step as a finer window's start
        passes it (the finer window no longer holds it, this one not yet)."""
        ss = self.samples
        i = bisect.bisect_left(ss, lo, lo=self.start, key=_t)
        j = bisect.bisect_right(ss, hi, lo=i, key=_t)
        if j < len(ss) and self.keys[j] * self.step <= hi and ss[j].t > hi >= lo:
            return [*ss[i:j], dataclasses.replace(ss[j], t=hi)]
        return ss[i:j]


def _t(s: LoadSignals) -> float:
    return s.t


class HistoryRecorder:
    """The history of one pool, at the resolutions the policy declared."""

    def __init__(self, windows: Sequence[HistoryWindow]) -> None:
        if not windows:
            raise ValueError("need at least one history window")
        self.windows = tuple(sorted(windows, key=lambda w: w.step_s))
        self._levels: dict[float, _Level] = {}
        for w in self.windows:
            lvl = self._levels.get(w.step_s)
            back = -w.start_s + w.step_s
            if lvl is None:
                self._levels[w.step_s] = _Level(w.step_s, back)
            else:
                lvl.lookback_s = max(lvl.lookback_s, back)
        self._last_t = -math.inf

    def add(self, s: LoadSignals) -> None:
        """Record a sample (in time order; a repeated ``t`` is ignored)."""
        if s.t <= self._last_t:
            return
        self._last_t = s.t
        for lvl in self._levels.values():
            lvl.add(s)

    def history(self, now: float) -> tuple[LoadSignals, ...]:
        """Samples for ``PoolState.history``, oldest first, finest resolution where windows overlap."""
        covered: list[tuple[float, float]] = []  # ranges already served by a finer window
        out: list[LoadSignals] = []
        for w in self.windows:  # finest first
            lo, hi = now + w.start_s, now + w.end_s
            for a, b in _minus((lo, hi), covered):
                out.extend(self._levels[w.step_s].between(a, b))
            covered.append((lo, hi))
        out.sort(key=_t)
        merged: list[LoadSignals] = []
        for s in out:  # at a window's edge two resolutions can meet at one t: their maximum
            if merged and merged[-1].t == s.t:
                merged[-1] = merge_max(merged[-1], s)
            else:
                merged.append(s)
        return tuple(merged)


def _minus(iv: tuple[float, float], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of the closed interval ``iv`` outside every interval of ``cut`` (ends shared)."""
    parts = [iv]
    for a, b in cut:
        nxt = []
        for lo, hi in parts:
            if b < lo or a > hi:
                nxt.append((lo, hi))
                continue
            if lo < a:
                nxt.append((lo, a))
            if b < hi:
                nxt.append((b, hi))
        parts = nxt
    return parts
