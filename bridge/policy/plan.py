"""The policy's entry point: ``plan(view, config) -> Plan``. Pure: no I/O, no logging, no clock.

Per pool (pools in name order), in units of whole nodes:

1. Hold what may not move (``Plan.held``): nodes with a ``problem``, a ``pin``, or in a
   transit phase (lending, reclaiming, returning: the actuator owns them).
2. ``serving_now`` = nodes serving or on their way back (serving, reclaiming, returning;
   a node with a problem counts only if its replica is Ready). Ready capacity = nodes with a
   Ready replica.
3. Demand now = the most demanding signal against its per-replica target
   (``policy.demand``); stale / missing / partial signals block lending; after
   ``blind_after_s`` with no valid sample, reclaim toward ``blind_serving``.
4. Floor = max(min_serving, calendar floor over the reclaim horizon).
5. Reclaim (immediate, no stabilization) when max(floor, nodes for the forecast peak over
   the reclaim horizon) exceeds ``serving_now``. Urgent ("spike": current demand above
   Ready capacity) ignores ``min_lend_s`` and may preempt jobs younger than
   ``min_runtime_s`` as a last resort; forecast-driven reclaims respect both.
6. Lend k nodes when the forecast over the *lend* horizon (reclaim
   horizon + ``min_lend_s``), the peak of the stabilization window and the calendar floor all
   fit in ``serving_now - k``; only with fresh, complete signals, a fully observed
   stabilization window and no capacity in transit.
7. Budgets: ``max_reclaims_per_tick`` (urgent pools first) and ``max_lends_per_tick``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from bridge.config import Config, PoolConfig
from bridge.model import (
    Action,
    ActionKind,
    ClusterView,
    HoldReason,
    NodeState,
    Phase,
    Pin,
    Plan,
    PoolDecision,
    PoolState,
    Reason,
)
from bridge.policy import calendar
from bridge.policy.calibrate import nodes_with_margin
from bridge.policy.demand import demand
from bridge.policy.forecast import Forecast, forecast, horizon_s, lend_horizon_s
from bridge.policy.victims import choose_victims

_TRANSIT = (Phase.LENDING, Phase.RECLAIMING, Phase.RETURNING)
_COMMITTED = (Phase.SERVING, Phase.RECLAIMING, Phase.RETURNING)


@dataclass(slots=True)
class _PoolWork:
    """A pool's wish before the per-tick budgets are applied."""

    cfg: PoolConfig
    decision: PoolDecision
    lendable: list[NodeState]  # best first
    lend_count: int
    lend_detail: str
    reclaimable: list[NodeState]
    reclaim_count: int
    reclaim_reason: Reason
    reclaim_detail: str
    urgent: bool
    allow_young: bool
    respect_min_lend: bool


