"""The Slurm backend over its command-line tools (sinfo/squeue --json, scontrol, sbatch, scancel).

Every call is an argv list with a timeout; stderr is capped and sanitized into AdapterError.
Lookups parse JSON and filter on the client side (22.05 ignores --json filters). Node names
and job ids are validated before they reach argv; no shell is ever involved, and the hold
job's command is a fixed text.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bridge import logs, wellknown
from bridge.adapters.protocols import DrainOutcomes, HoldOutcomes, RequeueOutcome, outcome
from bridge.errors import AdapterError
from bridge.names import validate_job_id, validate_node_name

from .parse import (
    REQUEUE_CHECK_FORMAT, RequeueCheck, parse_grace_time, parse_jobs, parse_nodes, parse_ping, parse_requeue_checks,
    parse_requeue_errors, parse_scontrol_node, parse_scontrol_nodes, parse_sdiag_time, parse_show_config, parse_show_partitions, validate_partition,
)
from .hostlist import expand
from .types import SlurmJobInfo, SlurmNode

SINFO_ARGV = ("sinfo", "--json", "--Node")
MAX_REASON = 200
MAX_STDERR = 500
HOLD_WRAP = "exec sleep infinity"  # fixed text: nothing from data ever goes into a command
# Names per list argument (A,B,...) of one read: 500 of at most 80 characters (a node name and a
# job name prefix) stay far below Linux's 128 KiB per argument; a first pass adopting 10,000
# serving nodes looks up their holds in 20 reads, not in one argument execve refuses.
LIST_CHUNK = 500
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _log() -> Any:
    return logs.get(__name__)


class NotOursError(AdapterError):
    """The bridge refused to touch something it did not set (an administrator's drain)."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


def changes_slurm(argv: Sequence[str]) -> bool:
    """Whether a command may change Slurm: anything but the reads the adapter issues (sinfo,
    squeue, ``scontrol show``/``ping``), so a write added later is fenced by default."""
    if argv[0] in ("sinfo", "squeue"):
        return False
    return not (argv[0] == "scontrol" and any(a in ("show", "ping") for a in argv[1:3]))


class CommandRunner(Protocol):
    """Runs one argv with a timeout (a fake one in unit tests)."""

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult: ...


REMOTE_SHELLS = frozenset({"ssh"})
"""Prefix programs that join the arguments after them into one line for a remote shell."""


class SubprocessRunner:
    """Runs the Slurm tools here, or through ``prefix`` (an argv list such as ``["ssh", "login1"]``
    or ``["nsenter", "-t", PID, "-m", "-p", "--"]``) where clients match the controller's release.

    ``ssh`` joins the command's arguments with spaces and the far side runs that line with the
    user's shell: behind it each argument is ``shlex.quote``d, so the remote POSIX shell splits
    the line back into exactly this argv (``%i|%u``, reasons with spaces, ``--wrap`` text) and
    nothing in an argument is ever read as shell syntax."""

    def __init__(self, env: Mapping[str, str] | None = None, prefix: Sequence[str] = ()) -> None:
        self.env = dict(os.environ if env is None else env)
        self.prefix = tuple(prefix)
        self.remote_shell = bool(self.prefix) and os.path.basename(self.prefix[0]) in REMOTE_SHELLS

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        args = [shlex.quote(a) for a in argv] if self.remote_shell else list(argv)
        try:
            res = subprocess.run(
                [*self.prefix, *args], capture_output=True, text=True, timeout=timeout_s, env=self.env, check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise AdapterError("slurm", f"{argv[0]}: timed out after {timeout_s:g} s") from None
        except OSError as e:
            via = f" (through {self.prefix[0]})" if self.prefix else ""
            raise AdapterError("slurm", f"{argv[0]}{via}: cannot run: {e.strerror or e}") from None
        return CommandResult(res.returncode, res.stdout, res.stderr)


def sanitize(text: str, limit: int) -> str:
    """Control characters removed, whitespace collapsed, capped at ``limit`` characters."""
    s = " ".join(_CONTROL.sub(" ", text or "").split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def drain_reason(reason: str) -> str:
    """The reason as written: ``gpu-bridge: <sanitized text>``, quotes removed, capped."""
    body = sanitize(reason, MAX_REASON).replace('"', "").replace("'", "")
    if body.startswith(wellknown.SLURM_REASON_PREFIX):
        body = body[len(wellknown.SLURM_REASON_PREFIX) :].strip()
    full = f"{wellknown.SLURM_REASON_PREFIX} {body}" if body else wellknown.SLURM_REASON_PREFIX
    return full[:MAX_REASON]


def _state_text(n: SlurmNode) -> str:
    """A node's state as scontrol prints it (IDLE+DRAIN), for messages."""
    return "+".join([n.state.upper(), *sorted(n.flags)])


# The reason slurmctld gives a node it marks DOWN itself because its slurmd stopped answering
SLURM_NOT_RESPONDING_REASON = "Not responding"


def admins_down(n: SlurmNode) -> bool:
    """DOWN (not drained) with someone else's reason: an administrator's DOWN. Also once the
    node stops responding too (Slurm keeps their reason then, and so does gpu-bridge), unless
    the reason is Slurm's own "Not responding" (a node Slurm marked DOWN itself gets our drain)."""
    return (not n.drained and n.state == "down" and bool(n.reason) and not n.reason_ours
            and (n.responding or not wellknown.is_slurm_reason(n.reason, SLURM_NOT_RESPONDING_REASON)))


def _drain_due(cur: SlurmNode, text: str) -> bool:
    """Whether our drain with reason ``text`` must be written on ``cur``: not if it already is
    so, nor over an administrator's drain (their reason is never overwritten), nor on an
    administrator's DOWN (responding or not since: no job can land, and their reason stays)."""
    if cur.drained and (cur.reason == text or not cur.reason_ours):
        return False
    return not admins_down(cur)


def hold_job_name(node: str) -> str:
    return wellknown.SLURM_HOLD_JOB_PREFIX + validate_node_name(node)


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    """``items`` in lists of at most ``LIST_CHUNK``: one command's list argument each."""
    return (items[i : i + LIST_CHUNK] for i in range(0, len(items), LIST_CHUNK))


def _sbatch_job_id(answer: str) -> str:
    """The job id ``sbatch --parsable`` answers (``ID`` or ``ID;cluster``), checked."""
    try:
        return validate_job_id(answer.strip().split(";")[0])
    except AdapterError:
        raise AdapterError("slurm", f"sbatch: unexpected answer {sanitize(answer, 80)!r}") from None


def mem_hold_job_name(node: str) -> str:
    """Warm lending's memory hold on ``node``: ``gpu-bridge-warm:<node>``."""
    return wellknown.SLURM_WARM_HOLD_JOB_PREFIX + validate_node_name(node)


def validate_mem_mb(mem_mb: object) -> int:
    """A memory size for ``--mem`` (MB): a positive integer, nothing else reaches argv."""
    if not isinstance(mem_mb, int) or isinstance(mem_mb, bool) or not 0 < mem_mb <= 1 << 40:
        raise AdapterError("slurm", f"memory hold: {str(mem_mb)[:40]!r} is not a positive number of MB")
    return mem_mb


class CliSlurm:
    """SlurmReader + SlurmWriter over the Slurm CLI. ``env`` e.g. ``{"SLURM_CONF": ...}`` merged
    over os.environ; ``command_prefix`` an argv list put before every command (config
    ``slurm.command_prefix``); ``runner`` replaces subprocess (tests)."""

    def __init__(self, *, env: Mapping[str, str] | None = None, runner: CommandRunner | None = None,
                 timeout_s: float = 10.0, hold_partition: str = wellknown.SLURM_HOLD_PARTITION,
                 hold_user: str | None = None, command_prefix: Sequence[str] = (),
                 fence: Callable[[Sequence[str], float], None] | None = None,
                 preempt_partition: str = wellknown.SLURM_PREEMPT_PARTITION, fast_partition: str | None = None,
                 warm_partition: str = wellknown.SLURM_WARM_PARTITION) -> None:
        self.run_cmd: CommandRunner = runner or SubprocessRunner({**os.environ, **(env or {})}, prefix=command_prefix)
        # called with (argv, timeout) right before each command that changes Slurm; raises to
        # refuse it (the Lease fence, bridge.wiring): checked there, not once before a write of
        # several commands, so the change lands while this instance still leads
        self.fence = fence
        self.timeout_s = timeout_s
        self.hold_partition = hold_partition
        self.hold_user = hold_user  # only hold jobs of this user count as ours (None: any user)
        self.preempt_partition = preempt_partition  # with fast_partition: the only ones whose jobs are ever requeued
        self.fast_partition = fast_partition  # the fast-grace tier (slurm.fast_partition), None: none
        self.warm_partition = warm_partition  # warm lending's memory holds (slurm.warm_partition)

    # ---- plumbing ----------------------------------------------------------------------
    def _run(self, argv: Sequence[str], *, ok_codes: tuple[int, ...] = (0,)) -> CommandResult:
        if self.fence is not None and changes_slurm(argv):
            self.fence(argv, self.timeout_s)
        res = self.run_cmd(argv, self.timeout_s)
        if res.returncode not in ok_codes:
            err = sanitize(res.stderr or res.stdout, MAX_STDERR) or "(no output)"
            raise AdapterError("slurm", f"{argv[0]} {argv[1] if len(argv) > 1 else ''}".strip()
                               + f" failed (rc {res.returncode}): {err}")
        return res

    # ---- read side ---------------------------------------------------------------------
    def ping(self) -> None:
        res = self._run(["scontrol", "ping"])
        if not parse_ping(res.stdout):
            raise AdapterError("slurm", f"scontrol ping: controller not UP: {sanitize(res.stdout, MAX_STDERR)}")

    def nodes(self, names: Iterable[str] | None = None) -> tuple[SlurmNode, ...]:
        wanted = None if names is None else [validate_node_name(n) for n in names]
        # --Node: one entry per node (and partition). Slurm 24.11 otherwise groups nodes of the
        # same state into one entry carrying one node's reason and the group's gres use; 22.05
        # lists nodes one by one either way.
        all_nodes = parse_nodes(self._run(SINFO_ARGV).stdout)
        if wanted is None:
            return all_nodes
        by_name = {n.name: n for n in all_nodes}
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise AdapterError("slurm", f"sinfo --json: unknown node(s) {', '.join(missing[:10])}")
        return tuple(by_name[n] for n in sorted(set(wanted)))

    def node(self, name: str) -> SlurmNode:
        return self.nodes([name])[0]

    def clock(self) -> float:
        """slurmctld's time, from ``sdiag`` ("sdiag output at <date> (<unix time>)", the time the
        controller answered): Slurm's PreemptTime and reason times are measured against it."""
        return parse_sdiag_time(self._run(["sdiag"]).stdout)

    def grace_time_s(self, partition: str) -> float:
        validate_partition(partition)
        res = self._run(["scontrol", "--oneliner", "show", "partition", partition])
        return parse_grace_time(res.stdout, partition)

    def jobs(
        self, *, partition: str | None = None, node: str | None = None, states: Iterable[str] | None = None
    ) -> tuple[SlurmJobInfo, ...]:
        if node is not None:
            validate_node_name(node)
        want_states = None if states is None else {s.lower() for s in states}
        out = []
        for j in parse_jobs(self._run(["squeue", "--json"]).stdout):
            if partition is not None and j.partition != partition:
                continue
            if node is not None and node not in j.nodes:
                continue
            if want_states is not None and j.state not in want_states:
                continue
            out.append(j)
        return tuple(out)

    # ---- the running configuration (read-only: `gpu-bridge check-slurm`) ------------------
    def show_config(self) -> dict[str, str]:
        """slurmctld's running settings (``scontrol show config``): what slurm.conf resolved to."""
        return parse_show_config(self._run(["scontrol", "show", "config"]).stdout)

    def partitions(self) -> dict[str, dict[str, str]]:
        """Every partition's settings as slurmctld has them (``scontrol --oneliner show partition``)."""
        return parse_show_partitions(self._run(["scontrol", "--oneliner", "show", "partition"]).stdout)

    # ---- write side --------------------------------------------------------------------
    def node_now(self, name: str) -> SlurmNode:
        """One node as slurmctld has it now, without reading the whole cluster (the writes'
        precondition: at 2,000 nodes a full sinfo --json is 2 MB to decode per write)."""
        validate_node_name(name)
        return parse_scontrol_node(self._run(["scontrol", "--oneliner", "show", "node", name]).stdout)

    def nodes_now(self, names: Collection[str]) -> dict[str, SlurmNode]:
        """The named nodes as slurmctld has them now, in one ``scontrol show node A,B,...`` per
        ``LIST_CHUNK`` (22.05 and 24.11 print one line per node; an unknown one fails the read):
        a pass's drains."""
        asked, out = sorted({validate_node_name(n) for n in names}), {}
        for chunk in _chunks(asked):
            res = self._run(["scontrol", "--oneliner", "show", "node", ",".join(chunk)], ok_codes=(0, 1))
            if res.returncode:  # e.g. "Node X not found" after the nodes it knows: the message, not the nodes
                why = " ".join(ln for ln in (res.stdout + "\n" + res.stderr).splitlines() if not ln.startswith("NodeName="))
                raise AdapterError("slurm", f"scontrol show node failed (rc 1): {sanitize(why, MAX_STDERR) or '(no output)'}")
            out.update(parse_scontrol_nodes(res.stdout, chunk))
        return out

    def _hold_name(self, node: str, *, mem: bool) -> tuple[str, str]:
        """Our hold's (``mem``: memory hold's) job name for ``node``, and its partition."""
        return (mem_hold_job_name(node), self.warm_partition) if mem else (hold_job_name(node), self.hold_partition)

    def _hold_ids(self, nodes: Collection[str], *, mem: bool = False) -> dict[str, tuple[str, ...]]:
        """Ids of our live hold jobs (``mem``: memory holds, warm lending) on each of ``nodes``, in
        one squeue per ``LIST_CHUNK`` (its text output honours its filters; the job name says the node)."""
        names = {self._hold_name(n, mem=mem)[0]: n for n in nodes}
        ids: dict[str, list[str]] = {n: [] for n in names.values()}
        for chunk in _chunks(sorted(names)):
            res = self._run([
                "squeue", "--noheader", "--name", ",".join(chunk), "--partition", self.warm_partition if mem else self.hold_partition,
                # not COMPLETING: a cancelled hold on its way out (scancel again would fail)
                "--states", "PENDING,RUNNING,CONFIGURING,SUSPENDED,REQUEUED", "--format", "%i|%u|%j",
            ])
            for line in res.stdout.splitlines():
                job_id, user, name = (line.strip().split("|", 2) + ["", ""])[:3]
                if job_id and name in names and (self.hold_user is None or user == self.hold_user):
                    ids[names[name]].append(validate_job_id(job_id))
        return {n: tuple(v) for n, v in ids.items()}

    def drain(self, node: str, reason: str) -> bool:
        return outcome(self.drain_nodes({node: reason}), validate_node_name(node))

    def drain_nodes(self, reasons: Mapping[str, str]) -> DrainOutcomes:
        """``drain`` for many nodes (node -> reason) with one read (``nodes_now``): each node decided
        as ``drain`` does, then one ``scontrol update`` per reason (and ``LIST_CHUNK``) for the nodes
        due, right after the read. A list Slurm refuses (it may have drained some) goes again node
        by node, each re-read."""
        texts = {validate_node_name(n): drain_reason(r) for n, r in reasons.items()}
        if not texts:
            return {}
        now = self.nodes_now(texts)
        out: DrainOutcomes = dict.fromkeys(texts, False)
        for text in sorted(set(texts.values())):
            for due in _chunks([n for n in sorted(texts) if texts[n] == text and _drain_due(now[n], text)]):
                try:
                    self._run(["scontrol", "update", f"NodeName={','.join(due)}", "State=DRAIN", f"Reason={text}"])
                except AdapterError as exc:
                    if len(due) == 1:
                        out[due[0]] = exc
                        continue
                    _log().warning("slurm_drain_retried_alone", node=",".join(due), error=str(exc))
                    for n in due:
                        try:
                            out[n] = self.drain(n, text)
                        except AdapterError as one:
                            out[n] = one
                    continue
                for n in due:
                    _log().info("slurm_drained", node=n, reason=text)
                    out[n] = True
        return out

    def resume(self, node: str) -> bool:
        validate_node_name(node)
        cur = self.node_now(node)
        if not cur.drained:
            return False  # no drain to lift (a DOWN/not-responding node is Slurm's or an admin's)
        if not cur.reason_ours:
            raise NotOursError("slurm", f"resume {node}: drained by someone else ({cur.reason[:80]!r}, "
                                        f"by {cur.reason_user or 'unknown'}): refusing")
        if cur.state == "unknown":
            # Right after a slurmctld restart, until the node's slurmd registers again: Slurm
            # refuses RESUME ("Invalid node state specified"). Retried next tick.
            _log().warning("slurm_resume_deferred", node=node, state=_state_text(cur),
                           detail="node not registered since a slurmctld restart")
            raise AdapterError("slurm", f"resume {node}: node is {_state_text(cur)} (its slurmd has not registered "
                                        "since a slurmctld restart): retrying")
        try:
            self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        except AdapterError as exc:
            # Slurm may refuse and still have lifted the drain (22.05 after a controller
            # restart): what counts is the node as it is now.
            after = self.node_now(node)
            if not after.drained:
                _log().warning("slurm_resume_refused_but_done", node=node, state=_state_text(after), error=str(exc))
                return True
            _log().warning("slurm_resume_refused", node=node, state=_state_text(after), error=str(exc))
            raise
        _log().info("slurm_resumed", node=node)
        return True

    def submit_hold(self, node: str) -> str:
        return outcome(self.submit_holds([node]), validate_node_name(node))

    def submit_holds(self, nodes: Collection[str]) -> HoldOutcomes:
        return self._submit_ours({validate_node_name(n): ["--exclusive"] for n in nodes},
                                 "gpu-bridge hold: keeps this node for serving", mem=False)

    def _submit_ours(self, sizes: Mapping[str, Sequence[str]], comment: str, *, mem: bool, **log_kw: int) -> HoldOutcomes:
        """Our hold (``mem``: memory hold) pinned to each node, of its size (sbatch options), the
        holds there read first (``_hold_ids``): an active one is returned, not submitted again. The
        job id sbatch answers, checked; a node's failed sbatch is its outcome, the others go on."""
        out: HoldOutcomes = {n: ids[0] for n, ids in self._hold_ids(sizes, mem=mem).items() if ids}
        for node, size in ((n, z) for n, z in sizes.items() if n not in out):
            name, partition = self._hold_name(node, mem=mem)
            try:
                res = self._run([
                    "sbatch", "--parsable", "--partition", partition, "--nodelist", node, "--nodes", "1", *size,
                    "--job-name", name, "--output", "/dev/null", "--error", "/dev/null", "--chdir", "/",
                    "--comment", comment, "--wrap", HOLD_WRAP,
                ])
                job_id = _sbatch_job_id(res.stdout)
            except AdapterError as exc:
                out[node] = exc
                continue
            _log().info("slurm_mem_hold_submitted" if mem else "slurm_hold_submitted", node=node, job=job_id, **log_kw)
            out[node] = job_id
        return out

    def cancel_hold(self, node: str) -> tuple[str, ...]:
        return self._cancel_ours(node, mem=False)

    def _cancel_ours(self, node: str, *, mem: bool) -> tuple[str, ...]:
        """Cancel our hold (``mem``: our memory hold) on ``node``; the ids cancelled."""
        name, partition = self._hold_name(node, mem=mem)
        ids = self._hold_ids([node], mem=mem)[node]
        if not ids:
            return ()
        # scancel applies the filters to the listed ids too: only our hold jobs can go
        argv = ["scancel", f"--name={name}", f"--partition={partition}"]
        if self.hold_user is not None:
            argv.append(f"--user={self.hold_user}")
        self._run([*argv, *ids])
        _log().info("slurm_mem_hold_cancelled" if mem else "slurm_hold_cancelled", node=node, job=",".join(ids))
        return ids

    def submit_mem_hold(self, node: str, mem_mb: int) -> str:
        """Warm lending's memory hold: pinned to ``node``, 1 CPU, no GPU, ``mem_mb`` of host
        memory, in the never-preempted warm partition (its tier preempts a research job that
        leaves too little memory). Idempotent: an active one is returned."""
        mb, node = validate_mem_mb(mem_mb), validate_node_name(node)
        size = ["--ntasks", "1", "--cpus-per-task", "1", f"--mem={mb}"]
        return outcome(self._submit_ours({node: size}, "gpu-bridge memory hold: a sleeping vLLM replica's host memory",
                                         mem=True, mem_mb=mb), node)

    def cancel_mem_hold(self, node: str) -> tuple[str, ...]:
        return self._cancel_ours(node, mem=True)

    def requeue(self, job_id: str, *, restart_count: int | None = None) -> bool:
        """One job through ``requeue_jobs``: True if requeued, False if not; its error raised."""
        got = self.requeue_jobs({job_id: restart_count})[validate_job_id(job_id)]
        if got.error is not None:
            raise got.error
        return got.requeued

    def requeue_jobs(self, jobs: Mapping[str, int | None]) -> dict[str, RequeueOutcome]:
        ids = {validate_job_id(j): rc for j, rc in jobs.items()}
        if not ids:
            return {}
        # every job re-read right before the requeue, in one read (not the whole queue's JSON:
        # 22.05 ignores --json filters): a job that ended meanwhile is never requeued (Slurm would
        # run a finished job again), nor one Slurm has not preempted, nor another partition's
        res = self._run(["squeue", "--noheader", f"--jobs={','.join(ids)}", "--Format", REQUEUE_CHECK_FORMAT],
                        ok_codes=(0, 1))
        if res.returncode == 1 and "Invalid job id" not in res.stderr:  # rc 1 is "gone" only for one id asked
            raise AdapterError("slurm", f"squeue --jobs failed (rc 1): {sanitize(res.stderr, MAX_STDERR) or '(no output)'}")
        now = parse_requeue_checks(res.stdout, ids) if res.returncode == 0 else {}
        out: dict[str, RequeueOutcome] = {}
        for jid, restart_count in ids.items():
            check = now.get(jid)
            why = "gone" if check is None else check.refusal((self.preempt_partition, self.fast_partition), restart_count)
            if check is not None and check.partition in (self.hold_partition, self.warm_partition):
                err = NotOursError("slurm", f"requeue {jid}: it is a hold job, not a research job")
                out[jid] = RequeueOutcome(jid, False, error=err)
            elif why:
                _log().info("slurm_requeue_skipped", job=jid, reason=why)
                out[jid] = RequeueOutcome(jid, False, skipped=why)
        due = {j: now[j] for j in ids if j not in out}
        return out | self._requeue_now(due, ids) if due else out

    def _requeue_now(self, due: Mapping[str, RequeueCheck], asked: Mapping[str, int | None]) -> dict[str, RequeueOutcome]:
        """``scontrol requeue`` of the jobs just checked, in one command. Slurm requeues each job it
        can and names each it could not ("<why> for job <id>"); those, or all of them when the
        answer names none (a timeout: nothing is known), go again one by one, each re-read first,
        so one bad job never holds back the others and none is requeued twice."""
        try:
            res = self._run(["scontrol", "requeue", ",".join(due)], ok_codes=(0,) if len(due) == 1 else (0, 1))
        except AdapterError as exc:
            if len(due) == 1:
                return {j: RequeueOutcome(j, False, error=exc) for j in due}
            failed, why = set(due), str(exc)
        else:
            named = (parse_requeue_errors(res.stderr) or set()) & set(due)
            failed, why = (named or set(due)) if res.returncode else set(), sanitize(res.stderr, MAX_STDERR)
        out = {}
        for jid, check in due.items():
            if jid in failed:
                _log().warning("slurm_requeue_retried_alone", job=jid, error=why)
                out[jid] = self.requeue_jobs({jid: asked[jid]})[jid]
            else:
                _log().info("slurm_job_requeued", job=jid, restart_count=check.restart_count)
                out[jid] = RequeueOutcome(jid, True)
        return out

    def set_tier(self, node: str, partition: str) -> bool:
        """Lend ``node`` to one tier: put it in ``partition`` (the preempt or the fast one) and
        take it out of the other (``scontrol update PartitionName=P Nodes=...``), so only that
        tier's jobs start there. Slurm keeps the lists until a reconfigure or restart resets
        slurm.conf's (the node is then in both: read as the normal tier)."""
        validate_node_name(node)
        tiers = (self.preempt_partition, self.fast_partition)
        if self.fast_partition is None or partition not in tiers:
            raise AdapterError("slurm", f"set_tier {node}: {partition!r} is not a tier partition {tiers}")
        parts, changed = self.partitions(), False
        for p in sorted(tiers, key=lambda p: p != partition):  # into the new tier first, then out of the old
            if p not in parts or parts[p].get("Nodes", "").upper() == "ALL":
                raise AdapterError("slurm", f"set_tier {node}: partition {p} missing or Nodes=ALL (needs a node list)")
            nodes = expand(parts[p].get("Nodes", ""))
            if (node in nodes) == (p == partition):
                continue
            new = (*nodes, node) if p == partition else tuple(n for n in nodes if n != node)
            self._run(["scontrol", "update", f"PartitionName={p}", f"Nodes={','.join(new)}"])
            changed = True
        if changed:
            _log().info("slurm_tier_set", node=node, partition=partition)
        return changed

    # ---- Slurm's own holds and drains (after a controller crash; docs/slurm-adapter.md) ----
    def release(self, job_id: str, reason: str) -> bool:
        """Release a job Slurm itself held with ``reason`` (e.g. launch_failed_requeued_held):
        only if it is still pending for that reason (a hold by a user or an administrator,
        JobHeldUser/JobHeldAdmin, is never released). False if it no longer is so."""
        jid = validate_job_id(job_id)
        job = next((j for j in self.jobs() if j.job_id == jid), None)
        if job is None or not job.held_for(reason):
            return False
        if job.partition in (self.hold_partition, self.warm_partition):  # as requeue_jobs: the bridge's partitions
            raise NotOursError("slurm", f"release {jid}: it is a hold job, not a research job")
        self._run(["scontrol", "release", jid])
        _log().info("slurm_job_released", job=jid, reason=job.state_description or job.state_reason)
        return True

    def _own_drain(self, node: str, slurm_reason: str, *, empty: bool) -> SlurmNode | None:
        """The node now, if it carries Slurm's own drain ``slurm_reason`` (whole, case-insensitive:
        ``wellknown.is_slurm_reason``), responds, and (``empty``) has nothing allocated or
        completing; None otherwise."""
        cur = self.node_now(node)
        if not cur.drained or cur.reason_ours or not wellknown.is_slurm_reason(cur.reason, slurm_reason):
            return None
        if cur.down or (empty and cur.allocated):
            return None
        return cur

    def clear_own_drain(self, node: str, slurm_reason: str) -> bool:
        """Lift a drain Slurm set itself (``slurm_reason``) on an empty node: an administrator's
        or another reason is never touched. False if the node is not (or no longer) so."""
        validate_node_name(node)
        cur = self._own_drain(node, slurm_reason, empty=True)
        if cur is None:
            return False
        self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        _log().warning("slurm_own_drain_cleared", node=node, slurm_reason=cur.reason)
        return True

    def take_over_drain(self, node: str, slurm_reason: str, reason: str) -> bool:
        """Replace Slurm's own drain reason (``slurm_reason``) on an empty node by ours: the
        node stays drained throughout (so it may hold our hold job), and from then on the
        drain is gpu-bridge's."""
        validate_node_name(node)
        cur = self._own_drain(node, slurm_reason, empty=False)
        if cur is None:
            return False
        text = drain_reason(reason)
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={text}"])
        _log().warning("slurm_own_drain_taken_over", node=node, slurm_reason=cur.reason, reason=text)
        return True
