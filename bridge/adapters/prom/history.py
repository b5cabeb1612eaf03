"""The pure half of the Prometheus histories: the queries and parsers of the request history
(``gpu-bridge simulate --prometheus``) and of the daemon's own series (``gpu-bridge web``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bridge.model import ReclaimMode, Tier

from .types import (
    E2E_COUNT, E2E_SUM, KV_V0, KV_V1, RUNNING, SUCCESS, TAG, WAITING, DaemonHistory, DelayCount, PromPool, RequestHistory,
    _bad, _describe, _escape, _float, _pod_key, _replica_key, _tag, _window, selector,
)

# Prometheus refuses a range query of more than 11,000 points per series.
MAX_RANGE_POINTS = 10_000


# --- the daemon's own history (``gpu-bridge web``) ---------------------------------------------

DAEMON_SERIES = ("lends", "reclaims", "lent", "slo_spent")


def _counter_step(series: str, window: str) -> str:
    """What a counter of the daemon's counted in the last ``window``: now minus then, a series
    absent then counting from 0 (the daemon's counters are born at their first increment,
    which ``increase()`` cannot see); a restart's reset gives 0, never a negative count."""
    return f"clamp_min(sum({series}) - (sum({series} offset {window}) or vector(0)), 0)"


def build_daemon_query(pool: PromPool, *, step_s: float) -> str:
    """One range query of the daemon's own series for a pool (``PromAdapter.daemon_history``)."""
    p = _escape(pool.name)
    w = _window(step_s)
    return " or ".join(
        _tag(expr, tag)
        for expr, tag in (
            (_counter_step(f'gpu_bridge_lends_total{{pool="{p}"}}', w), "lends"),
            (_counter_step(f'gpu_bridge_reclaims_total{{pool="{p}"}}', w), "reclaims"),
            (f'max(max_over_time(gpu_bridge_nodes{{pool="{p}",phase="lent"}}[{w}]))', "lent"),
            (f'max(max_over_time(gpu_bridge_pool_slo_budget_spent_ratio{{pool="{p}"}}[{w}]))', "slo_spent"),
        )
    )


def parse_daemon_history(result: Sequence[Mapping[str, Any]], *, start: float, end: float, step_s: float) -> DaemonHistory:
    """A ``daemon_history`` answer on a regular grid (pure). A value that is not a finite
    number >= 0 (NaN, +Inf, -5, text) is an unknown step (NaN), as a step with no sample; a
    timestamp that is not a finite number is a malformed answer (ValueError). ``+Inf`` was kept
    and made the web view's history page and its JSON fail (``ceil(inf)``, JSON has no inf)."""
    n = int(math.floor((end - start) / step_s + 1e-9)) + 1
    out = {k: [math.nan] * n for k in DAEMON_SERIES}
    for series in result:
        tag = series["metric"].get(TAG)
        if tag not in out:
            continue
        for t_raw, v_raw in series["values"]:
            t = float(t_raw)
            if not math.isfinite(t):
                raise ValueError(f"sample time {t_raw!r:.40} is not a finite number")
            i = int(round((t - start) / step_s))
            if 0 <= i < n:
                v = _float(v_raw)
                out[tag][i] = v if _bad(v) is None else math.nan
    return DaemonHistory(start=start, step_s=step_s, series={k: tuple(v) for k, v in out.items()})


def build_delay_query(pool: PromPool, *, window_s: float) -> str:
    """The pool's measured reclaims of the last ``window_s`` per tier, mode and bucket (instant)."""
    series = f'gpu_bridge_reclaim_measured_delay_seconds_bucket{{pool="{_escape(pool.name)}"}}'
    return f"sum by (tier, mode, le) (increase({series}[{_window(window_s)}]))"


def parse_delay_buckets(result: Sequence[Mapping[str, Any]]) -> tuple[DelayCount, ...]:
    """A ``build_delay_query`` answer -> the count in each bucket (pure). ``increase()``
    extrapolates: counts are rounded, a bucket never counts less than 0. The ``+Inf`` bucket's
    reclaims (over the largest bound, an hour) count at the largest bound. Any series without
    its labels or with a count NaN, infinite, negative or not a number: ValueError naming it."""
    cumulative: dict[tuple[Tier, ReclaimMode], dict[float, int]] = {}
    for item in result:
        metric = item["metric"]
        missing = [k for k in ("tier", "mode", "le") if k not in metric]
        if missing:
            raise ValueError(f"series {dict(metric)} has no {missing[0]!r} label")
        le, raw = _float(metric["le"]), item["value"][1]
        if math.isnan(le) or le < 0:
            raise ValueError(f"series {dict(metric)}: le is not a bucket bound")
        if (why := _bad(_float(raw))) is not None:
            raise ValueError(f"series {dict(metric)}: count {why} ({raw!r})")
        cumulative.setdefault((Tier(metric["tier"]), ReclaimMode(metric["mode"])), {})[le] = round(_float(raw))
    out = []
    for (tier, mode), by_le in cumulative.items():
        top, below = max((b for b in by_le if math.isfinite(b)), default=None), 0
        if top is None:
            raise ValueError(f"tier {tier}, mode {mode}: no finite le bucket")
        for le in sorted(by_le):
            n, below = max(0, by_le[le] - below), max(below, by_le[le])
            if n:
                out.append(DelayCount(tier, mode, min(le, top), n))
    return tuple(out)


