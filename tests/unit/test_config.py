"""Config loading: defaults, every problem collected and worded exactly, did-you-mean hints,
the check-config command. Error messages are asserted word for word: operators read them."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from bridge import cli
from bridge.config import (
    CalendarEffect,
    Config,
    PoolConfig,
    VictimRule,
    default_config,
    describe_keys,
    load_config,
    parse_config,
)
from bridge.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpu-bridge.yaml"


def problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="bridge.yaml")
    return info.value.problems


def test_minimal_config_gets_documented_defaults() -> None:
    cfg = parse_config({"pools": [{"name": "llama"}]})
    assert cfg.pools[0].name == "llama"
    assert cfg.pools[0].selector == {"gpu-bridge.io/pool": "llama"}
    assert cfg.pools[0].model == "llama"
    assert cfg.policy.scale_down_window_s == 300.0
    assert cfg.slurm.preempt_partition == "preempt"
    assert cfg.slurm.hold_partition == "gpu-bridge"
    assert cfg.policy.victims is VictimRule.LEAST_LOST_WORK
    assert cfg.daemon.dry_run is False


def test_default_config_is_valid_and_frozen() -> None:
    cfg = default_config("a", "b", cold_start_s=60)
    assert [p.name for p in cfg.pools] == ["a", "b"]
    assert cfg.pool("b").cold_start_s == 60
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.policy.tick_s = 1  # type: ignore[misc]
    # What the defaults render to must load back to the same config.
    from bridge.config import to_dict

    assert parse_config(to_dict(cfg)) == cfg


def test_example_file_is_valid() -> None:
    cfg = load_config(EXAMPLE)
    assert isinstance(cfg, Config)
    assert any(r.effect is CalendarEffect.NO_LEND for r in cfg.policy.calendar)


@pytest.mark.parametrize(
    "data, expected",
    [
        pytest.param(
            {"pools": [{"name": "a", "target": {"waiting_per_replica": -1}}]},
            ["bridge.yaml: pools[0].target.waiting_per_replica: must be > 0, got -1"],
            id="negative-target",
        ),
        pytest.param(
            {"pools": [{"name": "a", "target": {"concurrency_per_replica": "fast"}}]},
            ['bridge.yaml: pools[0].target.concurrency_per_replica: expected a number, got "fast"'],
            id="string-for-number",
        ),
        pytest.param(
            {"pools": [{"name": "a", "target": {"kv_cache_usage": 1.5}}]},
            ["bridge.yaml: pools[0].target.kv_cache_usage: must be <= 1, got 1.5"],
            id="fraction-above-one",
        ),
        pytest.param(
            {"pools": [{"name": "a", "min_serving": 1.5}]},
            ["bridge.yaml: pools[0].min_serving: expected an integer, got 1.5"],
            id="float-for-int",
        ),
        pytest.param(
            {"pools": [{"name": "a", "min_serving": True}]},
            ["bridge.yaml: pools[0].min_serving: expected an integer, got true"],
            id="bool-for-int",
        ),
        pytest.param(
            {"pools": [{"name": "a"}], "policy": {"tick": 30}},
            ['bridge.yaml: policy.tick: unknown key; did you mean "tick_s"?'],
            id="unknown-key-hint",
        ),
        pytest.param(
            {"pools": [{"name": "a"}], "polcy": {}},
            ['bridge.yaml: polcy: unknown key; did you mean "policy"?'],
            id="unknown-section-hint",
        ),
        pytest.param(
            {"pools": [{"name": "a"}], "zzz": 1},
            ["bridge.yaml: zzz: unknown key; expected one of pools, slurm, policy, prometheus, kubernetes, daemon, web"],
            id="unknown-key-no-hint",
        ),
        pytest.param(
            {},
            ["bridge.yaml: pools: required, expected a list"],
            id="pools-required",
        ),
        pytest.param(
            {"pools": []},
            ["bridge.yaml: pools: must list at least one pool, got none"],
            id="pools-empty",
        ),
        pytest.param(
            {"pools": [{"deployment": "x"}]},
            ["bridge.yaml: pools[0].name: required, expected a string"],
            id="pool-name-required",
        ),
        pytest.param(
            {"pools": [{"name": "a"}, {"name": "a"}]},
            ['bridge.yaml: pools[1].name: duplicate pool name "a" (also pools[0])'],
            id="duplicate-pool",
        ),
        pytest.param(
            {"pools": [{"name": "Big Model"}]},
            ['bridge.yaml: pools[0].name: expected a label value (lowercase letters, digits, - _ .), got "Big Model"'],
            id="pool-name-not-a-label",
        ),
        pytest.param(
            {"pools": [{"name": "a"}], "policy": {"victims": "newest"}},
            ['bridge.yaml: policy.victims: expected one of least_lost_work, newest_first, got "newest"; did you mean "newest_first"?'],
            id="enum-hint",
        ),
        pytest.param(
            {"pools": [{"name": "a", "target": {"concurrency_per_replica": None, "kv_cache_usage": None}}]},
            ["bridge.yaml: pools[0].target: at least one target must be set, got all null"],
            id="no-target",
        ),
        pytest.param(
            {"pools": "a"},
            ['bridge.yaml: pools: expected a list, got "a"'],
            id="pools-not-a-list",
        ),
        pytest.param(
            [1, 2],
            ["bridge.yaml: (top level): expected a mapping, got [1, 2]"],
            id="top-level-list",
        ),
        pytest.param(
            {"pools": [{"name": "a", "node_selector": {"pool": 3}}]},
            ["bridge.yaml: pools[0].node_selector.pool: expected a string, got 3"],
            id="selector-value",
        ),
        pytest.param(
            {"pools": [{"name": "a"}], "daemon": {"metrics_port": 70000, "log_level": "verbose"}},
            [
                "bridge.yaml: daemon.metrics_port: must be <= 65535, got 70000",
                'bridge.yaml: daemon.log_level: expected one of debug, info, warning, error, got "verbose"',
            ],
            id="daemon",
        ),
        pytest.param(
            {"pools": [{"name": "a"}], "policy": {"forecast": {"ratio_min": 2, "ratio_max": 1}}},
            ["bridge.yaml: policy.forecast.ratio_min: must be <= ratio_max (1), got 2"],
            id="ratio-order",
        ),
        pytest.param(
            {"pools": [{"name": "a"}], "policy": {"forecast": {"seasonal_lags_s": [86400, -1]}}},
            ["bridge.yaml: policy.forecast.seasonal_lags_s[1]: must be > 0, got -1"],
            id="list-item-bound",
        ),
        pytest.param(
            {"pools": [{"name": "a"}], "prometheus": {"timeout_s": float("nan")}},
            ["bridge.yaml: prometheus.timeout_s: expected a finite number, got nan"],
            id="nan",
        ),
    ],
)
def test_problem_messages_word_for_word(data: object, expected: list[str]) -> None:
    assert problems(data) == expected


@pytest.mark.parametrize(
    "rule, expected",
    [
        pytest.param(
            {"name": "day", "effect": "no_lend", "start": "8:00", "end": "20:00"},
            ['bridge.yaml: policy.calendar[0].start: expected a time HH:MM (00:00..24:00), got "8:00"'],
            id="time-format",
        ),
        pytest.param(
            {"name": "day", "effect": "no_lend", "start": "08:00", "end": "08:00"},
            ['bridge.yaml: policy.calendar[0].end: must differ from start, got "08:00" for both'],
            id="empty-window",
        ),
        pytest.param(
            {"name": "day", "effect": "no_lend", "start": "08:00", "end": "20:00", "days": ["mon", "fr"]},
            ['bridge.yaml: policy.calendar[0].days[1]: expected one of mon, tue, wed, thu, fri, sat, sun, got "fr"; did you mean "fri"?'],
            id="day-name",
        ),
        pytest.param(
            {"name": "day", "effect": "no_lend", "start": "08:00", "end": "20:00", "timezone": "Europe/Berln"},
            ['bridge.yaml: policy.calendar[0].timezone: unknown IANA timezone, got "Europe/Berln"'],
            id="timezone",
        ),
        pytest.param(
            {"name": "day", "effect": "min_serving", "start": "08:00", "end": "20:00"},
            ["bridge.yaml: policy.calendar[0].min_serving: required when effect is min_serving"],
            id="min-serving-required",
        ),
        pytest.param(
            {"name": "day", "effect": "no_lend", "start": "08:00", "end": "20:00", "min_serving": 3},
            ['bridge.yaml: policy.calendar[0].min_serving: only allowed with effect min_serving, got effect "no_lend"'],
            id="min-serving-misplaced",
        ),
        pytest.param(
            {"name": "day", "effect": "no_lend", "start": "08:00", "end": "20:00", "pools": ["lama"]},
            ['bridge.yaml: policy.calendar[0].pools[0]: no pool named "lama"; did you mean "llama"?'],
            id="unknown-pool",
        ),
        pytest.param(
            {"name": "day", "effect": "never", "start": "08:00", "end": "20:00"},
            ['bridge.yaml: policy.calendar[0].effect: expected one of no_lend, lend_only, min_serving, got "never"'],
            id="effect",
        ),
    ],
)
def test_calendar_rule_problems(rule: dict[str, object], expected: list[str]) -> None:
    assert problems({"pools": [{"name": "llama"}], "policy": {"calendar": [rule]}}) == expected


def test_every_problem_is_collected_in_one_pass() -> None:
    found = problems(
        {
            "pools": [{"name": "a", "min_serving": -1, "target": {"waiting_per_replica": 0}}, {"nme": "b"}],
            "slurm": {"grace_s": "2m"},
            "policy": {"tick_s": 0},
        }
    )
    assert found == [
        "bridge.yaml: pools[0].target.waiting_per_replica: must be > 0, got 0",
        "bridge.yaml: pools[0].min_serving: must be >= 0, got -1",
        'bridge.yaml: pools[1].nme: unknown key; did you mean "name"?',
        "bridge.yaml: pools[1].name: required, expected a string",
        'bridge.yaml: slurm.grace_s: expected a number, got "2m"',
        "bridge.yaml: policy.tick_s: must be > 0, got 0",
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("pools: [\n", "invalid YAML at line 2, column 1", id="syntax"),
        pytest.param("pools: []\npools: []\n", 'duplicate key "pools" at line 2', id="duplicate-key"),
    ],
)
def test_yaml_errors_name_the_file_and_place(tmp_path: Path, text: str, expected: str) -> None:
    f = tmp_path / "bridge.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(f"{f}: {expected}")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    assert info.value.problems == [f"{tmp_path / 'nope.yaml'}: cannot read: No such file or directory"]


def test_every_key_is_documented() -> None:
    rows = describe_keys()
    assert all(doc for _, _, doc in rows)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text()
    missing = [key for key, _, _ in rows if f"`{key}`" not in docs]
    assert missing == []


def test_check_config_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bridge.yaml"
    f.write_text("pools:\n  - name: llama\n")
    assert cli.main(["check-config", str(f)]) == 0
    out = capsys.readouterr().out
    assert "scale_down_window_s: 300.0" in out
    assert "gpu-bridge.io/pool: llama" in out


def test_check_config_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bridge.yaml"
    f.write_text("pools:\n  - name: llama\n    target: {waiting_per_replica: -1}\npolicy: {tick: 5}\n")
    assert cli.main(["check-config", str(f)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{f}: pools[0].target.waiting_per_replica: must be > 0, got -1",
        f'{f}: policy.tick: unknown key; did you mean "tick_s"?',
        f"{f}: 2 problems",
    ]


def test_check_config_json_and_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    f = tmp_path / "bridge.yaml"
    f.write_text("pools:\n  - name: llama\n    model_name: meta-llama/Llama-3.1-70B\n")
    assert cli.main(["check-config", "--json", str(f)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pools"][0]["model_name"] == "meta-llama/Llama-3.1-70B"
    assert data["policy"]["victims"] == "least_lost_work"
    assert cli.main(["check-config", "--keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "policy.scale_down_window_s\t300\tdemand must stay low this long before a lend (HPA stabilization window)" in lines
    assert cli.main(["check-config"]) == 2


def _doc_generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_config_doc", ROOT / "scripts" / "gen_config_doc.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docs_key_tables_are_generated_from_the_schema() -> None:
    """docs/config.md's tables are what scripts/gen_config_doc.py renders now: a key, default
    or description changed in bridge/config.py without re-running the script fails here."""
    gen = _doc_generator()
    text = gen.DOC.read_text(encoding="utf-8")
    assert gen.rendered(text) == text, "docs/config.md is stale: run .venv/bin/python scripts/gen_config_doc.py"
    # the check sees a stale table (an edited default) and the script's --check says so
    stale = text.replace("| `policy.tick_s` | `30` |", "| `policy.tick_s` | `31` |")
    assert stale != text and gen.rendered(stale) == text
    assert gen.main(["--check"]) == 0


@pytest.mark.parametrize(
    "data, expected",
    [
        pytest.param({"pools": [{"name": "a", "min_serving": 2.0}]}, None, id="whole-float-for-int"),
        pytest.param(
            {"pools": [{"name": "a"}], "policy": {"tick_s": float("inf")}},
            ["bridge.yaml: policy.tick_s: expected a finite number, got inf"],
            id="inf",
        ),
        pytest.param(
            {"pools": [{"name": "a", "max_lent": float("nan")}]},
            ["bridge.yaml: pools[0].max_lent: expected a finite number, got nan"],
            id="nan-for-int",
        ),
        pytest.param(
            {"pools": [{"name": "a"}], "slurm": {"command_prefix": {"ssh"}}},
            ["bridge.yaml: slurm.command_prefix: expected a list, got {'ssh'}"],
            id="set-for-list",
        ),
        pytest.param(
            {"pools": [{"name": "a", "node_selector": {3: "x"}}]},
            ["bridge.yaml: pools[0].node_selector.3: expected a string key, got 3"],
            id="selector-key",
        ),
        pytest.param(
            {"pools": [{"name": "a", "target": 12}]},
            ["bridge.yaml: pools[0].target: expected a mapping, got 12"],
            id="section-not-a-mapping",
        ),
        pytest.param(
            {"pools": [{"name": "a", "zzz": 1, "min_serving": "x", "yyy": 2}]},
            [
                "bridge.yaml: pools[0].zzz: unknown key; expected one of " + ", ".join(f.name for f in dataclasses.fields(PoolConfig)),
                "bridge.yaml: pools[0].yyy: unknown key; expected one of " + ", ".join(f.name for f in dataclasses.fields(PoolConfig)),
                'bridge.yaml: pools[0].min_serving: expected an integer, got "x"',
            ],
            id="unknown-keys-first-in-their-order",
        ),
    ],
)
def test_value_edges(data: object, expected: list[str] | None) -> None:
    if expected is None:
        cfg = parse_config(data)
        assert cfg.pools[0].min_serving == 2 and isinstance(cfg.pools[0].min_serving, int)
    else:
        assert problems(data) == expected


def test_cross_field_problems_of_several_sections_at_once() -> None:
    """A section's own checks run even when another section has problems, all reported."""
    found = problems({
        "pools": [{"name": "Bad Name", "drain_s": 1000}],
        "slurm": {"command_prefix": ["ssh login1"]},
        "policy": {"tick_s": -1, "forecast": {"ratio_min": 3, "ratio_max": 1}},
    })
    assert found == [
        'bridge.yaml: pools[0].name: expected a label value (lowercase letters, digits, - _ .), got "Bad Name"',
        'bridge.yaml: slurm.command_prefix[0]: expected a program (an argv list, not a shell command line), got "ssh login1"',
        "bridge.yaml: policy.tick_s: must be > 0, got -1",
        "bridge.yaml: policy.forecast.ratio_min: must be <= ratio_max (1), got 3",
    ]


