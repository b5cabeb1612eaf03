"""The error-budget governor: the SLO budget kept as a hard cap, by construction.

The calibrated margin (``calibrate.py``) *aims* at the budget; it is a forecast and can be
surprised. The governor is what makes the budget a promise. Over a rolling window (default
28 days; the whole run in the simulator) it counts the avoidable violation minutes the pool
really had (offered load above Ready capacity, load above every node excluded) and lets the
policy lend only while what is left of the budget can absorb the worst incident lending could
still cause: every lent node reclaimed at once, Ready one reclaim later.

**The bound.** Let ``B`` be the budget (``slo_budget`` x the window's minutes), ``S(t)`` the
avoidable violation minutes of the window counted up to ``t`` and ``W`` the minutes one
incident can span from a tick on (``incident_minutes``, over the nodes lent or lending after the
tick's decisions: fewer nodes, or none lending, make it shorter, hence ``Governor.cap``). The
policy keeps nodes lent only at ticks where ``B - S(t) >= W``; at any other tick it lends
nothing and reclaims at once (urgent, ``Reason.SLO_BUDGET``) what the incident cannot afford. An avoidable violation needs a node that is not Ready;
a node is not Ready only because of a lend kept at some allowed tick ``t_a``; after the last
allowed tick before it, every lent node is Ready again within ``W`` minutes. So every
avoidable violation minute ``m`` lies within ``W`` minutes of an allowed tick ``t_a``, and
``S(m) <= S(t_a) + W <= B``: in every window, violations <= unavoidable minutes + ``B``.

What the argument rests on (and ``docs/policy.md`` states): reclaims finish within the
planned reclaim horizon (measured delays' quantile plus ``forecast.margin_s``); the count
``S`` does not miss a violation (hence the conservative count of ``ViolationLedger``: a
minute's Ready capacity is the lower of its own and the previous minute's, and minutes without
a sample after capacity was lent count as violated until the blind rule has brought every
node back or, blind, the window's count has reached the budget: by then the governor has taken
every lent node back, by the argument above); and the history behind ``S`` covers the window
(the daemon rebuilds it from Prometheus at start-up, so its retention must cover
``governor.window_s``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from bridge.config import Config, PoolConfig
from bridge.model import Governor

_EPS = 1e-6


def incident_minutes(
    *,
    horizon_s: float,
    scrape_s: float,
    drain_s: float,
    tick_s: float,
    nodes: int,
    max_reclaims_per_tick: int,
    minute_s: float = 60.0,
    lending: bool = True,
) -> int:
    """Minutes one incident can touch from a tick on, if every lent node is reclaimed from the
    next tick: a node still lending (``lending``) first finishes its drain (whole ticks), the
    reclaims of ``nodes`` nodes take ``ceil(nodes / max_reclaims_per_tick)`` ticks, each then
    serves after the reclaim horizon (release + cold start + margin + tick + scrape), and the
    count itself lags one scrape. An interval of ``x`` minutes touches at most ``ceil(x) + 1``
    minutes."""
    extra_ticks = max(0, math.ceil(max(nodes, 1) / max(max_reclaims_per_tick, 1)) - 1)
    drain = math.ceil(drain_s / tick_s - 1e-9) * tick_s if lending else 0.0
    span = horizon_s + scrape_s + drain + extra_ticks * tick_s
    return math.ceil(span / minute_s - 1e-9) + 1


@dataclass(frozen=True, slots=True)
class Incident:
    """What one incident's length depends on besides the nodes lent (``incident_minutes``)."""

    horizon_s: float
    scrape_s: float
    drain_s: float
    tick_s: float
    max_reclaims_per_tick: int
    minute_s: float = 60.0

    def minutes(self, nodes: int, *, lending: bool = True) -> int:
        return incident_minutes(
            horizon_s=self.horizon_s, scrape_s=self.scrape_s, drain_s=self.drain_s, tick_s=self.tick_s, nodes=nodes,
            max_reclaims_per_tick=self.max_reclaims_per_tick, minute_s=self.minute_s, lending=lending,
        )

    def most_nodes(self, left_min: float, nodes: int, *, lending: bool) -> int:
        """The most of ``nodes`` that may be lent when ``left_min`` of the budget is left: the
        largest count, in whole reclaim rounds, whose incident fits; 0 when one node's does not."""
        per_round = max(self.max_reclaims_per_tick, 1)
        for rounds in range(math.ceil(max(nodes, 1) / per_round), 0, -1):
            k = min(nodes, rounds * per_round)
            if self.minutes(k, lending=lending) <= left_min + _EPS:
                return k
        return 0


