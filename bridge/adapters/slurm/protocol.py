"""The Slurm adapter's contract, split into a read side and an intent-level write side (in
the spirit of Slinky's slurm-operator: the daemon asks for "drain this node for serving",
"hold this node", never for a command line). The CLI backend is ``CliSlurm``; another backend
(slurmrestd, pyslurm) implements the same two Protocols."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from .types import SlurmJobInfo, SlurmNode


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

    def jobs(
        self, *, partition: str | None = None, node: str | None = None, states: Iterable[str] | None = None
    ) -> tuple[SlurmJobInfo, ...]:
        """Active jobs (pending/running/completing...), filtered on the client side."""
        ...

    def holds(self) -> dict[str, SlurmJobInfo]:
        """node -> our active hold job there (partition + name prefix)."""
        ...


@runtime_checkable
class SlurmWriter(Protocol):
    """Idempotent intents: True = a change was written, False = it already was so."""

    def drain(self, node: str, reason: str) -> bool:
        """DRAIN with a ``gpu-bridge:`` reason; never overwrites an administrator's drain."""
        ...

    def resume(self, node: str) -> bool:
        """Lift our drain; refuses (NotOursError) a drain we did not set."""
        ...

    def submit_hold(self, node: str) -> str:
        """The job id of our hold job on ``node`` (submitted unless one is already active)."""
        ...

    def cancel_hold(self, node: str) -> tuple[str, ...]:
        """Cancel our hold job(s) on ``node``; returns the ids cancelled."""
        ...

    def requeue(self, job_id: str) -> bool:
        """Requeue a running research job (never cancel it); False if it is not running."""
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


class SlurmAdapterProtocol(SlurmReader, SlurmWriter, Protocol):
    """Both sides, as the daemon holds them."""
