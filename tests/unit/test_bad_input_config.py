"""Malformed or contradictory config, fuzzed: the loader never raises anything but
ConfigError, every problem names the file, a key path and what is wrong, and
``gpu-bridge check-config`` exits 1 (never a traceback)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge import cli
from bridge.config import Config, describe_keys, load_config, parse_config, to_dict, default_config
from bridge.errors import ConfigError

SRC = "bridge.yaml"
# "<file>: <key path>: <problem>" with a key path made of names and [i] indexes
_SEG = r'(?:[A-Za-z0-9_][A-Za-z0-9_./-]*|"(?:[^"\\]|\\.)*")'
PROBLEM = re.compile(rf"^bridge\.yaml: (?P<path>\(top level\)|{_SEG}(?:\.{_SEG}|\[\d+\])*): (?P<msg>\S.*)$")
KNOWN_KEYS = sorted({k.replace("[]", "").split(".")[-1] for k, _d, _m in describe_keys()})

VALID: dict[str, Any] = {
    "pools": [
        {"name": "llama", "min_serving": 1, "max_lent": 3, "target": {"concurrency_per_replica": 24}},
        {"name": "qwen", "namespace": "serving"},
    ],
    "policy": {
        "tick_s": 30,
        "forecast": {"ratio_min": 0.5, "ratio_max": 3},
        "calendar": [{"name": "day", "effect": "no_lend", "start": "08:00", "end": "18:00", "pools": ["llama"]}],
    },
    "slurm": {"grace_s": 120},
    "daemon": {"metrics_port": 9808, "log_level": "info"},
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["", "08:00", "25:99", "no_lend", "info", "Mars/Olympus", "llama", "nan", "-1", "null"]),
)
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(min_size=1, max_size=12))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)),
    max_leaves=25,
)


def check_problems(exc: ConfigError) -> None:
    assert exc.problems, "a ConfigError must list at least one problem"
    for line in exc.problems:
        m = PROBLEM.match(line)
        assert m, f"problem does not name file, key path and problem: {line!r}"
        assert m.group("msg").strip(), line
        assert "Traceback" not in line
        assert not re.search(r"[\x00-\x1f\x7f]", line), f"control character in a problem: {line!r}"


def parse_or_problems(data: Any) -> Config | None:
    try:
        return parse_config(data, source=SRC)
    except ConfigError as exc:
        check_problems(exc)
        return None


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, (*prefix, i))
    return out


def put(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    obj = copy.deepcopy(obj)
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return obj


def test_the_valid_base_is_valid() -> None:
    assert isinstance(parse_config(VALID, source=SRC), Config)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_arbitrary_documents(data: Any) -> None:
    parse_or_problems(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_one_key_of_a_valid_config_replaced_by_garbage(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(paths(VALID)))
    garbage = data.draw(values)
    parse_or_problems(put(VALID, path, garbage))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_unknown_keys_are_named_with_their_path(data: st.DataObject) -> None:
    dicts = [p for p in paths(VALID) if isinstance(_get(VALID, p), dict)] + [()]
    where = data.draw(st.sampled_from(dicts))
    key = data.draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=10))
    target = _get(VALID, where)
    if key in target or key in KNOWN_KEYS:  # a real key (Hypothesis also draws the code's own strings)
        return
    bad = put(VALID, (*where, key), 1) if where else {**VALID, key: 1}
    with pytest.raises(ConfigError) as info:
        parse_config(bad, source=SRC)
    check_problems(info.value)
    dotted = _dotted((*where, key))
    assert any(line.startswith(f"{SRC}: {dotted}: unknown key") for line in info.value.problems), info.value.problems


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=200), st.sampled_from([
    "pools: [", "pools:\n  - name: a\n  - name: a\n", "{{{{", "pools: !!python/object:os.system ls\n",
    "a: b\na: c\n", "\t- x", "pools:\n- name: x\n  min_serving: .nan\n", "---\n---\n", "pools: *alias\n",
])))
def test_arbitrary_file_text(text: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / SRC
        p.write_text(text, encoding="utf-8")
        try:
            load_config(p)
        except ConfigError as exc:
            assert exc.problems
            for line in exc.problems:
                assert line.startswith(str(p) + ": "), line
                assert len(line) > len(str(p)) + 2


CONTRADICTIONS: list[tuple[dict[str, Any], str]] = [
    ({"pools": [{"name": "a"}, {"name": "a"}]}, 'bridge.yaml: pools[1].name: duplicate pool name "a" (also pools[0])'),
    ({"pools": [{"name": "a"}], "policy": {"forecast": {"ratio_min": 4, "ratio_max": 2}}},
     "bridge.yaml: policy.forecast.ratio_min: must be <= ratio_max (2), got 4"),
    ({"pools": [{"name": "a"}], "policy": {"calendar": [{"name": "x", "effect": "no_lend", "start": "10:00", "end": "10:00"}]}},
     'bridge.yaml: policy.calendar[0].end: must differ from start, got "10:00" for both'),
    ({"pools": [{"name": "a"}], "policy": {"calendar": [{"name": "x", "effect": "no_lend", "start": "10:00", "end": "11:00", "min_serving": 2}]}},
     'bridge.yaml: policy.calendar[0].min_serving: only allowed with effect min_serving, got effect "no_lend"'),
    ({"pools": [{"name": "a"}], "policy": {"calendar": [{"name": "x", "effect": "min_serving", "start": "10:00", "end": "11:00"}]}},
     "bridge.yaml: policy.calendar[0].min_serving: required when effect is min_serving"),
    ({"pools": [{"name": "a"}], "policy": {"calendar": [{"name": "x", "effect": "no_lend", "start": "10:00", "end": "11:00", "pools": ["b"]}]}},
     'bridge.yaml: policy.calendar[0].pools[0]: no pool named "b"'),
    ({"pools": [{"name": "a", "target": {"concurrency_per_replica": None, "kv_cache_usage": None}}]},
     "bridge.yaml: pools[0].target: at least one target must be set, got all null"),
    ({"pools": []}, "bridge.yaml: pools: must list at least one pool, got none"),
    ({"pools": [{"name": "a", "min_serving": 1.5}]}, "bridge.yaml: pools[0].min_serving: expected an integer, got 1.5"),
    ({"pools": [{"name": "a", "headroom": float("nan")}]}, "bridge.yaml: pools[0].headroom: expected a finite number, got nan"),
    ({"pools": [{"name": "a"}], "daemon": {"metrics_port": 70000}}, "bridge.yaml: daemon.metrics_port: must be <= 65535, got 70000"),
    ({"pools": [{"name": "a"}], "slurm": {"grace_s": True}}, "bridge.yaml: slurm.grace_s: expected a number, got true"),
]


@pytest.mark.parametrize(("data", "expected"), CONTRADICTIONS, ids=[e[:60] for _, e in CONTRADICTIONS])
def test_contradictions_named(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source=SRC)
    check_problems(info.value)
    assert any(line.startswith(expected) for line in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    "text",
    [
        "pools: [\n",  # truncated
        "pools:\n  - name: Bad Name!\n    min_serving: -3\n",
        "pools:\n  - name: a\npolicy:\n  tick: 30\n",
        "pools:\n  - name: a\n    target: 12\n",
        "[1, 2, 3]\n",
        "pools:\n  - name: a\n  - name: a\n",
    ],
)
def test_check_config_exits_1_with_named_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    p = tmp_path / "bridge.yaml"
    p.write_text(text)
    assert cli.main(["check-config", str(p)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err and not out
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"{p}: ") and "problem" in lines[-1]
    for line in lines[:-1]:
        rest = line[len(str(p)) + 2 :]
        assert line.startswith(f"{p}: ") and ": " in rest or rest.startswith("invalid YAML") or rest.startswith("duplicate key"), line


def test_resolved_config_round_trips() -> None:
    cfg = parse_config(VALID, source=SRC)
    assert parse_config(to_dict(cfg), source=SRC) == cfg
    assert default_config() == parse_config(to_dict(default_config()), source=SRC)


POOL_YAML = "pools:\n  - name: a\n"


def _nested_aliases(levels: int) -> str:
    """A "billion laughs": each level a list of nine aliases of the one below (9**levels values)."""
    v = "&a0 [x, x, x, x, x, x, x, x, x]"
    for i in range(1, levels + 1):
        v = f"&a{i} [{v}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    return v


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # 9**8 values: pydantic and the error messages walked them (minutes, gigabytes) before
        (f"slurm:\n  own_drain_reasons: {_nested_aliases(8)}\n" + POOL_YAML, "more than 100,000 values once its YAML aliases are expanded"),
        (POOL_YAML + f"    model_name: {_nested_aliases(8)}\n", "more than 100,000 values once its YAML aliases are expanded"),
        ("[" * 40 + "]" * 40 + "\n", "nested more than 32 levels deep"),
        ("[" * 5000 + "]" * 5000 + "\n", "invalid YAML: nested too deeply"),  # a RecursionError before
        ("{a: " * 5000 + "1" + "}" * 5000 + "\n", "invalid YAML: nested too deeply"),
        # a ValueError / TypeError out of the loader before
        (POOL_YAML + "    min_serving: " + "9" * 5000 + "\n", "invalid YAML at line 3, column 18: cannot read '9999"),
        (POOL_YAML + "    min_serving: !!int zz\n", "invalid YAML at line 3, column 18: cannot read 'zz' as int"),
        (POOL_YAML + "    cold_start_s: !!float zz\n", "invalid YAML at line 3, column 19: cannot read 'zz' as float"),
        (POOL_YAML + "    model_name: !!timestamp 2020-99-99\n", "cannot read '2020-99-99' as timestamp: month must be in 1..12"),
        (POOL_YAML + "? [a, b]\n: 1\n", "invalid YAML at line 3, column 3: found unhashable key"),
        # YAML 1.1 base 60: 1:30 was silently the number 90
        (POOL_YAML + "    cold_start_s: 1:30\n", 'pools[0].cold_start_s: expected a number, got "1:30"'),
        (POOL_YAML + "    min_serving: 1:30\n", 'pools[0].min_serving: expected an integer, got "1:30"'),
    ],
    ids=["alias-bomb-list", "alias-bomb-string", "deep-32", "deep-list", "deep-map", "int-5000-digits", "bad-int-tag",
         "bad-float-tag", "bad-timestamp", "list-as-key", "base60-float", "base60-int"],
)
def test_hostile_yaml_is_a_config_error_naming_the_problem(tmp_path: Path, text: str, says: str) -> None:
    import time

    p = tmp_path / SRC
    p.write_text(text, encoding="utf-8")
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert time.monotonic() - t0 < 10
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(f"{p}: ")
    assert says in info.value.problems[0], info.value.problems
    assert len(info.value.problems[0]) < 400


def test_unquoted_clock_times_and_merge_keys_read_as_written(tmp_path: Path) -> None:
    """``start: 20:00`` unquoted was the integer 1200 (YAML 1.1 base 60): refused as "expected a
    string, got 1200"; a merge key (``<<: *defaults``) was refused as an unknown tag by the
    duplicate-key check. Both are what the operator wrote now; a duplicate is still an error."""
    p = tmp_path / SRC
    p.write_text(
        "pools:\n  - &first {name: a, namespace: serving, deployment: vllm, model_name: m}\n"
        "  - <<: *first\n    name: b\n    model_name: other\n"
        "policy:\n  calendar:\n    - {name: nights, effect: lend_only, start: 20:00, end: 08:00}\n",
        encoding="utf-8",
    )
    cfg = load_config(p)
    assert [(q.name, q.namespace, q.model_name) for q in cfg.pools] == [("a", "serving", "m"), ("b", "serving", "other")]
    assert (cfg.policy.calendar[0].start, cfg.policy.calendar[0].end) == ("20:00", "08:00")
    p.write_text("pools:\n  - name: a\n    name: b\n", encoding="utf-8")
    with pytest.raises(ConfigError, match='duplicate key "name" at line 3'):
        load_config(p)


def test_a_file_that_never_ends_is_refused_not_read_into_memory(tmp_path: Path) -> None:
    """``check-config /dev/zero`` (or a log given by mistake) was read whole: MemoryError."""
    from bridge.config import MAX_YAML_BYTES

    with pytest.raises(ConfigError, match=r"^/dev/zero: larger than 1 MiB; expected a YAML config$"):
        load_config("/dev/zero")
    big = tmp_path / SRC
    big.write_text(POOL_YAML + "#" * MAX_YAML_BYTES, encoding="utf-8")
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_config(big)
    big.write_text(POOL_YAML + "#" * (MAX_YAML_BYTES - len(POOL_YAML)), encoding="utf-8")
    assert load_config(big).pools[0].name == "a"  # exactly the bound: read


@pytest.mark.parametrize(("written", "read"), [("1e3", 1000.0), ("1E-3", 0.001), ("2.5e+2", 250.0), ("1e400", None)])
def test_exponents_are_numbers(tmp_path: Path, written: str, read: float | None) -> None:
    """YAML 1.1 wanted a dot and a signed exponent: ``cold_start_s: 1e3`` was the string "1e3"
    ('expected a number, got "1e3"') and 1e400 was never infinity; now as YAML 1.2 reads them."""
    p = tmp_path / SRC
    p.write_text(POOL_YAML + f"    cold_start_s: {written}\n", encoding="utf-8")
    if read is None:
        with pytest.raises(ConfigError, match=r"pools\[0\]\.cold_start_s: expected a finite number, got inf"):
            load_config(p)
    else:
        assert load_config(p).pools[0].cold_start_s == read
