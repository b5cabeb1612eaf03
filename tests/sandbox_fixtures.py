"""pytest fixtures around the real sandbox (gpu_bridge_lab.sandbox.cluster.Sandbox).

- ``slurm_sandbox`` (session): one sandbox (4 nodes, GraceTime 10 s, Prometheus, vLLM simulator
  when available) shared by every integration test of the session: start-up costs ~6 s.
- ``slurm_clean`` (function): the same sandbox, reset after the test (daemons restarted if a
  test stopped one, every job cancelled, every node resumed and idle). Use it in any test that
  submits jobs or changes node state; the test may still clean up itself.
- ``sandbox_dir`` (function): a short fresh directory under /tmp for a test's own Sandbox.
- ``slurm_only(**options)``: a context manager for a module's own Slurm-only sandbox (no
  Prometheus, no vLLM: ready in about a second) with Slurm options of its own (plugins,
  JobRequeue, an administrator's snippet); ``.work`` is a world-writable dir for job files.
- ``slurm2411_sandbox`` (session) / ``slurm2411_clean`` (function): the same Slurm cluster
  (4 nodes, GraceTime 10 s, both partitions; no Prometheus) run by Debian 13's Slurm 24.11 in a
  cached trixie tree (gpu_bridge_lab.sandbox.nspawn; the first use builds it, ~1 min). Daemons and
  clients run through ``sb.slurm.command_prefix`` (Slurm's clients must match slurmctld);
  munged too (Debian 13's). The container binds /tmp, so test files are seen alike inside.
- ``QUIET_START_RPS``: ``serving_sandbox(peak_rps=QUIET_START_RPS)`` scales the simulator's trace
  down to the low load the e2e tests set before their daemon starts anyway: no start-up load
  (the trace's, ~8 replicas' worth on 4 nodes, queued until the test lowers it) holds the
  daemon's first lend back for half a minute while it is served and leaves the lend lookback.
- ``daemon_run(cfg, log_path, env, watcher=...)``: the end-to-end tests' daemon run (``gpu-bridge
  run`` on a serving sandbox) and its common ending, written once: the watcher closed, the
  daemon stopped, its log's tail printed on a failure, then exit 0 and no violation asserted
  (``assert_requeued``: no research job lost, each requeued).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bridge.errors import SandboxError
from gpu_bridge_lab.sandbox.cluster import Sandbox

QUIET_START_RPS = 2.0

if TYPE_CHECKING:  # the e2e helpers import the Kubernetes client: only the e2e tests load them
    from gpu_bridge_lab.sandbox.e2e import DaemonProc, Watcher, World


@contextlib.contextmanager
def _scratch(prefix: str) -> Iterator[Path]:
    """A fresh directory under /tmp for the block, removed after it. Unix socket paths live
    under a sandbox's dir: keep it short (pytest's tmp_path is long)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def _running(sb: Sandbox) -> Iterator[Sandbox]:
    """``sb`` up for the block (``up`` stops what it started if it fails), then every job
    cancelled (``cancel_all_jobs``) and ``sb`` down."""
    with sb:
        try:
            yield sb
        finally:
            cancel_all_jobs(sb)


@pytest.fixture(scope="session")
def slurm_sandbox() -> Iterator[Sandbox]:
    with _scratch("gbsb-") as d, _running(Sandbox(d, nodes=4, grace_s=10)) as sb:
        yield sb


@pytest.fixture
def slurm_clean(slurm_sandbox: Sandbox) -> Iterator[Sandbox]:
    yield slurm_sandbox
    slurm_sandbox.reset()


@pytest.fixture
def sandbox_dir() -> Iterator[Path]:
    with _scratch("gbsx-") as d:
        yield d


class SlurmOnly:
    """A Slurm-only sandbox and a world-writable work dir (jobs of user nobody write there)."""

    def __init__(self, sb: Sandbox, work: Path) -> None:
        self.sb = sb
        self.work = work

    @property
    def root(self) -> Path:
        return self.sb.dir

    def run(self, argv: list[str], *, timeout: float = 20, user: str | None = None) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against the sandbox, run in ``work`` (as ``user``, if given)."""
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
        return subprocess.run(argv, env=self.sb.slurm_env(), cwd=self.work, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol -o show job`` as a dict (``JobState``, ``Restarts``, ``NodeList``...)."""
        return dict(re.findall(r"(\w+)=(\S*)", self.run(["scontrol", "-o", "show", "job", job_id]).stdout))


@contextlib.contextmanager
def slurm_only(**options: Any) -> Iterator[SlurmOnly]:
    """``with slurm_only(nodes=1, job_requeue=0, ...) as c:``: Sandbox options as keywords."""
    with _scratch("gbso-") as d:
        d.chmod(0o755)  # munged (user munge) and jobs of user nobody must reach the sandbox dir
        work = d / "work"
        work.mkdir()
        work.chmod(0o777)
        with _running(Sandbox(d / "sb", prometheus=False, vllm=False, **options)) as sb:
            yield SlurmOnly(sb, work)