def govern(
    *, spent_min: int, budget_min: float, incident_min: int, window_s: float,
    keep_max: int | None = None, lend_max: int | None = None, resume_t: float | None = None,
) -> Governor:
    """The governor's state: the whole pool may be lent while ``budget_min - spent_min >=
    incident_min``, and ``keep_max`` / ``lend_max`` nodes (none lending / one lending) below that;
    ``resume_t``: when a held pool may lend again (``ViolationLedger.leave_time``)."""
    if budget_min < 0 or not math.isfinite(budget_min):
        raise ValueError(f"budget_min: expected a finite number >= 0, got {budget_min!r}")
    return Governor(spent_min=spent_min, budget_min=budget_min, incident_min=incident_min, window_s=window_s,
                    keep_max=keep_max, lend_max=lend_max, resume_t=resume_t)


PACE_FROM = 1.0  # share of the usable budget left below which the calibration slows down


def pace(g: Governor) -> float:
    """How fast the calibration may spend, 0..1: 1 while at least ``PACE_FROM`` (all) of the usable
    budget (budget minus the reserve of one incident) is left, then linearly down to 0 at the
    reserve. The calibration scales its miss rate by it, so the margin tightens smoothly as
    the cap nears (at 0 every rise the window has seen is covered) rather than lending at full
    pace into the cap and then nothing at all until violations leave the window."""
    usable = g.budget_min - g.incident_min
    if usable <= 0:
        return 0.0
    return min(1.0, max(0.0, (g.left_min - g.incident_min) / (PACE_FROM * usable)))


