"""``bridge.slurm_check.check`` over plain data: a Slurm set up as slurm_conf/ says fits; each
conflicting or missing setting is named by its key; slurm.conf.snippet sets no cluster-wide key
(it would silently replace the site's own) and the values it asks to merge are the ones the
check wants. Parsers of ``scontrol show config`` / ``show partition`` on recorded 22.05 output.
The command against a real slurmctld: tests/integration/test_check_slurm.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge.adapters.slurm.parse import parse_show_config, parse_show_partitions
from bridge.config import Config, default_config, replace
from bridge.slurm_check import check

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "slurm"
CLUSTER_WIDE = ("PreemptType", "PreemptMode", "PreemptParameters", "SlurmctldParameters", "JobSubmitPlugins",
                "CliFilterPlugins", "RequeueExit", "JobRequeue", "KillWait", "GresTypes", "SelectType",
                "SelectTypeParameters")

GOOD_SETTINGS = {
    "PreemptType": "preempt/partition_prio", "PreemptMode": "REQUEUE", "SlurmctldParameters": "enable_configless,preempt_send_user_signal",
    "RequeueExit": "75", "JobSubmitPlugins": "lua", "CliFilterPlugins": "cli_filter/lua",
}
PREEMPT = {"PartitionName": "preempt", "Nodes": "gpu-node-[01-04]", "PriorityTier": "1", "PreemptMode": "REQUEUE",
           "GraceTime": "120", "OverTimeLimit": "2"}
HOLD = {"PartitionName": "gpu-bridge", "Nodes": "gpu-node-[01-04]", "PriorityTier": "100", "PreemptMode": "OFF",
        "OverSubscribe": "EXCLUSIVE", "MaxTime": "UNLIMITED"}


def _parts(**extra: dict[str, str]) -> dict[str, dict[str, str]]:
    return {"preempt": dict(PREEMPT), "gpu-bridge": dict(HOLD), **extra}


def test_a_slurm_set_up_as_documented_fits() -> None:
    assert check(default_config(), GOOD_SETTINGS, _parts(cpu={"Nodes": "cpu-[01-10]"})) == []


@pytest.mark.parametrize(
    "settings, partitions, key",
    [
        ({"PreemptType": "preempt/qos"}, {}, "PreemptType"),
        ({"PreemptMode": "SUSPEND,GANG"}, {}, "PreemptMode"),
        ({"SlurmctldParameters": "enable_configless"}, {}, "SlurmctldParameters"),
        ({"RequeueExit": ""}, {}, "RequeueExit"),
        ({"JobSubmitPlugins": "pbs"}, {}, "JobSubmitPlugins"),
        ({"CliFilterPlugins": ""}, {}, "CliFilterPlugins"),
        ({}, {"preempt": {**PREEMPT, "PreemptMode": "CANCEL"}}, "PartitionName=preempt PreemptMode"),
        ({}, {"preempt": {**PREEMPT, "GraceTime": "300"}}, "PartitionName=preempt GraceTime"),
        ({}, {"preempt": {**PREEMPT, "OverTimeLimit": "NONE"}}, "PartitionName=preempt OverTimeLimit"),
        ({}, {"gpu-bridge": {**HOLD, "OverSubscribe": "NO"}}, "PartitionName=gpu-bridge OverSubscribe"),
        ({}, {"gpu-bridge": {**HOLD, "MaxTime": "1-00:00:00"}}, "PartitionName=gpu-bridge MaxTime"),
        ({}, {"gpu-bridge": {**HOLD, "PriorityTier": "1"}}, "PartitionName=gpu-bridge PriorityTier"),
        ({}, {"batch": {"Nodes": "gpu-node-03,cpu-01"}}, "PartitionName=batch Nodes"),
        ({}, {"all": {"Nodes": "ALL"}}, "PartitionName=all Nodes"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_conflict_is_named_by_its_key(settings: dict[str, str], partitions: dict[str, dict[str, str]], key: str) -> None:
    found = check(default_config(), {**GOOD_SETTINGS, **settings}, {**_parts(), **partitions})
    assert [f.key for f in found] == [key]


def test_24_11_spelling_of_the_signal_parameter_fits() -> None:
    settings = {**GOOD_SETTINGS, "SlurmctldParameters": "", "PreemptParameters": "send_user_signal"}
    assert check(default_config(), settings, _parts()) == []


def test_missing_partitions_are_named() -> None:
    found = check(default_config(), GOOD_SETTINGS, {})
    assert [str(f) for f in found] == [
        "PartitionName=preempt = (not set): missing: research jobs run there (slurm.preempt_partition)",
        "PartitionName=gpu-bridge = (not set): missing: the bridge's hold jobs run there (slurm.hold_partition)",
    ]


def _snippet() -> str:
    return (ROOT / "slurm_conf" / "slurm.conf.snippet").read_text()


def test_the_snippet_sets_no_cluster_wide_key() -> None:
    set_keys = {ln.split("=", 1)[0].strip() for ln in _snippet().splitlines() if ln.strip() and not ln.startswith("#") and "=" in ln}
    assert set_keys & set(CLUSTER_WIDE) == set()


def test_the_values_the_snippet_asks_to_merge_fit_the_check() -> None:
    asked = dict(re.findall(r"^#([A-Za-z]+)=(\S+)$", _snippet(), flags=re.M))
    assert set(asked) == set(CLUSTER_WIDE) - {"PreemptParameters"}
    assert check(default_config(), asked, _parts()) == []


def test_parse_recorded_22_05_output() -> None:
    settings = parse_show_config((FIX / "show-config-22.05.txt").read_text())
    assert settings["PreemptType"] == "preempt/partition_prio" and settings["RequeueExit"] == "75"
    assert settings["JobSubmitPlugins"] == "lua"
    parts = parse_show_partitions((FIX / "show-partition-22.05.txt").read_text())
    assert set(parts) >= {"preempt", "gpu-bridge"}
    assert parts["gpu-bridge"]["OverSubscribe"] == "EXCLUSIVE" and parts["preempt"]["PreemptMode"] == "REQUEUE"


# --- the fast-grace tier (slurm.fast_partition) ---------------------------------------------

FAST = {"PartitionName": "preempt-fast", "Nodes": "gpu-node-[01-04]", "PriorityTier": "1", "PreemptMode": "REQUEUE",
        "GraceTime": "15", "OverTimeLimit": "2"}


def _fast_config(fast_grace_s: float = 15.0) -> Config:
    cfg = default_config()
    return replace(cfg, slurm=replace(cfg.slurm, fast_partition="preempt-fast", fast_grace_s=fast_grace_s))


def test_a_fast_tier_set_up_as_documented_fits() -> None:
    assert check(_fast_config(), GOOD_SETTINGS, _parts(**{"preempt-fast": dict(FAST)})) == []


def test_without_the_fast_tier_configured_its_partition_is_just_another_sharing_nodes() -> None:
    """fast_partition: null (the default): a preempt-fast over the lendable nodes is unknown to
    gpu-bridge, which would neither plan nor honour its grace."""
    found = check(default_config(), GOOD_SETTINGS, _parts(**{"preempt-fast": dict(FAST)}))
    assert [f.key for f in found] == ["PartitionName=preempt-fast Nodes"]


@pytest.mark.parametrize(
    "fast, keys",
    [
        ({"PreemptMode": "CANCEL"}, ["PartitionName=preempt-fast PreemptMode"]),
        ({"GraceTime": "30"}, ["PartitionName=preempt-fast GraceTime"]),
        ({"GraceTime": "120"}, ["PartitionName=preempt-fast GraceTime"] * 2),  # != config and not shorter
        ({"OverTimeLimit": "NONE"}, ["PartitionName=preempt-fast OverTimeLimit"]),
        ({"PriorityTier": "100"}, ["PartitionName=preempt-fast PriorityTier"]),
        ({"Nodes": "gpu-node-[01-05]"}, ["PartitionName=preempt-fast Nodes"]),
        ({"Nodes": "ALL"}, ["PartitionName=preempt-fast Nodes"]),
    ],
    ids=["mode", "grace", "grace-not-shorter", "overtime", "tier", "more-nodes", "all-nodes"],
)
def test_each_fast_tier_conflict_is_named(fast: dict[str, str], keys: list[str]) -> None:
    found = check(_fast_config(), GOOD_SETTINGS, _parts(**{"preempt-fast": {**FAST, **fast}}))
    assert [f.key for f in found] == keys, found


def test_nodes_moved_between_the_tiers_by_gpu_bridge_fit_as_long_as_both_cover_the_lendable_ones() -> None:
    """A running cluster where gpu-bridge lent gpu-node-04 to the normal tier and gpu-node-01 to
    the fast one (``set_tier``): each list differs, together they are the lendable nodes."""
    parts = _parts(**{"preempt-fast": {**FAST, "Nodes": "gpu-node-[01-03]"}})
    parts["preempt"] = {**parts["preempt"], "Nodes": "gpu-node-[02-04]"}
    assert check(_fast_config(), GOOD_SETTINGS, parts) == []
    parts["preempt"] = {**parts["preempt"], "Nodes": "gpu-node-[02-03]"}  # gpu-node-04 in neither: never lendable
    assert [f.key for f in check(_fast_config(), GOOD_SETTINGS, parts)] == ["PartitionName=preempt-fast Nodes"]


def test_a_missing_fast_partition_is_named() -> None:
    found = check(_fast_config(), GOOD_SETTINGS, _parts())
    assert [f.key for f in found] == ["PartitionName=preempt-fast"]
    assert "slurm.fast_partition names it" in found[0].problem


def test_the_fast_grace_must_match_the_config() -> None:
    found = check(_fast_config(fast_grace_s=10), GOOD_SETTINGS, _parts(**{"preempt-fast": dict(FAST)}))
    assert [f.key for f in found] == ["PartitionName=preempt-fast GraceTime"]
    assert "slurm.fast_grace_s (10 s" in found[0].problem


def test_the_snippets_fast_partition_line_fits_the_check() -> None:
    """The commented line an administrator uncomments, parsed as slurmctld would show it."""
    m = re.search(r"^#PartitionName=preempt-fast (.*)$", _snippet(), flags=re.M)
    assert m
    line = dict(kv.split("=", 1) for kv in m.group(1).split())
    fast = {**line, "Nodes": PREEMPT["Nodes"], "MaxTime": line["MaxTime"]}
    preempt_line = dict(kv.split("=", 1) for kv in re.search(r"^PartitionName=preempt (.*)$", _snippet(), flags=re.M).group(1).split())  # type: ignore[union-attr]
    assert line["Nodes"] == preempt_line["Nodes"]  # same lendable nodes as preempt
    parts = _parts(**{"preempt-fast": fast})
    parts["preempt"]["GraceTime"] = preempt_line["GraceTime"]
    assert check(_fast_config(float(line["GraceTime"])), GOOD_SETTINGS, parts) == []
    assert float(line["GraceTime"]) == default_config().slurm.fast_grace_s


# --- warm lending's memory hold (slurm.warm_partition) -----------------------------------------

WARM = {"PartitionName": "gpu-bridge-warm", "Nodes": "gpu-node-[01-04]", "PriorityTier": "100", "PreemptMode": "OFF",
        "OverSubscribe": "NO", "MaxTime": "UNLIMITED"}
MEMORY = {"SelectTypeParameters": "CR_CORE_MEMORY", "DefMemPerCPU": "2000"}  # scontrol show config's spelling


def _warm_config() -> Config:
    cfg = default_config()
    return replace(cfg, pools=(replace(cfg.pools[0], warm_lending=True, warm_hold_mb=140_000),))


def test_a_warm_lending_slurm_set_up_as_documented_fits() -> None:
    assert check(_warm_config(), {**GOOD_SETTINGS, **MEMORY}, _parts(**{"gpu-bridge-warm": dict(WARM)})) == []
    # DefMemPerCPU on preempt's line (the snippet's way) instead of cluster-wide
    parts = _parts(**{"gpu-bridge-warm": dict(WARM)})
    parts["preempt"]["DefMemPerCPU"] = "7812"
    assert check(_warm_config(), {**GOOD_SETTINGS, "SelectTypeParameters": "CR_CORE_MEMORY"}, parts) == []


def test_the_warm_partition_shares_the_lendable_nodes_without_a_finding_even_when_warm_lending_is_off() -> None:
    """Its jobs are the bridge's own (cancelled at every reclaim, orphans too), never research."""
    assert check(default_config(), GOOD_SETTINGS, _parts(**{"gpu-bridge-warm": dict(WARM)})) == []