def test_sections_built_in_code_are_validated_and_worded_like_a_file() -> None:
    """default_config and replace validate again (cross-field checks too) and raise ConfigError
    with key paths relative to the section changed, never pydantic's own error."""
    from bridge.config import replace

    cfg = default_config("a", "b")
    assert replace(cfg.policy, tick_s=5).tick_s == 5.0
    with pytest.raises(ConfigError) as info:
        replace(cfg, pools=(replace(cfg.pools[0], drain_s=900), cfg.pools[1]))
    assert info.value.problems == ["overrides: policy.lend_timeout_s: must be > pools[0].drain_s + 20 s (920), got 600"]
    with pytest.raises(ConfigError) as info:
        replace(cfg.policy, tick_s=True, source="--tick-s")
    assert info.value.problems == ["--tick-s: tick_s: expected a number, got true"]
    with pytest.raises(ConfigError) as info:
        default_config("a", "a")
    assert info.value.problems == ['default_config: pools[1].name: duplicate pool name "a" (also pools[0])']
    with pytest.raises(ConfigError) as info:
        default_config(min_serving=-1)
    assert info.value.problems == ["default_config: min_serving: must be >= 0, got -1"]


def test_check_config_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """--schema prints the models' JSON Schema: every documented key, bounds, no unknown keys."""
    import json

    assert cli.main(["check-config", "--schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["required"] == ["pools"] and schema["additionalProperties"] is False
    pool = schema["$defs"]["PoolConfig"]["properties"]
    assert pool["min_serving"] == {
        "default": 1, "description": "nodes that always serve, whatever the load", "minimum": 0,
        "maximum": 10_000_000, "title": "Min Serving", "type": "integer",
    }
    assert pool["max_lent"]["anyOf"] == [{"maximum": 10_000_000, "minimum": 0, "type": "integer"}, {"type": "null"}]
    assert schema["$defs"]["TargetConfig"]["properties"]["kv_cache_usage"]["anyOf"][0] == {
        "exclusiveMinimum": 0, "maximum": 1, "type": "number",
    }
    top = {key for key, _d, _m in describe_keys() if "." not in key}
    assert set(schema["properties"]) == top


@pytest.mark.parametrize(
    ("slurm", "expected"),
    [
        pytest.param({}, [], id="tier-off-by-default"),
        pytest.param({"grace_s": 0}, [], id="tier-off-ignores-fast-grace"),
        pytest.param({"fast_partition": "preempt-fast"}, [], id="default-fast-grace-below-normal"),
        pytest.param(
            {"fast_partition": "preempt-fast", "fast_grace_s": 120},
            ["bridge.yaml: slurm.fast_grace_s: must be < slurm.grace_s (120) when fast_partition is set, got 120"],
            id="fast-grace-equal-to-normal",
        ),
        pytest.param(
            {"fast_partition": "preempt-fast", "grace_s": 10},
            ["bridge.yaml: slurm.fast_grace_s: must be < slurm.grace_s (10) when fast_partition is set, got 15"],
            id="default-fast-grace-above-lowered-normal",
        ),
        pytest.param({"fast_grace_s": 0}, ["bridge.yaml: slurm.fast_grace_s: must be > 0, got 0"], id="fast-grace-zero"),
        pytest.param(
            {"fast_partition": "preempt"},
            ['bridge.yaml: slurm.fast_partition: must differ from preempt_partition and hold_partition, got "preempt"'],
            id="fast-partition-is-the-normal-one",
        ),
        pytest.param(
            {"fast_partition": "pre empt"},
            ['bridge.yaml: slurm.fast_partition: expected a partition name, got "pre empt"'],
            id="fast-partition-not-a-name",
        ),
    ],
)
def test_fast_tier_keys(slurm: dict[str, object], expected: list[str]) -> None:
    """The fast tier is off unless named; when on, its grace must be shorter than the normal one."""
    data = {"pools": [{"name": "a"}], "slurm": slurm}
    if expected:
        assert problems(data) == expected
    else:
        cfg = parse_config(data)
        assert cfg.slurm.fast_partition == slurm.get("fast_partition")
        assert cfg.slurm.fast_grace_s == 15.0


def test_warm_lending_is_off_by_default_and_validated() -> None:
    pool = parse_config({"pools": [{"name": "llama"}]}).pools[0]
    assert (pool.warm_lending, pool.wake_s, pool.vllm_port) == (False, 30.0, 8000)
    warm = parse_config({"pools": [{"name": "llama", "warm_lending": True, "warm_hold_mb": 140_000}]})
    assert warm.pools[0].warm_lending is True and warm.pools[0].warm_hold_mb == 140_000
    assert warm.slurm.warm_partition == "gpu-bridge-warm"
    got = problems({"pools": [{"name": "llama", "warm_lending": "yes", "wake_s": 0, "vllm_port": 70000}]})
    assert len(got) == 3 and all(p.startswith("bridge.yaml: pools[0].") for p in got), got
    assert any("warm_lending" in p for p in got) and any("wake_s" in p for p in got) and any("vllm_port" in p for p in got)


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param({"pools": [{"name": "llama", "warm_lending": True}]},
                     ["bridge.yaml: pools[0].warm_hold_mb: required when warm_lending is on (the host memory, in MB, the sleeping "
                      "replica holds: kept from research jobs by the memory-hold job), got null"], id="hold-size-required"),
        pytest.param({"pools": [{"name": "llama", "warm_lending": True, "warm_hold_mb": 0}]},
                     ["bridge.yaml: pools[0].warm_hold_mb: must be > 0, got 0"], id="hold-size-positive"),
        pytest.param({"pools": [{"name": "llama", "warm_hold_mb": 1.5}]},
                     ["bridge.yaml: pools[0].warm_hold_mb: expected an integer, got 1.5"], id="hold-size-whole-mb"),
        pytest.param({"pools": [{"name": "llama"}], "slurm": {"warm_partition": "preempt"}},
                     ['bridge.yaml: slurm.warm_partition: must differ from preempt_partition, hold_partition and fast_partition, '
                      'got "preempt"'], id="warm-partition-its-own"),
        pytest.param({"pools": [{"name": "llama"}], "slurm": {"warm_partition": "a b"}},
                     ['bridge.yaml: slurm.warm_partition: expected a partition name, got "a b"'], id="warm-partition-name"),
    ],
)
def test_the_memory_hold_keys_are_validated(doc: dict[str, object], expected: list[str]) -> None:
    assert problems(doc) == expected