# --- request history (``gpu-bridge simulate --prometheus``) ------------------------------------

# A day of minutes per query: a large pool returns (replicas x finished reasons x signals)
# series per step, so shorter queries keep each answer a few tens of MB at most.
REQUEST_CHUNK_STEPS = 1440
REQUEST_SIGNALS = ("completed", "running", "waiting", "kv", "e2e_sum", "e2e_count")


def build_request_query(pool: PromPool, *, step_s: float) -> str:
    """One range query of a pool's request history, each term tagged with ``bridge_q``, every
    one the last sample of the step (``last_over_time(...[step])``: a series not scraped
    during the step is missing there, not its old value for Prometheus' 5-minute lookback):

    - ``completed``: the request counter of each series (every ``finished_reason``), whose
      differences from step to step are the completions (``parse_request_range``; a drop is a
      counter restart, counted from 0 as PromQL's ``increase`` does, but without its
      extrapolation, so consecutive steps add up exactly);
    - ``running``, ``waiting``: the gauges (requests in the system);
    - ``kv``: KV-cache usage, V1 name, and ``kv0`` the V0 name (a replica exports one of them);
    - ``e2e_sum`` / ``e2e_count``: the end-to-end latency histogram's sum and count counters.
    """
    sel, w = selector(pool), _window(step_s)
    tags = ((SUCCESS, "completed"), (RUNNING, "running"), (WAITING, "waiting"), (KV_V1, "kv"), (KV_V0, "kv0"),
            (E2E_SUM, "e2e_sum"), (E2E_COUNT, "e2e_count"))
    return "\n  or ".join(_tag(f"last_over_time({metric}{{{sel}}}[{w}])", tag) for metric, tag in tags)


COUNTERS = ("completed", "e2e_sum", "e2e_count")


def parse_request_range(
    results: Iterable[Sequence[Mapping[str, Any]]], *, pool: PromPool, start: float, step_s: float, steps: int
) -> RequestHistory:
    """Range-query results (matrices, one per chunk) -> RequestHistory (pure).

    Gauges are summed per replica (its engines). Counters are differenced per series first:
    the increase at step i needs the series' value at i - 1 (else it is missing there); a
    drop is a restart and counts the new value. Values that are NaN, infinite or negative
    are dropped (missing); series of another model are ignored."""
    out: dict[str, dict[str, dict[int, float]]] = {s: {} for s in REQUEST_SIGNALS}
    kv0: dict[str, dict[int, float]] = {}
    raw: dict[tuple[str, str, frozenset[tuple[str, str]]], dict[int, float]] = {}
    ignored: set[str] = set()
    for result in results:
        for item in result:
            metric = item.get("metric") or {}
            tag = metric.get(TAG, "")
            full = _replica_key(metric)
            key = _pod_key(frozenset((k, v) for k, v in full if k != "finished_reason"))
            why = pool.foreign(metric)
            if why is not None:
                ignored.add(f"{tag} {_describe(key)}: {why}")
                continue
            if tag not in REQUEST_SIGNALS and tag != "kv0":
                continue
            rep = _describe(key)
            if tag in COUNTERS:
                dest = raw.setdefault((tag, rep, full), {})
            else:
                dest = (kv0 if tag == "kv0" else out[tag]).setdefault(rep, {})
            for ts, rv in item.get("values") or ():
                i = round((float(ts) - start) / step_s)
                v = _float(rv)
                if not (0 <= i < steps and _bad(v) is None):
                    continue
                if tag in COUNTERS:
                    dest[i] = v
                elif tag in ("kv", "kv0"):  # a fraction per engine: the fullest engine's
                    dest[i] = max(dest.get(i, 0.0), v)
                else:  # engines of one replica (data parallelism) add up
                    dest[i] = dest.get(i, 0.0) + v
    for (tag, rep, _), vals in raw.items():
        dest = out[tag].setdefault(rep, {})
        for i, v in vals.items():
            prev = vals.get(i - 1)
            if prev is None:
                continue
            dest[i] = dest.get(i, 0.0) + (v - prev if v >= prev else v)
    for rep, vals in kv0.items():
        out["kv"].setdefault(rep, vals)
    return RequestHistory(pool.name, start, step_s, steps, out, tuple(sorted(ignored)))

