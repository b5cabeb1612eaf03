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

The fast-grace tier (``slurm.fast_partition``): a node is lent to one tier at a time
(``NodeState.tier``, ``Action.tier``), and each lent node is planned with its tier's release
time. Nothing can serve sooner than the fast horizon (fast grace + cold start + ...), so
``serving_now`` must cover the forecast over it; a fast-tier node reclaimed later is still
back within the normal horizon, so ``serving_now`` + the fast-tier nodes lent must cover the
forecast over that one, and only that shortfall needs normal-tier victims. Every other
reclaim takes fast-tier nodes first. Lending: up to the fast-tier backlog
(``ClusterView.pending_fast_nodes``) goes to the fast tier, bounded by the fast horizon's
forecast; the rest to the normal tier, bounded by both. With no fast partition the plan is
exactly the single-tier one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bridge.config import Config, PoolConfig
from bridge.model import (
    Action,
    ActionKind,
    ClusterView,
    HoldReason,
    LoadSignals,
    NodeState,
    Phase,
    Pin,
    Plan,
    PoolDecision,
    PoolState,
    Reason,
    Tier,
)
from bridge.policy import calendar
from bridge.policy.calibrate import nodes_with_margin
from bridge.policy.demand import Demand, demand
from bridge.policy.forecast import Forecast, forecast, horizon_s, lend_horizon_s
from bridge.policy.victims import VictimChoice, choose_victims

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
    urgent: bool  # also: may preempt jobs younger than min_runtime_s, as a last resort
    respect_min_lend: bool
    lend_fast: int = 0  # of lend_count, lent to the fast tier (the first ones)
    reclaim_normal: int = 0  # of reclaim_count, that must be normal-tier nodes (the rest: fast first)
    tiered: bool = False  # slurm.fast_partition is set


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
        choice = _victims(w, cands, take, view, config)
        budget -= len(choice.nodes)
        for i, name in enumerate(choice.nodes):
            jobs = choice.jobs.get(name, ())
            what = f"; preempts {', '.join(jobs)}" if jobs else "; idle in Slurm"
            actions.append(Action(ActionKind.RECLAIM, name, w.cfg.name, w.reclaim_reason,
                                  f"reclaim {name}: {w.reclaim_detail}{what}", urgent=w.urgent, jobs=jobs,
                                  lost_gpu_hours=choice.lost_gpu_hours if i == 0 else 0.0))
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
            decisions[w.cfg.name] = _replace(d, reason=why if got == 0 else d.reason, detail=f"{d.detail}; {text}")

    budget = config.policy.max_lends_per_tick
    for w in works:
        if w.lend_count <= 0:
            continue
        take = min(w.lend_count, budget, len(w.lendable))
        for i, n in enumerate(w.lendable[:take]):
            tier = Tier.FAST if i < w.lend_fast else Tier.NORMAL
            actions.append(Action(ActionKind.LEND, n.name, w.cfg.name, Reason.LOW_FORECAST,
                                  f"lend {n.name}" + (f" to the {tier.value} tier" if w.tiered else "") + f": {w.lend_detail}",
                                  tier=tier))
        budget -= take
        if take < w.lend_count:
            d = decisions[w.cfg.name]
            decisions[w.cfg.name] = _replace(
                d,
                reason=Reason.RATE_LIMITED if take == 0 else d.reason,
                detail=f"{d.detail}; {take} of {w.lend_count} lends this tick (max_lends_per_tick)",
            )
    return Plan(now, tuple(actions), tuple(decisions[w.cfg.name] for w in works), held=held, hold_reasons=codes)


