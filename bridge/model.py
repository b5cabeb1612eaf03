"""Value types shared by observation, policy, actuation and the simulator.

Plain frozen data, no I/O: the adapters build these from the outside world (``observe``),
the policy reads them and returns a ``Plan``, the actuator carries the plan out. The
offline simulator builds the same types from its model, so the daemon, ``--dry-run`` and
``gpu-bridge simulate`` run the very same policy functions. The reason codes (``Reason``,
``HoldReason``) are ``str`` enums, so comparing them with plain strings works.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime


class Phase(enum.StrEnum):
    """Where a node is in its lifecycle; recorded on the node itself (label + annotation).

    serving -> lending -> lent -> reclaiming -> returning -> serving
    """

    SERVING = "serving"  # Kubernetes serves on it; Slurm holds it (drained by gpu-bridge)
    LENDING = "lending"  # fenced in Kubernetes, serving replica being removed
    LENT = "lent"  # released to the Slurm preemptible partition
    RECLAIMING = "reclaiming"  # Slurm jobs being preempted with requeue
    RETURNING = "returning"  # unfenced in Kubernetes, waiting for a Ready serving replica


class WarmState(enum.StrEnum):
    """Warm lending's record on a node (annotation ``gpu-bridge.io/warm``: ``<state>/<pod>``)."""

    ASLEEP = "asleep"  # the replica was put to sleep (level 1): the node is lent warm
    AWAKE = "awake"  # woken at the reclaim: it serves again once its readiness gate is open
    COLD = "cold"  # sleep or wake failed, or the sleeping pod was lost: the cold path from here on


@dataclass(frozen=True, slots=True)
class WarmRecord:
    """Which replica warm lending put to sleep on a node, and how far it got."""

    state: WarmState
    pod: str

    def __str__(self) -> str:
        return f"{self.state}/{self.pod}"


class Pin(enum.StrEnum):
    """An operator's override: the policy never moves a pinned node."""

    SERVING = "serving"
    SLURM = "slurm"


class Reason(enum.StrEnum):
    """Stable reason codes of actions and pool decisions (metrics labels, tests, alerts)."""

    # actions
    LOW_FORECAST = "low_forecast"  # lend: forecast over the lend horizon fits without this node
    SPIKE = "spike"  # reclaim now: current demand exceeds Ready capacity (urgent)
    FORECAST_RISE = "forecast_rise"  # reclaim ahead of a forecast need (voluntary)
    MIN_SERVING = "min_serving"  # reclaim: below the pool's min_serving
    CALENDAR = "calendar"  # reclaim: a calendar rule needs the node serving soon
    SIGNALS_LOST = "signals_lost"  # reclaim toward blind_serving: no valid signal for too long
    # decisions that move nothing
    STEADY = "steady"  # serving matches the need
    AT_FLOOR = "at_floor"  # could lend, but min_serving / a calendar floor holds
    STABILIZING = "stabilizing"  # demand has not been low (or observed) for the whole window
    SIGNALS_STALE = "signals_stale"  # newest sample older than policy.signal_max_age_s
    SIGNALS_MISSING = "signals_missing"  # no sample, or a configured signal absent/NaN/negative
    SIGNALS_PARTIAL = "signals_partial"  # fewer replicas reporting than are Ready
    CALENDAR_NO_LEND = "calendar_no_lend"  # a calendar rule forbids lending over the horizon
    MAX_LENT = "max_lent"  # the pool's max_lent is reached
    NO_RESEARCH_DEMAND = "no_research_demand"  # require_pending_jobs and nothing waits
    CAPACITY_IN_TRANSIT = "capacity_in_transit"  # nodes of the pool are being reclaimed/returned
    RECENT_RETURN = "recent_return"  # a node returned to serving less than one reclaim horizon ago (policy.relend_dwell)
    MIN_LEND_DURATION = "min_lend_duration"  # reclaim wanted, every lent node is too recently lent
    MIN_RUNTIME = "min_runtime"  # reclaim wanted, remaining victims run jobs younger than min_runtime_s
    NO_CANDIDATES = "no_candidates"  # nothing that may be moved
    RATE_LIMITED = "rate_limited"  # max lends/reclaims per tick spent
    CALIBRATING = "calibrating"  # too little history to calibrate the safety margin: no lending yet
    MANUAL = "manual"  # an operator's request (gpu-bridge lend/reclaim)
    SLO_BUDGET = "slo_budget"  # the budget left cannot absorb one more incident: nothing lent, lent nodes reclaimed


