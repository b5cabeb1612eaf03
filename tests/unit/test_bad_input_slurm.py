"""Slurm JSON of an unknown shape, truncated or fuzzed: the parsers raise a clear
AdapterError (never another exception, never "no nodes"/"no jobs"), and the daemon, reading
it through the real CLI adapter, holds every node: no write to Kubernetes or Slurm, no lend,
no reclaim. The same world with valid output does act (the control)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge import wellknown as wk
from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.prom.types import PromPool
from bridge.adapters.slurm.cli import CliSlurm, CommandResult
from tests.slurm_text import sdiag
from bridge.adapters.slurm.parse import parse_jobs, parse_nodes
from bridge.config import default_config
from bridge.daemon import Daemon
from bridge.errors import AdapterError
from bridge.model import ActionKind, HoldReason, LoadSignals, Phase
from bridge.observe import Readings, join

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
DOCS = {name: (FIX / name).read_text() for name in
        ("sinfo-22.05.json", "sinfo-24.11.json", "squeue-22.05.json", "squeue-24.11.json")}
NOW = 1_767_225_600.0


def parse(name: str, text: str) -> Any:
    return parse_nodes(text) if name.startswith("sinfo") else parse_jobs(text)


# --- the parsers -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DOCS))
def test_truncated_at_every_point_is_an_adapter_error(name: str) -> None:
    text = DOCS[name]
    assert parse(name, text)  # the whole document parses
    step = max(1, len(text) // 400)
    for cut in range(0, len(text) - 1, step):
        piece = text[:cut]
        try:
            parse(name, piece)
        except AdapterError as exc:
            assert str(exc).startswith("slurm: "), exc
            continue
        # a prefix that is itself a complete JSON document (whitespace cut) must equal the whole
        assert piece.strip() == text.strip(), f"{name} cut at {cut} parsed as a valid document"


@pytest.mark.parametrize(
    "text",
    [
        '{"nodes": null}', '{"sinfo": {}}', '{"sinfo": [1]}', '{"jobs": {}}', '{"jobs": [1]}', '{"jobs": null}',
        '{"meta": {"plugin": {"data_parser": "v0.0.99"}}, "things": []}', "null", "42", '"text"', "[]",
        '{"nodes": [{"name": "n1", "state": ["IDLE"], "state_flags": "DRAIN"}]}',
        '{"sinfo": [{"nodes": {"nodes": "n1"}, "node": {"state": "IDLE"}}]}',
        '{"sinfo": [{"nodes": {"nodes": ["n[1-"]}, "node": {"state": ["IDLE"]}}]}',
        '{"jobs": [{"job_id": "abc", "job_state": "RUNNING", "name": "x", "partition": "p"}]}',
        '{"jobs": [{"job_id": 1, "job_state": [], "name": "x", "partition": "p"}]}',
        '{"jobs": [{"job_id": 1, "job_state": "RUNNING", "name": 7, "partition": "p"}]}',
        '{"jobs": [{"job_id": 1, "job_state": "RUNNING", "name": "x", "partition": "p", "nodes": ["n1"]}]}',
        '\x00\x01binary', "<html>502 Bad Gateway</html>",
    ],
)
def test_unknown_shapes_are_adapter_errors(text: str) -> None:
    for parser in (parse_nodes, parse_jobs):
        with pytest.raises(AdapterError) as info:
            parser(text)
        assert str(info.value).startswith("slurm: ") and len(str(info.value)) < 600


JOB = {"job_id": 12, "job_state": ["RUNNING"], "nodes": "gpu-node-01", "name": "x", "partition": "preempt",
       "start_time": {"set": True, "infinite": False, "number": 1000}, "requeue": True, "restart_cnt": 0}


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        # read as job 1, job -5, job 0 and job 7 before: a write meant for a job would go to another
        ("job_id", 1.5, "job_id: expected a positive whole job id, got 1.5"),
        ("job_id", -5, "job_id: expected a positive whole job id, got -5"),
        ("job_id", 0, "job_id: expected a positive whole job id, got 0"),
        ("job_id", {"set": True, "infinite": False, "number": 7.9}, "job_id: expected a positive whole job id"),
        ("job_id", float("nan"), "job_id: expected a finite number, got nan"),
        # NaN / Infinity (json.loads reads them) were kept as times: compared as nothing, summed as nan
        ("start_time", float("nan"), "job 12 start_time: expected a finite number, got nan"),
        ("start_time", float("inf"), "job 12 start_time: expected a finite number, got inf"),
        ("preempt_time", float("nan"), "job 12 preempt_time: expected a finite number, got nan"),
        ("end_time", float("-inf"), "job 12 end_time: expected a finite number, got -inf"),
        # a count of -3, 2.7 or 1e300 was kept (int(1e300) has 301 digits)
        ("restart_cnt", -3, "job 12 restart_cnt: expected a whole number 0..1,000,000,000, got -3.0"),
        ("restart_cnt", 2.7, "job 12 restart_cnt: expected a whole number 0..1,000,000,000, got 2.7"),
        ("restart_cnt", 1e300, "job 12 restart_cnt: expected a whole number"),
        # "false" was read as requeueable (bool() of any non-empty value), null as not
        ("requeue", "false", "job 12: key 'requeue': expected true or false, got 'false'"),
        ("requeue", None, "job 12: key 'requeue': expected true or false, got None"),
        ("requeue", [1], "job 12: key 'requeue': expected true or false, got [1]"),
    ],
)
def test_job_fields_of_the_wrong_kind_are_named(key: str, value: Any, says: str) -> None:
    with pytest.raises(AdapterError) as info:
        parse_jobs(json.dumps({"jobs": [JOB | {key: value}]}), active_only=False)
    assert str(info.value).startswith("slurm: squeue --json: ") and says in str(info.value), info.value


def test_a_nan_time_in_sinfo_is_named() -> None:
    node = {"name": "gpu-node-01", "state": "idle", "state_flags": ["DRAIN"], "reason": "x", "reason_changed_at": float("nan")}
    with pytest.raises(AdapterError, match="node 'gpu-node-01' reason_changed_at: expected a finite number, got nan"):
        parse_nodes(json.dumps({"nodes": [node]}))


def test_well_formed_job_fields_still_parse() -> None:
    (job,) = parse_jobs(json.dumps({"jobs": [JOB | {"requeue": False, "restart_cnt": 3.0}]}), active_only=False)
    assert (job.job_id, job.requeueable, job.restart_count, job.start_time) == ("12", False, 3, 1000.0)
    (job,) = parse_jobs(json.dumps({"jobs": [{k: v for k, v in JOB.items() if k != "requeue"}]}), active_only=False)
    assert job.requeueable  # absent: Slurm's default


garbage = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(), st.text(max_size=20),
    st.lists(st.one_of(st.integers(), st.text(max_size=8), st.none()), max_size=3),
    st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8), st.none()), max_size=3),
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            out += _paths(v, (*prefix, i))
    return out


PARSED = {name: json.loads(text) for name, text in DOCS.items()}
PATHS = {name: _paths(doc) for name, doc in PARSED.items()}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzzed_documents_parse_or_raise_adapter_error(data: st.DataObject) -> None:
    """Any key of a recorded document replaced by garbage, or removed: the parse either
    succeeds or raises AdapterError; a TypeError/KeyError/... would crash the daemon's tick."""
    name = data.draw(st.sampled_from(sorted(DOCS)))
    doc = copy.deepcopy(PARSED[name])
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        path = data.draw(st.sampled_from(PATHS[name]))
        cur = doc
        try:
            for p in path[:-1]:
                cur = cur[p]
            if data.draw(st.booleans()) and isinstance(cur, dict):
                cur.pop(path[-1], None)
            else:
                cur[path[-1]] = data.draw(garbage)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation changed the shape under this path
    try:
        parse(name, json.dumps(doc))
    except AdapterError:
        pass


