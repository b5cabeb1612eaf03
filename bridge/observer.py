"""The loop's read side: one pass over the three systems, nothing written, nothing remembered.

Each ``read`` is the Kubernetes watch cache, one ``sinfo``/``squeue`` and one Prometheus query
per pool (and, at the first answer after a query outage, one range query of the gap; and
while a node returns asleep in a pool with ``wake_gpu_free_mib``, one query of its GPUs; when a
query fails and ``prometheus.direct_fallback`` is on, the pool's Ready pods' own ``/metrics``
instead). A system that cannot be read is a ``None`` (Slurm) or a missing reading (Prometheus)
in the ``Snapshot``, and named in ``errors``: ``bridge.observe.join`` then holds what it cannot
see, and the daemon counts the error. ``outlook`` is the one read apart from it: the metrics'
range queries, made every ``OUTLOOK_STEP_S`` and only while metrics are served."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge import logs
from bridge.adapters.prom.types import PromPool
from bridge.adapters.protocols import KubeAdapterProtocol, PromReader, ReplicaReader, SlurmAdapterProtocol
from bridge.config import Config, PoolConfig
from bridge.errors import AdapterError
from bridge.model import Calibration, Governor, LoadSignals, Phase, SlurmJob, WarmState
from bridge.observe import KubeNode, Readings, Snapshot, SlurmNodeLike
from bridge.policy.outlook import OUTLOOK_HOURS, OUTLOOK_STEP_S, HourOutlook, lendable_outlook, outlook_span_s

if TYPE_CHECKING:
    from bridge.adapters.kube.objects import PodInfo

log = logs.get(__name__)


def needs_slurm_clock(kube_nodes: Sequence[KubeNode], jobs: Sequence[SlurmJob]) -> bool:
    """slurmctld's clock is compared only with a preemption's time (the grace, ``past_grace``)
    and a fresh drain's (its state save, in ``returning``): read (``sdiag``) only while a job
    was preempted or a node is on its way back, so a steady tick is one ``sinfo`` and one ``squeue``."""
    return (any(getattr(j, "preempt_time", None) is not None for j in jobs)
            or any(n.phase in (Phase.RECLAIMING, Phase.RETURNING) for n in kube_nodes))


@dataclass
class Observer:
    config: Config
    kube: KubeAdapterProtocol
    slurm: SlurmAdapterProtocol
    prom: PromReader
    prom_pools: Mapping[str, PromPool]
    # the pools' pods read directly when a Prometheus query fails (``prometheus.direct_fallback``)
    replicas: ReplicaReader | None = None

    def read(self, now: float, since: Mapping[str, float] | None = None) -> Snapshot:
        """One pass over the three systems. ``since``: pool -> its newest sample in the policy
        memory; a valid reading after a gap of more than two ticks brings the gap's samples
        Prometheus kept (``recovered``: one range query, made only then)."""
        errors: list[str] = []
        kube_nodes = self.kube.nodes()
        pods = {p.name: self.kube.pods(p.name) for p in self.config.pools}
        desired: dict[str, int] = {}
        pool_problems: dict[str, str] = {}
        for p in self.config.pools:
            dep = self.kube.deployment(p.name)
            if dep is not None:
                desired[p.name] = dep.replicas
                if dep.problem:
                    pool_problems[p.name] = f"deployment {p.namespace}/{p.deployment}: {dep.problem}"
        slurm_nodes: Sequence[SlurmNodeLike] | None = None
        slurm_jobs: Sequence[SlurmJob] | None = None
        slurm_now: float | None = None
        try:
            slurm_nodes, slurm_jobs = self.slurm.nodes(), self.slurm.jobs()
            if needs_slurm_clock(kube_nodes, slurm_jobs):
                slurm_now = self.slurm.clock()  # after both reads: no time of theirs is later than it
        except AdapterError as exc:
            log.warning("slurm_unavailable", error=str(exc))
            errors.append("slurm")
            slurm_nodes = slurm_jobs = None
        readings: dict[str, Readings] = {}
        for p in self.config.pools:
            try:
                # the pool's pods as Kubernetes knows them: a stale series of a pod deleted
                # during a Prometheus outage is then dropped instead of blocking lending
                r = self.prom.current(self.prom_pools[p.name], live_pods={pod.name for pod in pods[p.name]})
                last = (since or {}).get(p.name)
                recovered = self._recovered(p, last, r.signals.t) if r.signals is not None and last is not None else ()
                readings[p.name] = Readings(r.signals, r.problem, r.inflight_by_pod, recovered)
            except AdapterError as exc:
                errors.append("prometheus")
                log.warning("prometheus_unavailable", pool=p.name, error=str(exc))
                readings[p.name] = self._direct(p, pods[p.name], now, str(exc), errors)
        gpu_free = self._gpu_free(kube_nodes, errors)
        return Snapshot(now, kube_nodes, pods, desired, pool_problems, slurm_nodes, slurm_jobs, slurm_now,
                        readings, tuple(errors), gpu_free)

    def _direct(self, pool: PoolConfig, pods: Sequence[PodInfo], now: float, prom_error: str, errors: list[str]) -> Readings:
        """Prometheus failed: the pool's Ready pods read directly if configured, else (or if that
        fails too) no reading, the policy blind."""
        if self.replicas is None:
            return Readings(None, prom_error, {})
        try:
            r = self.replicas.read(pool.name, pods, now)
        except AdapterError as exc:
            errors.append("vllm")
            log.warning("direct_read_failed", pool=pool.name, error=str(exc))
            return Readings(None, f"{prom_error}; direct read: {exc}", {})
        return Readings(r.signals, r.problem, r.inflight_by_pod)

    def _gpu_free(self, kube_nodes: Sequence[KubeNode], errors: list[str]) -> dict[str, float | None]:
        """The lowest free GPU MiB of each node returning asleep in a pool that checks it before
        the wake (``pools[].wake_gpu_free_mib``): one query per such pool, none in a steady tick.
        With ``auto``, the lowest MiB free beyond what its sleeping pod's engine allocates at the
        wake (``PoolConfig.wake_gpu_need_mib``: compared with 0; the log's ``margin_mib``).
        A failed read leaves the nodes unknown (not free: the wake waits, then gives up)."""
        out: dict[str, float | None] = {}
        for p in self.config.pools:
            if p.wake_gpu_free_mib is None:
                continue
            pods = {n.name: n.warm.pod for n in kube_nodes if n.phase is Phase.RETURNING and n.warm is not None
                    and n.warm.state is WarmState.ASLEEP and n.pool == p.name}
            if not pods:
                continue
            nodes = sorted(pods)
            try:
                out.update(self.prom.gpu_free(self.prom_pools[p.name], nodes, node_label=self.config.prometheus.gpu_node_label,
                                              gpus=p.gpus_per_node, pods=pods if p.wake_gpu_free_mib == "auto" else None))
            except AdapterError as exc:
                errors.append("prometheus")
                log.warning("gpu_free_unavailable", pool=p.name, nodes=nodes, error=str(exc))
            for n in nodes:
                log.info("wake_gpu_check", node=n, phase=str(Phase.RETURNING), pool=p.name, need_mib=p.wake_gpu_free_mib,
                         **{"margin_mib" if p.wake_gpu_free_mib == "auto" else "free_mib": out.get(n)})
        return out

    def _recovered(self, pool: PoolConfig, last: float, t: float) -> tuple[LoadSignals, ...]:
        """The samples Prometheus kept between the memory's newest (``last``) and ``t``, one a
        tick, when more than two ticks lie between them (a query outage, not a late tick).
        What Prometheus did not scrape stays a gap, counted conservatively; a failed read too."""
        tick = self.config.policy.tick_s
        if not math.isfinite(last) or t - last <= 2 * tick:
            return ()
        try:
            got = self.prom.history(self.prom_pools[pool.name], start=last + tick, end=t - tick / 2, step_s=tick)
        except AdapterError as exc:
            log.warning("gap_history_unavailable", pool=pool.name, error=str(exc), gap_s=round(t - last, 1))
            return ()
        out = tuple(s for s in got if last < s.t < t)
        log.info("gap_history", pool=pool.name, gap_s=round(t - last, 1), samples=len(out))
        return out

    def outlook(
        self, pool: PoolConfig, now: float, nodes: int, calibration: Calibration | None, governor: Governor | None = None,
    ) -> tuple[HourOutlook, ...] | None:
        """The pool's lendable capacity ahead, as ``gpu-bridge forecast`` has it; None: unreadable."""
        try:
            start = math.floor((now - outlook_span_s(self.config, OUTLOOK_HOURS)) / OUTLOOK_STEP_S) * OUTLOOK_STEP_S
            hist = self.prom.history(self.prom_pools[pool.name], start=start, end=now, step_s=OUTLOOK_STEP_S)
            return lendable_outlook(hist, now, config=self.config, pool=pool, nodes=nodes, hours=OUTLOOK_HOURS,
                                    calibration=calibration, governor=governor)
        except AdapterError as exc:
            log.warning("outlook_unavailable", pool=pool.name, error=str(exc))
            return None
