"""Pure parsers of ``sinfo --json`` and ``squeue --json``, Slurm 22.05 and 24.11 shapes.

22.05 (openapi v0.0.38): ``{"meta","errors","nodes":[{name, state:"idle", state_flags:[..],
reason, gres:"gpu:4", ...}]}``; jobs with ``job_state:"RUNNING"`` and plain integers.
24.11 (data_parser v0.0.42): ``{"sinfo":[{nodes:{nodes:[..]}, node:{state:["IDLE","DRAIN"]},
reason:{description,..}, gres:{total,used}, partition:{name}}], ...}``; jobs with
``job_state:["RUNNING"]`` and ``{"set","infinite","number"}`` number objects.

Anything unexpected raises AdapterError naming the command, the record and the key: a shape
we do not understand is never read as "no nodes" or "no jobs".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
import math
import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import msgspec
import orjson

from bridge import wellknown
from bridge.errors import AdapterError
from bridge.model import JOB_STATES_ENDED, holds_nodes

from .hostlist import expand
from .types import BASE_STATES, SlurmJobInfo, SlurmNode

_GPU_COUNT = re.compile(r"(?:^|[,\s])(?:gres[:/])?gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


def _fail(what: str, msg: str) -> AdapterError:
    return AdapterError("slurm", f"{what}: {msg}")


def _guarded(what: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``; a record of a shape the checks above did not foresee (a list where a
    string was expected, ...) becomes an AdapterError naming it, never a crash of the tick."""
    try:
        return fn(*args)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ArithmeticError) as e:
        raise _fail(what, f"malformed record ({type(e).__name__}: {str(e)[:120]})") from None


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large document is decoded and turned into
    records (a parser decorated with it): JSON makes no reference cycles (reference counting frees it all), but the
    thousands of objects alive during the parse trigger collections that traverse the whole
    heap, over and over (about a third of a tick's CPU at 2,000 nodes)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_json(text: str, what: str) -> Mapping[str, Any]:
    """Parse a command's JSON output; truncated/garbled/empty output and Slurm-reported
    errors raise AdapterError."""
    if not text.strip():
        raise _fail(what, "empty output")
    try:
        try:
            # orjson decodes squeue's 6 MB at 2,000 nodes about 3x faster than the standard
            # library; anything it refuses (NaN literals, integers beyond 64 bits) falls back
            doc = orjson.loads(text)
        except orjson.JSONDecodeError:
            doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(what, f"unparseable JSON ({e.msg} at line {e.lineno} col {e.colno}; {len(text)} bytes)") from None
    if not isinstance(doc, dict):
        raise _fail(what, f"expected a JSON object, got {type(doc).__name__}")
    errors = doc.get("errors")
    if errors:
        raise _fail(what, f"Slurm reported errors: {str(errors)[:300]}")
    return doc


# The keys each record parser reads: the fast decode keeps these and skips the rest of a
# record (a job of ``squeue --json`` has about 100 keys; the parsers read 17).
JOB_KEYS = ("job_id", "job_state", "nodes", "tres_per_node", "gres_detail", "name", "user_name", "partition",
            "start_time", "comment", "requeue", "restart_cnt", "preempt_time", "end_time", "state_reason",
            "batch_host", "state_description")
NODE_KEYS_22 = ("name", "state", "state_flags", "partitions", "reason", "gres", "gres_used", "reason_set_by_user",
                "reason_changed_at")
SINFO_KEYS_24 = ("nodes", "node", "reason", "gres", "partition")


@functools.cache
def _decoder(lists: tuple[tuple[str, tuple[str, ...]], ...]) -> msgspec.json.Decoder[Any]:
    """A decoder of a document whose list ``key`` holds records of which only ``keys`` are kept."""
    unset = msgspec.UNSET
    fields: list[tuple[str, Any, Any]] = [("errors", Any, unset)]
    for key, keys in lists:
        rec = msgspec.defstruct(f"_{key}", [(k, Any, unset) for k in keys])
        fields.append((key, list[rec] | msgspec.UnsetType, unset))  # type: ignore[valid-type]
    return msgspec.json.Decoder(msgspec.defstruct("_doc", fields))


def load_records(text: str, what: str, lists: tuple[tuple[str, tuple[str, ...]], ...]) -> Mapping[str, Any]:
    """``load_json`` of a document read for the records of its lists only, each record a dict of
    the ``keys`` it has: decoding skips every other key without building it (at 2,000 nodes
    squeue's 6 MB in about a quarter of ``load_json``'s time). Anything the fast decode does not
    take as that shape (not JSON, not an object, a record not an object, no list at all) goes
    through ``load_json`` and the parsers' checks, which name the problem."""
    try:
        doc = _decoder(lists).decode(text)
    except msgspec.DecodeError:  # ValidationError is one
        return load_json(text, what)
    unset = msgspec.UNSET
    if doc.errors is not unset and doc.errors:
        raise _fail(what, f"Slurm reported errors: {str(doc.errors)[:300]}")
    out = {key: [{k: v for k in keys if (v := getattr(r, k)) is not unset} for r in recs]
           for key, keys in lists if (recs := getattr(doc, key)) is not unset}
    return out if out else load_json(text, what)


def number(value: Any, what: str) -> float | None:
    """A Slurm number: plain int/float (22.05) or ``{"set","infinite","number"}`` (24.11).
    Unset, infinite or 0 (Slurm's "none" for times) -> None."""
    if isinstance(value, bool):
        raise _fail(what, f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):  # json.loads reads NaN and Infinity: a time of nan compared as nothing
            raise _fail(what, f"expected a finite number, got {value!r}")
        return float(value) if value else None
    if isinstance(value, dict):
        if "number" not in value:
            raise _fail(what, f"number object without 'number': {str(value)[:80]}")
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return number(value["number"], what)
    if value is None:
        return None
    raise _fail(what, f"expected a number, got {type(value).__name__}")


MAX_COUNT = 1_000_000_000  # a restart count beyond it is not one Slurm keeps


def _int(value: Any, what: str) -> int:
    """A count (``restart_cnt``): a whole number 0..``MAX_COUNT``; unset -> 0."""
    v = number(value, what)
    if v is None:
        return 0
    if not v.is_integer() or not 0 <= v <= MAX_COUNT:
        raise _fail(what, f"expected a whole number 0..{MAX_COUNT:,}, got {v!r}")
    return int(v)


def _job_id(value: Any, what: str) -> str:
    """A job id: a positive whole number (1.5 was read as job 1, -5 and 0 taken as they came:
    a wrong id would be a write to another job)."""
    v = number(value, what)
    if v is None or not v.is_integer() or not 0 < v < 2**63:
        raise _fail(what, f"expected a positive whole job id, got {value!r:.60}")
    return str(int(v))


def _requeue(rec: Mapping[str, Any], what: str) -> bool:
    """``requeue``: true/false (absent: true, Slurm's default); a string ``"false"`` was read as
    true (any non-empty value was), and the victim choice counts a checkpoint only if requeued."""
    v = rec.get("requeue", True)
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise _fail(what, f"key 'requeue': expected true or false, got {v!r:.60}")


def _str(rec: Mapping[str, Any], key: str, what: str, default: str | None = None) -> str:
    if key not in rec:
        if default is not None:
            return default
        raise _fail(what, f"missing key {key!r}")
    v = rec[key]
    if v is None:
        return ""
    if not isinstance(v, str):
        raise _fail(what, f"key {key!r}: expected a string, got {type(v).__name__}")
    return v


@functools.lru_cache(maxsize=4096)
def gpu_count(gres: str) -> int:
    """``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gres:gpu:4``, ``gres/gpu:4`` -> 4 (sum over entries).
    Cached: a cluster has a handful of distinct gres strings, read thousands of times a tick."""
    return sum(int(m.group(1)) for m in _GPU_COUNT.finditer(gres or ""))


def _split_state(states: list[str], what: str) -> tuple[str, frozenset[str]]:
    if not states or not all(isinstance(s, str) for s in states):
        raise _fail(what, f"bad node state {states!r}")
    base = ""
    flags = set()
    for s in states:
        low = s.lower()
        if not base and low in BASE_STATES:
            base = low
        else:
            flags.add(s.upper())
    if not base:
        raise _fail(what, f"no base state in {states!r}")
    return base, frozenset(flags)


def _node_22(rec: Any, i: int) -> SlurmNode:
    what = f"sinfo --json: nodes[{i}]"
    if not isinstance(rec, dict):
        raise _fail(what, "expected an object")
    name = _str(rec, "name", what)
    what = f"sinfo --json: node {name!r}"
    state = rec.get("state")
    flags = rec.get("state_flags", [])
    if not isinstance(state, str) or not isinstance(flags, list):
        raise _fail(what, f"bad 'state'/'state_flags': {state!r} {flags!r}")
    base, fl = _split_state([state, *flags], what)
    parts = rec.get("partitions") or []
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise _fail(what, f"bad 'partitions' (the node's tier is read from it): {parts!r:.80}")
    return SlurmNode(
        name=name,
        state=base,
        flags=fl,
        reason=_str(rec, "reason", what, ""),
        gpus=gpu_count(_str(rec, "gres", what, "")),
        gpus_used=gpu_count(_str(rec, "gres_used", what, "")),
        partitions=tuple(sorted({str(p) for p in parts})),
        reason_user=_str(rec, "reason_set_by_user", what, ""),
        reason_time=number(rec.get("reason_changed_at"), what + " reason_changed_at"),
    )


def _nodes_24(entries: Any) -> list[SlurmNode]:
    if not isinstance(entries, list):
        raise _fail("sinfo --json", "'sinfo' is not a list")
    by_name: dict[str, SlurmNode] = {}
    for i, rec in enumerate(entries):
        what = f"sinfo --json: sinfo[{i}]"
        if not isinstance(rec, dict):
            raise _fail(what, "expected an object")
        try:
            names = rec["nodes"]["nodes"]
            states = rec["node"]["state"]
        except (KeyError, TypeError):
            raise _fail(what, "missing 'nodes.nodes' or 'node.state'") from None
        if not isinstance(names, list) or not isinstance(states, list):
            raise _fail(what, "'nodes.nodes' and 'node.state' must be lists")
        base, fl = _split_state(states, what)
        reason_obj = rec.get("reason", "")
        if isinstance(reason_obj, dict):
            reason = str(reason_obj.get("description") or "")
            r_user = str(reason_obj.get("user") or "")
            r_time = number(reason_obj.get("time"), what + " reason.time")
        elif isinstance(reason_obj, str) or reason_obj is None:
            reason, r_user, r_time = reason_obj or "", "", None
        else:
            raise _fail(what, f"bad 'reason': {str(reason_obj)[:80]}")
        gres = rec.get("gres") or {}
        if not isinstance(gres, dict):
            raise _fail(what, "'gres' must be an object")
        part = rec.get("partition") or {}
        pname = part.get("name") if isinstance(part, dict) else None
        expanded = [name for group in names for name in expand(str(group))]
        if len(expanded) > 1:
            # 24.11 groups nodes of one state without --Node: the entry carries one node's
            # reason and the group's gres use, so no node's own reason can be known
            raise _fail(what, f"{len(expanded)} nodes in one entry ({str(names)[:60]}): per-node facts lost; "
                              "run sinfo --json with --Node")
        for name in expanded:
            prev = by_name.get(name)
            parts = (prev.partitions if prev else ()) + ((str(pname),) if pname else ())
            by_name[name] = SlurmNode(
                name=name, state=base, flags=fl, reason=reason,
                gpus=gpu_count(str(gres.get("total") or "")), gpus_used=gpu_count(str(gres.get("used") or "")),
                # sorted: 24.11 lists a node's partition entries in no fixed order, and the same
                # node read twice must compare equal
                partitions=tuple(sorted(set(parts))), reason_user=r_user, reason_time=r_time,
            )
    return list(by_name.values())


@_no_cyclic_gc()
def parse_nodes(text: str) -> tuple[SlurmNode, ...]:
    """All nodes of ``sinfo --json`` output, sorted by name (either version's shape)."""
    doc = load_records(text, "sinfo --json", (("sinfo", SINFO_KEYS_24), ("nodes", NODE_KEYS_22)))
    if "sinfo" in doc:
        nodes = _guarded("sinfo --json", _nodes_24, doc["sinfo"])
    elif "nodes" in doc:
        raw = doc["nodes"]
        if not isinstance(raw, list):
            raise _fail("sinfo --json", "'nodes' is not a list")
        nodes = [_guarded(f"sinfo --json: nodes[{i}]", _node_22, r, i) for i, r in enumerate(raw)]
    else:
        raise _fail("sinfo --json", f"unknown shape: no 'nodes' or 'sinfo' key (keys: {sorted(doc)[:10]})")
    return tuple(sorted(nodes, key=lambda n: n.name))


def checkpoint_time(comment: str) -> float | None:
    """``gpu-bridge:checkpoint=<unix time>`` anywhere in the comment (comma/space separated);
    a malformed value -> None (a job's comment is user data, never trusted to parse)."""
    # bounded: the daemon writes it as a date in the preemption Event (checkpoint=1e300 raised
    # OverflowError out of the reclaim's first step: any researcher could stop the daemon)
    return _comment_number(comment, wellknown.SLURM_CHECKPOINT_COMMENT, lo=0.0, hi=wellknown.LAST_UNIX_S)


def signal_save_s(comment: str) -> float | None:
    """``gpu-bridge:save-on-signal=<seconds>``: the job checkpoints when Slurm signals it
    (at the start of GraceTime) and needs that long; malformed -> None (counts as not saving).
    Claiming it only gets a job preempted first, so nobody gains by lying."""
    return _comment_number(comment, wellknown.SLURM_SIGNAL_SAVE_COMMENT, lo=-1e-9, hi=86400.0)


def _comment_number(comment: str, prefix: str, *, lo: float, hi: float = float("inf")) -> float | None:
    """The number after ``prefix`` in a comment token, if finite and in (lo, hi]."""
    if not comment or prefix not in comment:
        return None  # most jobs: no token to look for
    for tok in re.split(r"[\s,;]+", comment):
        if tok.startswith(prefix):
            try:
                v = float(tok[len(prefix) :])
            except ValueError:
                return None
            return v if lo < v <= hi and v != float("inf") else None
    return None


def _job(rec: Any, i: int) -> SlurmJobInfo:
    what = f"squeue --json: jobs[{i}]"
    if not isinstance(rec, dict):
        raise _fail(what, "expected an object")
    if "job_id" not in rec:
        raise _fail(what, "missing key 'job_id'")
    jid = _job_id(rec["job_id"], what + " job_id")
    what = f"squeue --json: job {jid}"
    st = rec.get("job_state")
    if isinstance(st, list) and st and all(isinstance(s, str) for s in st):
        state = st[0].lower()
    elif isinstance(st, str) and st:
        state = st.lower()
    else:
        raise _fail(what, f"bad 'job_state': {st!r}")
    nodes = expand(_str(rec, "nodes", what, ""))
    tres = _str(rec, "tres_per_node", what, "")
    gpus = gpu_count(tres)
    if not gpus:
        gd = rec.get("gres_detail") or []
        gpus = max((gpu_count(str(g)) for g in gd), default=0) if isinstance(gd, list) else 0
    running = holds_nodes(state)
    return SlurmJobInfo(
        job_id=jid,
        name=_str(rec, "name", what),
        user=_str(rec, "user_name", what, ""),
        partition=_str(rec, "partition", what),
        state=state,
        nodes=nodes if running else (),
        start_time=number(rec.get("start_time"), what + " start_time") if running else None,
        checkpoint_time=checkpoint_time(_str(rec, "comment", what, "")),
        signal_save_s=signal_save_s(_str(rec, "comment", what, "")),
        requeueable=_requeue(rec, what),
        gpus_per_node=gpus,
        restart_count=_int(rec.get("restart_cnt", 0), what + " restart_cnt"),
        preempt_time=number(rec.get("preempt_time"), what + " preempt_time"),
        end_time=number(rec.get("end_time"), what + " end_time") if running else None,
        state_reason=_str(rec, "state_reason", what, ""),
        batch_host=_str(rec, "batch_host", what, ""),
        state_description=_str(rec, "state_description", what, ""),
    )


@_no_cyclic_gc()
def parse_jobs(text: str, *, active_only: bool = True) -> tuple[SlurmJobInfo, ...]:
    """Jobs of ``squeue --json`` output (either shape), by job id; finished ones (still listed
    for MinJobAge) dropped unless ``active_only=False``."""
    doc = load_records(text, "squeue --json", (("jobs", JOB_KEYS),))
    raw = doc.get("jobs")
    if raw is None:
        raise _fail("squeue --json", f"unknown shape: no 'jobs' key (keys: {sorted(doc)[:10]})")
    if not isinstance(raw, list):
        raise _fail("squeue --json", "'jobs' is not a list")
    jobs = [_guarded(f"squeue --json: jobs[{i}]", _job, r, i) for i, r in enumerate(raw)]
    if active_only:
        jobs = [j for j in jobs if j.state not in JOB_STATES_ENDED]  # a state unknown here is kept
    return tuple(sorted(jobs, key=lambda j: (len(j.job_id), j.job_id)))


def parse_ping(text: str) -> bool:
    """``scontrol ping``: True when the (primary) controller is UP."""
    return bool(re.search(r"\bis UP\b", text or ""))


# --- one node, from `scontrol --oneliner show node NAME` (the writes' cheap precondition read) ---
_SC_NAME = re.compile(r"^NodeName=(\S+)")
_SC_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_SC_GRES = re.compile(r"(?:^|\s)Gres=(\S+)")
# Reason is the last key; scontrol appends " [user@time]"
_SC_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?: \[([^@\]\s]*)@[^\]]*\])?\s*$")