@pytest.mark.parametrize(("pool", "daemon", "said"), [
    ({"namespace": "Serving_NS"}, {}, 'pools[0].namespace: expected a Kubernetes namespace (lowercase letters, digits, '
                                      "'-'; at most 63), got \"Serving_NS\""),
    ({"namespace": "n" * 64}, {}, "pools[0].namespace: expected a Kubernetes namespace"),
    ({"deployment": "vllm/scale"}, {}, 'pools[0].deployment: expected a Kubernetes Deployment name'),
    ({"node_selector": {"a/b/c": "x"}}, {}, 'pools[0].node_selector.a/b/c: expected a Kubernetes label key'),
    ({"node_selector": {"k": "bad value!"}}, {}, 'pools[0].node_selector.k: expected a Kubernetes label value'),
    ({"prometheus_matchers": {"bad label": "x"}}, {},
     'pools[0].prometheus_matchers."bad label": expected a Prometheus label name'),
    ({}, {"lease_namespace": "GPU"}, "daemon.lease_namespace: expected a Kubernetes namespace"),
    ({}, {"lease_name": "a/b"}, "daemon.lease_name: expected a Kubernetes Lease name"),
], ids=["namespace-case", "namespace-long", "deployment-slash", "selector-key", "selector-value", "matcher-label",
        "lease-namespace", "lease-name"])
