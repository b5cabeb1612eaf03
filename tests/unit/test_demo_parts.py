"""The demo's pure parts: day shape, job plan and argv, job tracking, log events, summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.adapters.slurm.types import SlurmJobInfo
from gpu_bridge_lab.demo import report
from gpu_bridge_lab.demo.jobs import JobSubmitter, job_plan
from gpu_bridge_lab.demo.shape import clock, day_shape, parse_clock, replica_rps_at_target
from gpu_bridge_lab.demo.timeline import Display, daemon_event, progress_text
from gpu_bridge_lab.demo.watch import JobTracker, LogTail, Sample
from bridge.trace import load_trace


def test_replica_rps_is_littles_law_at_light_load() -> None:
    # 60 in flight / (1024 * 0.02 + 256) tokens / 40 tokens/s = 60 / 6.912 s
    assert replica_rps_at_target(60.0) == pytest.approx(60 / 6.912)


def test_default_day_scales_its_busiest_window_to_n_replicas() -> None:
    rps = replica_rps_at_target(60.0)
    s = day_shape(load_trace(), day=9, start="22:00", minutes=5, nodes=4, replica_rps=rps)
    assert s.speed == pytest.approx(288.0)
    assert s.peak_replicas == pytest.approx(4.0)
    assert s.trough_replicas < 1.0  # a real night trough: most of the pool can be lent
    assert clock(s.trace_start_s) == "day 9 22:00"
    assert s.global_peak_rps > s.peak_rps  # --peak-rps is about the whole 14 days


@pytest.mark.parametrize("bad", ["25:00", "7", "07:60", "ab:cd"])
def test_bad_start_names_the_flag(bad: str) -> None:
    with pytest.raises(ValueError, match="--start"):
        parse_clock(bad)


def test_bad_minutes_and_nodes_name_the_flag() -> None:
    t = load_trace()
    with pytest.raises(ValueError, match="--minutes"):
        day_shape(t, day=9, start="22:00", minutes=0, nodes=4, replica_rps=8.0)
    with pytest.raises(ValueError, match="--nodes"):
        day_shape(t, day=9, start="22:00", minutes=5, nodes=1, replica_rps=8.0)


def test_job_plan_is_seeded_and_argv_is_a_list(tmp_path: Path) -> None:
    a, b = job_plan(20, seed=3, time_scale=1.0), job_plan(20, seed=3, time_scale=1.0)
    assert a == b and {j.kind for j in a} <= {"train", "train-2n", "sweep"}
    assert all(6 <= j.duration_s <= 50 for j in a)
    sub = JobSubmitter(tmp_path, {}, a, max_pending=2, gap_s=1.0)
    for spec in a[:5]:
        argv = sub.argv(spec)
        assert argv[:2] == ["sbatch", "--parsable"] and "--requeue" in argv and "--gres=gpu:4" in argv
        assert argv[argv.index("-p") + 1] == "preempt" and argv[argv.index("-N") + 1] == str(spec.nodes)
        assert any(x.startswith("--time=") for x in argv)
        assert Path(argv[-1]).exists()  # the template (or sweep script) copied into the work dir


def _job(jid: str, state: str, restarts: int = 0, nodes: tuple[str, ...] = ()) -> SlurmJobInfo:
    return SlurmJobInfo(job_id=jid, name="j", user="root", partition="preempt", state=state, nodes=nodes,
                        start_time=None, checkpoint_time=None, requeueable=True, gpus_per_node=4,
                        restart_count=restarts)


def test_tracker_sees_start_requeue_resume_finish() -> None:
    tr = JobTracker()
    tr.add("7", "train-01", 0.0)
    kinds = []
    for t, snap in enumerate([
        (_job("7", "pending"),),
        (_job("7", "running", 0, ("gpu-node-02",)),),
        (_job("7", "pending", 1),),
        (_job("7", "running", 1, ("gpu-node-03",)),),
        (_job("7", "completed", 1),),
    ]):
        kinds += [e.kind for e in tr.update(snap, float(t))]
    assert kinds == ["started", "requeued", "resumed", "finished"]
    rec = tr.jobs["7"]
    assert rec.requeued and rec.resumed and rec.state == "completed"


def test_tracker_job_aged_out_of_squeue_counts_as_finished() -> None:
    tr = JobTracker()
    tr.add("8", "sweep-02", 0.0)
    tr.update((_job("8", "running", 0, ("gpu-node-01",)),), 1.0)
    assert [e.kind for e in tr.update((), 2.0)] == ["finished"]


def test_log_tail_keeps_partial_lines(tmp_path: Path) -> None:
    p = tmp_path / "daemon.log"
    tail = LogTail(p)
    assert tail.read() == []
    p.write_text('{"event": "a"}\n{"event": ')
    assert [d["event"] for d in tail.read()] == ["a"]
    with open(p, "a") as f:
        f.write('"b"}\nnot json\n')
    assert [d["event"] for d in tail.read()] == ["b"]


def test_daemon_events_worth_showing() -> None:
    rec = daemon_event({"event": "node_transition_started", "node": "n1", "phase": "reclaiming", "reason": "spike",
                        "detail": "demand 3 > 2 Ready", "jobs": ["12"]}, 1.0, 100.0)
    assert rec is not None and rec.kind == "reclaim" and "12" in rec.text and "spike" in rec.text
    done = daemon_event({"event": "node_reclaimed", "node": "n1", "detection_s": -0.01, "slurm_release_s": 7.0,
                         "kubernetes_ready_s": 3.2, "total_s": 10.2}, 2.0, 200.0)
    assert done is not None and done.kind == "serving" and "detection 0.0 s" in done.text
    assert daemon_event({"event": "node_step", "step": "fence", "node": "n1"}, 1.0, 1.0) is None
    lent = daemon_event({"event": "node_step", "step": "mark_lent", "changed": True, "node": "n1"}, 1.0, 1.0)
    assert lent is not None and lent.kind == "lent"


def _sample(t: float, rate: float, ready: int, lent: int) -> Sample:
    phases = {f"n{i}": ("lent" if i < lent else "serving") for i in range(4)}
    return Sample(t, 1000.0 + t * 288, rate, 0.0, ready, phases, 0, 0, 0, lent)


def test_summary_gpu_hours_and_slo_minutes(tmp_path: Path) -> None:
    shape = day_shape(load_trace(), day=9, start="22:00", minutes=5, nodes=4, replica_rps=10.0)
    # 10 s with 2 nodes lent; load 25 req/s = 2.5 replicas on 2 Ready for the last 5 s
    samples = [_sample(float(t), 15.0 if t < 5 else 25.0, 2, 2) for t in range(11)]
    s = report.summarize(samples, [], JobTracker(), shape=shape, min_serving=1, nodes=4)
    assert s["lent_gpu_hours_demo"] == pytest.approx(2 * 4 * 10 / 3600, abs=1e-3)
    assert s["lent_gpu_hours_trace"] == pytest.approx(2 * 4 * 10 * 288 / 3600, abs=0.1)
    assert s["slo_violation_minutes"] == pytest.approx(5 * 288 / 60, abs=0.1)
    assert s["min_ready"] == 2
    text = report.table(s)
    assert "GPU-hours lent to Slurm" in text and "SLO-violation minutes" in text
    json.dumps(s)
    dumped = json.loads(report.dump(tmp_path / "run.json", samples, []).read_text())
    assert len(dumped["samples"]) == 11 and dumped["samples"][0]["phases"]["n0"] == "lent"
    png = report.plot(tmp_path / "d.png", samples, [], shape=shape, nodes=4, min_serving=1)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_progress_line_and_non_tty_display(tmp_path: Path) -> None:
    s = _sample(3.0, 17.4, 3, 1)
    line = progress_text(s, nodes=4, demand=1.5, replica_rps=8.7)
    assert "Ready 3/4" in line and "lent 1" in line and "17.4 req/s" in line
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        d = Display(f, every_s=5.0)
        for t in range(12):
            d.progress(line, float(t))
    assert out.read_text().count("Ready 3/4") == 3  # t = 0, 5, 10: one line per 5 s, no escape codes
    assert "\033" not in out.read_text()
