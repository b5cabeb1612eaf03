"""Issue 24 point 6: a mass reclaim's holds are looked up with one Slurm read per pass, not one
``squeue --name`` per node before its sbatch (200 reads in the first tick of reclaiming 200 nodes).

- ``CliSlurm.submit_holds``: the holds already there read in one ``squeue --noheader --name
  A,B,... --format %i|%u|%j`` (the job name says the node; only our partition, states and user
  count), then one sbatch per node without one; a node whose sbatch fails gets its error, the
  others go on; a read that fails submits nothing.
- The actuator: the SUBMIT_HOLD/ENSURE_HOLD steps of one pass share one ``submit_holds``, made at
  the first of them; each step records its own node. Outside a pass, ``submit_hold``. (The mass
  reclaim over the fakes: test_drain_batch.py, one ``submit_holds`` per pass.)"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from bridge import wellknown as wk
from bridge.actuate import Actuator, StepRecord
from bridge.adapters.slurm.cli import CliSlurm, CommandResult
from bridge.errors import AdapterError
from bridge.lifecycle import NodeFacts, Step
from bridge.model import Phase
from bridge.reconcile import Intents
from tests.slurm_script import ScriptedSlurm
from tests.unit.test_drain_batch import POOL, Kube

NODES = [f"gpu-node-{i:02d}" for i in range(1, 5)]
ACTIVE = "PENDING,RUNNING,CONFIGURING,SUSPENDED,REQUEUED"


def queue(jobs: dict[str, tuple[str, str, str]], refuse: dict[str, CommandResult] | None = None,
          read: CommandResult | None = None) -> ScriptedSlurm:
    """Jobs as ``squeue`` lists them (id -> (user, name, partition)), filtered as squeue filters
    its text output (or, given ``read``, its answer); sbatch queues a job, or answers
    ``refuse[node]`` for that node."""
    jobs, refused = dict(jobs), refuse or {}

    def options(argv: list[str]) -> dict[str, str]:
        return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}

    def squeue(argv: list[str]) -> CommandResult:
        opts = options(argv)
        assert argv[1] == "--noheader" and opts["--states"] == ACTIVE and opts["--format"] == "%i|%u|%j", argv
        if read is not None:
            return read
        names = opts["--name"].split(",")
        return CommandResult(0, "".join(f"{j}|{u}|{n}\n" for j, (u, n, p) in jobs.items()
                                        if n in names and p == opts["--partition"]), "")

    def sbatch(argv: list[str]) -> CommandResult:
        opts = options(argv)
        node = opts["--nodelist"]
        if node in refused:
            return refused[node]
        job = str(100 + len(jobs))
        jobs[job] = ("root", opts["--job-name"], opts["--partition"])
        return CommandResult(0, f"{job}\n", "")

    return ScriptedSlurm().on(["squeue"], squeue).on(["sbatch"], sbatch)


def commands(slurm: ScriptedSlurm) -> list[str]:
    return [f"squeue {c[c.index('--name') + 1]}" if c[0] == "squeue" else f"sbatch {c[c.index('--nodelist') + 1]}"
            for c in slurm.calls]


def hold(node: str) -> str:
    return wk.SLURM_HOLD_JOB_PREFIX + node


def test_one_read_finds_the_holds_there_and_only_the_nodes_without_one_are_submitted() -> None:
    slurm = queue({
        "7": ("root", hold("gpu-node-02"), wk.SLURM_HOLD_PARTITION),  # ours: returned, not submitted again
        "8": ("alice", hold("gpu-node-03"), wk.SLURM_HOLD_PARTITION),  # another user's job of that name: not ours
        "9": ("root", hold("gpu-node-04"), "preempt"),  # another partition: not ours
        "10": ("root", wk.SLURM_WARM_HOLD_JOB_PREFIX + "gpu-node-01", wk.SLURM_WARM_PARTITION),  # a memory hold
    })
    got = CliSlurm(runner=slurm, hold_user="root").submit_holds(NODES)
    assert commands(slurm) == [f"squeue {','.join(hold(n) for n in NODES)}",
                                "sbatch gpu-node-01", "sbatch gpu-node-03", "sbatch gpu-node-04"]
    assert got == {"gpu-node-01": "104", "gpu-node-02": "7", "gpu-node-03": "105", "gpu-node-04": "106"}
    sbatch = slurm.calls[1]
    assert sbatch[sbatch.index("--partition") + 1] == wk.SLURM_HOLD_PARTITION and "--exclusive" in sbatch
    assert sbatch[sbatch.index("--job-name") + 1] == hold("gpu-node-01") and sbatch[-2:] == ["--wrap", "exec sleep infinity"]


def test_a_refused_sbatch_is_that_nodes_outcome_and_the_others_go_on() -> None:
    slurm = queue({}, refuse={"gpu-node-02": CommandResult(1, "", "sbatch: error: Batch job submission failed: Invalid node name specified\n"),
                              "gpu-node-03": CommandResult(0, "Submitted batch job 5\n", "")})
    got = CliSlurm(runner=slurm).submit_holds(NODES)
    assert commands(slurm) == [f"squeue {','.join(hold(n) for n in NODES)}"] + [f"sbatch {n}" for n in NODES]
    assert isinstance(got["gpu-node-02"], AdapterError) and "Invalid node name" in str(got["gpu-node-02"])
    assert isinstance(got["gpu-node-03"], AdapterError) and "unexpected answer" in str(got["gpu-node-03"])
    assert got["gpu-node-01"] == "100" and got["gpu-node-04"] == "101"
    with pytest.raises(AdapterError, match="Invalid node name"):  # one node: its error raised
        CliSlurm(runner=slurm).submit_hold("gpu-node-02")


def test_a_failed_read_submits_nothing_and_bad_names_never_reach_argv() -> None:
    slurm = queue({}, read=CommandResult(1, "", "slurm_load_jobs error: Unable to contact slurm controller\n"))
    with pytest.raises(AdapterError, match="Unable to contact"):
        CliSlurm(runner=slurm).submit_holds(NODES)
    assert commands(slurm) == [f"squeue {','.join(hold(n) for n in NODES)}"]
    clean = queue({})
    with pytest.raises(AdapterError, match="node name"):
        CliSlurm(runner=clean).submit_holds(["gpu-node-01", "a,b"])
    assert clean.calls == [] and CliSlurm(runner=clean).submit_holds([]) == {} and clean.calls == []


# --- the actuator: one read per pass -----------------------------------------------------------

def _reclaiming(name: str) -> NodeFacts:
    """A node a reclaim has just started on, no hold yet: SUBMIT_HOLD is its step."""
    return NodeFacts(name=name, phase=Phase.RECLAIMING, phase_since=0.0, fenced=True, pods=(), slurm_drained_by_us=False,
                     slurm_drained_by_other=False, slurm_down=False, slurm_allocated=True, hold=None, research_jobs=("3",))


def _pass(slurm: ScriptedSlurm, nodes: Sequence[str]) -> tuple[list[StepRecord], list[str]]:
    points: list[str] = []
    act = Actuator(kube=Kube(), slurm=CliSlurm(runner=slurm), clock=lambda: 1.0,  # type: ignore[arg-type]
                   targets={"default": POOL}, after_write=points.append)
    view = SimpleNamespace(view=SimpleNamespace(now=1.0, jobs={}))
    steps = tuple((Step.SUBMIT_HOLD, _reclaiming(n), "default") for n in nodes)
    return act.apply(Intents(observation=view, steps=steps)), points  # type: ignore[arg-type]


def test_a_pass_of_holds_reads_slurm_once_and_each_step_records_its_own_node() -> None:
    slurm = queue({"7": ("root", hold("gpu-node-03"), wk.SLURM_HOLD_PARTITION)},
                  refuse={"gpu-node-04": CommandResult(1, "", "sbatch: error: Socket timed out\n")})
    records, points = _pass(slurm, NODES)
    assert commands(slurm) == [f"squeue {','.join(hold(n) for n in NODES)}", "sbatch gpu-node-01", "sbatch gpu-node-02",
                                "sbatch gpu-node-04"]
    assert [(r.node, r.step, r.detail, r.error is None) for r in records] == [
        ("gpu-node-01", Step.SUBMIT_HOLD, "101", True), ("gpu-node-02", Step.SUBMIT_HOLD, "102", True),
        ("gpu-node-03", Step.SUBMIT_HOLD, "7", True), ("gpu-node-04", Step.SUBMIT_HOLD, "", False)]
    assert "Socket timed out" in str(records[3].error)
    assert points == ["submit_hold"] * 3  # each node's own write point (the lab's crash injection)


def test_a_failed_batch_read_fails_every_hold_step_and_submits_nothing() -> None:
    slurm = queue({}, read=CommandResult(1, "", "slurm_load_jobs error: Socket timed out\n"))
    records, points = _pass(slurm, NODES)
    assert len(slurm.calls) == 1 and points == []  # one read, made once
    assert [r.node for r in records] == NODES and all(r.error is not None and "Socket timed out" in str(r.error) for r in records)



def test_many_nodes_are_read_in_lists_execve_accepts() -> None:
    """A first pass adopting thousands of serving nodes looks up their holds (and a mass drain
    reads its nodes) in lists of at most LIST_CHUNK: one argument of 10,000 names (270 KB) is
    more than Linux accepts (128 KiB), and every step of the pass would fail on every tick."""
    from bridge.adapters.slurm.cli import LIST_CHUNK

    nodes = [f"gpu-node-{i:05d}" for i in range(2 * LIST_CHUNK + 1)]
    slurm = queue({"7": ("root", hold(nodes[-1]), wk.SLURM_HOLD_PARTITION)})
    got = CliSlurm(runner=slurm).submit_holds(nodes)
    reads = [c[c.index("--name") + 1].split(",") for c in slurm.calls if c[0] == "squeue"]
    assert [len(r) for r in reads] == [LIST_CHUNK, LIST_CHUNK, 1] and sorted(sum(reads, [])) == sorted(hold(n) for n in nodes)
    assert max(len(",".join(r)) for r in reads) < 64 * 1024
    assert got[nodes[-1]] == "7" and len([c for c in slurm.calls if c[0] == "sbatch"]) == len(nodes) - 1

    scontrol = (ScriptedSlurm()
                .on(["scontrol", "--oneliner", "show", "node"],
                    lambda argv: CommandResult(0, "".join(f"NodeName={n} State=IDLE\n" for n in argv[4].split(",")), ""))
                .on(["scontrol", "update"], CommandResult(0, "", "")))  # scontrol update NodeName=A,B,... State=DRAIN
    drained = CliSlurm(runner=scontrol).drain_nodes(dict.fromkeys(nodes, "serving"))
    shown = [(c[4] if c[2] == "show" else c[2].removeprefix("NodeName=")).split(",") for c in scontrol.calls]
    assert [len(x) for x in shown] == [LIST_CHUNK, LIST_CHUNK, 1] * 2  # the reads, then the writes, in lists
    assert all(drained[n] is True for n in nodes)
