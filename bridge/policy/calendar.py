"""Calendar rules as constraints on the serving floor of a pool over a time interval.

- ``no_lend``: inside the window nothing is lent; a window that starts within the reclaim
  horizon already raises the floor to every node, so they are Ready when it opens.
- ``min_serving``: inside the window the floor is at least ``min_serving`` nodes.
- ``lend_only``: if a pool has such rules, lending is allowed only while the whole interval
  lies inside their union (the fixed night window of the published practice).

Windows are local wall-clock times in the rule's IANA timezone (zoneinfo, so DST shifts
the window in UTC, not in local time); a window belongs to the day it starts on.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from zoneinfo import ZoneInfo

from bridge.config import DAYS, CalendarEffect, CalendarRule

INFINITE = 1 << 30  # "every node"


@functools.lru_cache(maxsize=4096)
def _window(start: str, end: str, tz: str, day: dt.date) -> tuple[float, float]:
    zone = ZoneInfo(tz)

    def at(d: dt.date, hhmm: str) -> float:
        if hhmm == "24:00":
            d, hhmm = d + dt.timedelta(days=1), "00:00"
        h, m = int(hhmm[:2]), int(hhmm[3:])
        return dt.datetime(d.year, d.month, d.day, h, m, tzinfo=zone).timestamp()

    a = at(day, start)
    b = at(day, end)
    if b <= a:
        b = at(day + dt.timedelta(days=1), end)
    return a, b


def windows(rule: CalendarRule, lo: float, hi: float) -> list[tuple[float, float]]:
    """The rule's windows (unix seconds) that overlap [lo, hi]."""
    zone = ZoneInfo(rule.timezone)
    first = dt.datetime.fromtimestamp(lo, zone).date() - dt.timedelta(days=1)
    last = dt.datetime.fromtimestamp(hi, zone).date()
    out = []
    d = first
    while d <= last:
        if DAYS[d.weekday()] in rule.days:
            a, b = _window(rule.start, rule.end, rule.timezone, d)
            if a < hi and b > lo:
                out.append((a, b))
        d += dt.timedelta(days=1)
    return out


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> bool:
    pos = lo
    for a, b in sorted(intervals):
        if a > pos:
            return False
        pos = max(pos, b)
        if pos >= hi:
            return True
    return pos >= hi


def floor(rules: Sequence[CalendarRule], pool: str, lo: float, hi: float) -> tuple[int, str | None]:
    """The highest serving floor the rules set anywhere in [lo, hi], and the rule's name.
    ``INFINITE`` means every node must serve."""
    best, why = 0, None
    allow: list[tuple[float, float]] = []
    have_allow = False
    for r in rules:
        if not r.applies_to(pool):
            continue
        if r.effect is CalendarEffect.LEND_ONLY:
            have_allow = True
            allow.extend(windows(r, lo, hi))
            continue
        if not windows(r, lo, hi):
            continue
        v = INFINITE if r.effect is CalendarEffect.NO_LEND else int(r.min_serving or 0)
        if v > best:
            best, why = v, r.name
    if have_allow and not _covered(allow, lo, hi) and best < INFINITE:
        names = sorted({r.name for r in rules if r.applies_to(pool) and r.effect is CalendarEffect.LEND_ONLY})
        best, why = INFINITE, "outside " + "/".join(names)
    return best, why
