"""The daemon, as the Lease holder: leadership, watch-cache freshness and scheduling around one
pass: ``Observer.read`` (the watch cache, one sinfo/squeue, one Prometheus query per pool) ->
``bridge.reconcile`` (policy, operators' requests, lifecycle steps and scales, as data) ->
``Actuator.apply`` (skipped by ``--dry-run``) -> ``bridge.ledger`` (memory, metrics, reclaim
timings). ``iterate`` ticks again at once while a pass changed something; while anything is in
transit it iterates every ``transit_poll_s``, else it waits for the next policy tick or a watch
event. Nothing here cannot be rebuilt: phases live on the nodes, the load history and the
measured reclaim delays are refilled from Prometheus at start (``bridge.wiring.policy_memory``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from bridge import logs
from bridge.actuate import Actuator
from bridge.adapters.prom.types import PromPool
from bridge.adapters.protocols import KubeAdapterProtocol, Leader, PoolTarget, PromReader, ReplicaReader, SlurmAdapterProtocol
from bridge.adapters.vllm import sleep_controls
from bridge.config import Config
from bridge.config import replace as cfg_replace
from bridge.errors import AdapterError
from bridge.ledger import Ledger, TickResult
from bridge.metrics import BridgeMetrics, NullMetrics
from bridge.model import Tier
from bridge.observe import Observation
from bridge.observer import Observer
from bridge.policy.memory import PoolMemory
from bridge.reconcile import LoopState, observation, reconcile

log = logs.get(__name__)

MAX_CHAINED_STEPS = 12  # passes of one iteration: immediate steps chain, never forever


def with_slurm_grace(config: Config, slurm: SlurmAdapterProtocol) -> Config:
    """The config with ``slurm.grace_s`` (and ``fast_grace_s``, with a fast tier) checked against
    the partition's GraceTime as slurmctld has it (read once, at start-up). A config lower than
    Slurm's is raised to Slurm's (logged): the daemon never requeues a job before the grace Slurm
    promised it, and the policy plans reclaims with the grace they really take. A higher one is
    kept (the daemon then only waits longer; Slurm still ends the grace at its own GraceTime)."""
    for key, partition in (("grace_s", config.slurm.preempt_partition), ("fast_grace_s", config.slurm.fast_partition)):
        if partition is None:
            continue
        slurm_grace_s, grace_s = slurm.grace_time_s(partition), getattr(config.slurm, key)
        if grace_s >= slurm_grace_s:
            log.info("slurm_grace", partition=partition, grace_s=grace_s, slurm_grace_s=slurm_grace_s)
            continue
        log.warning("slurm_grace_raised", partition=partition, grace_s=slurm_grace_s, configured_grace_s=grace_s,
                    detail=f"slurm.{key} is lower than the partition's GraceTime: Slurm's is used")
        changes: dict[str, Any] = {key: slurm_grace_s}
        config = cfg_replace(config, slurm=cfg_replace(config.slurm, **changes))
    return config


class Daemon:
    """One gpu-bridge instance: leadership, freshness and scheduling around the pass. ``tick()``
    is one pass, ``iterate()`` one iteration of ``run`` (tests call either directly)."""

    def __init__(
        self, config: Config, *, kube: KubeAdapterProtocol, slurm: SlurmAdapterProtocol, prom: PromReader,
        prom_pools: Mapping[str, PromPool], leader: Leader | None = None,
        metrics: BridgeMetrics | None = None,  # None: NullMetrics
        clock: Callable[[], float] = time.time, dry_run: bool = False, transit_poll_s: float = 0.25,
        max_cache_age_s: float = 75.0, after_write: Callable[[str], None] | None = None,
        memory: Mapping[str, PoolMemory] | None = None,
        replicas: ReplicaReader | None = None,
    ) -> None:
        self.config, self.kube, self.leader, self.clock, self.transit_poll_s = config, kube, leader, clock, transit_poll_s
        self.dry_run = dry_run  # reconcile and log, never apply
        self.max_cache_age_s = max_cache_age_s  # watch timeout (60 s) + request timeout + slack
        self.observer = Observer(config, kube, slurm, prom, prom_pools, replicas)
        targets = {p.name: PoolTarget(p.name, p.namespace, p.deployment) for p in config.pools}
        fast = config.slurm.fast_partition
        tiers = {Tier.NORMAL: config.slurm.preempt_partition, Tier.FAST: fast} if fast else {}
        self.actuator = Actuator(kube=kube, slurm=slurm, clock=clock, targets=targets, grace_s=config.slurm.grace_s, tiers=tiers,
                                 sleep_control=sleep_controls(config.pools),  # vLLM clients for warm pools only
                                 sleep_retry_s={p.name: p.drain_s for p in config.pools if p.warm_lending},
                                 mem_hold_mb={p.name: p.warm_hold_mb for p in config.pools
                                              if p.warm_lending and p.warm_hold_mb is not None})
        if after_write is not None:  # a lab's hook (crash injection); the product sets none
            self.actuator.after_write = after_write
        # the policy's memory: empty unless given back-filled (bridge.wiring.policy_memory)
        self.memory = dict(memory) if memory is not None else {p.name: PoolMemory(config, p) for p in config.pools}
        self.state = LoopState()
        self.ledger = Ledger(config, self.memory, self.state, metrics or NullMetrics(), self.observer.outlook, clock)
        self.wake = threading.Event()
        self._progress_mono = time.monotonic()  # the loop's heartbeat (LeaseKeeper's alive())

    def observe(self, now: float) -> Observation:
        """What the loop would decide on now (``status``, the web view); remembers nothing."""
        return observation(self.observer.read(now), self.memory, self.config)

    def loop_alive(self, stall_s: float) -> bool:
        """The loop started a pass within ``stall_s``: a slow pass is alive, a wedged one is
        not (the LeaseKeeper then lets the Lease lapse)."""
        return time.monotonic() - self._progress_mono < stall_s

    def tick(self) -> TickResult:
        self._progress_mono = time.monotonic()
        now = self.clock()
        why_not = self._why_not_act()
        if why_not is not None:
            return TickResult(observed=False, error=why_not or None)
        snapshot = self.observer.read(now, since={name: m.last_t for name, m in self.memory.items()})
        intents = reconcile(self.ledger.remember(snapshot), self.memory, self.config, self.state)
        records = [] if self.dry_run else self.actuator.apply(intents)
        return self.ledger.consume(intents, records, now)

    def iterate(self) -> TickResult:
        """A pass, then at once another while the last one changed something (bounded)."""
        result = self.tick()
        for _ in range(MAX_CHAINED_STEPS - 1):
            if self.dry_run or not result.more:
                break
            nxt = self.tick()
            result = replace(nxt, planned=result.planned or nxt.planned, steps=result.steps + nxt.steps)
        return result

    def _why_not_act(self) -> str | None:
        """Not leading ("") or a watch cache not fresh enough to act on (why); None: go."""
        if self.leader is not None:
            try:
                leading = self.leader.try_acquire_or_renew()
            except AdapterError as exc:
                log.warning("lease_error", error=str(exc))
                leading = False
            self.ledger.metrics.set_leader(leading)
            if not leading:
                return ""
        status = self.kube.cache_status()
        age = status.last_event_age_s
        if not status.synced or (age is not None and age > self.max_cache_age_s):
            # A watch cut silently keeps "synced" until its read timeout: fail closed on age too.
            log.warning("kube_cache_not_fresh", synced=status.synced, last_event_age_s=age)
            self.ledger.count_error("kubernetes")
            return "kubernetes watch cache not synced or stale"
        return None

    def run(self, stop: threading.Event, *, on_tick: Callable[[TickResult], None] | None = None) -> None:
        """Iterate until ``stop`` is set; an iteration is never cut in half."""
        while not stop.is_set():
            started = self.clock()
            try:
                result = self.iterate()
            except AdapterError as exc:
                self.ledger.count_error(exc.system)
                log.warning("tick_failed", error=str(exc))
                result = TickResult(observed=False, error=str(exc))
            if on_tick is not None:
                on_tick(result)
            interval = self.transit_poll_s if result.in_transit > 0 else min(self.config.policy.tick_s, 5.0)
            delay = max(0.0, interval - (self.clock() - started))
            self.wake.clear()
            if stop.wait(0) or self.wake.wait(delay):
                continue
        if self.leader is not None and self.leader.is_leader:
            try:
                self.leader.release()
            except AdapterError as exc:
                log.warning("lease_release_failed", error=str(exc))