def test_names_kubernetes_or_prometheus_would_refuse_are_config_errors(
        pool: dict[str, Any], daemon: dict[str, Any], said: str) -> None:
    """Caught when the config is read, naming the key, not as a failed API call or PromQL error at run time."""
    got = problems({"pools": [{"name": "llama", **pool}], "daemon": daemon})
    assert len(got) == 1 and got[0].startswith(f"bridge.yaml: {said}"), got


def test_usual_kubernetes_names_and_selectors_are_accepted() -> None:
    cfg = parse_config({"pools": [{"name": "llama", "namespace": "serving-1", "deployment": "vllm.llama-70b",
                                   "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "",
                                                     "gpu-bridge.io/pool": "llama"},
                                   "prometheus_matchers": {"job": "vllm", "__meta_x": "y"}}],
                        "daemon": {"lease_name": "gpu-bridge.leader", "lease_namespace": "gpu-bridge"}})
    assert cfg.pools[0].namespace == "serving-1" and cfg.daemon.lease_name == "gpu-bridge.leader"


@pytest.mark.parametrize(("web", "said"), [
    ({"root_path": "//evil.example"}, "web.root_path: expected empty or a path such as /rnode/host/8808"),
    ({"root_path": "gpu-bridge"}, "web.root_path: expected empty or a path"),
    ({"root_path": "/gpu-bridge/"}, "web.root_path: expected empty or a path"),
    ({"root_path": "/a b"}, "web.root_path: expected empty or a path"),
    ({"user_header": "X Forwarded User"}, "web.user_header: expected an HTTP header name"),
    ({"user_header": "X-User\r\nInjected: 1"}, "web.user_header: expected an HTTP header name"),
], ids=["root-path-other-host", "root-path-relative", "root-path-trailing-slash", "root-path-space", "header-spaces",
        "header-crlf"])
def test_the_web_view_s_prefix_and_user_header_must_be_what_they_say(web: dict[str, Any], said: str) -> None:
    """The prefix starts every redirect and link (``//host`` would send researchers elsewhere)."""
    got = problems({"pools": [{"name": "llama"}], "web": web})
    assert len(got) == 1 and got[0].startswith(f"bridge.yaml: {said}"), got
    ok = parse_config({"pools": [{"name": "llama"}], "web": {"root_path": "/rnode/gpu-login-01/8808",
                                                              "user_header": "X-Forwarded-User"}})
    assert ok.web.root_path == "/rnode/gpu-login-01/8808"
