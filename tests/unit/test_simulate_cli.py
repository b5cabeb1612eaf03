"""The simulator's workload, job-mix parsing, report and command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bridge.cli import main
from bridge.config import TargetConfig
from bridge.errors import ConfigError
from bridge.policy.demand import demand
from bridge.simulate.research import parse_job_mix
from bridge.simulate.workload import build_workload, signals
from bridge.trace import Trace, load_trace

KEYS = {
    "policy",
    "lent_gpu_hours",
    "useful_gpu_hours",
    "lost_gpu_hours",
    "preemptions",
    "early_preemptions",
    "early_lost_gpu_hours",
    "lends",
    "reclaims",
    "slo_violation_minutes",
    "trace_minutes",
}


def small_trace(tmp_path: Path) -> Path:
    p = tmp_path / "t.csv"
    lines = ["window_start_s,rate_req_per_s,cv,clients_active"]
    for i in range(36):
        lines.append(f"{i * 600},{100 + 60 * math.sin(i / 6):.3f},{2.0 + (i % 5)},10")
    p.write_text("\n".join(lines) + "\n")
    return p


def test_busiest_window_needs_the_peak_replicas_and_windows_keep_their_means() -> None:
    trace = load_trace()
    w = build_workload(trace, peak_replicas=20, seed=3)
    assert w.window_load.max() == pytest.approx(20.0)
    per_window = w.load.reshape(-1, 10).mean(axis=1)
    np.testing.assert_allclose(per_window, w.window_load, rtol=1e-9)
    assert w.minutes == 14 * 1440
    assert w.scale == pytest.approx(20 * 4.0 / trace.peak_rate)
    assert "20 replicas" in w.describe_scale()
    # bursts: minutes vary inside a window, more where the trace's cv is higher
    dev = np.abs(w.load.reshape(-1, 10) / per_window[:, None] - 1).mean(axis=1)
    cv = np.asarray(trace.cvs)
    assert dev[cv > 10].mean() > 3 * dev[cv < 2].mean()


def test_same_seed_same_load() -> None:
    t = load_trace()
    a = build_workload(t, peak_replicas=10, seed=1, days=1)
    b = build_workload(t, peak_replicas=10, seed=1, days=1)
    c = build_workload(t, peak_replicas=10, seed=2, days=1)
    assert np.array_equal(a.load, b.load) and not np.array_equal(a.load, c.load)
    assert a.minutes == 1440


@pytest.mark.parametrize(
    "target",
    [TargetConfig(), TargetConfig(concurrency_per_replica=None, kv_cache_usage=0.7), TargetConfig(tokens_per_s_per_replica=900.0)],
)
def test_signals_read_back_the_offered_load_through_the_policys_targets(target: TargetConfig) -> None:
    for load, ready in ((3.2, 8), (7.9, 8), (0.0, 2)):
        s = signals(100.0, load, ready, target)
        assert demand(s, target).replicas == pytest.approx(load)
        assert s.replicas_reporting == ready
        assert s.kv_cache_usage_sum is not None and s.kv_cache_usage_sum <= ready
    # overload: KV caches full, the rest waits; the concurrency signal still shows the load
    s = signals(0.0, 20.0, 8, TargetConfig())
    assert s.kv_cache_usage_sum == pytest.approx(8.0) and s.waiting > 0
    assert demand(s, TargetConfig()).replicas == pytest.approx(20.0)
    none = signals(0.0, 5.0, 0, TargetConfig())
    assert none.running is None and demand(none, TargetConfig()).replicas is None


def test_job_mix_parsing_names_every_problem() -> None:
    mix = parse_job_mix({"queue_depth": 5, "classes": [{"name": "a", "nodes": 2, "min_hours": 1, "max_hours": 3, "checkpoint_s": 600}]})
    assert mix.queue_depth == 5 and mix.classes[0].nodes == 2 and mix.classes[0].checkpoint_s == 600
    with pytest.raises(ConfigError) as exc:
        parse_job_mix({"classes": [{"nodes": 0, "min_hours": 2, "max_hours": 1, "bogus": 1}]}, "mix.yaml")
    text = "\n".join(exc.value.problems)
    assert "mix.yaml: classes[0].nodes: must be an integer 1..64, got 0" in text
    assert "classes[0].bogus: unknown key" in text


def test_json_has_exactly_the_keys_for_every_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = small_trace(tmp_path)
    png = tmp_path / "p.png"
    rc = main(["simulate", "--trace", str(trace), "--nodes", "8", "--peak-replicas", "5", "--policy", "all", "--json", "--plot", str(png)])
    assert rc == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert [r["policy"] for r in rows] == ["bridge", "fixed-window", "reactive", "oracle"]
    for r in rows:
        assert set(r) == KEYS
        assert r["trace_minutes"] == 36 * 10
    assert "trace scale" in out.err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = small_trace(tmp_path)
    conf = tmp_path / "bridge.yaml"
    conf.write_text("pools:\n  - name: llama\n    cold_start_s: 200\n")
    rc = main(
        ["simulate", "--trace", str(trace), "--config", str(conf), "--nodes", "6", "--peak-replicas", "4",
         "--policy", "oracle", "--grace-s", "30", "--tick-s", "60", "--victims", "naive", "--days", "0.2"]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "cold start 200 s" in out and "grace 30 s" in out and "tick 60 s" in out and "newest_first" in out
    assert "oracle" in out.splitlines()[-1]


def test_bad_flags_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--tick-s", "0"]) == 2
    assert "--tick-s: must be a finite number > 0, got 0" in capsys.readouterr().err
    assert main(["simulate", "--days", "inf"]) == 2
    assert "--days: must be a finite number > 0, got inf" in capsys.readouterr().err
    assert main(["simulate", "--fixed-floor", "30"]) == 2
    assert "--fixed-floor: must be 0..24 (--nodes), got 30" in capsys.readouterr().err
    assert main(["simulate", "--nodes", "100000000"]) == 2  # was a run of hours, no answer
    assert "--nodes: must be 1..100,000, got 100000000" in capsys.readouterr().err
    assert main(["simulate", "--gpus-per-node", "0"]) == 2
    assert "--gpus-per-node: must be 1..64, got 0" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(tmp_path / "missing.csv")]) == 2
    assert "cannot read trace" in capsys.readouterr().err
    bad = tmp_path / "mix.yaml"
    bad.write_text("classes: []\n")
    assert main(["simulate", "--job-mix", str(bad)]) == 2
    assert "classes: must be a non-empty list" in capsys.readouterr().err
    bad.write_bytes(b"classes:\n  - name: \xff\n")
    assert main(["simulate", "--job-mix", str(bad)]) == 2
    assert f"{bad}: not UTF-8 text (byte 19: invalid start byte)" in capsys.readouterr().err


def test_job_mix_is_read_like_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The job mix went through plain ``yaml.safe_load``: a duplicate key silently kept the last
    value, an alias bomb expanded, ``!!int zz`` was a ValueError traceback."""
    mix = tmp_path / "mix.yaml"
    cls = "{name: a, nodes: 1, min_hours: 1, max_hours: 2, checkpoint_s: 600}"
    for text, says in (
        (f"queue_depth: 5\nqueue_depth: 50\nclasses: [{cls}]\n", 'duplicate key "queue_depth" at line 2'),
        (f"queue_depth: !!int zz\nclasses: [{cls}]\n", "invalid YAML at line 1, column 14: cannot read 'zz' as int"),
        ("x: &a [" + ", ".join(["&b [" + ", ".join(["y"] * 400) + "]"] + ["*b"] * 400) + f"]\nclasses: [{cls}]\n",
         "more than 100,000 values once its YAML aliases are expanded"),
    ):
        mix.write_text(text, encoding="utf-8")
        assert main(["simulate", "--job-mix", str(mix), "--days", "0.1"]) == 2
        err = capsys.readouterr().err
        assert f"{mix}: " in err and says in err and "Traceback" not in err, err