def _victims(w: _PoolWork, cands: Sequence[NodeState], take: int, view: ClusterView, config: Config) -> VictimChoice:
    """The reclaim's victims: with the fast tier, first the normal-tier nodes only they can
    replace (``reclaim_normal``), then the rest fast-tier first (back one normal grace sooner)."""

    def pick(nodes: Sequence[NodeState], count: int, fast_first: bool) -> VictimChoice:
        return choose_victims(nodes, count, view.jobs, view.now, rule=config.policy.victims,
                              min_runtime_s=config.slurm.min_runtime_s, allow_young=w.urgent,
                              grace_s=config.slurm.grace_s, fast_first=fast_first)

    if not w.tiered:
        return pick(cands, take, False)
    first = pick([n for n in cands if n.tier is Tier.NORMAL], min(w.reclaim_normal, take), False)
    if len(first.nodes) >= take:
        return first
    chosen = set(first.nodes)
    rest = pick([n for n in cands if n.name not in chosen], take - len(first.nodes), True)
    return VictimChoice(
        first.nodes + rest.nodes,
        {**first.jobs, **rest.jobs},
        first.lost_gpu_hours + rest.lost_gpu_hours,
        rest.short,
        rest.short_because_young,
    )


def _hold(held: dict[str, str], codes: dict[str, HoldReason], n: NodeState, code: HoldReason, why: str) -> None:
    held[n.name] = f"{code.value}: {why}"
    codes[n.name] = code


def _replace(d: PoolDecision, **kw: object) -> PoolDecision:
    return replace(d, **kw)  # type: ignore[arg-type]


