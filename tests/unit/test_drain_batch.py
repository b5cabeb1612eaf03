"""Issue 24 point 6: a mass reclaim drains with one Slurm read per pass, not one per node.

- ``CliSlurm.drain_nodes``: every node re-read in one ``scontrol --oneliner show node A,B,...``
  (22.05 and 24.11 print one line per node, and fail the whole read on an unknown one), each
  decided as ``drain`` decides (already so, an administrator's drain or DOWN: no write), then one
  ``scontrol update NodeName=A,B State=DRAIN`` per reason right after the read. A list Slurm
  refuses (measured on both: it may have drained the nodes before the one it refused) goes again
  node by node, each re-read first.
- The actuator: the DRAIN steps of one pass make one ``drain_nodes`` for all their nodes, at the
  first of them; each node's step still records its own outcome. Outside a pass, ``drain``.

The scripted answers are the lines 22.05 and 24.11 print (tests/integration/test_slurm_adapter.py
checks them on both)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from bridge.actuate import Actuator, StepRecord
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.slurm.cli import CliSlurm, CommandResult
from bridge.errors import AdapterError
from bridge.lifecycle import HoldFacts, NodeFacts, Step
from bridge.model import Phase
from bridge.reconcile import Intents
from tests.slurm_script import ScriptedSlurm
from tests.unit.test_daemon_loop import HIGH, World

OURS = "gpu-bridge: serving (pool default)"
POOL = PoolTarget("default", "serving", "vllm")


SHOW_NODE = ["scontrol", "--oneliner", "show", "node"]


def cluster(nodes: dict[str, tuple[str, str, str]],
            refusals: Sequence[tuple[CommandResult, Sequence[str]] | None] = ()) -> tuple[ScriptedSlurm, dict[str, list[str]]]:
    """A few nodes as ``scontrol --oneliner show node`` prints them (node -> [state, reason, user],
    the table returned beside the runner); ``scontrol update`` changes them, or, per the next of
    ``refusals`` (None: done), refuses after draining the nodes it names (Slurm applies a list up
    to the node it refuses)."""
    table = {n: list(v) for n, v in nodes.items()}
    pending = list(refusals)

    def line(name: str) -> str:
        state, reason, user = table[name]
        why = f" Reason={reason} [{user}@2026-12-06T04:23:13]" if reason else ""
        return f"NodeName={name} Arch=x86_64 CoresPerSocket=1 Gres=gpu:4 State={state} Partitions=preempt,gpu-bridge{why}\n"

    def show(argv: list[str]) -> CommandResult:
        out = ""
        for name in argv[4].split(","):
            if name not in table:
                return CommandResult(1, out + f"Node {name} not found\n", "")
            out += line(name)
        return CommandResult(0, out, "")

    def update(argv: list[str]) -> CommandResult:
        opts = dict(a.split("=", 1) for a in argv[2:])
        assert opts["State"] == "DRAIN", argv
        refused = pending.pop(0) if pending else None
        for name in refused[1] if refused else opts["NodeName"].split(","):
            base = table[name][0].split("+")[0]
            table[name] = [f"{base}+DRAIN", opts["Reason"], "root"]
        return refused[0] if refused else CommandResult(0, "", "")

    return ScriptedSlurm().on(SHOW_NODE, show).on(["scontrol", "update"], update), table


def commands(slurm: ScriptedSlurm) -> list[str]:
    return [f"show {c[4]}" if c[2] == "show" else f"update {c[2]}" for c in slurm.calls]


def test_one_read_decides_each_node_as_drain_does_and_one_write_drains_the_due() -> None:
    slurm, nodes = cluster({
        "gpu-node-01": ("IDLE", "", ""),  # lent, empty: drained
        "gpu-node-02": ("IDLE+DRAIN", OURS, "root"),  # already so: nothing to write
        "gpu-node-03": ("IDLE+DRAIN", "maintenance: disk", "admin"),  # an administrator's drain: left alone
        "gpu-node-04": ("DOWN", "bad dimm", "admin"),  # an administrator's DOWN: left alone
        "gpu-node-05": ("ALLOCATED+DRAIN", "gpu-bridge: reclaimed", "root"),  # ours, another reason: rewritten
        "gpu-node-06": ("DOWN*", "Not responding", "slurm"),  # Slurm's own DOWN: ours to drain
    })
    got = CliSlurm(runner=slurm).drain_nodes({n: "serving (pool default)" for n in nodes})
    assert commands(slurm) == ["show gpu-node-01,gpu-node-02,gpu-node-03,gpu-node-04,gpu-node-05,gpu-node-06",
                                "update NodeName=gpu-node-01,gpu-node-05,gpu-node-06"]
    assert slurm.calls[1] == ["scontrol", "update", "NodeName=gpu-node-01,gpu-node-05,gpu-node-06", "State=DRAIN",
                              f"Reason={OURS}"]
    assert got == {"gpu-node-01": True, "gpu-node-02": False, "gpu-node-03": False, "gpu-node-04": False,
                   "gpu-node-05": True, "gpu-node-06": True}
    assert nodes["gpu-node-03"][1:] == ["maintenance: disk", "admin"] and nodes["gpu-node-04"][1] == "bad dimm"


def test_nodes_of_different_reasons_get_one_write_per_reason_after_the_one_read() -> None:
    slurm, nodes = cluster({n: ("IDLE", "", "") for n in ("gpu-node-01", "gpu-node-02", "gpu-node-03")})
    got = CliSlurm(runner=slurm).drain_nodes({"gpu-node-03": "serving (pool a)", "gpu-node-01": "serving (pool b)",
                                              "gpu-node-02": "serving (pool a)"})
    assert commands(slurm) == ["show gpu-node-01,gpu-node-02,gpu-node-03", "update NodeName=gpu-node-02,gpu-node-03",
                                "update NodeName=gpu-node-01"]
    assert got == dict.fromkeys(("gpu-node-01", "gpu-node-02", "gpu-node-03"), True)
    assert nodes["gpu-node-01"][1] == "gpu-bridge: serving (pool b)"


def test_a_refused_list_goes_again_node_by_node_each_re_read() -> None:
    # Slurm drained 01 then refused at 02 (as 22.05 and 24.11 do with a list): 01 re-read is
    # drained with our reason (no second write), 02 is written alone, 03 refused alone: its error
    refusal = CommandResult(1, "", "slurm_update error: Invalid node state specified\n")
    slurm, nodes = cluster({n: ("IDLE", "", "") for n in ("gpu-node-01", "gpu-node-02", "gpu-node-03")},
                           refusals=[(refusal, ["gpu-node-01"]), None, (refusal, [])])
    got = CliSlurm(runner=slurm).drain_nodes(dict.fromkeys(nodes, "serving (pool default)"))
    assert commands(slurm) == ["show gpu-node-01,gpu-node-02,gpu-node-03",
                                "update NodeName=gpu-node-01,gpu-node-02,gpu-node-03",
                                "show gpu-node-01", "show gpu-node-02", "update NodeName=gpu-node-02",
                                "show gpu-node-03", "update NodeName=gpu-node-03"]
    assert got["gpu-node-01"] is False and got["gpu-node-02"] is True
    assert isinstance(got["gpu-node-03"], AdapterError) and "Invalid node state" in str(got["gpu-node-03"])


@pytest.mark.parametrize(("answer", "match"), [
    pytest.param(CommandResult(1, "NodeName=gpu-node-01 State=IDLE\nNode gpu-node-02 not found\n", ""),
                 "scontrol show node failed .*: Node gpu-node-02 not found$", id="unknown-node"),
    pytest.param(CommandResult(1, "", "slurm_load_node error: Unable to contact slurm controller (connect failure)\n"),
                 "scontrol show node failed .*Unable to contact", id="controller-down"),
    pytest.param(CommandResult(2, "", "scontrol: error: Socket timed out\n"), "scontrol --oneliner failed .*timed out",
                 id="rc-2"),
    pytest.param(CommandResult(0, "NodeName=gpu-node-01 State=IDLE\n", ""), "gpu-node-02 missing", id="one-missing"),
    pytest.param(CommandResult(0, "NodeName=gpu-node-01 State=IDLE\n" * 2 + "NodeName=gpu-node-02 State=IDLE\n", ""),
                 "gpu-node-01 listed twice", id="twice"),
    pytest.param(CommandResult(0, "NodeName=gpu-node-01 State=IDLE\nNodeName=gpu-node-09 State=IDLE\n", ""),
                 "gpu-node-09 not asked", id="not-asked"),
    pytest.param(CommandResult(0, "NodeName=gpu-node-01 State=IDLE\nNodeName=gpu-node-02 State=WEIRD\n", ""),
                 "unknown state", id="state"),
])
def test_a_read_not_understood_fails_the_batch_and_writes_nothing(answer: CommandResult, match: str) -> None:
    slurm = ScriptedSlurm(otherwise=answer)
    with pytest.raises(AdapterError, match=match):
        CliSlurm(runner=slurm).drain_nodes({"gpu-node-01": "serving", "gpu-node-02": "serving"})
    assert [c[:4] for c in slurm.calls] == [["scontrol", "--oneliner", "show", "node"]]


def test_an_invalid_node_name_never_reaches_argv() -> None:
    slurm, _ = cluster({})
    with pytest.raises(AdapterError, match="node name"):
        CliSlurm(runner=slurm).drain_nodes({"gpu-node-01": "serving", "a,b": "serving"})
    assert slurm.calls == []


# --- the actuator: one read per pass -----------------------------------------------------------

def _lent_back(name: str) -> NodeFacts:
    """A reclaimed node whose hold runs and research is gone, as observed: DRAIN is its step."""
    return NodeFacts(name=name, phase=Phase.RECLAIMING, phase_since=0.0, fenced=True, pods=(), slurm_drained_by_us=False,
                     slurm_drained_by_other=False, slurm_down=False, slurm_allocated=True,
                     hold=HoldFacts(job_id="7", running=True), research_jobs=())


class Kube:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None:
        self.events.append((node, reason))


def _pass(slurm: ScriptedSlurm, nodes: Sequence[str]) -> tuple[list[StepRecord], list[str]]:
    """One pass of DRAIN steps for ``nodes`` through the real CliSlurm; its records and write points."""
    points: list[str] = []
    act = Actuator(kube=Kube(), slurm=CliSlurm(runner=slurm), clock=lambda: 1.0,  # type: ignore[arg-type]
                   targets={"default": POOL}, after_write=points.append)
    view = SimpleNamespace(view=SimpleNamespace(now=1.0, jobs={}))
    return act.apply(Intents(observation=view, steps=tuple((Step.DRAIN, _lent_back(n), "default") for n in nodes))), points  # type: ignore[arg-type]


def test_a_pass_of_drains_reads_slurm_once_and_each_step_records_its_own_node() -> None:
    nodes = [f"gpu-node-{i:02d}" for i in range(1, 5)]
    slurm, table = cluster(dict.fromkeys(nodes, ("ALLOCATED", "", "")))
    # after the daemon observed the nodes (each step's facts: none drained or DOWN), before its pass writes
    table["gpu-node-02"] = ["ALLOCATED+DRAIN", "maintenance: psu", "admin"]
    table["gpu-node-03"] = ["DOWN", "rma", "admin"]
    records, points = _pass(slurm, nodes)
    assert commands(slurm) == ["show gpu-node-01,gpu-node-02,gpu-node-03,gpu-node-04",
                                "update NodeName=gpu-node-01,gpu-node-04"]
    assert [(r.node, r.step, r.changed, r.error) for r in records] == [
        ("gpu-node-01", Step.DRAIN, True, None), ("gpu-node-02", Step.DRAIN, False, None),
        ("gpu-node-03", Step.DRAIN, False, None), ("gpu-node-04", Step.DRAIN, True, None)]
    assert points == ["drain", "drain"]  # each drained node's own write point (the lab's crash injection)
    assert table["gpu-node-02"][1:] == ["maintenance: psu", "admin"]  # never overwritten
    assert table["gpu-node-03"][:2] == ["DOWN", "rma"]  # an administrator's DOWN respected


def test_a_failed_batch_read_fails_every_drain_step_and_writes_nothing() -> None:
    nodes = ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
    slurm, _ = cluster({"gpu-node-01": ("IDLE", "", ""), "gpu-node-03": ("IDLE", "", "")})  # 02 unknown: the read fails
    records, points = _pass(slurm, nodes)
    assert commands(slurm) == ["show gpu-node-01,gpu-node-02,gpu-node-03"]  # one read, made once, no write
    assert [r.node for r in records] == nodes and points == []
    assert all(not r.changed and r.error is not None and "gpu-node-02 not found" in str(r.error) for r in records)


def test_outside_a_pass_a_drain_reads_its_own_node() -> None:
    slurm, _ = cluster({"gpu-node-01": ("IDLE", "", ""), "gpu-node-02": ("IDLE", "", "")})
    act = Actuator(kube=Kube(), slurm=CliSlurm(runner=slurm), clock=lambda: 1.0)  # type: ignore[arg-type]
    assert act.execute(Step.DRAIN, _lent_back("gpu-node-02"), POOL).changed
    assert commands(slurm) == ["show gpu-node-02", "update NodeName=gpu-node-02"]


def test_a_mass_reclaim_holds_and_drains_every_node_with_one_read_per_pass() -> None:
    """Three lent nodes reclaimed at once (the fake counts its calls as CliSlurm makes them): the
    pass that starts the reclaim submits their holds with one ``submit_holds`` (test_hold_batch.py),
    and the pass where their holds run drains the three with one ``drain_nodes``, never ``drain``."""
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    lent = [n for n, p in w.phases().items() if p is Phase.LENT]
    w.load = HIGH
    per_tick = []
    for _ in range(20):
        calls, writes = dict(w.slurm.calls), len(w.slurm.writes)
        w.tick()
        per_tick.append({k: (w.slurm.calls[c] - calls.get(c, 0), sorted(n for x, n in w.slurm.writes[writes:] if x == k))
                         for k, c in (("submit_hold", "submit_holds"), ("drain", "drain_nodes"), ("drain_alone", "drain"))})
    assert [t["submit_hold"] for t in per_tick if t["submit_hold"][1]] == [(1, sorted(lent))], per_tick
    assert [t["drain"] for t in per_tick if t["drain"][1]] == [(1, sorted(lent))], per_tick
    assert sum(t["drain_alone"][0] for t in per_tick) == 0, per_tick
    assert w.count(Phase.SERVING) == 4 and w.violations == []