class ViolationLedger:
    """Avoidable violation minutes of one pool over a rolling window, counted conservatively
    from the same samples the policy sees (peak demand and fewest Ready replicas per step).

    A step counts when its demand exceeds the lower of its own and the previous step's fewest
    Ready replicas (a node that became Ready between two samples does not hide the minute it
    was missing), unless the demand exceeds the whole pool (no policy could serve it). A step
    without a valid sample counts when the last known Ready capacity was below the whole pool
    (something was lent) and it lies within ``gap_steps`` of that sample (after which the blind
    rule has reclaimed every node), and, given a budget (``stop``, in steps), only while the
    window's count before it is below the budget: once it is, the governor has taken every lent
    node back and they serve (the bound's argument: every avoidable minute ``m`` has ``S(m) <= B``),
    so later blind steps hide nothing and an outage cannot drive the budget below zero (nor delay
    the recovery by minutes no one missed). Only a cache: the same samples give the same count."""

    def __init__(self, *, step_s: float, window_s: float, gap_steps: int, stop: float | None = None) -> None:
        self.step_s = step_s
        self.window_steps = max(1, math.ceil(window_s / step_s - 1e-9))
        self.gap_steps = gap_steps
        self.stop = stop
        self._key: int | None = None  # the step being filled
        self._d = math.nan
        self._r = math.nan
        self._prev_r = math.nan  # fewest Ready replicas of the previous step (NaN: unknown)
        self._last_known: tuple[int, float] | None = None  # (step, fewest Ready) of the last valid step
        # candidate steps: (step, demand, ready) with demand > ready, or (step, NaN, last known ready)
        self._marks: deque[tuple[int, float, float]] = deque()
        self._flags: deque[bool] = deque()  # per mark: whether it counts at capacity ``_cap``
        self._cap: float | None = None
        self._counted = 0  # marks that count at capacity ``_cap``

    def add(self, t: float, demand: float | None, ready: float) -> None:
        """Record a sample at ``t``: demand in replicas (None = invalid) and Ready replicas."""
        key = math.floor(t / self.step_s)
        d = math.nan if demand is None else demand
        r = ready if demand is not None else math.nan
        if self._key is None:
            self._key, self._d, self._r = key, d, r
            return
        if key < self._key:
            return
        if key == self._key:
            self._d = d if math.isnan(self._d) else (self._d if math.isnan(d) else max(self._d, d))
            self._r = r if math.isnan(self._r) else (self._r if math.isnan(r) else min(self._r, r))
            return
        self._close(self._key, self._d, self._r)
        for k in range(self._key + 1, min(key, self._key + 1 + self.gap_steps + 1)):
            self._close(k, math.nan, math.nan)
        self._key, self._d, self._r = key, d, r

    def _mark(self, k: int, d: float, r: float) -> None:
        if self._cap is not None:
            self._drop(k - self.window_steps + 1)  # what is left is the window ending at ``k``
            flag = self._flag(d, r, self._cap, self._counted)
            self._flags.append(flag)
            self._counted += flag
        self._marks.append((k, d, r))

    def _flag(self, d: float, r: float, cap: float, before: int) -> bool:
        """Whether a mark counts, given the count of the window before it."""
        if not self._counts(d, r, cap):
            return False
        return not math.isnan(d) or self.stop is None or before < self.stop - _EPS

    def _drop(self, lo: int) -> None:
        """Forget the marks before step ``lo`` (they left the window)."""
        while self._marks and self._marks[0][0] < lo:
            self._marks.popleft()
            if self._flags:
                self._counted -= self._flags.popleft()

    def _older(self, lo: int) -> int:
        """Counted marks before step ``lo``, still kept for the steps to close."""
        got = 0
        for (k, _, _), flag in zip(self._marks, self._flags):
            if k >= lo:
                break
            got += flag
        return got

    def _recount(self, cap: float) -> None:
        """Every mark's flag at a new capacity, in order, each with its own window's count before it."""
        self._cap, self._flags = cap, deque()
        first, in_window = 0, 0  # the oldest mark in the window of the one being judged, and that window's count
        for k, d, r in self._marks:
            while self._marks[first][0] < k - self.window_steps + 1:
                in_window -= self._flags[first]
                first += 1
            flag = self._flag(d, r, cap, in_window)
            self._flags.append(flag)
            in_window += flag
        self._counted = sum(self._flags)

    def _close(self, k: int, d: float, r: float) -> None:
        got = self._judge(k, d, r)
        if got is not None:
            self._mark(k, *got)
        if not math.isnan(d) and not math.isnan(r):
            self._last_known = (k, r)
            self._prev_r = r
        else:
            self._prev_r = math.nan

    def _judge(self, k: int, d: float, r: float) -> tuple[float, float] | None:
        if not math.isnan(d) and not math.isnan(r):
            r_eff = r if math.isnan(self._prev_r) else min(r, self._prev_r)
            return (d, r_eff) if d > r_eff + _EPS else None
        if self._last_known is not None and k - self._last_known[0] <= self.gap_steps:
            return (math.nan, self._last_known[1])
        return None

    @staticmethod
    def _counts(d: float, r: float, cap: float) -> bool:
        if math.isnan(d):
            return r < cap - _EPS
        return d <= cap + _EPS

    def spent(self, now: float, *, capacity: float) -> int:
        """Avoidable violation steps in the window ending at ``now``'s step (the step still
        being filled included); ``capacity`` = replicas the whole pool can serve."""
        lo = math.floor(now / self.step_s) - self.window_steps + 1
        if self._cap != capacity:
            self._recount(capacity)
        # a step still to close (``_key`` on) is judged with its own window: keep what that holds
        self._drop(lo if self._key is None else min(lo, self._key - self.window_steps + 1))
        open_step = 0
        if self._key is not None and self._key >= lo:
            got = self._judge(self._key, self._d, self._r)
            if got is not None and not math.isnan(got[0]) and self._counts(*got, capacity):
                open_step = 1
        pending = self._pending_gap(math.floor(now / self.step_s), lo, capacity, self._counted + open_step)
        return self._counted - self._older(lo) + open_step + pending

    def leave_time(self, now: float, *, capacity: float, count: int) -> float | None:
        """When ``count`` of the minutes counted in the window ending at ``now`` will have left it,
        the window rolling on and no new violation counted: the start of the first step whose
        window no longer holds them. None when the closed steps hold fewer (the newest ones,
        still being counted, decide)."""
        if count <= 0:
            return now
        self.spent(now, capacity=capacity)  # the flags at this capacity, the marks before the window dropped
        lo = math.floor(now / self.step_s) - self.window_steps + 1
        seen = 0
        for (k, _, _), flag in zip(self._marks, self._flags):
            if k >= lo and flag:
                seen += 1
                if seen == count:
                    return float((k + self.window_steps) * self.step_s)
        return None

    def _pending_gap(self, now_k: int, lo: int, capacity: float, n: int) -> int:
        """Steps after the last sample up to ``now`` that will count once closed: while no
        sample arrives (Prometheus down), the count keeps running, so the governor sees the
        budget go during the outage itself, not after it. ``n``: the count of the marks kept and
        of the open step (the marks leave each pending step's window as ``_mark`` would drop them)."""
        if self._key is None or now_k <= self._key:
            return 0
        if not math.isnan(self._d) and not math.isnan(self._r):
            known: tuple[int, float] | None = (self._key, self._r)
        else:
            known = self._last_known
        if known is None or not self._counts(math.nan, known[1], capacity):
            return 0
        # the steps over by now (the one ``now`` is in may still get its sample)
        first, last = max(self._key + 1, lo), min(now_k - 1, known[0] + self.gap_steps)
        if self.stop is None or last < first:
            return max(0, last - first + 1)
        # each step as ``_mark`` will judge it: counted while its window's count is below the budget
        marks, flags, oldest, got, j = self._marks, self._flags, 0, 0, first
        while j <= last:
            while oldest < len(marks) and marks[oldest][0] < j - self.window_steps + 1:
                n -= flags[oldest]
                oldest += 1
            if n < self.stop - _EPS:
                n, got, j = n + 1, got + 1, j + 1
            elif oldest < len(marks):
                j = max(j + 1, marks[oldest][0] + self.window_steps)  # the next step the window is lighter
            else:
                break  # nothing left to leave the window: no later step counts
        return got


def gap_steps(config: Config, pool: PoolConfig, step_s: float, window_s: float) -> int:
    """Steps without a sample that may still hide violations while something is lent. With
    ``blind_serving: null`` the blind rule (``policy.blind_after_s``) reclaims every node, so
    only until it has and they serve (the configured horizon of the slowest pool, its drain,
    two ticks). With a finite ``blind_serving`` (default 0: blind, the pool holds) nothing
    brings the lent nodes back but the governor itself: every blind step counts, the whole
    window long, until the budget left can no longer absorb one incident and it reclaims."""
    from bridge.policy.forecast import horizon_s

    if pool.blind_serving is not None:
        return math.ceil(window_s / step_s - 1e-9)
    p = config.policy
    slowest = max((horizon_s(config, q) + q.drain_s for q in config.pools), default=0.0)
    return math.ceil((p.blind_after_s + slowest + 2 * p.tick_s) / step_s - 1e-9) + 1
