"""The adapters' contracts, in one place: what the daemon, the actuator, the dry-run and fenced
wrappers and the lab's fakes all implement or hold.

Each outside system has a read side and an intent-level write side (in the spirit of Slinky's
slurm-operator: the daemon asks for "drain this node for serving", "hold this node", never for
a command line or a raw patch). Every write is idempotent: True = a change was written, False =
it already was so. The real implementations are ``bridge.adapters.kube.client.KubeAdapter``,
``bridge.adapters.slurm.cli.CliSlurm``, ``bridge.adapters.prom.signals.PromAdapter`` and
``bridge.adapters.kube.lease.LeaderElector``; ``tests/contract/test_fake_parity.py`` runs the same
assertions against them and the fakes, so the two cannot drift.

The value types are imported for type checking only (``bridge.errors``, a leaf, at run time):
this module must be importable from the adapter packages themselves without a cycle.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from bridge.errors import AdapterError

if TYPE_CHECKING:
    from bridge.model import LoadSignals, Phase, Pin, WarmRecord

    from .kube.informer import InformerStatus
    from .kube.objects import DeploymentInfo, EvictOutcome, NodeInfo, PodInfo, ScaleInfo
    from .prom.types import DelayCount, PromPool, SignalsReading
    from .slurm.types import SlurmJobInfo, SlurmNode


# --- Kubernetes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolTarget:
    """Where one pool's nodes and serving replicas are. ``pod_selector`` None = the
    Deployment's own ``spec.selector.matchLabels``, read once at start; ``node_selector``
    None (or ``{gpu-bridge.io/pool: <name>}``) = nodes labelled with the pool's name."""

    name: str
    namespace: str
    deployment: str
    pod_selector: str | None = None
    node_selector: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class CacheStatus:
    """Is the watch cache fit to decide on? ``synced`` is all informers synced;
    ``last_event_age_s`` is the stalest informer's age (None = never heard from)."""

    synced: bool
    last_event_age_s: float | None
    informers: tuple[InformerStatus, ...] = ()


@runtime_checkable
class KubeReader(Protocol):
    """Watch-cache snapshots (one GET only where said)."""

    def cache_status(self) -> CacheStatus: ...

    def nodes(self) -> tuple[NodeInfo, ...]:
        """The pool nodes (label gpu-bridge.io/pool in the configured pools), sorted by name."""
        ...

    def node(self, name: str) -> NodeInfo | None: ...

    def pods(self, pool: str) -> tuple[PodInfo, ...]:
        """The serving pods of a pool's Deployment (terminating ones included)."""
        ...

    def deployment(self, pool: str) -> DeploymentInfo | None: ...

    def read_node(self, name: str) -> NodeInfo:
        """The node as the API server has it now (one GET; any node, not only the pools'):
        for the operator's commands, which must not act on a stale cache."""
        ...

    def read_scale(self, namespace: str, deployment: str) -> ScaleInfo:
        """The Deployment's scale subresource, read now (one GET)."""
        ...


@runtime_checkable
class KubeWriter(Protocol):
    """Idempotent writes with optimistic concurrency: True = a change was written."""

    def set_phase(self, node: str, phase: Phase, reason: str, since: float) -> bool: ...

    def set_request(self, node: str, request: str | None) -> bool:
        """An operator's lend/reclaim request on the node (None removes it)."""
        ...

    def set_pin(self, node: str, pin: Pin | None) -> bool:
        """An operator's pin on the node (None removes it)."""
        ...

    def fence(self, node: str) -> bool:
        """Cordon and taint the node so no serving pod lands on it while lent."""
        ...

    def unfence(self, node: str) -> bool: ...

    def set_pod_deletion_cost(self, namespace: str, pod: str, cost: int) -> bool: ...

    def set_warm(self, node: str, record: WarmRecord | None) -> bool:
        """Warm lending's record on the node (annotation); None removes it."""

    def set_pod_awake(self, namespace: str, pod: str, awake: bool) -> bool:
        """Warm lending's readiness-gate condition on a pod: False keeps it out of the Service."""

    def scale(self, namespace: str, deployment: str, replicas: int) -> bool: ...

    def evict(self, namespace: str, pod: str) -> EvictOutcome:
        """Through the Eviction API, so PodDisruptionBudgets are honoured."""
        ...

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None: ...


