"""The pure history -> load step of ``simulate --prometheus`` (bridge.simulate.history), the
request-history parsing of the Prometheus adapter, and the CLI's bad-input paths."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bridge.adapters.prom.history import build_request_query, parse_request_range
from bridge.adapters.prom.types import PromPool
from bridge.config import TargetConfig
from bridge.cli.simulate import parse_duration, parse_time
from bridge.simulate.history import HistoryError, build_history_load, trace_csv
from bridge.trace import load_trace
from bridge.adapters.prom.types import RequestHistory

T0 = 1_796_000_400.0  # a multiple of 600 s
TARGET = TargetConfig()


def synthetic(
    minutes: int,
    rate_per_min: list[float] | float,
    *,
    replicas: int = 2,
    in_system: float = 10.0,
    drop: dict[int, set[int]] | None = None,
    latency_s: float = 6.0,
    start: float = T0,
) -> RequestHistory:
    """A history whose every minute completed ``rate`` requests over ``replicas`` replicas
    with a steady ``in_system`` each; ``drop[replica]`` = steps that replica has no sample."""
    rates = [rate_per_min] * (minutes + 1) if isinstance(rate_per_min, float) else list(rate_per_min)
    drop = drop or {}
    series: dict[str, dict[str, dict[int, float]]] = {s: {} for s in ("completed", "running", "waiting", "kv", "e2e_sum", "e2e_count")}
    for r in range(replicas):
        rep = f'{{pod="p{r}"}}'
        for s in series:
            series[s][rep] = {}
        for i in range(minutes + 1):
            if i in drop.get(r, set()):
                continue
            c = rates[i] / replicas
            if i > 0:
                series["completed"][rep][i] = c
                series["e2e_count"][rep][i] = c
                series["e2e_sum"][rep][i] = c * latency_s
            series["running"][rep][i] = in_system
            series["waiting"][rep][i] = 0.0
            series["kv"][rep][i] = 0.1
    return RequestHistory("llama", start, 60.0, minutes + 1, series)


def test_steady_load_is_read_back_with_littles_law_capacity() -> None:
    h = synthetic(1440, 240.0)  # 4 req/s for a day
    hl = build_history_load(h, TARGET)
    assert hl.usable_minutes == 1440 and hl.requested_minutes == 1440 and not hl.gaps
    assert hl.workload.minutes == 1440
    assert hl.latency_s == pytest.approx(6.0)
    assert hl.replica_rps == pytest.approx(24.0 / 6.0)
    assert np.allclose(hl.workload.load, 4.0 / 4.0)
    assert np.allclose(hl.trace.rates, 4.0) and len(hl.trace.rates) == 144
    assert hl.start_unix == T0
    assert hl.replicas_seen == 2
    # cross-check: 2 replicas x 10 in the system / 24 per replica
    assert hl.policy_peak == pytest.approx(20.0 / 24.0)


def test_arrivals_include_the_change_of_requests_in_the_system() -> None:
    h = synthetic(1440, 60.0, replicas=1)
    h.series["running"]['{pod="p0"}'][100] = 40.0  # 30 more requests in the system at minute 100
    hl = build_history_load(h, TARGET, replica_rps=1.0)
    counts = hl.workload.load * 60.0
    # load[m] is the minute (t_m, t_m+1]: step 100's sample closes load[99]
    assert counts[99] == pytest.approx(60.0 + 30.0)
    assert counts[100] == pytest.approx(60.0 - 30.0)  # and they leave again
    assert counts[98] == pytest.approx(60.0)


def test_gap_is_bridged_never_zero_and_not_judged() -> None:
    rates = [120.0] * 1000 + [600.0] * 1000
    h = synthetic(1999, rates, replicas=2, drop={0: set(range(990, 1020)), 1: set(range(990, 1020))})
    hl = build_history_load(h, TARGET, replica_rps=1.0)
    assert len(hl.gaps) == 1
    g = hl.gaps[0]
    assert g.minutes == 31  # 30 steps missing, and the first minute after needs the one before
    use = hl.workload.usable
    assert use is not None and int((~use).sum()) == 31
    i = int(round((g.start - hl.start_unix) / 60))
    filled = hl.workload.load[i : i + g.minutes]
    assert np.all(filled == pytest.approx(10.0))  # the higher neighbour (600/min), not 0
    assert "none of the 2 replicas" in g.reason


def test_missing_pod_marks_its_minutes_unusable() -> None:
    h = synthetic(1500, 120.0, replicas=3, drop={1: set(range(500, 505))})
    hl = build_history_load(h, TARGET, replica_rps=1.0)
    assert len(hl.gaps) == 1 and hl.gaps[0].minutes == 6
    assert 'replica {pod="p1"} did not report' in hl.gaps[0].reason


def test_replica_that_starts_or_ends_is_not_a_gap() -> None:
    # p1 only exists for the second half (a scale-up), p0 throughout
    h = synthetic(1500, 120.0, replicas=2, drop={1: set(range(0, 700))})
    hl = build_history_load(h, TARGET, replica_rps=1.0)
    assert not hl.gaps and hl.usable_minutes == 1500


def test_partial_first_day_trims_to_whole_windows() -> None:
    start = T0 + 17 * 60 + 0  # 17 minutes after a window boundary
    h = synthetic(1500, 120.0, start=start)
    hl = build_history_load(h, TARGET, replica_rps=1.0)
    assert hl.start_unix % 600 == 0 and hl.start_unix > start
    assert hl.workload.minutes % 10 == 0


def test_too_little_data_is_refused() -> None:
    with pytest.raises(HistoryError, match=r"only 6\.0 h of usable data.*need at least 24 h"):
        build_history_load(synthetic(360, 120.0), TARGET, replica_rps=1.0)


def test_no_series_is_refused() -> None:
    h = RequestHistory("llama", T0, 60.0, 2000, {s: {} for s in ("completed", "running", "waiting")})
    with pytest.raises(HistoryError, match="no series of vllm:num_requests_running"):
        build_history_load(h, TARGET, replica_rps=1.0)


def test_capacity_needs_a_concurrency_target_or_the_flag() -> None:
    with pytest.raises(HistoryError, match="concurrency_per_replica is null.*--replica-rps"):
        build_history_load(synthetic(1500, 120.0), TargetConfig(concurrency_per_replica=None))


def test_cv_is_the_index_of_dispersion_and_export_reads_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rates = list(rng.poisson(300.0, 1501).astype(float))
    hl = build_history_load(synthetic(1500, rates), TARGET, replica_rps=1.0)
    cv = np.array(hl.trace.cvs)
    assert 0.8 < float(np.median(cv)) < 1.2  # Poisson counts: index of dispersion 1
    p = tmp_path / "t.csv"
    p.write_text(trace_csv(hl.trace))
    back = load_trace(p)
    assert back.window_s == 600 and len(back.rates) == len(hl.trace.rates)
    assert np.allclose(back.rates, hl.trace.rates, rtol=1e-5)


def test_parse_request_range_sums_engines_keeps_v0_kv_and_drops_other_models() -> None:
    pool = PromPool("llama", "llama")
    res = [
        {"metric": {"bridge_q": "completed", "model_name": "llama", "pod": "a", "engine": "0", "finished_reason": "stop"},
         "values": [[T0, "5"], [T0 + 60, "7"], [T0 + 120, "3"]]},  # restarted between 1 and 2
        {"metric": {"bridge_q": "completed", "model_name": "llama", "pod": "a", "engine": "1", "finished_reason": "stop"},
         "values": [[T0, "1"], [T0 + 60, "4"]]},
        {"metric": {"bridge_q": "completed", "model_name": "llama", "pod": "a", "engine": "1", "finished_reason": "length"},
         "values": [[T0 + 60, "9"]]},  # first sample: no increase
        {"metric": {"bridge_q": "kv0", "model_name": "llama", "pod": "a"}, "values": [[T0, "0.5"]]},
        {"metric": {"bridge_q": "running", "model_name": "other", "pod": "b"}, "values": [[T0, "3"]]},
        {"metric": {"bridge_q": "running", "model_name": "llama", "pod": "a"}, "values": [[T0, "NaN"], [T0 + 60, "-1"]]},
    ]
    h = parse_request_range([res[:2], res[2:]], pool=pool, start=T0, step_s=60.0, steps=3)  # two chunks
    rep = '{model_name="llama",pod="a"}'
    assert h.series["completed"][rep] == {1: 2.0 + 3.0, 2: 3.0}  # per series, then summed; a drop counts anew
    assert h.series["kv"][rep] == {0: 0.5}
    assert h.series["running"].get(rep, {}) == {}  # NaN and negative are missing, not values
    assert h.ignored and "other" in h.ignored[0]


def test_request_query_reads_v1_and_v0_names_with_the_pool_selector() -> None:
    q = build_request_query(PromPool("p", "llama", {"namespace": "serving"}), step_s=60.0)
    for name in ("vllm:request_success_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:e2e_request_latency_seconds_sum"):
        assert f'{name}{{model_name="llama",namespace="serving"}}' in q
    assert "last_over_time(vllm:request_success_total" in q and "[60s]" in q


def test_durations_and_times() -> None:
    assert parse_duration("7d", "--since") == 7 * 86400
    assert parse_duration("90m", "--since") == 5400
    assert parse_time("2026-11-02T00:00", "--start") == 1793577600.0
    assert parse_time("2026-11-02T01:00+01:00", "--start") == 1793577600.0
    with pytest.raises(Exception, match="--since: expected a duration"):
        parse_duration("a week", "--since")
    with pytest.raises(Exception, match="--start: expected ISO 8601"):
        parse_time("yesterday", "--start")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bridge", "simulate", *args], capture_output=True, text=True, timeout=60)


def test_unreachable_prometheus_exits_3_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _cli("--prometheus", f"http://127.0.0.1:{port}", "--since", "2d")
    assert r.returncode == 3
    assert f"Prometheus at http://127.0.0.1:{port}" in r.stderr and "query_range failed" in r.stderr


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (("--prometheus", "http://127.0.0.1:1", "--since", "2d", "--start", "2026-11-01"), "--since and --start"),
        (("--prometheus", "http://127.0.0.1:1", "--since", "soon"), "--since: expected a duration"),
        (("--prometheus", "http://127.0.0.1:1", "--days", "2"), "--days: not with --prometheus"),
        (("--prometheus", "ftp://x", "--since", "2d"), "--prometheus: expected an http(s) URL"),
        (("--prometheus", "http://127.0.0.1:1", "--pool", "nosuch"), "--pool: no pool named 'nosuch'"),
        (("--since", "2d"), "--since: only with --prometheus"),
        (("--trace", "x.csv", "--prometheus", "http://127.0.0.1:1"), "not allowed with argument"),
    ],
)
def test_bad_input_exits_2(args: tuple[str, ...], msg: str) -> None:
    r = _cli(*args)
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr


class _FakeClient:
    """custom_query_range over a synthetic counter (10 requests a minute) and a gauge."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []

    def custom_query_range(self, query: str, *, start_time: Any, end_time: Any, step: str, timeout: float) -> Any:
        a, b, st = start_time.timestamp(), end_time.timestamp(), float(step)
        self.calls.append((a, b))
        ts = a + st * np.arange(round((b - a) / st) + 1)
        lab = {"model_name": "llama", "pod": "p0"}
        return [
            {"metric": {**lab, "bridge_q": "completed", "finished_reason": "stop"},
             "values": [[t, str((t - T0) / 6.0)] for t in ts]},
            {"metric": {**lab, "bridge_q": "running"}, "values": [[t, "3"] for t in ts]},
            {"metric": {**lab, "bridge_q": "waiting"}, "values": [[t, "0"] for t in ts]},
        ]


def test_request_history_reads_day_chunks_that_join_without_a_gap() -> None:
    from bridge.adapters.prom.signals import PromAdapter

    client = _FakeClient()
    adapter = PromAdapter("http://127.0.0.1:1", client=client)  # type: ignore[arg-type]
    h = adapter.request_history(PromPool("llama", "llama"), start=T0, end=T0 + 3 * 86400.0)
    assert len(client.calls) == 4  # 4321 steps: three days of 1440 and the closing step
    assert client.calls[1][0] == client.calls[0][1] + 60
    done = h.series["completed"]['{model_name="llama",pod="p0"}']
    assert len(done) == h.steps - 1 and all(v == pytest.approx(10.0) for v in done.values())
    hl = build_history_load(h, TARGET, replica_rps=1.0)
    assert hl.usable_minutes == 3 * 1440 and np.allclose(hl.workload.load * 60, 10.0)