# --- the daemon, reading Slurm through the real CLI adapter -------------------------------------

NODES = [f"gpu-node-0{i}" for i in range(1, 5)]


def sinfo(nodes: Sequence[str] = NODES, undrained: Sequence[str] = ()) -> str:
    recs = []
    for n in nodes:
        drained = n not in undrained
        recs.append({
            "name": n, "state": "allocated" if drained else "idle", "state_flags": ["DRAIN"] if drained else [],
            "reason": "gpu-bridge: serving (pool default)" if drained else "", "gres": "gpu:4",
            "partitions": ["preempt", "gpu-bridge"],
        })
    return json.dumps({"meta": {}, "errors": [], "nodes": recs})


def squeue(nodes: Sequence[str] = NODES) -> str:
    jobs = [{"job_id": 100 + i, "name": wk.SLURM_HOLD_JOB_PREFIX + n, "user_name": "root", "partition": "gpu-bridge",
             "job_state": "RUNNING", "nodes": n, "start_time": int(NOW - 3600)} for i, n in enumerate(nodes)]
    return json.dumps({"meta": {}, "errors": [], "jobs": jobs})


class Runner:
    """A CommandRunner answering sinfo/squeue with set texts, recording every argv."""

    def __init__(self, sinfo_text: str, squeue_text: str) -> None:
        self.out = {"sinfo": sinfo_text, "squeue": squeue_text}
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0] in self.out and list(argv[1:2]) == ["--json"]:
            return CommandResult(0, self.out[argv[0]], "")
        if argv[0] == "sbatch":
            return CommandResult(0, "900\n", "")
        if list(argv) == ["sdiag"]:
            return CommandResult(*sdiag(1_800_000_000.0))
        return CommandResult(0, "", "")

    def writes(self) -> list[list[str]]:
        return [c for c in self.calls if c[1:2] != ["--json"] and c != ["sdiag"]]


