"""Parsing recorded `sinfo --json` / `squeue --json` output of Slurm 22.05 (recorded from the
sandbox) and 24.11 (written from its documented shape); hostlists; bad shapes fail closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.adapters.slurm.hostlist import expand
from bridge.adapters.slurm.parse import checkpoint_time, gpu_count, parse_jobs, parse_nodes
from bridge.adapters.slurm.parse import signal_save_s
from bridge.names import validate_job_id, validate_node_name
from bridge.adapters.slurm.parse import parse_ping
from bridge.errors import AdapterError

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIX / name).read_text()


@pytest.mark.parametrize("name", ["sinfo-22.05.json", "sinfo-24.11.json"])
def test_nodes_both_versions(name: str) -> None:
    nodes = {n.name: n for n in parse_nodes(fixture(name))}
    assert sorted(nodes) == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    n1, n2, n3 = nodes["gpu-node-01"], nodes["gpu-node-02"], nodes["gpu-node-03"]
    assert n1.state == "mixed" and not n1.drained and n1.allocated and n1.gpus == 4 and n1.gpus_used == 4
    assert n2.state == "allocated" and n2.drained_by_us and not n2.drained_by_other
    assert n2.reason == "gpu-bridge: serving since 1796215000" and n2.reason_ours and n2.reason_user == "root"
    assert n3.state == "idle" and n3.drained_by_other and not n3.reason_ours and not n3.allocated
    assert all(n.partitions == ("gpu-bridge", "preempt") for n in nodes.values())  # sorted: one value per node
    assert nodes["gpu-node-04"].down


def test_not_responding_node_22() -> None:
    nodes = {n.name: n for n in parse_nodes(fixture("sinfo-22.05-down.json"))}
    n1 = nodes["gpu-node-01"]
    assert n1.state == "down" and not n1.responding and n1.down and "NOT_RESPONDING" in n1.flags
    assert nodes["gpu-node-04"].state == "idle" and nodes["gpu-node-04"].flags == frozenset()


def test_not_responding_node_24() -> None:
    n4 = {n.name: n for n in parse_nodes(fixture("sinfo-24.11.json"))}["gpu-node-04"]
    assert n4.state == "down" and not n4.responding and n4.reason_time == 1796216600.0


def test_jobs_22_active_only_and_fields() -> None:
    jobs = {j.job_id: j for j in parse_jobs(fixture("squeue-22.05.json"))}
    assert sorted(jobs) == ["1", "3", "4"]  # job 2 COMPLETED is still listed by squeue (MinJobAge): dropped
    j1 = jobs["1"]
    assert (j1.state, j1.partition, j1.nodes, j1.gpus_per_node) == ("running", "preempt", ("gpu-node-01",), 4)
    assert j1.checkpoint_time == 1796215000.0 and j1.start_time == 1796216561.0 and j1.requeueable
    assert j1.preempt_time is None and not j1.is_hold
    hold = jobs["3"]
    assert hold.is_hold and hold.hold_node == "gpu-node-02" and hold.state == "running"
    assert jobs["4"].state == "pending" and jobs["4"].nodes == () and jobs["4"].start_time is None
    all_jobs = parse_jobs(fixture("squeue-22.05.json"), active_only=False)
    assert [j.state for j in all_jobs if j.job_id == "2"] == ["completed"]


def test_jobs_22_requeued() -> None:
    j1 = {j.job_id: j for j in parse_jobs(fixture("squeue-22.05-requeued.json"))}["1"]
    assert j1.state == "pending" and j1.restart_count == 1 and j1.state_reason == "ReqNodeNotAvail" and j1.nodes == ()


def test_jobs_24() -> None:
    jobs = {j.job_id: j for j in parse_jobs(fixture("squeue-24.11.json"))}
    assert sorted(jobs, key=int) == ["101", "103", "104", "105", "106"]
    j = jobs["101"]
    assert j.state == "running" and j.user == "alice" and j.gpus_per_node == 4
    assert j.preempt_time == 1796216790.0 and j.end_time == 1796216800.0 and j.checkpoint_time == 1796216700.0
    assert jobs["103"].is_hold and jobs["103"].end_time is None  # {"set": true, "number": 0}: no end
    assert jobs["105"].state == "pending" and jobs["105"].restart_count == 2
    multi = jobs["106"]
    assert multi.nodes == ("gpu-node-01", "gpu-node-03") and multi.gpus_per_node == 2
    assert multi.checkpoint_time is None  # "gpu-bridge:checkpoint=garbage"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gpu-node-[01-03,07]", ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-07")),
        ("a1,b[8-10]", ("a1", "b8", "b9", "b10")),
        ("r[1-2]n[01-02]", ("r1n01", "r1n02", "r2n01", "r2n02")),
        ("", ()),
        ("(null)", ()),
        ("gpu-node-01", ("gpu-node-01",)),
    ],
)
def test_expand(text: str, want: tuple[str, ...]) -> None:
    assert expand(text) == want


@pytest.mark.parametrize("bad", ["n[1-", "n]1[", "n[3-1]", "n[a-b]", "n[1-999999999]"])
def test_expand_rejects_malformed(bad: str) -> None:
    with pytest.raises(AdapterError, match="hostlist"):
        expand(bad)


@given(st.lists(st.integers(min_value=0, max_value=999), min_size=1, max_size=20, unique=True))
def test_expand_round_trips_padded_ranges(nums: list[int]) -> None:
    text = "gpu-node-[" + ",".join(f"{n:03d}" for n in nums) + "]"
    assert expand(text) == tuple(f"gpu-node-{n:03d}" for n in nums)


def test_gpu_count_and_checkpoint() -> None:
    assert gpu_count("gpu:4") == 4 and gpu_count("gpu:a100:4(S:0-1)") == 4
    assert gpu_count("gres:gpu:4") == 4 and gpu_count("gres/gpu:2") == 2 and gpu_count("") == 0
    assert gpu_count("tmpsize:7T,gpu:l40s:4(S:0-1)") == 4
    assert checkpoint_time("gpu-bridge:checkpoint=1796216700") == 1796216700.0
    assert checkpoint_time("owner=alice, gpu-bridge:checkpoint=12.5") == 12.5
    assert checkpoint_time("gpu-bridge:checkpoint=-1") is None
    assert checkpoint_time("gpu-bridge:checkpoint=nan") is None
    assert checkpoint_time("") is None


def test_ping() -> None:
    assert parse_ping(fixture("ping-22.05.txt"))
    assert not parse_ping("Slurmctld(primary) at vm is DOWN")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty output"),
        (fixture("sinfo-22.05.json")[:700], "unparseable JSON"),
        ("[]", "expected a JSON object"),
        ('{"meta": {}, "errors": []}', "unknown shape"),
        ('{"errors": [{"error": "boom"}], "nodes": []}', "Slurm reported errors"),
        ('{"nodes": [{"name": "n1"}]}', "bad 'state'"),
        ('{"nodes": [{"state": "idle"}]}', "missing key 'name'"),
        ('{"nodes": [{"name": "n1", "state": "weird", "state_flags": []}]}', "no base state"),
        ('{"sinfo": [{"nodes": {}}]}', "missing 'nodes.nodes'"),
        ('{"nodes": {"a": 1}}', "'nodes' is not a list"),
    ],
)
def test_bad_sinfo_fails_closed(text: str, match: str) -> None:
    with pytest.raises(AdapterError, match=match):
        parse_nodes(text)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"meta": {}}, "no 'jobs' key"),
        ({"jobs": [{"name": "x"}]}, "missing key 'job_id'"),
        ({"jobs": [{"job_id": 1, "job_state": 3, "name": "x", "partition": "p"}]}, "bad 'job_state'"),
        ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "partition": "p"}]}, "missing key 'name'"),
        ({"jobs": [{"job_id": {"set": True}, "job_state": "RUNNING"}]}, "without 'number'"),
        ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "name": "x", "partition": "p", "start_time": "x"}]},
         "start_time: expected a number"),
    ],
)
def test_bad_squeue_fails_closed(doc: object, match: str) -> None:
    with pytest.raises(AdapterError, match=match):
        parse_jobs(json.dumps(doc))


def test_truncated_squeue_fails_closed() -> None:
    with pytest.raises(AdapterError, match="unparseable JSON"):
        parse_jobs(fixture("squeue-24.11.json")[:-40])


@pytest.mark.parametrize("bad", ["", "gpu node", "n;rm -rf /", "$(reboot)", "-w", "a" * 64, "n\n1", "ñode"])
def test_node_name_validation(bad: str) -> None:
    with pytest.raises(AdapterError, match="node name"):
        validate_node_name(bad)


def test_job_id_validation() -> None:
    assert validate_job_id("123") == "123" and validate_job_id(7) == "7" and validate_job_id("12_3") == "12_3"
    for bad in ["", "1;2", "-1", "1 2", "x" * 20, True]:
        with pytest.raises(AdapterError, match="job id"):
            validate_job_id(bad)


def test_grace_over() -> None:
    j = {j.job_id: j for j in parse_jobs(fixture("squeue-24.11.json"))}
    victim = j["101"]  # preempt_time 1796216790, end_time 1796216800
    assert not victim.grace_over(1796216800.5) and victim.grace_over(1796216801.0)
    assert not j["103"].grace_over(2e9)  # not preempted


def test_a_job_being_signalled_still_holds_its_nodes() -> None:
    """Right after a hold job preempts it, squeue shows the victim SIGNALING while Slurm
    delivers the pre-preemption signal: it still runs on its node (a transient state that a
    test caught once), so its nodes and end time must not vanish."""
    doc = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "slurm" / "squeue-22.05.json").read_text())
    rec = next(j for j in doc["jobs"] if j["job_state"] == "RUNNING")
    rec["job_state"] = "SIGNALING"
    doc["jobs"] = [rec]
    (job,) = parse_jobs(json.dumps(doc))
    assert job.state == "signaling"
    assert job.nodes and job.start_time is not None and job.end_time is not None


@pytest.mark.parametrize(
    ("comment", "seconds"),
    [
        ("gpu-bridge:checkpoint=1796216700,gpu-bridge:save-on-signal=45", 45.0),
        ("note gpu-bridge:save-on-signal=0", 0.0),
        ("gpu-bridge:save-on-signal=-3", None),
        ("gpu-bridge:save-on-signal=nan", None),
        ("gpu-bridge:save-on-signal=1e9", None),  # more than a day: not believed
        ("gpu-bridge:save-on-signal=", None),
        ("gpu-bridge:checkpoint=1796216700", None),
        ("", None),
    ],
)
def test_save_on_signal_comment(comment: str, seconds: float | None) -> None:
    assert signal_save_s(comment) == seconds
    if "checkpoint=1796216700" in comment:
        assert checkpoint_time(comment) == 1796216700.0
