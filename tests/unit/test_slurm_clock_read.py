"""slurmctld's clock (``sdiag``) is read only while something compares a time with it: a
preemption's grace or a returning node's fresh drain. A steady tick is one sinfo and one squeue."""

from __future__ import annotations

from bridge.model import Phase

try:
    from test_daemon_loop import HIGH, LOW, World
except ImportError:  # run as a package
    from .test_daemon_loop import HIGH, LOW, World  # type: ignore[no-redef]


class Counting:
    def __init__(self, w: World) -> None:
        self.calls = 0
        self.phases_when_read: list[set[Phase | None]] = []
        inner = w.slurm.clock

        def clock() -> float:
            self.calls += 1
            self.phases_when_read.append(set(w.phases().values()))
            return inner()

        w.slurm.clock = clock  # type: ignore[method-assign]


def test_the_clock_is_read_only_during_a_reclaim() -> None:
    w = World()
    c = Counting(w)
    w.run_until(lambda: w.count(Phase.LENT) == 3, 80, "lent down to min_serving")
    jobs = [w.sbatch(f"research-{i}", duration_s=400) for i in range(3)]
    w.tick(5)
    before = c.calls
    w.tick(20)  # steady: nodes lent with research running, serving ones serving
    assert c.calls == before, "sdiag read in a steady state"
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 60, "all serving again")
    assert c.calls > before  # the grace was judged by slurmctld's clock
    assert all(ph & {Phase.RECLAIMING, Phase.RETURNING} for ph in c.phases_when_read[-(c.calls - before):])
    assert all(w.job(j).restart_count == 1 for j in jobs)  # requeued after the grace, as before
    w.load = LOW
    after = c.calls
    w.tick(3)
    assert c.calls == after or any(getattr(j, "preempt_time", None) for j in w.slurm.jobs())