def parse_scontrol_node(text: str) -> SlurmNode:
    """The one node `scontrol --oneliner show node NAME` prints (same meaning as in sinfo --json).

    Used before each drain/resume so a write checks the node's state as it is now without
    decoding the whole cluster's sinfo JSON (2 MB at 2,000 nodes)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) != 1 or not _SC_NAME.match(lines[0]):
        raise AdapterError("slurm", f"scontrol show node: expected one NodeName= line, got {len(lines)} line(s)")
    line = lines[0]
    name = _SC_NAME.match(line).group(1)  # type: ignore[union-attr]
    state_m = _SC_STATE.search(line)
    if state_m is None:
        raise AdapterError("slurm", f"scontrol show node {name}: no State= field")
    parts = state_m.group(1).split("+")
    base_raw = parts[0]
    flags = {p.upper() for p in parts[1:] if p}
    if base_raw.endswith("*"):
        flags.add("NOT_RESPONDING")
    base = base_raw.rstrip("*~#!%$@^-").lower()
    if base in ("drained", "draining", "drain"):  # shown by some versions: a flag on an idle node
        base, flags = "idle", flags | {"DRAIN"}
    if base not in BASE_STATES:
        raise AdapterError("slurm", f"scontrol show node {name}: unknown state {state_m.group(1)[:40]!r}")
    reason, user = "", ""
    reason_m = _SC_REASON.search(line)
    if reason_m is not None:
        reason, user = reason_m.group(1).strip(), reason_m.group(2) or ""
    gres_m = _SC_GRES.search(line)
    gpus = gpu_count(gres_m.group(1)) if gres_m is not None else 0
    return SlurmNode(name=name, state=base, flags=frozenset(flags), reason=reason, gpus=gpus, reason_user=user)


def parse_scontrol_nodes(text: str, asked: Collection[str]) -> dict[str, SlurmNode]:
    """``scontrol --oneliner show node A,B,...``: one line per node (22.05 and 24.11), each parsed
    as ``parse_scontrol_node``. Every node asked must be there exactly once, and no other: the
    drains decide on it, so an answer not understood fails them all (no write made blind)."""
    out: dict[str, SlurmNode] = {}
    for line in (ln for ln in text.splitlines() if ln.strip()):
        n = parse_scontrol_node(line)
        if n.name in out or n.name not in asked:
            raise AdapterError("slurm", f"scontrol show node: {n.name} {'listed twice' if n.name in out else 'not asked'}")
        out[n.name] = n
    missing = [n for n in asked if n not in out]
    if missing:
        raise AdapterError("slurm", f"scontrol show node: {', '.join(missing[:10])} missing from its answer")
    return out


# --- the running configuration (`gpu-bridge check-slurm`) -------------------------------------
_CONFIG_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)\s*=\s?(.*)$")


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = value`` lines -> {Key: value} ("" for an unset key,
    printed "(null)"). The first occurrence of
    a key counts (later sections, e.g. cgroup.conf's, never shadow slurm.conf's keys)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _CONFIG_LINE.match(line.strip())
        if m is not None:
            value = m.group(2).strip()
            out.setdefault(m.group(1), "" if value == "(null)" else value)  # "(null)": not set
    if "PreemptType" not in out and "SlurmctldPort" not in out:
        raise AdapterError("slurm", "scontrol show config: no Key = value settings in its output")
    return out


def parse_show_partitions(text: str) -> dict[str, dict[str, str]]:
    """``scontrol --oneliner show partition``: one ``PartitionName=... Key=value ...`` line per
    partition -> {name: {Key: value}}."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        name = fields.get("PartitionName")
        if name:
            out[name] = fields
    return out


