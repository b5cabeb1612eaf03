"""Each research job a reclaim preempts is recorded as a ``GpuBridgeJobPreempted`` Event on
the node, with its GraceTime and the work it loses since its last checkpoint, as the policy's
``job_loss_gpu_hours`` counts it; ``gpu-bridge web`` reads it back (``parse_preemption``)."""

from __future__ import annotations

from bridge.model import Phase
from bridge.policy.victims import job_loss_gpu_hours
from bridge.preemption import EVENT_REASON, parse_preemption
from tests.unit.test_daemon_loop import HIGH, World


def test_a_reclaim_records_each_preempted_job_with_its_lost_work() -> None:
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    ckpt = w.t
    job = w.slurm.add_job(name="with-checkpoint", comment=f"gpu-bridge:checkpoint={ckpt:.0f}")
    w.durations[job] = 1000
    w.tick(30)
    running = w.slurm.snapshot()[job]
    assert running.state == "running"
    w.load = HIGH
    w.run_until(lambda: any(e.reason == EVENT_REASON for e in w.kube.events), 20, "the preemption Event")
    (event,) = [e for e in w.kube.events if e.reason == EVENT_REASON]
    p = parse_preemption(event.message, 0.0)
    assert p is not None, event.message
    assert (p.job_id, p.node, p.grace_s) == (job, running.nodes[0], 5.0)
    assert p.checkpoint_time == float(round(ckpt))
    # the policy's own count at the reclaim (the Event's time): 4 GPUs x the time since the checkpoint
    assert p.lost_gpu_hours == round(job_loss_gpu_hours(running, event.t, 5.0), 3)
    assert p.lost_gpu_hours == round(4 * (event.t - round(ckpt)) / 3600, 3) > 0
    w.run_until(lambda: w.slurm.snapshot()[job].restart_count == 1, 30, "the job requeued")
    assert len([e for e in w.kube.events if e.reason == EVENT_REASON]) == 1  # one record per preemption


def test_a_checkpoint_time_no_date_can_show_does_not_stop_the_daemon() -> None:
    """A job's comment is its owner's text: ``gpu-bridge:checkpoint=1e300`` raised OverflowError
    out of the reclaim's first step (the preemption Event writes the checkpoint as a date), so
    any researcher could stop the daemon by submitting one job. Now the checkpoint is read as
    none published; the reclaim goes on, the job is requeued, the Event says so."""
    w = World()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    job = w.slurm.add_job(name="far-future", comment="gpu-bridge:checkpoint=1e300")
    w.durations[job] = 1000
    w.tick(30)
    assert w.slurm.snapshot()[job].checkpoint_time is None
    w.load = HIGH
    w.run_until(lambda: any(e.reason == EVENT_REASON for e in w.kube.events), 20, "the preemption Event")
    (event,) = [e for e in w.kube.events if e.reason == EVENT_REASON]
    assert "no checkpoint published" in event.message
    w.run_until(lambda: w.slurm.snapshot()[job].restart_count == 1, 30, "the job requeued")


def test_the_message_never_raises_on_a_time_out_of_range() -> None:
    from bridge.preemption import preemption_message

    for t in (1e300, 1.8e15, -1.0, float("nan"), float("inf")):
        text = preemption_message(job_id="5", node="n", grace_s=1, lost_gpu_hours=0, checkpoint_time=t)
        assert "no checkpoint published" in text


def test_an_event_text_that_cannot_be_read_is_not_a_preemption() -> None:
    """Anyone allowed to create Events can write one with this reason: its numbers are not
    trusted to parse (``1..2`` raised ValueError, and the web view's job pages with it)."""
    head = "job 5 preempted to reclaim n for serving: GraceTime {g} s, then requeued; {l} GPU-h of work lost ({c})"
    for g, l, c in (("1..2", "0.1", "no checkpoint published"), ("1", "0..1", "no checkpoint published"),
                    ("1e999", "0.1", "no checkpoint published"),
                    ("1", "0.1", "last checkpoint 2026-13-45T99:99:99Z")):
        assert parse_preemption(head.format(g=g, l=l, c=c), 1.0) is None
    assert parse_preemption(head.format(g="1", l="0.1", c="no checkpoint published"), 1.0) is not None