def cancel_all_jobs(sb: Sandbox, timeout_s: float = 20.0) -> None:
    """Cancel every job and wait for them to go, before ``down``: a 24.11 slurmstepd keeps no
    environment or command line naming the sandbox, so ``down``'s sweep cannot find one that
    outlives its slurmd (a hold job's ``sleep infinity`` would run on)."""
    try:
        sb.run_slurm(["scancel", "--full", "--user=root"], check=False)
        sb.run_slurm(["scancel", "--full", "--user=nobody"], check=False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and sb.run_slurm(["squeue", "-h", "-o", "%i"], check=False).stdout.split():
            time.sleep(0.3)
    except (OSError, subprocess.SubprocessError, SandboxError):
        pass  # slurmctld already gone: down() does what it can


@pytest.fixture(scope="session")
def slurm2411_sandbox() -> Iterator[Sandbox]:
    from gpu_bridge_lab.sandbox import nspawn

    tree = nspawn.ensure_tree("trixie")
    with _scratch("gb24-") as d:
        box = nspawn.Container(tree, binds=["/tmp"], log_path=d / "nspawn.log").start()
        try:
            sb = Sandbox(d, nodes=4, grace_s=10, prometheus=False, vllm=False,
                         slurm_command_prefix=box.host_pid_prefix(), slurm_root=tree)
            with _running(sb):
                yield sb
        finally:
            box.stop()


@pytest.fixture
def slurm2411_clean(slurm2411_sandbox: Sandbox) -> Iterator[Sandbox]:
    yield slurm2411_sandbox
    slurm2411_sandbox.reset()


@pytest.fixture(scope="session")
def kube_plane() -> Iterator[Sandbox]:
    """One real Kubernetes control plane for the session (etcd, kube-apiserver, controllers,
    scheduler, kwok; gpu_bridge_lab.sandbox.realkube), shared by the adapter, leader, CLI,
    drain and contract tests: starting one costs ~10 s. Tests keep apart by working in
    namespaces, pools and node names of their own (a random prefix each)."""
    from gpu_bridge_lab.sandbox.realkube import control_plane

    # pods Ready 0.5 s after they start (kwok): the tests wait for readiness, not for a cold start
    with control_plane(kube_args=("--pod-start-delay-s", "0.5")) as sb:
        yield sb


@dataclass
class DaemonRun:
    """A daemon run of ``daemon_run``: ``rc`` is its exit code once stopped."""

    daemon: DaemonProc
    watcher: Watcher | None
    rc: int | None = None


@contextlib.contextmanager
def daemon_run(cfg: Path, log_path: Path, env: Mapping[str, str], *, watcher: Watcher | None = None,
               samples_over: int | None = None, min_ready: int | None = None, saw_warm: bool = False,
               explain: Callable[[], None] | None = None) -> Iterator[DaemonRun]:
    """``gpu-bridge run --config cfg`` (``DaemonProc``, its JSON log at ``log_path``) for the
    block; the block starts ``watcher`` when it should. Then, whatever the block did: the
    watcher closed (if started), the daemon SIGTERMed (SIGKILL after 20 s), and, if it exited
    non-zero or the block failed, ``explain()`` and the log's tail printed. If the block passed:

    - the daemon exited 0 on SIGTERM;
    - the watcher (if any) saw no violation (Ready serving capacity under min_serving, a node
      running research jobs beside a serving pod, a node lent warm without its memory hold);
    - ``samples_over``: the watcher took more samples than that (it really watched);
    - ``min_ready``: the fewest Ready serving pods it saw was at least that;
    - ``saw_warm``: it saw research jobs beside sleeping pods, each node lent warm with its
      memory hold running.
    """
    from gpu_bridge_lab.sandbox.e2e import DaemonProc

    run = DaemonRun(DaemonProc(cfg, log_path, env).start(), watcher)
    failed = True
    try:
        yield run
        failed = False
    finally:
        if watcher is not None and watcher.ident is not None:  # a thread never started cannot be joined
            watcher.close()
        run.rc = run.daemon.stop()
        if failed and explain is not None:
            explain()
        if run.rc or failed:
            print(log_path.read_text()[-3000:])
    assert run.rc == 0, f"the daemon must exit 0 on SIGTERM, it exited {run.rc}"
    if watcher is not None:
        assert watcher.violations == [], watcher.violations[:5]
        if samples_over is not None:
            assert watcher.samples > samples_over, watcher.samples
        if min_ready is not None:
            assert watcher.min_ready >= min_ready, watcher.min_ready
        if saw_warm:
            assert watcher.warm_samples > 0  # it did see research jobs beside sleeping pods
            assert watcher.mem_hold_samples > 0  # ... each on a node lent warm with its memory hold running


def assert_requeued(w: World, job_ids: Iterable[str], states: Iterable[str] | None = None, *,
                    squeue: list[dict[str, Any]] | None = None) -> None:
    """Every research job is still in Slurm (not lost) and was requeued at least once
    (preempted, never cancelled); ``states``: the job states each may be in; ``squeue``: the
    jobs already read (``w.jobs()``), else read now."""
    jobs = {str(j["job_id"]): j for j in (w.jobs() if squeue is None else squeue)}
    for jid in job_ids:
        assert jid in jobs, f"job {jid} vanished from squeue (lost?)"
        if states is not None:
            assert jobs[jid]["job_state"] in set(states), (jid, jobs[jid]["job_state"])
        assert jobs[jid]["restart_cnt"] >= 1, jobs[jid]