# --- the requeue's re-read of its jobs, slurmctld's clock, a partition's GraceTime ------------------
# squeue --Format fields, each ended by "|": none is user-controlled text (a job name or comment
# could otherwise forge a field)
REQUEUE_CHECK_FORMAT = "JobID:|,State:|,Partition:|,PreemptTime:|,RestartCnt:|"
_PARTITION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclasses.dataclass(frozen=True, slots=True)
class RequeueCheck:
    """One job as ``squeue --jobs=ID,... --Format REQUEUE_CHECK_FORMAT`` has it right now."""

    job_id: str
    state: str  # lowercase
    partition: str
    preempted: bool  # Slurm recorded a PreemptTime
    restart_count: int

    def refusal(self, partitions: tuple[str | None, ...], restart_count: int | None) -> str:
        """Why this job must not be requeued now ("" = it may); ``partitions``: the preempt ones."""
        if self.state != "running":
            return f"not running ({self.state})"
        if self.partition not in partitions:
            return f"partition {self.partition}, not {'/'.join(p for p in partitions if p)}"
        if not self.preempted:
            return "Slurm has not preempted it (no PreemptTime): it gets its signal and GraceTime first"
        if restart_count is not None and self.restart_count != restart_count:
            return f"another run (restart {self.restart_count}, preempted run {restart_count})"
        return ""