def world(sinfo_text: str, squeue_text: str, *, load_replicas: float) -> tuple[Daemon, FakeKube, Runner]:
    config = default_config(min_serving=1)
    kube = FakeKube(now=NOW)
    for n in NODES:
        labels = {wk.LABEL_PHASE: "serving"} if n != "gpu-node-04" else {}
        ann = {wk.ANNOTATION_PHASE_SINCE: f"{NOW - 86400:.3f}"} if n != "gpu-node-04" else {}
        kube.add_node(n, "default", labels=labels, annotations=ann)
    kube.add_pool(PoolTarget("default", "default", "vllm"), replicas=len(NODES))
    kube.calls.clear()
    prom = FakeProm()
    prom.set("default", LoadSignals(t=NOW, running=load_replicas * 24, waiting=0.0, kv_cache_usage_sum=0.1 * len(NODES),
                                    tokens_per_s=None, replicas_reporting=len(NODES)))
    runner = Runner(sinfo_text, squeue_text)
    slurm = CliSlurm(runner=runner)
    d = Daemon(config, kube=kube, slurm=slurm, prom=prom, prom_pools={"default": PromPool("default", "default")},
               clock=lambda: NOW)
    return d, kube, runner


def kube_writes(kube: FakeKube) -> dict[tuple[str, str], int]:
    return {k: v for k, v in kube.calls.items() if k[0] != "get" and v}


def test_control_valid_output_does_act() -> None:
    d, kube, runner = world(sinfo(undrained=["gpu-node-04"]), squeue(NODES[:3]), load_replicas=3.5)
    result = d.iterate()
    assert result.observed
    assert kube_writes(kube), "adopting gpu-node-04 writes its phase"
    assert any(any("gpu-node-04" in a for a in c) for c in runner.writes()), "holding/draining gpu-node-04 in Slurm"


BROKEN_SLURM = [
    ("sinfo truncated", sinfo(undrained=["gpu-node-04"])[:150], squeue(NODES[:3])),
    ("squeue truncated", sinfo(undrained=["gpu-node-04"]), squeue(NODES[:3])[:-30]),
    ("sinfo unknown shape", json.dumps({"meta": {}, "errors": [], "machines": []}), squeue(NODES[:3])),
    ("squeue unknown shape", sinfo(undrained=["gpu-node-04"]), json.dumps({"meta": {}, "queue": []})),
    ("sinfo empty", "", squeue(NODES[:3])),
    ("squeue html", sinfo(undrained=["gpu-node-04"]), "<html>500</html>"),
    ("sinfo errors", json.dumps({"errors": [{"error": "Unable to contact slurm controller"}], "nodes": []}), squeue()),
]


@pytest.mark.parametrize(("case", "sinfo_text", "squeue_text"), BROKEN_SLURM, ids=[c[0] for c in BROKEN_SLURM])
@pytest.mark.parametrize("load_replicas", [0.2, 40.0], ids=["low-load", "spike"])
def test_daemon_holds_every_node_on_bad_slurm_output(case: str, sinfo_text: str, squeue_text: str, load_replicas: float) -> None:
    d, kube, runner = world(sinfo_text, squeue_text, load_replicas=load_replicas)
    for _ in range(3):
        d.iterate()
    assert kube_writes(kube) == {}, f"{case}: wrote to Kubernetes"
    assert kube.events == []
    assert runner.writes() == [], f"{case}: wrote to Slurm"
    plan = d.ledger.last_plan
    assert plan is not None and not [a for a in plan.actions if a.kind in (ActionKind.LEND, ActionKind.RECLAIM)]
    assert set(plan.hold_reasons) == set(NODES) and set(plan.hold_reasons.values()) == {HoldReason.PROBLEM}
    obs = d.ledger.last_observation
    assert obs is not None and obs.facts == {}
    assert all("Slurm state unknown" in obs.problems[n] for n in NODES)