HEADER = b"window_start_s,rate_req_per_s,cv,clients_active\n"


@pytest.mark.parametrize(("content", "says"), [
    (b"", "missing column(s) window_start_s, rate_req_per_s"),
    (b"\xff\xfe\x00binary", "not a UTF-8 text file (byte 0: invalid start byte)"),
    (HEADER, "need at least 2 windows, got 0"),
    (HEADER + b"0,1,1,1\n600,abc,1,1\n", ":3: rate_req_per_s: expected a number, got 'abc'"),
    (HEADER + b"0,1,1,1\n600,nan,1,1\n", ":3: rate_req_per_s: expected a finite number >= 0, got 'nan'"),
    (HEADER + b"0,1,1,1\n0,1,1,1\n", "window_start_s must increase, got 0.0 then 0.0"),
    (HEADER + b"0,0,1,1\n600,0,1,1\n", "every rate is 0, nothing to scale"),
    (HEADER + b"0,1,1,1\n90,2,1,1\n180,2,1,1\n", "window must be a whole number of minutes, got 90 s"),
], ids=["empty", "binary", "header-only", "text", "nan", "duplicate-window", "all-zero", "90-s-windows"])
def test_a_bad_trace_file_is_one_clear_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       content: bytes, says: str) -> None:
    trace = tmp_path / "t.csv"
    trace.write_bytes(content)
    assert main(["simulate", "--trace", str(trace), "--days", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-bridge simulate: ") and str(trace) in err and says in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("text", [
    "\ufeffwindow_start_s,rate_req_per_s,cv,clients_active\n0,1.5,2,1\n600,3,1,1\n",  # a spreadsheet's byte-order mark
    "window_start_s, rate_req_per_s, cv, clients_active\r\n0, 1.5, 2, 1\r\n600, 3, 1, 1\r\n",  # spaces, CRLF
    "rate_req_per_s,clients_active,window_start_s,cv,note\n1.5,1,0,2,x\n3,1,600,1,y\n",  # columns in any order, one more
], ids=["bom", "spaces-crlf", "reordered"])
def test_a_trace_written_by_other_tools_reads_the_same(tmp_path: Path, text: str) -> None:
    """A trace exported by a spreadsheet or written by hand: the same windows, rates and cvs
    (a byte-order mark before the header read as "missing column(s) window_start_s")."""
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8", newline="")
    t = load_trace(path)
    assert (t.starts_s, t.rates, t.cvs, t.window_s) == ((0.0, 600.0), (1.5, 3.0), (2.0, 1.0), 600.0)