def parse_requeue_checks(text: str, job_ids: Collection[str]) -> dict[str, RequeueCheck]:
    """The re-read of ``job_ids`` (``squeue --jobs=A,B,... --Format REQUEUE_CHECK_FORMAT``), by
    job id; a job squeue no longer lists is absent. Lines of other jobs (the other tasks of an
    array whose id was asked) are left out; a line not of the format raises, naming its field."""
    out: dict[str, RequeueCheck] = {}
    for n, line in enumerate((ln for ln in text.splitlines() if ln.strip()), 1):
        fields = [f.strip() for f in line.strip().split("|")]
        if len(fields) < 5:
            raise _fail("squeue --jobs", f"line {n}: expected JobID|State|Partition|PreemptTime|RestartCnt|, got {line[:80]!r}")
        jid, state, partition, preempt, restarts = fields[:5]
        if jid not in job_ids:
            continue
        if not state or not restarts.isdigit():
            field, value = ("RestartCnt", restarts) if state else ("State", state)
            raise _fail("squeue --jobs", f"job {jid}: bad {field} {value[:20]!r}")
        if jid in out:
            raise _fail("squeue --jobs", f"job {jid}: listed twice")
        out[jid] = RequeueCheck(jid, state.lower(), partition, preempt not in ("", "N/A", "None", "Unknown"), int(restarts))
    return out