def plan(view: ClusterView, config: Config) -> Plan:
    """Decide which nodes to lend and which to reclaim, as of ``view.now``.

    Same view and config -> same plan (no randomness, no clock, sorted iteration)."""
    now = view.now
    held: dict[str, str] = {}
    codes: dict[str, HoldReason] = {}
    known = {p.name for p in config.pools}
    by_pool: dict[str, list[NodeState]] = {p.name: [] for p in config.pools}
    for n in sorted(view.nodes, key=lambda n: n.name):
        if n.pool not in known:
            _hold(held, codes, n, HoldReason.UNKNOWN_POOL, f"pool {n.pool!r} is not in the config")
            continue
        by_pool[n.pool].append(n)
        if n.problem:
            _hold(held, codes, n, HoldReason.PROBLEM, n.problem)
        elif n.pin is not None:
            _hold(held, codes, n, HoldReason.PINNED, f"pinned to {n.pin.value}")
        elif n.phase in _TRANSIT:
            _hold(held, codes, n, HoldReason.IN_TRANSIT, f"{n.phase.value} for {now - n.phase_since:.0f} s")

    works = [
        _assess(view, config, cfg, by_pool[cfg.name], view.pools.get(cfg.name))
        for cfg in sorted(config.pools, key=lambda p: p.name)
    ]

    actions: list[Action] = []
    decisions: dict[str, PoolDecision] = {w.cfg.name: w.decision for w in works}
    # Reclaims first: urgent pools, then the rest, by name.
    budget = config.policy.max_reclaims_per_tick
    for w in sorted(works, key=lambda w: (not w.urgent, w.cfg.name)):
        if w.reclaim_count <= 0:
            continue
        want = w.reclaim_count
        take = min(want, budget)
        cands = w.reclaimable
        if w.respect_min_lend:
            cands = [n for n in cands if now - n.phase_since >= config.policy.min_lend_s]
        choice = choose_victims(
            cands,
            take,
            view.jobs,
            now,
            rule=config.policy.victims,
            min_runtime_s=config.slurm.min_runtime_s,
            allow_young=w.allow_young,
            grace_s=config.slurm.grace_s,
        )
        budget -= len(choice.nodes)
        for i, name in enumerate(choice.nodes):
            jobs = choice.jobs.get(name, ())
            actions.append(
                Action(
                    ActionKind.RECLAIM,
                    name,
                    w.cfg.name,
                    w.reclaim_reason,
                    f"reclaim {name}: {w.reclaim_detail}" + (f"; preempts {', '.join(jobs)}" if jobs else "; idle in Slurm"),
                    urgent=w.urgent,
                    jobs=jobs,
                    lost_gpu_hours=choice.lost_gpu_hours if i == 0 else 0.0,
                )
            )
        got = len(choice.nodes)
        if got < want:
            d = decisions[w.cfg.name]
            if take < want and got == take:
                why, text = Reason.RATE_LIMITED, f"{got} of {want} reclaims this tick (max_reclaims_per_tick)"
            elif choice.short_because_young:
                why = Reason.MIN_RUNTIME
                text = f"{got} of {want} reclaims: other lent nodes run jobs younger than {config.slurm.min_runtime_s:.0f} s"
            elif w.respect_min_lend and len(cands) < len(w.reclaimable):
                why = Reason.MIN_LEND_DURATION
                text = f"{got} of {want} reclaims: other lent nodes were lent < {config.policy.min_lend_s:.0f} s ago"
            else:
                why, text = Reason.NO_CANDIDATES, f"{got} of {want} reclaims: no other lent node may be reclaimed"
            if got == 0:
                decisions[w.cfg.name] = _replace(d, reason=why, detail=f"{d.detail}; {text}")
            else:
                decisions[w.cfg.name] = _replace(d, detail=f"{d.detail}; {text}")

    budget = config.policy.max_lends_per_tick
    for w in works:
        if w.lend_count <= 0:
            continue
        take = min(w.lend_count, budget, len(w.lendable))
        for n in w.lendable[:take]:
            actions.append(Action(ActionKind.LEND, n.name, w.cfg.name, Reason.LOW_FORECAST, f"lend {n.name}: {w.lend_detail}"))
        budget -= take
        if take < w.lend_count:
            d = decisions[w.cfg.name]
            decisions[w.cfg.name] = _replace(
                d,
                reason=Reason.RATE_LIMITED if take == 0 else d.reason,
                detail=f"{d.detail}; {take} of {w.lend_count} lends this tick (max_lends_per_tick)",
            )
    return Plan(
        now=now,
        actions=tuple(actions),
        pools=tuple(decisions[w.cfg.name] for w in works),
        held=held,
        hold_reasons=codes,
    )


def _hold(held: dict[str, str], codes: dict[str, HoldReason], n: NodeState, code: HoldReason, why: str) -> None:
    held[n.name] = f"{code.value}: {why}"
    codes[n.name] = code


def _replace(d: PoolDecision, **kw: object) -> PoolDecision:
    return replace(d, **kw)  # type: ignore[arg-type]


