"""`gpu-bridge status` shows who owns every node and why: the phase's reason written on the
node (annotation gpu-bridge.io/reason) is in the rows (--json) and, shortened, in the table."""

from __future__ import annotations

from bridge.cli.daemon import WHY_WIDTH, status_rows, status_table
from bridge.model import Phase
from tests.pdb_world import pdb_world


def test_status_rows_and_table_say_who_owns_each_node_and_why() -> None:
    w = pdb_world({"tick_s": 1000, "lend_timeout_s": 60})
    w.start_stuck_lend()  # gpu-node-01: lending, its pod kept by the PDB
    for _ in range(8):
        w.tick()
    long_reason = "adopted by gpu-bridge as a serving node; " + "x" * 200
    w.kube.set_phase("gpu-node-03", Phase.SERVING, long_reason, w.t[0])
    w.tick()
    rows = {r["node"]: r for r in status_rows(w.daemon.observe(w.t[0]))}
    assert set(rows) == {"gpu-node-01", "gpu-node-02", "gpu-node-03"}
    lending = rows["gpu-node-01"]
    assert (lending["owner"], lending["phase"]) == ("-> slurm", "lending")
    assert lending["reason"] == "lend gpu-node-01: requested by an operator"
    assert rows["gpu-node-02"]["owner"] == "serving"
    assert rows["gpu-node-02"]["reason"] == "adopted by gpu-bridge as a serving node"
    assert rows["gpu-node-03"]["reason"] == long_reason[: len(rows["gpu-node-03"]["reason"])]
    assert len(rows["gpu-node-03"]["reason"]) > WHY_WIDTH  # --json: the whole reason
    table = status_table(list(rows.values())).splitlines()
    assert table[0].split() == ["NODE", "POOL", "OWNER", "PHASE", "SINCE", "SLURM", "ON", "IT", "NOTE", "WHY"]
    line3 = next(line for line in table if line.startswith("gpu-node-03"))
    assert line3.endswith("...") and "adopted by gpu-bridge as a serving node" in line3
    assert len(line3.split("  ")[-1].strip()) <= WHY_WIDTH
    line1 = next(line for line in table if line.startswith("gpu-node-01"))
    assert line1.endswith("lend gpu-node-01: requested by an operator")