_REQUEUE_ERROR = re.compile(r"\S\s+for job (\S+)$")


def parse_requeue_errors(stderr: str) -> set[str] | None:
    """The jobs ``scontrol requeue A,B,...`` could not requeue (rc 1): Slurm 22.05 and 24.11 requeue
    every job they can and print "<why> for job <id>" for each other one; None when a line is
    not of that form (then nothing is known of any job)."""
    named = [_REQUEUE_ERROR.search(ln.strip()) for ln in stderr.splitlines() if ln.strip()]
    return {m.group(1) for m in named if m} if named and all(named) else None


_SDIAG_TIME = re.compile(r"^sdiag output at .*\((\d+)\)\s*$", re.MULTILINE)


def parse_sdiag_time(text: str) -> float:
    """slurmctld's time from sdiag's header line "sdiag output at <date> (<unix time>)"."""
    m = _SDIAG_TIME.search(text or "")
    if m is None:
        raise AdapterError("slurm", "sdiag: no 'sdiag output at ... (<unix time>)' line")
    return float(m.group(1))


def validate_partition(name: str) -> str:
    if not isinstance(name, str) or not _PARTITION.fullmatch(name):
        raise AdapterError("slurm", f"invalid partition name {str(name)[:40]!r}")
    return name


def parse_grace_time(text: str, partition: str) -> float:
    """GraceTime (seconds) of ``scontrol --oneliner show partition NAME``'s one line."""
    parts = parse_show_partitions(text)
    if list(parts) != [partition]:
        raise AdapterError("slurm", f"scontrol show partition {partition}: expected one PartitionName={partition} line")
    grace = parts[partition].get("GraceTime", "")
    if not grace.isdigit():
        raise AdapterError("slurm", f"scontrol show partition {partition}: no GraceTime=<seconds> field")
    return float(grace)