class HoldReason(enum.StrEnum):
    """Why a node is left where it is, whatever the demand (``Plan.hold_reasons``)."""

    PROBLEM = "problem"  # NodeState.problem is set: fail closed
    PINNED = "pinned"  # an operator's pin
    IN_TRANSIT = "in_transit"  # lending / reclaiming / returning: the actuator owns it
    UNKNOWN_POOL = "unknown_pool"  # its pool is not in the config


class Tier(enum.StrEnum):
    """Which preemptible partition a lent node serves: a node is lent to one tier at a time.

    The fast tier (``slurm.fast_partition``, a GraceTime of seconds) is for jobs that
    checkpoint continuously or are short: its nodes come back sooner, so the policy may lend
    more of them and takes them back first on a surprise."""

    NORMAL = "normal"  # slurm.preempt_partition, slurm.grace_s
    FAST = "fast"  # slurm.fast_partition, slurm.fast_grace_s


class ReclaimMode(enum.StrEnum):
    """How a reclaimed node's replica came back: its reclaim delay differs by minutes."""

    WARM = "warm"  # the sleeping replica was woken (warm lending)
    COLD = "cold"  # a new replica cold-started (no warm lend, or its wake failed)


class ActionKind(enum.StrEnum):
    LEND = "lend"  # serving -> lending -> lent
    RECLAIM = "reclaim"  # lent -> reclaiming -> returning -> serving


@dataclass(frozen=True, slots=True)
class LoadSignals:
    """vLLM signals of one pool at one instant, summed over its replicas.

    ``None`` means the signal is missing (no series, NaN, scrape failed): never read as
    "no load". ``t`` is the time of the sample (Prometheus evaluation time, or the
    simulator's clock).
    """

    t: float
    running: float | None  # sum of vllm:num_requests_running
    waiting: float | None  # sum of vllm:num_requests_waiting
    kv_cache_usage_sum: float | None  # sum over replicas of vllm:kv_cache_usage_perc (0..1 each)
    tokens_per_s: float | None  # prompt + generation tokens per second, over the rate window
    replicas_reporting: int  # how many replicas the sums cover