@runtime_checkable
class KubeAdapterProtocol(KubeReader, KubeWriter, Protocol):
    """Both sides, as the daemon holds them."""


# --- Slurm ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequeueOutcome:
    """What ``SlurmWriter.requeue_jobs`` did with one job: requeued, or not and why (``skipped``:
    it ended, Slurm requeued it, another run...), or ``error``: refused (a hold job) or Slurm's
    requeue failed."""

    job_id: str
    requeued: bool
    skipped: str = ""
    error: AdapterError | None = None


DrainOutcomes = dict[str, "bool | AdapterError"]
"""What ``SlurmWriter.drain_nodes`` did on each node: True drained, False already so (or an
administrator's drain or DOWN, left alone), or the error of its write."""

HoldOutcomes = dict[str, "str | AdapterError"]
"""What ``SlurmWriter.submit_holds`` did on each node: its hold's job id, or its sbatch's error."""
T = TypeVar("T")


def outcome(outcomes: Mapping[str, T | AdapterError], key: str) -> T:
    """``key``'s outcome of a call made for many (``DrainOutcomes``, ``HoldOutcomes``): its error raised."""
    got = outcomes[key]
    if isinstance(got, AdapterError):
        raise got
    return got


@runtime_checkable
class SlurmReader(Protocol):
    """Every lookup either answers or raises AdapterError: never an empty answer on failure."""

    def ping(self) -> None:
        """Raise AdapterError unless slurmctld answers."""
        ...

    def nodes(self, names: Iterable[str] | None = None) -> tuple[SlurmNode, ...]:
        """The named nodes (all if None), sorted by name; a named node Slurm does not know raises."""
        ...

    def node(self, name: str) -> SlurmNode: ...

    def clock(self) -> float:
        """slurmctld's current time (unix s): Slurm's own times are compared with it, not ours."""
        ...

    def grace_time_s(self, partition: str) -> float:
        """The partition's GraceTime in seconds, as slurmctld has it."""
        ...

    def jobs(
        self, *, partition: str | None = None, node: str | None = None, states: Iterable[str] | None = None
    ) -> tuple[SlurmJobInfo, ...]:
        """Active jobs (pending/running/completing...), filtered on the client side."""
        ...


@runtime_checkable
class SlurmWriter(Protocol):
    """Idempotent intents: True = a change was written, False = it already was so."""

    def drain(self, node: str, reason: str) -> bool:
        """DRAIN with a ``gpu-bridge:`` reason; never overwrites an administrator's drain."""
        ...

    def drain_nodes(self, reasons: Mapping[str, str]) -> DrainOutcomes:
        """``drain`` for each node (node -> reason), all read in one Slurm call right before the
        writes (a pass's drains); a failed read raises, and nothing is written."""
        ...

    def resume(self, node: str) -> bool:
        """Lift our drain; refuses (NotOursError) a drain we did not set."""
        ...

    def submit_hold(self, node: str) -> str:
        """The job id of our hold job on ``node`` (submitted unless one is already active)."""
        ...

    def submit_holds(self, nodes: Collection[str]) -> HoldOutcomes:
        """``submit_hold`` for each node, the holds there read first, all in one Slurm call (per
        list of 500 names) rather than one per node (a pass's holds: a mass reclaim's); a failed
        read raises, and nothing is submitted."""
        ...

    def cancel_hold(self, node: str) -> tuple[str, ...]:
        """Cancel our hold job(s) on ``node``; returns the ids cancelled (empty: none was there)."""
        ...

    def submit_mem_hold(self, node: str, mem_mb: int) -> str:
        """The job id of our memory hold on ``node`` (warm lending: 1 CPU, no GPU, ``mem_mb`` of
        host memory, in the warm partition), submitted unless one is already active."""
        ...

    def cancel_mem_hold(self, node: str) -> tuple[str, ...]:
        """Cancel our memory hold(s) on ``node``; returns the ids cancelled (empty: none was there)."""
        ...

    def requeue_jobs(self, jobs: Mapping[str, int | None]) -> dict[str, RequeueOutcome]:
        """Requeue research jobs Slurm preempted (never cancel them): ``jobs`` maps each id to the
        run that was preempted (its restart count; None: any). All are re-read right before, in one
        read: a job is requeued only if it still runs in a preempt partition with its preemption
        recorded, in that run, so a job that ended is never run again; a hold job is refused
        (NotOursError). One outcome per job: a failure of one never holds back the others."""
        ...

    def set_tier(self, node: str, partition: str) -> bool:
        """Make ``partition`` (the preempt or the fast one) the only tier partition of ``node``."""
        ...

    def release(self, job_id: str, reason: str) -> bool:
        """Release a job Slurm itself held with ``reason``; False if it is not held so."""
        ...

    def clear_own_drain(self, node: str, slurm_reason: str) -> bool:
        """Lift Slurm's own drain ``slurm_reason`` on a node with nothing allocated."""
        ...

    def take_over_drain(self, node: str, slurm_reason: str, reason: str) -> bool:
        """Replace Slurm's own drain ``slurm_reason`` on an empty node by our drain."""
        ...