@pytest.mark.parametrize(
    "settings, warm, keys",
    [
        ({"SelectTypeParameters": "CR_CORE"}, {}, ["SelectTypeParameters"]),
        ({"DefMemPerCPU": "", "DefMemPerNode": "UNLIMITED"}, {}, ["PartitionName=preempt DefMemPerCPU"]),
        ({}, None, ["PartitionName=gpu-bridge-warm"]),
        ({}, {"PreemptMode": "REQUEUE"}, ["PartitionName=gpu-bridge-warm PreemptMode"]),
        ({}, {"OverSubscribe": "EXCLUSIVE"}, ["PartitionName=gpu-bridge-warm OverSubscribe"]),
        ({}, {"MaxTime": "1-00:00:00"}, ["PartitionName=gpu-bridge-warm MaxTime"]),
        ({}, {"PriorityTier": "1"}, ["PartitionName=gpu-bridge-warm PriorityTier"]),
        ({}, {"Nodes": "gpu-node-[01-03]"}, ["PartitionName=gpu-bridge-warm Nodes"]),
    ],
    ids=["memory-not-counted", "no-default-memory", "missing", "preempted", "exclusive", "time-limit", "tier", "nodes"],
)
def test_each_warm_lending_conflict_is_named(settings: dict[str, str], warm: dict[str, str] | None, keys: list[str]) -> None:
    parts = _parts() if warm is None else _parts(**{"gpu-bridge-warm": {**WARM, **warm}})
    found = check(_warm_config(), {**GOOD_SETTINGS, **MEMORY, **settings}, parts)
    assert [f.key for f in found] == keys, found


def test_the_snippets_warm_partition_line_fits_the_check() -> None:
    """The commented line an administrator uncomments, parsed as slurmctld would show it."""
    m = re.search(r"^#PartitionName=gpu-bridge-warm (.*)$", _snippet(), flags=re.M)
    assert m
    line = dict(kv.split("=", 1) for kv in m.group(1).split())
    hold_line = dict(kv.split("=", 1) for kv in re.search(r"^PartitionName=gpu-bridge (.*)$", _snippet(), flags=re.M).group(1).split())  # type: ignore[union-attr]
    assert line["Nodes"] == hold_line["Nodes"]  # every lendable node
    warm = {**line, "Nodes": HOLD["Nodes"], "MaxTime": "UNLIMITED" if line["MaxTime"] == "INFINITE" else line["MaxTime"]}
    assert check(_warm_config(), {**GOOD_SETTINGS, **MEMORY}, _parts(**{"gpu-bridge-warm": warm})) == []