def test_trace_window_must_be_whole_minutes() -> None:
    t = Trace((0.0, 90.0), (1.0, 2.0), (1.0, 1.0), 90.0)
    with pytest.raises(ValueError, match="whole number of minutes"):
        build_workload(t, peak_replicas=2)


def test_one_pool_of_a_multi_pool_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "two.yaml"
    conf.write_text("pools:\n  - name: llama\n  - name: qwen\n    cold_start_s: 240\n")
    trace = small_trace(tmp_path)
    assert main(["simulate", "--trace", str(trace), "--config", str(conf), "--pool", "qwen", "--nodes", "6",
                 "--peak-replicas", "4", "--policy", "bridge", "--json"]) == 0
    out = capsys.readouterr()
    assert "cold start 240 s" in out.err and json.loads(out.out)[0]["policy"] == "bridge"
    assert main(["simulate", "--config", str(conf), "--pool", "nope"]) == 2
    assert "--pool: no pool named 'nope'" in capsys.readouterr().err


def test_the_replica_capacity_is_a_unit_not_a_change_of_burstiness() -> None:
    # the bursts are the measured stream's; converting req/s into replicas must not thin it
    t = load_trace()
    a = build_workload(t, peak_replicas=20, replica_rps=4.0, seed=1, days=2)
    b = build_workload(t, peak_replicas=20, replica_rps=40.0, seed=1, days=2)
    np.testing.assert_allclose(a.load, b.load, rtol=1e-12)
    assert b.scale == pytest.approx(10 * a.scale)


def test_plot_without_matplotlib_says_which_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["simulate", "--days", "0.1", "--policy", "reactive", "--plot", str(tmp_path / "p.png")]) == 2
    assert "--plot: needs matplotlib, the [plot] extra: pip install 'gpu-bridge[plot]'" in capsys.readouterr().err


def test_a_trace_that_never_ends_is_refused_not_read_into_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate --trace /dev/zero`` was read whole: a MemoryError traceback (or the machine's memory)."""
    assert main(["simulate", "--trace", "/dev/zero", "--days", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "/dev/zero: larger than 256 MiB; expected a CSV trace" in err and "Traceback" not in err
