"""Value types shared by observation, policy, actuation and the simulator.

Plain frozen data, no I/O: the adapters build these from the outside world (``observe``),
the policy reads them and returns a ``Plan``, the actuator carries the plan out. The
offline simulator builds the same types from its model, so the daemon, ``--dry-run`` and
``gpu-bridge simulate`` run the very same policy functions.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Phase(enum.StrEnum):
    """Where a node is in its lifecycle; recorded on the node itself (label + annotation).

    serving -> lending -> lent -> reclaiming -> returning -> serving
    """

    SERVING = "serving"  # Kubernetes serves on it; Slurm holds it (drained by gpu-bridge)
    LENDING = "lending"  # fenced in Kubernetes, serving replica being removed
    LENT = "lent"  # released to the Slurm preemptible partition
    RECLAIMING = "reclaiming"  # Slurm jobs being preempted with requeue
    RETURNING = "returning"  # unfenced in Kubernetes, waiting for a Ready serving replica


class Pin(enum.StrEnum):
    """An operator's override: the policy never moves a pinned node."""

    SERVING = "serving"
    SLURM = "slurm"


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
class PoolState:
    """One serving pool (one model's Deployment) as observed now."""

    name: str
    signals: LoadSignals | None  # newest sample; None = no sample at all
    history: tuple[LoadSignals, ...] = ()  # older samples, oldest first (forecast, stabilization)
    ready_replicas: int = 0  # Ready serving pods, from Kubernetes
    desired_replicas: int = 0  # the Deployment's spec.replicas


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
    requeueable: bool = True
    gpus_per_node: int = 4
    restart_count: int = 0


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node of a lending pool, joined from Kubernetes and Slurm."""

    name: str
    pool: str
    phase: Phase
    phase_since: float  # unix seconds when the current phase began
    gpus: int = 4
    pin: Pin | None = None
    serving_pods: int = 0  # pods of the pool's Deployment bound to this node
    serving_ready: bool = False  # one of them is Ready
    slurm_state: str = "unknown"  # idle | allocated | mixed | drained | draining | down | unknown
    jobs: tuple[str, ...] = ()  # research job ids running on the node
    # Fail closed: a node whose state could not be read or makes no sense (bad labels, an
    # administrator's drain, a lookup error) is held where it is and never lent.
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything the policy may look at, as of ``now``."""

    now: float
    nodes: tuple[NodeState, ...]
    pools: Mapping[str, PoolState]
    jobs: Mapping[str, SlurmJob] = field(default_factory=dict)
    pending_research_nodes: int = 0  # nodes' worth of research jobs waiting in the preempt partition


@dataclass(frozen=True, slots=True)
class Action:
    """One node to move, with a reason code (for metrics) and a sentence (for people)."""

    kind: ActionKind
    node: str
    pool: str
    reason: str  # a stable code, e.g. "low_forecast", "spike", "forecast_rise"
    detail: str  # "lend gpu-node-07: forecast peak 11.2 replicas over next 14 min < 13 serving - 1"


@dataclass(frozen=True, slots=True)
class PoolDecision:
    """Why the policy wants this many serving nodes in a pool."""

    pool: str
    demand_now: float | None  # replicas needed by the current load (None: signals missing/stale)
    forecast_peak: float | None  # replicas needed at the peak of the forecast horizon
    horizon_s: float
    serving_now: int  # nodes serving or on their way back (returning, reclaiming)
    desired_serving: int
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Plan:
    now: float
    actions: tuple[Action, ...]
    pools: tuple[PoolDecision, ...]
    held: Mapping[str, str] = field(default_factory=dict)  # node -> why it is not moved
