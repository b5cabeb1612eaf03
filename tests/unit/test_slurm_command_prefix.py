"""``slurm.command_prefix``: validated as an argv list in the config, put before every Slurm
command by the adapter (the command itself unchanged, the environment passed on), and named in
errors. Also the 24.11 sinfo guard: an entry naming several nodes (grouped output, one reason
for all) is refused rather than read."""

from __future__ import annotations

import json
import sys

import pytest

from bridge.adapters.slurm.cli import CliSlurm, SubprocessRunner
from bridge.adapters.slurm.parse import parse_nodes
from bridge.config import parse_config
from bridge.errors import AdapterError, ConfigError

POOLS = [{"name": "llama"}]


def test_prefix_config_is_an_argv_list() -> None:
    cfg = parse_config({"pools": POOLS, "slurm": {"command_prefix": ["ssh", "-o", "BatchMode=yes", "login1"]}})
    assert cfg.slurm.command_prefix == ("ssh", "-o", "BatchMode=yes", "login1")
    assert parse_config({"pools": POOLS}).slurm.command_prefix == ()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("ssh login1", 'slurm.command_prefix: expected a list, got "ssh login1"'),
        (["ssh login1"], "slurm.command_prefix[0]: expected a program (an argv list, not a shell command line)"),
        (["ssh", ""], "slurm.command_prefix[1]: expected a non-empty argument without control characters"),
        (["ssh", "login1\nrm"], "slurm.command_prefix[1]: expected a non-empty argument without control characters"),
        (["ssh", 3], "slurm.command_prefix[1]: expected a string, got 3"),
    ],
)
def test_bad_prefix_is_refused_naming_the_item(value: object, problem: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"pools": POOLS, "slurm": {"command_prefix": value}}, source="bridge.yaml")
    assert any(p.startswith(f"bridge.yaml: {problem}") for p in ei.value.problems), ei.value.problems


def test_runner_puts_the_prefix_before_the_unchanged_argv_and_passes_the_environment() -> None:
    show = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('SLURM_CONF')]))"
    runner = SubprocessRunner({"SLURM_CONF": "/etc/slurm-x/slurm.conf", "PATH": "/usr/bin:/bin"},
                              prefix=[sys.executable, "-c", show])
    res = runner(["scontrol", "update", "NodeName=n1", "Reason=a b; rm -rf /"], 10)
    assert res.returncode == 0
    assert json.loads(res.stdout) == [["scontrol", "update", "NodeName=n1", "Reason=a b; rm -rf /"],
                                      "/etc/slurm-x/slurm.conf"]


def test_a_missing_prefix_program_is_an_adapter_error_naming_both() -> None:
    slurm = CliSlurm(command_prefix=["/nonexistent/ssh", "login1"], timeout_s=5)
    with pytest.raises(AdapterError) as ei:
        slurm.ping()
    assert "scontrol (through /nonexistent/ssh): cannot run" in str(ei.value)


def _entry(names: list[str], reason: str) -> dict[str, object]:
    return {"nodes": {"nodes": names}, "node": {"state": ["IDLE", "DRAIN"]},
            "reason": {"description": reason, "time": 1796290632, "user": "root"},
            "gres": {"total": "gpu:4", "used": "gpu:0"}, "partition": {"name": "preempt"}}


@pytest.mark.parametrize("names", [["gpu-node-01", "gpu-node-02"], ["gpu-node-[01-02]"]])
def test_grouped_sinfo_entry_is_refused(names: list[str]) -> None:
    # what 24.11's `sinfo --json` (without --Node) printed for an admin's drain and ours
    text = json.dumps({"sinfo": [_entry(names, "gpu-bridge: serving")], "errors": []})
    with pytest.raises(AdapterError, match=r"2 nodes in one entry .* run sinfo --json with --Node"):
        parse_nodes(text)


def test_per_node_entries_keep_each_nodes_reason() -> None:
    # `sinfo --json --Node` on 24.11: one entry per node and partition
    text = json.dumps({"sinfo": [_entry(["gpu-node-01"], "gpu-bridge: serving"),
                                 _entry(["gpu-node-02"], "maintenance: disk")], "errors": []})
    nodes = {n.name: n for n in parse_nodes(text)}
    assert nodes["gpu-node-01"].drained_by_us and nodes["gpu-node-02"].drained_by_other
    assert nodes["gpu-node-02"].reason == "maintenance: disk"
