"""A pool's own Prometheus history -> the simulator's per-minute load (pure; no I/O).

``gpu-bridge simulate --prometheus`` reads ``bridge.adapters.prom.types.RequestHistory`` (one
sample per minute and replica) and this module turns it into a ``Workload``:

- **arrivals.** vLLM has no arrivals counter. Requests that arrived in a minute = requests
  that finished in it (the change of ``vllm:request_success_total``, every finished_reason,
  aborts included, between the last samples of consecutive minutes) + the change of requests
  in the system (``vllm:num_requests_running`` + ``_waiting``, last samples likewise). Both
  are differences of the same sample instants, so minutes add up exactly to windows (no
  ``increase()`` extrapolation). A minute below 0 (a restart losing its in-flight requests)
  counts as 0.
- **counter restarts**: a counter that drops restarted; its new value is the increase (the
  rule of PromQL's ``increase``).
- **missing pods.** A replica is expected from its first to its last sample in the range
  (a pod that starts or is deleted simply begins or ends). A minute inside that life in which
  it has no completion count or no gauges lost its requests: the minute is *unusable*, never
  read as zero. A replica that vanishes for good while unscraped is not detectable (its last
  requests are missing), and a deleted pod's gauges linger for Prometheus' lookback (5 min)
  unless Prometheus wrote a staleness marker.
- **gaps.** A minute is usable when every expected replica reported in it and at its start.
  Unusable minutes before the first and after the last usable one are trimmed (the range
  then starts and ends on whole 10-minute windows). Inner gaps are bridged at the higher of
  the mean load of the 10 usable minutes before and the 10 after (never zero), are not
  counted as SLO-violation minutes, and are listed.
- **partial first day.** The simulation starts at the first usable window, at its real time
  of day (calendar rules and the fixed-window baseline run on the real clock, UTC).
- **windows.** Per 10-minute window (aligned to the clock): rate = mean of its minutes, cv =
  sqrt(s^2 / m) of its per-minute counts over its usable minutes (the index of dispersion of
  counts at 60 s, as for the Azure traces: the inter-arrival cv of a renewal process, and it
  also picks up drift inside the window). These are what ``--export-trace`` writes.
- **per-replica capacity** (requests/s one replica carries at its target, the unit that turns
  requests into replicas): ``--replica-rps`` if given, else Little's law on the pool's own
  measurements: ``concurrency_per_replica / W`` with ``W`` the mean end-to-end latency
  (``vllm:e2e_request_latency_seconds`` sum / count) over the busiest tenth of the usable
  windows, where the latency at the target concurrency shows (vLLM's latency grows with the
  batch). Without a concurrency target or a latency histogram it must be given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from bridge.adapters.prom.types import RequestHistory
from bridge.config import TargetConfig
from bridge.errors import BridgeError
from bridge.simulate.workload import MINUTE_S, Workload
from bridge.trace import COLUMNS, Trace

WINDOW_S = 600.0
MIN_USABLE_S = 86400.0  # less than a day of data cannot say what a day of lending looks like
BUSY_FRACTION = 0.1  # the busiest tenth of the windows gives the latency at load


class HistoryError(BridgeError):
    """The history cannot say anything (no series, too little usable data); the message
    names what is missing."""


@dataclass(frozen=True, slots=True)
class Gap:
    """Consecutive unusable minutes ``[start, end)`` (unix s) and why."""

    start: float
    end: float
    reason: str

    @property
    def minutes(self) -> int:
        return int(round((self.end - self.start) / MINUTE_S))


@dataclass(frozen=True, slots=True)
class HistoryLoad:
    """The load built from a pool's history, and what it is based on."""

    workload: Workload
    trace: Trace  # the 10-minute windows (rate, cv), t = 0 at ``start_unix``
    start_unix: float  # real time of the workload's minute 0
    requested_minutes: int  # the range asked for
    usable_minutes: int
    gaps: tuple[Gap, ...]
    replica_rps: float
    replica_rps_source: str
    latency_s: float | None  # the e2e latency used by Little's law
    replicas_seen: int  # most replicas reporting in one minute
    policy_peak: float | None  # peak demand the policy's own signals gave, replicas
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def usable_fraction(self) -> float:
        return self.usable_minutes / max(1, self.requested_minutes)

    def describe(self) -> list[str]:
        """Lines for the operator: coverage, gaps, capacity, scale."""
        from datetime import UTC, datetime

        def ts(t: float) -> str:
            return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")

        w = self.workload
        end = self.start_unix + w.duration_s
        out = [
            f"history {ts(self.start_unix)} .. {ts(end)} UTC: {self.usable_minutes} usable minutes of "
            f"{self.requested_minutes} in the range asked ({100 * self.usable_fraction:.1f} %); "
            f"{w.minutes} minutes simulated, {sum(g.minutes for g in self.gaps)} bridged in {len(self.gaps)} gap(s)",
            f"per-replica capacity {self.replica_rps:.3f} req/s ({self.replica_rps_source}); "
            f"busiest 10-min window {w.peak_rate:.2f} req/s = {w.peak_replicas:.2f} replicas; "
            f"peak minute {float(w.load.max()):.2f} replicas; most replicas seen {self.replicas_seen}",
        ]
        if self.policy_peak is not None:
            out.append(
                f"cross-check: peak demand from the policy's own signals (running + waiting, KV usage) "
                f"{self.policy_peak:.2f} replicas"
            )
        for g in self.gaps[:10]:
            out.append(f"  gap {ts(g.start)} .. {ts(g.end)} ({g.minutes} min): {g.reason}")
        if len(self.gaps) > 10:
            out.append(f"  ... and {len(self.gaps) - 10} more gap(s)")
        out += [f"note: {n}" for n in self.notes]
        return out


