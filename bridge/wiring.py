"""Builds the real adapters from a config: the one place that knows which class talks to what,
and the policy memory back-filled from Prometheus at start."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bridge import logs
from bridge.adapters.kube.client import KubeAdapter, api_client_from_config
from bridge.adapters.prom.signals import PromAccess, PromAdapter
from bridge.adapters.prom.types import DelayCount, PromPool
from bridge.adapters.protocols import KubeAdapterProtocol, PoolTarget, PromReader, ReplicaReader, SlurmAdapterProtocol
from bridge.adapters.replicas import replica_reader
from bridge.adapters.slurm.cli import CliSlurm
from bridge.adapters.wrappers import FencedKube, FencedSlurm, lease_fence
from bridge.config import Config
from bridge.errors import AdapterError, ConfigError
from bridge.adapters.kube.lease import LeaderElector, default_identity
from bridge.model import LoadSignals, Tier
from bridge.policy.forecast import history_windows
from bridge.policy.memory import MAX_DELAYS, PoolMemory

log = logs.get(__name__)


def check_private_file(path: str | Path, *, what: str) -> None:
    """Refuse a config or credential file that someone other than its owner (or root) can
    write: whoever can write it controls what the daemon does to two schedulers."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read {what}: {exc.strerror or exc}"]) from None
    if st.st_uid not in (0, os.geteuid()):
        raise ConfigError([f"{p}: {what} is owned by uid {st.st_uid}, neither root nor the daemon's user "
                           f"(uid {os.geteuid()}), who can write it; refusing to use it. "
                           f"Fix with: chown {os.geteuid()} {p}"])
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError([f"{p}: {what} is writable by group or others (mode {stat.filemode(st.st_mode)}); "
                           f"refusing to use it. Fix with: chmod go-w {p}"])


def check_secret_file(path: str | Path, *, what: str) -> None:
    """``check_private_file``, and readable by no one but the daemon (its user, or its own
    group as in the install's ``0640 root:gpu-bridge``): whoever reads a key or a token is the
    daemon to that service. A systemd credential (under ``$CREDENTIALS_DIRECTORY``) is taken
    as systemd made it: a per-unit private directory, the unit's user granted by an ACL."""
    check_private_file(path, what=what)
    p = Path(path)
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if creds and p.resolve().is_relative_to(Path(creds).resolve()):
        return
    st = p.stat()
    if st.st_mode & stat.S_IROTH:
        raise ConfigError([f"{p}: {what} is readable by others (mode {stat.filemode(st.st_mode)}); refusing to use it. "
                           f"Fix with: chmod o-rwx {p}"])
    if st.st_mode & stat.S_IRGRP and st.st_gid != os.getegid():
        raise ConfigError([f"{p}: {what} is readable by group gid {st.st_gid}, not the daemon's (gid {os.getegid()}); "
                           f"refusing to use it. Fix with: chmod g-rwx {p}"])


def read_secret_file(path: str | Path, *, what: str) -> str:
    """A credential file's one token, after ``check_secret_file``."""
    check_secret_file(path, what=what)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{p}: cannot read {what}: {getattr(exc, 'strerror', None) or exc}"]) from None
    if not text or any(c.isspace() for c in text):
        raise ConfigError([f"{p}: {what}: expected one token (no spaces or line breaks), got {'nothing' if not text else 'several words'}"])
    return text


def prom_access(config: Config) -> PromAccess:
    """The TLS files and bearer token of ``prometheus``, each file checked like the kubeconfig
    (a CA bundle others can write would let them add a CA); the key and token must be private."""
    pc = config.prometheus
    for key, path in (("ca_file", pc.ca_file), ("cert_file", pc.cert_file)):
        if path is not None:
            check_private_file(path, what=f"prometheus.{key}")
    if pc.key_file is not None:
        check_secret_file(pc.key_file, what="prometheus.key_file")
    token = read_secret_file(pc.bearer_token_file, what="prometheus.bearer_token_file") if pc.bearer_token_file else None
    return PromAccess(ca_file=pc.ca_file, cert_file=pc.cert_file, key_file=pc.key_file, bearer_token=token)


def prom_adapter(config: Config, *, url: str | None = None, timeout_s: float | None = None) -> PromAdapter:
    """The Prometheus adapter of ``config`` (``url``/``timeout_s`` override for the CLI tools)."""
    pc = config.prometheus
    return PromAdapter(url or pc.url, timeout_s=timeout_s or pc.timeout_s, staleness_s=config.policy.signal_max_age_s,
                       rate_window_s=pc.rate_window_s, scrape_interval_s=pc.scrape_interval_s,
                       access=prom_access(config))


def prom_pools(config: Config) -> dict[str, PromPool]:
    """Each pool's series selection: model, namespace, matchers, own pods (``prometheus``)."""
    return {p.name: PromPool.from_config(p, config.prometheus) for p in config.pools}


def kubeconfig_paths(config: Config) -> list[Path]:
    """The kubeconfig file(s) the client will read: the configured one, else (outside a
    cluster) $KUBECONFIG's list as the client saw it at import, else ~/.kube/config."""
    k = config.kubernetes
    if k.kubeconfig:
        return [Path(k.kubeconfig)]
    if k.in_cluster or "KUBERNETES_SERVICE_HOST" in os.environ:
        return []
    from kubernetes.config import kube_config

    found = [Path(os.path.expanduser(p)) for p in str(kube_config.KUBE_CONFIG_DEFAULT_LOCATION).split(os.pathsep) if p]
    return [p for p in found if p.exists()]