def _min(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"


def _assess(
    view: ClusterView,
    config: Config,
    cfg: PoolConfig,
    nodes: Sequence[NodeState],
    state: PoolState | None,
) -> _PoolWork:
    now = view.now
    pol = config.policy
    rpn = cfg.replicas_per_node

    cal = state.calibration if state is not None else None
    margin = cal.margin if cal is not None else None
    used: list[float] = []  # margins applied this tick (for the reason)
    unseen: list[float] = []  # spans that reached an hour not in the history yet

    def need(replicas: float, span_s: float = 0.0) -> int:
        """Nodes for a base forecast that must hold for ``span_s``: the calibrated margin for
        those hours, and the configured headroom as a floor."""
        n, m, hit_unseen = nodes_with_margin(replicas, cal, cfg, now, now + span_s)
        if hit_unseen:
            unseen.append(span_s)
        if m is not None:
            used.append(m)
        return n

    def margin_text() -> str:
        if cal is None:
            return f"+{cfg.headroom:.0%} +{cfg.headroom_replicas:g} headroom"
        floor = f"; floor +{cfg.headroom:.0%} +{cfg.headroom_replicas:g}" if cfg.headroom or cfg.headroom_replicas else ""
        new_hours = f"; an hour not yet in the history: at least the peak seen, {cal.peak_seen:.1f}" if unseen else ""
        return cal.describe(used[-1] if used else None) + floor + new_hours

    movable = [n for n in nodes if not n.problem and n.pin is None]
    serving_now = sum(1 for n in nodes if n.phase in _COMMITTED and (not n.problem or n.serving_ready))
    ready = sum(1 for n in nodes if n.phase in (Phase.SERVING, Phase.RETURNING) and n.serving_ready)
    lent_now = sum(1 for n in nodes if n.phase in (Phase.LENDING, Phase.LENT))
    in_transit = sum(1 for n in nodes if n.phase in (Phase.RECLAIMING, Phase.RETURNING))
    reclaimable = [n for n in movable if n.phase is Phase.LENT]
    lendable = sorted(
        (n for n in movable if n.phase is Phase.SERVING),
        key=lambda n: (n.serving_pods > 0, n.serving_ready, n.inflight if n.inflight is not None else float("inf"), n.name),
    )
    # The most nodes that could ever serve: everything not broken and not pinned to Slurm.
    reachable = sum(
        1
        for n in nodes
        if (not n.problem and n.pin is not Pin.SLURM) or (n.problem and n.phase in _COMMITTED and n.serving_ready)
    )

    h = horizon_s(config, cfg)
    lh = lend_horizon_s(config, cfg)
    if state is not None and state.horizon_s is not None and state.horizon_s > h:  # measured delays
        lh += state.horizon_s - h
        h = state.horizon_s
    cal_floor, cal_rule = calendar.floor(pol.calendar, cfg.name, now, now + h)
    cal_floor_lend, cal_rule_lend = calendar.floor(pol.calendar, cfg.name, now, now + lh)
    floor = max(cfg.min_serving, cal_floor)
    floor_lend = max(cfg.min_serving, cal_floor_lend)
    floor_c = min(floor, reachable)

    signals = state.signals if state is not None else None
    history = state.history if state is not None else ()
    cur = demand(signals, cfg.target)
    fc: Forecast = forecast(history, signals, now, config=config, pool=cfg)

    # Signal health, worst first.
    status: Reason | None = None
    status_text = ""
    if signals is None or cur.replicas is None:
        status, status_text = Reason.SIGNALS_MISSING, "no usable load signal"
    elif now - signals.t > pol.signal_max_age_s:
        status, status_text = Reason.SIGNALS_STALE, f"newest sample is {now - signals.t:.0f} s old > {pol.signal_max_age_s:.0f} s"
    elif cur.missing:
        status, status_text = Reason.SIGNALS_MISSING, f"missing {', '.join(cur.missing)}"
    elif signals.replicas_reporting < ready * rpn:
        status, status_text = (
            Reason.SIGNALS_PARTIAL,
            f"{signals.replicas_reporting} replicas reporting < {ready * rpn} Ready",
        )
    fresh = status is None
    demand_now = cur.replicas if (signals is not None and now - signals.t <= pol.signal_max_age_s) else None
    blind = fc.last_valid_t is None or now - fc.last_valid_t > pol.blind_after_s

    def decision(desired: int, reason: Reason, detail: str) -> PoolDecision:
        return PoolDecision(
            pool=cfg.name,
            demand_now=demand_now,
            forecast_peak=fc.peak,
            horizon_s=h,
            serving_now=serving_now,
            desired_serving=desired,
            reason=reason,
            detail=detail,
            ready_now=ready,
        )

    def work(
        d: PoolDecision,
        *,
        lend: int = 0,
        lend_detail: str = "",
        reclaim: int = 0,
        reason: Reason = Reason.STEADY,
        detail: str = "",
        urgent: bool = False,
        respect_min_lend: bool = True,
    ) -> _PoolWork:
        return _PoolWork(
            cfg, d, lendable, lend, lend_detail, reclaimable, reclaim, reason, detail, urgent, urgent, respect_min_lend
        )

    # --- the error-budget governor: the budget left cannot absorb one more incident -------
    # (first, blind or not: with a finite blind_serving only the governor takes lent nodes
    # back while the signals are missing; governor.gap_steps)
    gov = state.governor if state is not None else None
    budget_held = gov is not None and not gov.lend_allowed
    if gov is not None and budget_held and reclaimable:
        text = f"reclaim every lent node: {gov.describe()}"
        return work(
            decision(serving_now + len(reclaimable), Reason.SLO_BUDGET, text),
            reclaim=len(reclaimable),
            reason=Reason.SLO_BUDGET,
            detail=text,
            urgent=True,
            respect_min_lend=False,
        )

    # --- blind: no valid sample for too long -> back toward a safe serving count ---------
    if blind:
        target = cfg.blind_serving if cfg.blind_serving is not None else reachable
        desired = max(floor_c, min(target, reachable))
        text = f"no valid load sample for > {pol.blind_after_s:.0f} s ({status_text or 'none'}); serve {desired} of {reachable} nodes blind"
        if desired > serving_now:
            return work(
                decision(desired, Reason.SIGNALS_LOST, text),
                reclaim=desired - serving_now,
                reason=Reason.SIGNALS_LOST,
                detail=text,
                respect_min_lend=False,
            )
        return work(decision(serving_now, status or Reason.SIGNALS_MISSING, text))

    # --- reclaim side: immediate ---------------------------------------------------------
    known_load = [x for x in (demand_now, fc.peak, fc.recent_peak) if x is not None]
    if not known_load:  # only when blind_after_s exceeds the burst window
        return work(decision(serving_now, status or Reason.SIGNALS_MISSING, f"not lending: {status_text or 'no recent sample'}"))
    load = max(known_load)
    need_nodes = need(load, h)
    desired = max(floor_c, need_nodes)
    urgent = demand_now is not None and demand_now > ready * rpn
    if desired > serving_now:
        if urgent and need_nodes > serving_now:
            reason = Reason.SPIKE
            text = f"demand {demand_now:.1f} replicas ({cur.by}) > {ready * rpn} Ready; need {need_nodes} nodes, {serving_now} serving or returning"
        elif need_nodes > serving_now:
            reason = Reason.FORECAST_RISE
            text = (
                f"forecast peak {load:.1f} replicas over next {_min(h)} needs {need_nodes} nodes "
                f"({margin_text()}), {serving_now} serving or returning"
            )
        elif cal_floor > cfg.min_serving and floor_c > serving_now:
            reason = Reason.CALENDAR
            text = f"calendar rule {cal_rule} needs {floor_c} nodes serving within {_min(h)}, {serving_now} serving"
        else:
            reason = Reason.MIN_SERVING
            text = f"min_serving {cfg.min_serving} > {serving_now} serving"
        if not fresh:
            text += f" ({status_text})"
        count = min(desired, reachable) - serving_now
        if count <= 0:
            return work(decision(desired, Reason.NO_CANDIDATES, f"{text}; no lent node may be reclaimed"))
        return work(
            decision(desired, reason, text),
            reclaim=count,
            reason=reason,
            detail=text,
            urgent=urgent,
            respect_min_lend=reason is Reason.FORECAST_RISE,
        )

    # --- lend side: only on full, fresh information ---------------------------------------
    if not fresh:
        return work(decision(serving_now, status, f"not lending: {status_text}"))  # type: ignore[arg-type]
    if gov is not None and budget_held:
        return work(decision(serving_now, Reason.SLO_BUDGET, f"not lending: {gov.describe()}"))
    if cal is not None and margin is None:
        return work(
            decision(
                serving_now,
                Reason.CALIBRATING,
                f"not lending: {cal.samples} of {cal.needed} minutes of history to calibrate the margin on",
            )
        )
    lend_load = max(x for x in (demand_now, fc.lend_peak, fc.recent_peak) if x is not None)
    lend_need = need(lend_load, lh)
    floor_l = max(floor_lend, lend_need)
    if floor_l >= serving_now:
        if lend_need >= serving_now:
            return work(
                decision(
                    serving_now,
                    Reason.STEADY,
                    f"forecast peak {lend_load:.1f} replicas over next {_min(lh)} needs {lend_need} of {serving_now} serving nodes ({margin_text()})",
                )
            )
        if cal_floor_lend >= serving_now and cal_floor_lend > cfg.min_serving:
            return work(
                decision(serving_now, Reason.CALENDAR_NO_LEND, f"calendar rule {cal_rule_lend} forbids lending within {_min(lh)}")
            )
        return work(decision(serving_now, Reason.AT_FLOOR, f"min_serving {cfg.min_serving} = {serving_now} serving"))
    if not fc.stable:
        return work(
            decision(
                serving_now,
                Reason.STABILIZING,
                f"demand not observed low for the whole {pol.scale_down_window_s:.0f} s window",
            )
        )
    if in_transit:
        return work(decision(serving_now, Reason.CAPACITY_IN_TRANSIT, f"{in_transit} nodes on their way back to serving"))
    if pol.require_pending_jobs and view.pending_research_nodes <= 0:
        return work(decision(serving_now, Reason.NO_RESEARCH_DEMAND, "no research job waits in the preempt partition"))
    room = serving_now - floor_l
    if cfg.max_lent is not None:
        if lent_now >= cfg.max_lent:
            return work(decision(serving_now, Reason.MAX_LENT, f"{lent_now} lent = max_lent {cfg.max_lent}"))
        room = min(room, cfg.max_lent - lent_now)
    if not lendable:
        return work(decision(serving_now, Reason.NO_CANDIDATES, "no serving node may be lent (pinned or with a problem)"))
    k = min(room, len(lendable))
    text = (
        f"forecast peak {lend_load:.1f} replicas over next {_min(lh)} "
        f"({margin_text()}) needs {lend_need} < {serving_now} serving - {k}"
        if lend_need > floor_lend
        else f"forecast peak {lend_load:.1f} replicas over next {_min(lh)} ({margin_text()}) fits the floor of {floor_l}, "
        f"{serving_now} serving - {k}"
    )
    return work(decision(serving_now - k, Reason.LOW_FORECAST, text), lend=k, lend_detail=text)


def decisions_by_pool(p: Plan) -> Mapping[str, PoolDecision]:
    """Helper for callers: the plan's decisions keyed by pool name."""
    return {d.pool: d for d in p.pools}