def test_join_holds_every_node_when_slurm_failed() -> None:
    config = default_config()
    kube = FakeKube(now=NOW)
    for n in NODES:
        kube.add_node(n, "default", labels={wk.LABEL_PHASE: "lent"}, annotations={wk.ANNOTATION_PHASE_SINCE: "1"})
    obs = join(now=NOW, config=config, kube_nodes=kube.nodes(), pods={"default": ()}, desired_replicas={"default": 0},
               slurm_nodes=None, slurm_jobs=None, readings={"default": Readings(None)})
    assert obs.facts == {} and set(obs.problems) == set(NODES)
    assert all(n.problem and n.phase is Phase.LENT for n in obs.view.nodes)


def test_a_node_missing_from_sinfo_is_held_and_the_rest_still_run() -> None:
    """sinfo lists three of the four pool nodes (a partial answer): the missing one is held
    ("node unknown to Slurm") and the tick does not crash."""
    d, kube, runner = world(sinfo(NODES[:3]), squeue(NODES[:3]), load_replicas=3.5)
    result = d.iterate()
    assert result.observed
    obs = d.ledger.last_observation
    assert obs is not None and obs.problems.get("gpu-node-04") == "node unknown to Slurm"
    assert not any("gpu-node-04" in " ".join(c) for c in runner.writes())


# --- the parse fast paths (bench_scale) give the slow paths' answers -------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abz09-_.[],; \t()N", max_size=30))
def test_expand_fast_path_equals_the_general_one(text: str) -> None:
    from bridge.adapters.slurm import hostlist

    try:
        slow: tuple[str, ...] | None = ()
        stripped = text.strip()
        if stripped and stripped not in ("(null)", "None"):
            slow = tuple(x for item in hostlist._split_top(stripped) for x in hostlist._expand_one(item))
            if len(slow) > hostlist.MAX_EXPANDED:
                raise ValueError("too many names in all")
    except ValueError:
        slow = None
    try:
        fast: tuple[str, ...] | None = hostlist.expand(text)
    except AdapterError:
        fast = None
    assert fast == slow


def test_a_hostlist_is_bounded_in_all_not_only_per_item() -> None:
    """Each bracket was bounded (100,000 names) but not their sum: 30 items of 99,991 names each
    expanded to 3 million strings (4 s, 250 MB) per job; now an AdapterError naming the list."""
    from bridge.adapters.slurm import hostlist

    with pytest.raises(AdapterError, match="more than 100,000 names"):
        hostlist.expand(",".join(["n[0-99990]"] * 30))
    assert len(hostlist.expand("n[0-99990]")) == 99_991


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="gpures:/a10,()S-4 2", max_size=30))
def test_cached_gpu_count_equals_the_regex(gres: str) -> None:
    from bridge.adapters.slurm.parse import _GPU_COUNT, gpu_count

    assert gpu_count(gres) == sum(int(m.group(1)) for m in _GPU_COUNT.finditer(gres))
    assert gpu_count(gres) == gpu_count(gres)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="gpu-bridge:checkpoint=0123456789.e, ;xinf", max_size=40))
def test_checkpoint_fast_path_equals_the_scan(comment: str) -> None:
    import re as _re

    from bridge.adapters.slurm.parse import checkpoint_time

    want = None
    for tok in _re.split(r"[\s,;]+", comment):
        if tok.startswith(wk.SLURM_CHECKPOINT_COMMENT):
            try:
                v = float(tok[len(wk.SLURM_CHECKPOINT_COMMENT):])
            except ValueError:
                break
            want = v if 0 < v <= wk.LAST_UNIX_S else None
            break
    assert checkpoint_time(comment) == want


def test_parse_leaves_the_collector_as_it_found_it() -> None:
    import gc

    assert gc.isenabled()
    parse_nodes(DOCS["sinfo-22.05.json"])
    with pytest.raises(AdapterError):
        parse_jobs("{")
    assert gc.isenabled()
    gc.disable()
    try:
        parse_jobs(DOCS["squeue-22.05.json"])
        assert not gc.isenabled()  # never turned on behind a caller's back
    finally:
        gc.enable()