@dataclass
class Adapters:
    kube: KubeAdapterProtocol
    slurm: SlurmAdapterProtocol
    prom: PromAdapter
    prom_pools: dict[str, PromPool]
    leader: LeaderElector | None
    identity: str
    replicas: ReplicaReader | None = None  # the pods read directly when Prometheus fails (prometheus.direct_fallback)
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for c in reversed(self._closers):
            try:
                c()
            except Exception as exc:  # closing is best effort
                log.warning("close_failed", error=str(exc))


def slurm_adapter(config: Config) -> CliSlurm:
    """The Slurm CLI adapter as the config says to reach Slurm (no fence: see build_adapters)."""
    sc = config.slurm
    return CliSlurm(env={"SLURM_CONF": sc.slurm_conf} if sc.slurm_conf else None, timeout_s=sc.command_timeout_s,
                    hold_partition=sc.hold_partition, command_prefix=sc.command_prefix, hold_user=sc.hold_user,
                    preempt_partition=sc.preempt_partition, fast_partition=sc.fast_partition,
                    warm_partition=sc.warm_partition)


def build_adapters(config: Config, *, leader: bool = True, identity: str | None = None, start_watches: bool = True) -> Adapters:
    """Real adapters for ``config``; the Kubernetes watches are started (and must sync).
    ``leader``: with the Lease, and every write fenced by it (a dry run has neither)."""
    identity = identity or default_identity()
    k = config.kubernetes
    for path in kubeconfig_paths(config):
        check_private_file(path, what="kubeconfig")
    api = api_client_from_config(kubeconfig=k.kubeconfig, context=k.context, in_cluster=k.in_cluster or None,
                                 allow_insecure_tls=k.allow_insecure_tls)
    targets = [PoolTarget(p.name, p.namespace, p.deployment, node_selector=dict(p.node_selector) or None)
               for p in config.pools]
    real_kube = KubeAdapter(api, pools=targets, identity=identity, request_timeout_s=k.timeout_s)
    closers: list[Callable[[], None]] = []
    if start_watches:
        real_kube.start()
        closers.append(real_kube.stop)
    slurm = slurm_adapter(config)
    prom = prom_adapter(config)
    elector = None
    if leader:
        d = config.daemon
        elector = LeaderElector(api, namespace=d.lease_namespace, identity=identity, name=d.lease_name,
                                lease_duration_s=d.lease_duration_s)
    kube: KubeAdapterProtocol = real_kube
    slurm_side: SlurmAdapterProtocol = slurm
    if elector is not None:
        # Every write checks the Lease right before it is made, not once per tick; each Slurm
        # command that changes something, only if the leadership outlasts its timeout.
        kube = FencedKube(kube, elector)
        slurm_side = FencedSlurm(slurm_side, elector)
        slurm.fence = lease_fence(elector)
    closers.append(api.close)
    return Adapters(kube=kube, slurm=slurm_side, prom=prom, prom_pools=prom_pools(config), leader=elector,
                    identity=identity, replicas=replica_reader(config), _closers=closers)


def policy_memory(config: Config, prom: PromReader, pools: Mapping[str, PromPool], now: float) -> dict[str, PoolMemory]:
    """Each pool's policy memory as a restart lost it, rebuilt from Prometheus once at start:
    the history windows (oldest first) and the calibration's window (``query_range`` in
    chunks: Prometheus answers at most 11 000 points per series and query). Day one is not
    blind when Prometheus already holds the pool's vLLM history; a failed read is logged.
    The measured reclaim delays too (``rebuild_delays``), over the calibration's window."""
    out = {}
    for pool in config.pools:
        mem = out[pool.name] = PoolMemory(config, pool)
        if pool.measured_delays:
            window = config.policy.calibration.window_s
            try:
                got = rebuild_delays(mem, prom.reclaim_delays(pools[pool.name], window_s=window))
                log.info("reclaim_delays_rebuilt", pool=pool.name, samples=got, window_s=window)
            except AdapterError as exc:
                log.warning("reclaim_delays_unavailable", pool=pool.name, error=str(exc))
        samples: list[LoadSignals] = []
        for w in history_windows(config, pool):
            try:
                samples += prom.history(pools[pool.name], start=now + w.start_s, end=min(now, now + w.end_s), step_s=w.step_s)
            except AdapterError as exc:
                log.warning("history_unavailable", pool=pool.name, error=str(exc))
        for sample in sorted(samples, key=lambda s: s.t):
            mem.add(sample, calibration=False)
        if mem.calibrator is None:
            continue
        step, start, got = config.policy.calibration.step_s, now - mem.calibrator.span_s, 0
        while start < now:
            end = min(now, start + 10_000 * step)
            try:
                for sample in prom.history(pools[pool.name], start=start, end=end, step_s=step):
                    mem.add(sample, history=False)
                    got += 1
            except AdapterError as exc:
                log.warning("calibration_history_unavailable", pool=pool.name, error=str(exc))
            start = end + step
        log.info("calibration_history", pool=pool.name, samples=got, window_s=mem.calibrator.span_s)
    return out


def rebuild_delays(mem: PoolMemory, buckets: Sequence[DelayCount], *, keep: int = MAX_DELAYS) -> int:
    """Feed ``mem`` the measured delays of a histogram's buckets, each at its bucket's upper
    bound (never below the delay measured: nor is the horizon). Their order is lost: a tier's
    counts beyond ``keep`` are scaled down (rounded up), so its quantile stays; smallest first,
    so any excess dropped is of the smallest. Returns the samples fed."""
    fed = 0
    for tier in Tier:
        mine = sorted((b for b in buckets if b.tier is tier), key=lambda b: b.le)
        scale = min(1.0, keep / max(1, sum(b.count for b in mine)))
        for b in mine:
            for _ in range(math.ceil(b.count * scale)):
                mem.add_delay(b.le, tier, b.mode)
                fed += 1
    return fed