def _minutes(h: RequestHistory) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Per step: completions, requests in the system, completeness, why incomplete, replicas."""
    n = h.steps
    comp = np.zeros(n)
    insys = np.zeros(n)
    ok = np.ones(n, dtype=bool)
    why = [""] * n
    seen = np.zeros(n, dtype=np.int64)
    run, wait, done = h.series.get("running", {}), h.series.get("waiting", {}), h.series.get("completed", {})
    replicas = sorted(set(run) | set(done))
    if not replicas:
        ok[:] = False
        return comp, insys, ok, ["no series"] * n, seen
    any_data = np.zeros(n, dtype=bool)
    expected = np.zeros(n, dtype=np.int64)
    missing: dict[int, list[str]] = {}
    for r in replicas:
        steps = set(run.get(r, {})) | set(done.get(r, {}))
        first, last = min(steps), max(steps)
        rr, ww, dd = run.get(r, {}), wait.get(r, {}), done.get(r, {})
        expected[first : last + 1] += 1
        for i in range(first, last + 1):
            has_g = i in rr and i in ww
            has_c = i in dd or i == first  # the first sample of a counter has no increase yet
            if has_g:
                insys[i] += rr[i] + ww[i]
                seen[i] += 1
                any_data[i] = True
            if i in dd:
                comp[i] += dd[i]
            if not (has_g and has_c):
                ok[i] = False
                missing.setdefault(i, []).append(r)
    for i, reps in missing.items():
        if len(reps) == expected[i] and expected[i] > 1:
            why[i] = f"none of the {expected[i]} replicas was scraped"
        else:
            why[i] = f"replica {reps[0]} did not report" + (f" (and {len(reps) - 1} more)" if len(reps) > 1 else "")
    for i in range(n):
        if not any_data[i]:
            ok[i] = False
            why[i] = why[i] or "no series"
    return comp, insys, ok, why, seen


def build_history_load(
    h: RequestHistory, target: TargetConfig, *, replica_rps: float | None = None, min_usable_s: float = MIN_USABLE_S,
    source: str = "",
) -> HistoryLoad:
    """The simulator's load from ``h`` (one step per minute); see the module docstring.
    Raises HistoryError when it cannot say anything."""
    if abs(h.step_s - MINUTE_S) > 1e-9:
        raise ValueError(f"history step must be {MINUTE_S:g} s, got {h.step_s:g}")
    if replica_rps is not None and not (replica_rps > 0 and math.isfinite(replica_rps)):
        raise ValueError(f"replica_rps: must be > 0, got {replica_rps!r}")
    comp, insys, ok, why, seen = _minutes(h)
    n = h.steps
    if not ok.any() and all(w == "no series" for w in why):
        raise HistoryError(
            f"pool {h.pool}: no series of vllm:num_requests_running / vllm:request_success_total "
            f"in the range (check the pool's model_name and prometheus_matchers, and the range)"
        )
    # minute i (step i's value) covers (t_i - 60, t_i]; arrivals need the step before it too
    usable = np.zeros(n, dtype=bool)
    usable[1:] = ok[1:] & ok[:-1]
    arr = np.zeros(n)
    arr[1:] = comp[1:] + insys[1:] - insys[:-1]
    arr = np.where(usable, np.maximum(arr, 0.0), 0.0)
    reasons = [why[i] or (why[i - 1] if i else "start of range") for i in range(n)]

    # minute start times; align the simulated span to whole windows of the clock
    mstart = h.start + (np.arange(n) - 1) * MINUTE_S
    idx = np.nonzero(usable)[0]
    requested = n - 1
    if idx.size == 0:
        raise HistoryError(f"pool {h.pool}: no usable minute in the range ({reasons[-1]})")
    k = int(round(WINDOW_S / MINUTE_S))
    first = idx[0]
    while (mstart[first] % WINDOW_S) > 1e-6:
        first += 1
    last = idx[-1] + 1  # exclusive
    while last > first and (mstart[last - 1] + MINUTE_S) % WINDOW_S > 1e-6:
        last -= 1
    n_use = int(usable[first:last].sum()) if last > first else 0
    if last - first < k or n_use * MINUTE_S < min_usable_s:
        raise HistoryError(
            f"pool {h.pool}: only {n_use * MINUTE_S / 3600:.1f} h of usable data in the range "
            f"({int(usable.sum())} usable minutes of {requested}); need at least {min_usable_s / 3600:g} h "
            f"to say what lending would have done (give a longer --since or --start/--end)"
        )
    counts = arr[first:last]  # arrivals per minute
    use = usable[first:last]
    rs = [reasons[i] for i in range(first, last)]
    m = counts.size

    # bridge the inner gaps: the higher of the mean of 10 usable minutes before and after
    gaps: list[Gap] = []
    filled = counts.copy()
    i = 0
    while i < m:
        if use[i]:
            i += 1
            continue
        j = i
        while j < m and not use[j]:
            j += 1
        before = counts[:i][use[:i]][-k:]
        after = counts[j:][use[j:]][:k]
        level = max(float(before.mean()) if before.size else 0.0, float(after.mean()) if after.size else 0.0)
        filled[i:j] = level
        gaps.append(Gap(float(mstart[first + i]), float(mstart[first + j]), rs[i]))
        i = j

    # 10-minute windows: rate and cv over the usable minutes (cv: the range's median if < 3)
    nw = m // k
    win = filled.reshape(nw, k)
    wuse = use.reshape(nw, k)
    rates = win.mean(axis=1) / MINUTE_S
    cvs = np.full(nw, np.nan)
    for w in range(nw):
        c = counts[w * k : (w + 1) * k][wuse[w]]
        if c.size >= 3 and c.mean() > 0:
            cvs[w] = math.sqrt(float(c.var(ddof=1)) / float(c.mean()))
    med = float(np.nanmedian(cvs)) if np.isfinite(cvs).any() else 1.0
    cvs = np.where(np.isfinite(cvs), cvs, med)

    # per-replica capacity
    notes: list[str] = []
    if h.ignored:
        notes.append(f"{len(h.ignored)} series of another model_name or namespace ignored (e.g. {h.ignored[0]})")
    latency = None
    if replica_rps is not None:
        rps, src = float(replica_rps), "--replica-rps"
    else:
        rps, src, latency = _little(h, target, first, last, use, rates, k)
    load = filled / MINUTE_S / rps
    start_unix = float(mstart[first])
    trace = Trace(
        tuple(float(x) for x in np.arange(nw) * WINDOW_S), tuple(float(x) for x in rates), tuple(float(x) for x in cvs),
        WINDOW_S, source,
    )
    peak_rate = float(rates.max())
    if peak_rate <= 0:
        raise HistoryError(f"pool {h.pool}: no request arrived in the usable part of the range: nothing to lend against")
    workload = Workload(
        load=np.ascontiguousarray(load, dtype=float), window_load=rates / rps, minute_s=MINUTE_S, window_s=WINDOW_S,
        scale=1.0, replica_rps=rps, peak_rate=peak_rate, peak_replicas=peak_rate / rps, source=source,
        usable=np.ascontiguousarray(use),
    )
    return HistoryLoad(
        workload=workload, trace=trace, start_unix=start_unix, requested_minutes=requested, usable_minutes=n_use,
        gaps=tuple(gaps), replica_rps=rps, replica_rps_source=src, latency_s=latency,
        replicas_seen=int(seen.max()) if seen.size else 0, policy_peak=_policy_peak(h, target, first, last),
        notes=tuple(notes),
    )


def _little(
    h: RequestHistory, target: TargetConfig, first: int, last: int, use: np.ndarray, rates: np.ndarray, k: int
) -> tuple[float, str, float]:
    c = target.concurrency_per_replica
    if c is None:
        raise HistoryError(
            f"pool {h.pool}: no per-replica capacity: target.concurrency_per_replica is null, so Little's law "
            f"cannot turn requests into replicas; pass --replica-rps"
        )
    s = _total(h.series.get("e2e_sum", {}), h.steps)
    cnt = _total(h.series.get("e2e_count", {}), h.steps)
    s, cnt = s[first:last], cnt[first:last]
    nw = rates.size
    order = np.argsort(rates)[::-1]
    busy = order[: max(1, int(math.ceil(BUSY_FRACTION * nw)))]
    tot_s = tot_c = 0.0
    for w in busy:
        sl = slice(w * k, (w + 1) * k)
        good = use[sl] & np.isfinite(s[sl]) & np.isfinite(cnt[sl])
        tot_s += float(s[sl][good].sum())
        tot_c += float(cnt[sl][good].sum())
    if not tot_c > 0 or not tot_s > 0:
        raise HistoryError(
            f"pool {h.pool}: no per-replica capacity: vllm:e2e_request_latency_seconds has no samples in the "
            f"busiest windows; pass --replica-rps"
        )
    lat = tot_s / tot_c
    return c / lat, (
        f"Little's law: concurrency target {c:g} / mean e2e latency {lat:.2f} s in the busiest "
        f"{len(busy)} of {nw} windows"
    ), lat


def _total(series: Mapping[str, Mapping[int, float]], n: int) -> np.ndarray:
    """Sum over replicas per step; NaN where no replica has a value."""
    out = np.full(n, np.nan)
    for vals in series.values():
        for i, v in vals.items():
            out[i] = v if math.isnan(out[i]) else out[i] + v
    return out


def _policy_peak(h: RequestHistory, target: TargetConfig, first: int, last: int) -> float | None:
    """Peak demand the policy's own gauges give (running + waiting over the concurrency
    target, KV usage over its target: the two default signals), for a cross-check."""
    best: float | None = None
    run = _total(h.series.get("running", {}), h.steps)
    wait = _total(h.series.get("waiting", {}), h.steps)
    kv = _total(h.series.get("kv", {}), h.steps)
    for i in range(max(first, 0), min(last + 1, h.steps)):
        vals = []
        if target.concurrency_per_replica and np.isfinite(run[i]) and np.isfinite(wait[i]):
            vals.append((run[i] + wait[i]) / target.concurrency_per_replica)
        if target.kv_cache_usage and np.isfinite(kv[i]):
            vals.append(kv[i] / target.kv_cache_usage)
        if vals:
            v = float(max(vals))
            best = v if best is None else max(best, v)
    return best


def trace_csv(trace: Trace) -> str:
    """The windows as a trace CSV (ServeGen columns; ``clients_active`` is 1: not measured)."""
    rows = [f"{t:.0f},{r:.6f},{c:.4f},1" for t, r, c in zip(trace.starts_s, trace.rates, trace.cvs)]
    return "\n".join([",".join(COLUMNS), *rows]) + "\n"
