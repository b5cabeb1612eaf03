"""The wrappers the daemon puts around its adapters, both systems side by side.

``FencedKube`` / ``FencedSlurm``: reads pass through, every write first checks that this
instance still holds the Lease: a daemon whose Lease lapsed in the middle of a step (renewals
failing past the renew deadline) cannot write even if its loop has not noticed yet. (A dry run
needs no wrapper: the daemon never applies what it decides.)

Each implements the same Protocols (``bridge.adapters.protocols``) as what it wraps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from bridge.errors import AdapterError

from .protocols import (
    KubeAdapterProtocol, KubeReader, KubeWriter, LeaseHolder, SlurmAdapterProtocol, SlurmReader, SlurmWriter,
)


class NotLeaderError(AdapterError):
    """A write was refused because this instance does not hold the Lease (any more)."""

    def __init__(self, write: str, system: str = "kubernetes", why: str = "Lease lost or not renewed in time") -> None:
        super().__init__(system, f"{write} refused: not the leader ({why})")


def lease_fence(leader: LeaseHolder) -> Callable[[Sequence[str], float], None]:
    """The check a Slurm adapter runs right before each command that changes Slurm: the
    leadership must last the command's whole timeout (renewed first if it would not), so a
    write of several commands cannot land after a standby took over half-way."""

    def check(argv: Sequence[str], timeout_s: float) -> None:
        if not leader.hold_for(timeout_s):
            write = " ".join(argv[:2])
            raise NotLeaderError(write, system="slurm", why=f"the Lease does not hold for the {timeout_s:g} s it may take")

    return check


# --- the write fence ------------------------------------------------------------------------


def _methods(protocol: type) -> list[str]:
    """The methods ``protocol`` declares itself (not its bases')."""
    return [name for name, member in vars(protocol).items() if not name.startswith("_") and callable(member)]


def _through(name: str, *, fenced: bool) -> Callable[..., Any]:
    """The wrapper's method ``name``: the wrapped adapter's, after the Lease check if ``fenced``."""

    def method(self: _Fenced, *args: Any, **kwargs: Any) -> Any:
        if fenced and not self._leader.is_leader:
            raise NotLeaderError(name, self.system)
        return getattr(self._inner, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


class _Fenced:
    """Every read is the wrapped adapter's; every write (a method of the write Protocol) raises
    NotLeaderError unless ``leader.is_leader`` right before it. The methods are made from the
    Protocols (``reader``, ``writer``) when a subclass is defined, so a write added to a
    Protocol is fenced here without a line of its own, and cannot pass through unfenced."""

    system: ClassVar[str]

    def __init__(self, inner: Any, leader: LeaseHolder) -> None:
        self._inner = inner
        self._leader = leader

    def __init_subclass__(cls, *, reader: type, writer: type, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _methods(reader):
            setattr(cls, name, _through(name, fenced=False))
        for name in _methods(writer):
            setattr(cls, name, _through(name, fenced=True))

    if TYPE_CHECKING:  # the methods made above, as mypy sees them (the Protocols are checked where they are used)

        def __getattr__(self, name: str) -> Any: ...


class FencedKube(_Fenced, reader=KubeReader, writer=KubeWriter):
    system = "kubernetes"

    def __init__(self, inner: KubeAdapterProtocol, leader: LeaseHolder) -> None:
        super().__init__(inner, leader)


class FencedSlurm(_Fenced, reader=SlurmReader, writer=SlurmWriter):
    system = "slurm"

    def __init__(self, inner: SlurmAdapterProtocol, leader: LeaseHolder) -> None:
        super().__init__(inner, leader)