@runtime_checkable
class SlurmAdapterProtocol(SlurmReader, SlurmWriter, Protocol):
    """Both sides, as the daemon holds them."""


# --- Prometheus -----------------------------------------------------------------------------


@runtime_checkable
class PromReader(Protocol):
    """Read only: the pool's load signals now, their history and its measured reclaims (to
    rebuild what a restart lost)."""

    def current(
        self, pool: PromPool, *, at: float | None = None, live_pods: Collection[str] | None = None
    ) -> SignalsReading: ...

    def history(self, pool: PromPool, *, start: float, end: float, step_s: float) -> tuple[LoadSignals, ...]: ...

    def reclaim_delays(self, pool: PromPool, *, window_s: float) -> tuple[DelayCount, ...]: ...

    def gpu_free(self, pool: PromPool, nodes: Collection[str], *, node_label: str, gpus: int,
                 pods: Mapping[str, str] | None = None) -> dict[str, float | None]: ...


class ReplicaReader(Protocol):
    """Read only: a pool's signals from its Ready pods themselves (``bridge.adapters.replicas``),
    for the ticks Prometheus cannot answer; AdapterError when any Ready pod cannot be read."""

    def read(self, pool: str, pods: Sequence[PodInfo], now: float) -> SignalsReading: ...


# --- the Lease ------------------------------------------------------------------------------


@runtime_checkable
class LeaseHolder(Protocol):
    """What a write fence needs: do we hold the Lease right now, and for long enough?"""

    @property
    def is_leader(self) -> bool: ...

    def hold_for(self, seconds: float) -> bool:
        """Leadership lasts at least ``seconds`` more (renewing first if needed)."""
        ...


@runtime_checkable
class Leader(LeaseHolder, Protocol):
    """Leader election as the daemon drives it: one non-blocking step per tick."""

    def try_acquire_or_renew(self) -> bool: ...

    def release(self) -> bool: ...


# --- vLLM's sleep mode (warm lending) --------------------------------------------------------


@runtime_checkable
class SleepControl(Protocol):
    """One vLLM server's sleep mode (``bridge.adapters.vllm.VllmSleepClient``): each call
    returns once vLLM has done it, and raises AdapterError on any other answer."""

    def sleep(self, level: int = 1) -> None:
        """Level 1: weights to host memory, KV cache discarded; level 2: both discarded."""
        ...

    def wake_up(self, tags: Collection[str] = ()) -> None:
        """Wake ``tags`` (``weights``, ``kv_cache``; empty: everything)."""
        ...

    def is_sleeping(self) -> bool: ...