def _min(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"


def _assess(
    view: ClusterView, config: Config, cfg: PoolConfig, nodes: Sequence[NodeState], state: PoolState | None
) -> _PoolWork:
    """One pool's wish: the first step that decides, in order of precedence."""
    c = _Tick(view, config, cfg, nodes, state)
    return _budget_reclaim(c) or _blind(c) or _reclaim(c) or _lend(c)


def _signal_health(signals: LoadSignals | None, cur: Demand, now: float, max_age_s: float, ready_replicas: int) -> tuple[Reason | None, str]:
    """Why the signals are not good enough to lend on, worst first (None: fresh and complete)."""
    if signals is None or cur.replicas is None:
        return Reason.SIGNALS_MISSING, "no usable load signal"
    if now - signals.t > max_age_s:
        return Reason.SIGNALS_STALE, f"newest sample is {now - signals.t:.0f} s old > {max_age_s:.0f} s"
    if cur.missing:
        return Reason.SIGNALS_MISSING, f"missing {', '.join(cur.missing)}"
    if signals.replicas_reporting < ready_replicas:
        return Reason.SIGNALS_PARTIAL, f"{signals.replicas_reporting} replicas reporting < {ready_replicas} Ready"
    return None, ""


class _Tick:
    """One pool's facts this tick, shared by the steps of ``_assess``. ``need`` records the
    margins it applied so that the reasons can name them."""

    def __init__(
        self, view: ClusterView, config: Config, cfg: PoolConfig, nodes: Sequence[NodeState], state: PoolState | None
    ) -> None:
        self.view, self.config, self.cfg, self.now, self.pol = view, config, cfg, view.now, config.policy
        self.rpn = cfg.replicas_per_node
        self.cal = state.calibration if state is not None else None
        self.gov = state.governor if state is not None else None
        self.used: list[float] = []  # margins applied this tick (for the reason)
        self.unseen: list[float] = []  # spans that reached an hour not in the history yet
        self._count(nodes)
        self._horizons(state)
        self._health(state)

    def _count(self, nodes: Sequence[NodeState]) -> None:
        movable = [n for n in nodes if not n.problem and n.pin is None]
        self.serving_now = sum(1 for n in nodes if n.phase in _COMMITTED and (not n.problem or n.serving_ready))
        self.ready = sum(1 for n in nodes if n.phase in (Phase.SERVING, Phase.RETURNING) and n.serving_ready)
        self.lent_now = sum(1 for n in nodes if n.phase in (Phase.LENDING, Phase.LENT))
        self.lending_now = sum(1 for n in nodes if n.phase is Phase.LENDING)
        self.in_transit = sum(1 for n in nodes if n.phase in (Phase.RECLAIMING, Phase.RETURNING))
        # when a node last entered serving (a return, or a lend given up): the no-thrash dwell
        self.last_return = max((n.phase_since for n in nodes if n.phase is Phase.SERVING), default=None)
        self.reclaimable = [n for n in movable if n.phase is Phase.LENT]
        # lent to the fast tier (lending ones too: back within the normal horizon after the drain)
        self.tiered = self.config.slurm.fast_partition is not None
        self.fast_lent = (
            sum(1 for n in movable if n.phase in (Phase.LENDING, Phase.LENT) and n.tier is Tier.FAST) if self.tiered else 0
        )
        self.lendable = sorted(
            (n for n in movable if n.phase is Phase.SERVING),
            key=lambda n: (n.serving_pods > 0, n.serving_ready, n.inflight if n.inflight is not None else float("inf"), n.name),
        )
        # The most nodes that could ever serve: everything not broken and not pinned to Slurm.
        self.reachable = sum(
            1
            for n in nodes
            if (not n.problem and n.pin is not Pin.SLURM) or (n.problem and n.phase in _COMMITTED and n.serving_ready)
        )

    def _horizons(self, state: PoolState | None) -> None:
        cfg, now = self.cfg, self.now

        def horizons(measured: float | None, fast: bool) -> tuple[float, float]:
            """Reclaim and lend horizons: the configured ones, both raised by a longer measured one."""
            h, lh = horizon_s(self.config, cfg, fast=fast), lend_horizon_s(self.config, cfg, fast=fast)
            return (measured, lh + (measured - h)) if measured is not None and measured > h else (h, lh)

        self.h, self.lh = horizons(state.horizon_s if state is not None else None, False)
        # the fast tier's horizons (the normal ones when there is no fast tier)
        self.hf, self.lhf = (self.h, self.lh) if not self.tiered else horizons(
            state.fast_horizon_s if state is not None else None, True)
        self.cal_floor, self.cal_rule = calendar.floor(self.pol.calendar, cfg.name, now, now + self.h)
        self.cal_floor_lend, self.cal_rule_lend = calendar.floor(self.pol.calendar, cfg.name, now, now + self.lh)
        self.floor_lend = max(cfg.min_serving, self.cal_floor_lend)
        self.floor_c = min(max(cfg.min_serving, self.cal_floor), self.reachable)

    def _health(self, state: PoolState | None) -> None:
        now, pol = self.now, self.pol
        signals = state.signals if state is not None else None
        self.cur = demand(signals, self.cfg.target)
        history = state.history if state is not None else ()
        self.fc: Forecast = forecast(history, signals, now, config=self.config, pool=self.cfg)
        self.fc_fast = (forecast(history, signals, now, config=self.config, pool=self.cfg, fast=True)
                        if self.tiered else self.fc)
        self.status, self.status_text = _signal_health(signals, self.cur, now, pol.signal_max_age_s, self.ready * self.rpn)
        self.fresh = self.status is None
        self.demand_now = self.cur.replicas if (signals is not None and now - signals.t <= pol.signal_max_age_s) else None
        self.blind = self.fc.last_valid_t is None or now - self.fc.last_valid_t > pol.blind_after_s

    def need(self, replicas: float, span_s: float = 0.0) -> int:
        """Nodes for a base forecast that must hold for ``span_s``: the calibrated margin for
        those hours, and the configured headroom as a floor."""
        n, m, hit_unseen = nodes_with_margin(replicas, self.cal, self.cfg, self.now, self.now + span_s)
        if hit_unseen:
            self.unseen.append(span_s)
        if m is not None:
            self.used.append(m)
        return n

    def margin_text(self) -> str:
        cfg, cal = self.cfg, self.cal
        if cal is None:
            return f"+{cfg.headroom:.0%} +{cfg.headroom_replicas:g} headroom"
        floor = f"; floor +{cfg.headroom:.0%} +{cfg.headroom_replicas:g}" if cfg.headroom or cfg.headroom_replicas else ""
        new_hours = f"; an hour not yet in the history: at least the peak seen, {cal.peak_seen:.1f}" if self.unseen else ""
        return cal.describe(self.used[-1] if self.used else None) + floor + new_hours

    def decision(self, desired: int, reason: Reason, detail: str) -> PoolDecision:
        return PoolDecision(self.cfg.name, self.demand_now, self.fc.peak, self.h, self.serving_now, desired, reason,
                            detail, ready_now=self.ready)

    def work(self, d: PoolDecision, *, lend: int = 0, lend_detail: str = "", reclaim: int = 0,
             reason: Reason = Reason.STEADY, detail: str = "", urgent: bool = False, respect_min_lend: bool = True,
             lend_fast: int = 0, reclaim_normal: int = 0) -> _PoolWork:
        return _PoolWork(
            self.cfg, d, self.lendable, lend, lend_detail, self.reclaimable, reclaim, reason, detail, urgent, respect_min_lend,
            lend_fast, reclaim_normal, self.tiered,
        )

    def hold(self, reason: Reason, detail: str) -> _PoolWork:
        """Keep the serving count as it is."""
        return self.work(self.decision(self.serving_now, reason, detail))

    def reclaim(self, desired: int, count: int, reason: Reason, text: str, *, urgent: bool = False,
                respect_min_lend: bool = True, reclaim_normal: int = 0) -> _PoolWork:
        """Take ``count`` lent nodes back toward ``desired`` serving nodes; ``text`` says why."""
        return self.work(self.decision(desired, reason, text), reclaim=count, reason=reason, detail=text, urgent=urgent,
                         respect_min_lend=respect_min_lend, reclaim_normal=reclaim_normal)


def _budget_reclaim(c: _Tick) -> _PoolWork | None:
    """The error-budget governor: the budget left cannot absorb the incident the nodes lent
    could cause; back to what it can (``Governor.cap``), every lent node when not one. First,
    blind or not: with a finite blind_serving only the governor takes lent nodes back while
    the signals are missing (governor.gap_steps)."""
    gov = c.gov
    cap = gov.cap(lending=c.lending_now > 0) if gov is not None else None
    if gov is None or cap is None or c.lent_now <= cap or not c.reclaimable:
        return None
    count = min(len(c.reclaimable), c.lent_now - cap)
    what = "every lent node" if count == len(c.reclaimable) else f"{count} of {c.lent_now} lent nodes"
    text = f"reclaim {what}: {gov.describe()}"
    return c.reclaim(c.serving_now + count, count, Reason.SLO_BUDGET, text, urgent=True, respect_min_lend=False)


def _blind(c: _Tick) -> _PoolWork | None:
    """No valid sample for too long: back toward a safe serving count."""
    if not c.blind:
        return None
    target = c.cfg.blind_serving if c.cfg.blind_serving is not None else c.reachable
    desired = max(c.floor_c, min(target, c.reachable))
    text = f"no valid load sample for > {c.pol.blind_after_s:.0f} s ({c.status_text or 'none'}); serve {desired} of {c.reachable} nodes blind"
    if desired > c.serving_now:
        return c.reclaim(desired, desired - c.serving_now, Reason.SIGNALS_LOST, text, respect_min_lend=False)
    return c.hold(c.status or Reason.SIGNALS_MISSING, text)


def _reclaim(c: _Tick) -> _PoolWork | None:
    """Reclaim, immediately, when the floor or the forecast peak over the reclaim horizon
    needs more than is serving."""
    known_load = [x for x in (c.demand_now, c.fc.peak, c.fc.recent_peak) if x is not None]
    if not known_load:  # only when blind_after_s exceeds the burst window
        return c.hold(c.status or Reason.SIGNALS_MISSING, f"not lending: {c.status_text or 'no recent sample'}")
    load = max(known_load)
    need_nodes = c.need(load, c.h)
    normal_short = 0
    if c.tiered:
        # serving must cover the fast horizon; serving + fast-tier lent the normal one
        load_f = max(x for x in (c.demand_now, c.fc_fast.peak, c.fc_fast.recent_peak) if x is not None)
        need_f = c.need(load_f, c.hf)
        normal_short = max(0, need_nodes - c.fast_lent - c.serving_now)
        need_nodes = max(need_f, need_nodes - c.fast_lent)
    desired = max(c.floor_c, need_nodes)
    if desired <= c.serving_now:
        return None
    urgent = c.demand_now is not None and c.demand_now > c.ready * c.rpn
    if urgent and need_nodes > c.serving_now:
        reason = Reason.SPIKE
        text = f"demand {c.demand_now:.1f} replicas ({c.cur.by}) > {c.ready * c.rpn} Ready; need {need_nodes} nodes, {c.serving_now} serving or returning"
    elif need_nodes > c.serving_now:
        reason = Reason.FORECAST_RISE
        text = (
            f"forecast peak {load:.1f} replicas over next {_min(c.h)} needs {need_nodes} nodes "
            f"({c.margin_text()}), {c.serving_now} serving or returning"
        )
    elif c.cal_floor > c.cfg.min_serving and c.floor_c > c.serving_now:
        reason = Reason.CALENDAR
        text = f"calendar rule {c.cal_rule} needs {c.floor_c} nodes serving within {_min(c.h)}, {c.serving_now} serving"
    else:
        reason = Reason.MIN_SERVING
        text = f"min_serving {c.cfg.min_serving} > {c.serving_now} serving"
    if not c.fresh:
        text += f" ({c.status_text})"
    count = min(desired, c.reachable) - c.serving_now
    if count <= 0:
        return c.work(c.decision(desired, Reason.NO_CANDIDATES, f"{text}; no lent node may be reclaimed"))
    if c.fast_lent:
        text += f" (+{c.fast_lent} fast-tier lent, back within {_min(c.hf)})"
    return c.reclaim(desired, count, reason, text, urgent=urgent, respect_min_lend=reason is Reason.FORECAST_RISE,
                     reclaim_normal=min(normal_short, count))


def _lend(c: _Tick) -> _PoolWork:
    """Lend only on full, fresh information, what the forecast over the lend horizon leaves."""
    if not c.fresh:
        return c.hold(c.status, f"not lending: {c.status_text}")  # type: ignore[arg-type]
    cap = c.gov.cap(lending=True) if c.gov is not None else None
    if c.gov is not None and cap is not None and c.lent_now >= cap:
        return c.hold(Reason.SLO_BUDGET, f"not lending: {c.gov.describe()}")
    if c.cal is not None and c.cal.margin is None:
        return c.hold(Reason.CALIBRATING, f"not lending: {c.cal.samples} of {c.cal.needed} minutes of history to calibrate the margin on")
    lend_load = max(x for x in (c.demand_now, c.fc.lend_peak, c.fc.recent_peak) if x is not None)
    lend_need = c.need(lend_load, c.lh)
    floor_l = max(c.floor_lend, lend_need)
    room_fast = 0
    if c.tiered:
        room_fast, room_normal = _tier_room(c, floor_l)
        if room_fast + room_normal <= 0:
            return _no_room(c, lend_load, lend_need)
    elif floor_l >= c.serving_now:
        return _no_room(c, lend_load, lend_need)
    blocked = _lend_blocked(c)
    if blocked is not None:
        return blocked
    room = room_fast + room_normal if c.tiered else c.serving_now - floor_l
    if c.cfg.max_lent is not None:
        room = min(room, c.cfg.max_lent - c.lent_now)
    if cap is not None:
        room = min(room, cap - c.lent_now)
    k = min(room, len(c.lendable))
    k_fast = min(k, room_fast)
    fc_text = f"forecast peak {lend_load:.1f} replicas over next {_min(c.lh)}"
    text = (
        f"{fc_text} ({c.margin_text()}) needs {lend_need} < {c.serving_now} serving - {k}"
        if lend_need > c.floor_lend
        else f"{fc_text} ({c.margin_text()}) fits the floor of {floor_l}, {c.serving_now} serving - {k}"
    )
    if c.tiered:
        text += f"; {k_fast} to the fast tier ({c.view.pending_fast_nodes} nodes of fast-tier jobs wait, {c.fast_lent} lent)"
    return c.work(c.decision(c.serving_now - k, Reason.LOW_FORECAST, text), lend=k, lend_detail=text, lend_fast=k_fast)


def _tier_room(c: _Tick, floor_l: int) -> tuple[int, int]:
    """Nodes to lend to the fast and to the normal tier. Every lend is bounded by the fast
    tier's (shorter) lend horizon; the normal-tier ones also by the normal horizon, with the
    fast-tier nodes lent counted as back in time. The fast tier gets the backlog's fast share
    of the lent nodes: the more of the waiting work is fast-tier, the more may be lent."""
    load_f = max(x for x in (c.demand_now, c.fc_fast.lend_peak, c.fc_fast.recent_peak) if x is not None)
    room_all = c.serving_now - max(c.floor_lend, c.need(load_f, c.lhf))
    cap_normal = c.serving_now + c.fast_lent - floor_l
    total = c.view.pending_research_nodes
    share = min(1.0, c.view.pending_fast_nodes / total) if total > 0 else 0.0
    for k in range(room_all, 0, -1):
        k_fast = max(0, min(k, math.ceil(share * (c.lent_now + k) - 1e-9) - c.fast_lent))
        if k - k_fast <= cap_normal:
            return k_fast, k - k_fast
    return 0, 0


def _no_room(c: _Tick, lend_load: float, lend_need: int) -> _PoolWork:
    """The forecast, the calendar or min_serving needs every serving node over the lend horizon."""
    if lend_need >= c.serving_now:
        return c.hold(
            Reason.STEADY,
            f"forecast peak {lend_load:.1f} replicas over next {_min(c.lh)} needs {lend_need} of {c.serving_now} serving nodes ({c.margin_text()})",
        )
    if c.cal_floor_lend >= c.serving_now and c.cal_floor_lend > c.cfg.min_serving:
        return c.hold(Reason.CALENDAR_NO_LEND, f"calendar rule {c.cal_rule_lend} forbids lending within {_min(c.lh)}")
    return c.hold(Reason.AT_FLOOR, f"min_serving {c.cfg.min_serving} = {c.serving_now} serving")


def _lend_blocked(c: _Tick) -> _PoolWork | None:
    """There is room to lend, but not now: unstable demand, capacity in transit, a node back
    from a reclaim less than one reclaim horizon ago (``relend_dwell``: the demand that took it
    back has not yet been low for as long as the next reclaim would take), no research demand,
    max_lent reached or no node that may be lent."""
    if not c.fc.stable:
        return c.hold(Reason.STABILIZING, f"demand not observed low for the whole {c.pol.scale_down_window_s:.0f} s window")
    if c.in_transit:
        return c.hold(Reason.CAPACITY_IN_TRANSIT, f"{c.in_transit} nodes on their way back to serving")
    if c.pol.relend_dwell and c.last_return is not None and c.now - c.last_return < c.h:
        return c.hold(
            Reason.RECENT_RETURN,
            f"a node returned to serving {_min(c.now - c.last_return)} ago < one reclaim horizon ({_min(c.h)}): no re-lend yet",
        )
    if c.pol.require_pending_jobs and c.view.pending_research_nodes <= 0:
        return c.hold(Reason.NO_RESEARCH_DEMAND, "no research job waits in the preempt partition")
    if c.cfg.max_lent is not None and c.lent_now >= c.cfg.max_lent:
        return c.hold(Reason.MAX_LENT, f"{c.lent_now} lent = max_lent {c.cfg.max_lent}")
    if not c.lendable:
        return c.hold(Reason.NO_CANDIDATES, "no serving node may be lent (pinned or with a problem)")
    return None