@dataclass(frozen=True, slots=True)
class Calibration:
    """The pool's safety margin, calibrated on its own history (``bridge.policy.calibrate``).

    Capacity kept for a base forecast ``b`` replicas is ``margin * (b + smoothing) - smoothing``.
    ``margin`` is None while there is too little history (``samples < needed``): no lending.
    Rebuilt from history, never kept: the daemon recomputes it from Prometheus after a restart.
    """

    margin: float | None
    level: float  # quantile level of the score the margin is (1 - adjusted miss rate)
    samples: int  # scores (history steps) it rests on
    needed: int  # scores needed before lending
    spent: int  # realised violation steps in the window (demand above Ready replicas, avoidable)
    allowed: float  # violation steps the budget allows over the same window
    budget: float  # pools[].slo_budget
    horizon_s: float  # reclaim horizon the scores were taken over
    smoothing: float = 1.0  # replicas added to both sides of the score's ratio
    at: float = 0.0  # when it was computed (unix s)
    # margin by hour of the day (UTC hours of the steps; 24 values, inf = hour not seen yet),
    # or () = ``margin`` always
    by_hour: tuple[float, ...] = ()
    peak_seen: float = 0.0  # highest demand in the window (replicas): the floor for hours not seen yet
    pace: float = 1.0  # the governor's share of its usable budget left: the miss rate is scaled by it

    def margin_over(self, lo: float, hi: float) -> float | None:
        """The margin for capacity that must hold over [lo, hi] (unix s): the largest of the
        hours it touches (``margin`` when not calibrated by time of day); ``inf`` when one of
        them is not in the history yet."""
        if self.margin is None or not self.by_hour:
            return self.margin
        n = len(self.by_hour)
        k0, k1 = int(lo // 3600), int(hi // 3600)
        return max(self.by_hour[k % n] for k in range(k0, min(k1, k0 + n - 1) + 1))

    def describe(self, margin: float | None = None) -> str:
        """For reasons: the margin (the one used, if given) and the budget spent so far."""
        m = margin if margin is not None else self.margin
        shown = "none yet" if m is None else f"x{m:.2f}"
        paced = f"; paced x{self.pace:.2f} by the governor" if self.pace < 1.0 else ""
        return (
            f"calibrated margin {shown} (q{self.level:.4f} over {self.samples} min); "
            f"budget spent {self.spent} of {self.allowed:.1f} min ({self.budget:.2%}){paced}"
        )


@dataclass(frozen=True, slots=True)
class Governor:
    """The pool's SLO budget over a rolling window, as a hard cap (``bridge.policy.governor``).

    Nodes may stay lent only while what is left of the budget can absorb the worst incident
    they could cause from now (every lent node reclaimed at once, Ready one reclaim later):
    ``incident_min`` with the whole pool lent and a lend in progress; fewer nodes lent (fewer
    reclaim rounds) or none lending (no drain to wait for) cost less, hence ``cap``. Rebuilt
    from history, never kept."""

    spent_min: int  # avoidable violation minutes in the window (counted conservatively)
    budget_min: float  # slo_budget x the window's minutes
    incident_min: int  # minutes one incident can cost from now (the whole pool lent, a lend in progress)
    window_s: float
    # the most nodes that may be lent or lending when none is lending / when one is (None: all
    # or nothing, by ``incident_min``)
    keep_max: int | None = None
    lend_max: int | None = None
    # when held (no node may be lent): when one node's incident fits again as old violation
    # minutes leave the window, if no new one is counted (unix s; None: not held, or unknown yet)
    resume_t: float | None = None

    @property
    def left_min(self) -> float:
        return self.budget_min - self.spent_min

    @property
    def lend_allowed(self) -> bool:
        """The whole pool may be lent: one incident of every node fits what is left."""
        return self.left_min >= self.incident_min

    def cap(self, *, lending: bool) -> int | None:
        """The most nodes that may be lent (lent or lending) after this tick, with a lend in
        progress or not; None: no limit."""
        if self.lend_allowed:
            return None
        graded = self.lend_max if lending else self.keep_max
        return graded if graded is not None else 0

    def describe(self) -> str:
        """For reasons and ``status``: what is left, and whether lending is held."""
        head = f"budget left {max(self.left_min, 0.0):.1f} of {self.budget_min:.1f} min ({self.window_s / 86400:g} d)"
        if self.lend_allowed:
            return f"{head}; one incident would cost {self.incident_min} min"
        keep, lend = self.cap(lending=False), self.cap(lending=True)
        if keep:
            text = (f"{head}; lending capped: an incident of every node would cost {self.incident_min} min, "
                    f"so at most {lend} nodes lent while lending, {keep} otherwise")
        else:
            text = f"{head}; lending held: one incident would cost {self.incident_min} min"
        when = self.resume_utc
        if when is None:
            return text
        return f"{text}; new lends may resume {when}, as old violation minutes leave the window (if no new one)"

    @property
    def resume_utc(self) -> str | None:
        """``resume_t`` as shown to people (None: not held, or not known)."""
        return None if self.resume_t is None else datetime.fromtimestamp(self.resume_t, UTC).strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True, slots=True)
class PoolState:
    """One serving pool (one model's Deployment) as observed now."""

    name: str
    signals: LoadSignals | None  # newest sample; None = no sample at all
    history: tuple[LoadSignals, ...] = ()  # older samples, oldest first (forecast, stabilization)
    ready_replicas: int = 0  # Ready serving pods, from Kubernetes
    desired_replicas: int = 0  # the Deployment's spec.replicas
    calibration: Calibration | None = None  # None: uncalibrated (the configured headroom only)
    horizon_s: float | None = None  # reclaim horizon from measured delays; None: the configured one
    fast_horizon_s: float | None = None  # the same for fast-tier nodes (fast grace); None: the configured one
    governor: Governor | None = None  # the SLO budget as a hard cap; None: no governor
    # the samples of a gap in the signals that the source kept (Prometheus scraped on while
    # its queries failed), oldest first, read once the signals are back: the memory takes
    # them before ``signals``, so the governor's count of the gap is the real one
    recovered: tuple[LoadSignals, ...] = ()


# Seconds a lending node's serving pod may outlive the Deployment's scale-down before it is
# evicted instead (the ReplicaSet removed another pod). Here, not in the lifecycle, because
# the config's checks need it too.
EVICT_AFTER_S = 20.0

# Slurm job states (lowercase) in which a job holds its nodes: it has them allocated, is
# starting on them (configuring: prolog, node boot), being signalled right after a preemption
# (signaling), or is still cleaning up (completing, stage_out). The one list both the Slurm
# adapter and the join use.
JOB_STATES_HOLDING_NODES = frozenset(
    {"running", "completing", "configuring", "suspended", "stopped", "signaling", "stage_out", "resizing"}
)
# States in which a job holds no node: waiting (pending, being requeued, held) or ended (still
# listed for MinJobAge). A state in none of the three lists (one a later Slurm adds) is read as
# holding the nodes the job names (``holds_nodes``): never a free node by mistake.
JOB_STATES_WAITING = frozenset({"pending", "requeued", "requeue_hold", "requeue_fed", "resv_del_hold", "special_exit"})
JOB_STATES_ENDED = frozenset(
    {"completed", "cancelled", "failed", "timeout", "node_fail", "preempted", "boot_fail", "deadline", "out_of_memory", "revoked"}
)


def holds_nodes(state: str) -> bool:
    """Whether a job in Slurm state ``state`` (lowercase) holds the nodes it names."""
    return state in JOB_STATES_HOLDING_NODES or (state not in JOB_STATES_WAITING and state not in JOB_STATES_ENDED)


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """A research job as Slurm reports it (active jobs only: pending, running, completing)."""

    job_id: str
    name: str
    user: str
    partition: str
    state: str  # lowercase Slurm job state: "pending", "running", "completing", ...
    nodes: tuple[str, ...]  # expanded node names it holds (empty while pending)
    start_time: float | None  # unix seconds of the current run's start
    checkpoint_time: float | None = None  # published via comment "gpu-bridge:checkpoint=<t>"
    signal_save_s: float | None = None  # comment "gpu-bridge:save-on-signal=<s>": checkpoints on the signal in s
    requeueable: bool = True
    gpus_per_node: int = 4
    restart_count: int = 0


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node of a lending pool, joined from Kubernetes and Slurm."""

    name: str
    pool: str
    phase: Phase
    phase_since: float  # unix seconds when the current phase began (0.0: a node never moved, serving since before we knew it)
    gpus: int = 4
    pin: Pin | None = None
    serving_pods: int = 0  # pods of the pool's Deployment bound to this node
    serving_ready: bool = False  # one of them is Ready
    slurm_state: str = "unknown"  # idle | allocated | mixed | drained | draining | down | unknown
    jobs: tuple[str, ...] = ()  # research job ids running on the node
    # Fail closed: a node whose state could not be read or makes no sense (bad labels, an
    # administrator's drain, a lookup error) is held where it is and never lent.
    problem: str | None = None
    reason: str = ""  # why it is in its phase (annotation gpu-bridge.io/reason): for people, not the policy
    # running + waiting requests on the replica(s) of this node; None = unknown. Used only to
    # pick which serving node to lend (least in-flight work first).
    inflight: float | None = None
    tier: Tier = Tier.NORMAL  # the partition it is lent to (lending, lent, reclaiming); normal when unknown


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything the policy may look at, as of ``now``."""

    now: float
    nodes: tuple[NodeState, ...]
    pools: Mapping[str, PoolState]
    jobs: Mapping[str, SlurmJob] = field(default_factory=dict)
    pending_research_nodes: int = 0  # nodes' worth of research jobs waiting in the preempt partitions (both tiers)
    pending_fast_nodes: int = 0  # of those, waiting in the fast partition (slurm.fast_partition)


@dataclass(frozen=True, slots=True)
class Action:
    """One node to move, with a reason code (for metrics) and a sentence (for people)."""

    kind: ActionKind
    node: str
    pool: str
    reason: Reason  # a stable code, e.g. Reason.LOW_FORECAST
    detail: str  # "lend gpu-node-07: forecast peak 11.2 replicas over next 14 min < 13 serving - 1"
    urgent: bool = False  # a reclaim for load that exceeds Ready capacity now
    jobs: tuple[str, ...] = ()  # research jobs the reclaim preempts (all nodes of each)
    lost_gpu_hours: float = 0.0  # estimated work lost by those preemptions (first action carries it)
    tier: Tier = Tier.NORMAL  # a lend: the partition the node is released to


@dataclass(frozen=True, slots=True)
class PoolDecision:
    """Why the policy wants this many serving nodes in a pool."""

    pool: str
    demand_now: float | None  # replicas needed by the current load (None: signals missing/stale)
    forecast_peak: float | None  # replicas needed at the peak of the forecast horizon
    horizon_s: float
    serving_now: int  # nodes serving or on their way back (returning, reclaiming)
    desired_serving: int
    reason: Reason
    detail: str
    ready_now: int = 0  # nodes with a Ready serving replica


@dataclass(frozen=True, slots=True)
class Plan:
    now: float
    actions: tuple[Action, ...]
    pools: tuple[PoolDecision, ...]
    held: Mapping[str, str] = field(default_factory=dict)  # node -> why it is not moved (a sentence)
    hold_reasons: Mapping[str, HoldReason] = field(default_factory=dict)  # node -> why it is not moved (a code)
