"""The free-GPU check before a warm wake through the whole daemon over the lab's fakes
(test_daemon_warm's World, FakeProm answering the nodes' lowest free GPU MiB): a reclaimed node
whose GPUs are held waits, then is woken when they are freed; held past ``wake_gpu_wait_s`` it
falls back cold exactly as a failed wake does; a crash mid-wait changes nothing."""

from __future__ import annotations

import dataclasses

import pytest

from bridge.cli.daemon import status_rows, status_table
from bridge.model import Phase, WarmState

try:
    from test_actuate_warm import info_events
    from test_daemon_warm import HIGH, World
except ImportError:  # run as a package
    from .test_actuate_warm import info_events  # type: ignore[no-redef]
    from .test_daemon_warm import HIGH, World  # type: ignore[no-redef]

NEED = 70_000
WAIT = 8.0


def world(need: int | str = NEED, **kw: object) -> World:
    w = World(**kw)  # type: ignore[arg-type]
    pool = dataclasses.replace(w.config.pools[0], wake_gpu_free_mib=need, wake_gpu_wait_s=WAIT)
    w.config = dataclasses.replace(w.config, pools=(pool,))
    w.daemon = w.new_daemon()
    return w


def reclaim_held(w: World) -> tuple[set[str], list[str]]:
    """Lend down to min_serving with research, hold every lent node's GPUs, reclaim: the pods
    before and the lent nodes."""
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    lent = sorted(n for n, p in w.phases().items() if p is Phase.LENT)
    w.prom.gpu = {n: 80_000.0 for n in w.phases()} | {n: 9_000.0 for n in lent}  # a job stuck in "Kill task failed"
    before = {p.name for p in w.kube.pods("default") if not p.terminating}
    w.load = HIGH
    w.run_until(lambda: all(w.phases()[n] is Phase.RETURNING for n in lent), 40, "returning")
    return before, lent


def test_held_gpus_delay_the_wake_until_they_are_freed() -> None:
    w = world()
    assert w.prom.gpu_queries == []  # lending and lent: never read
    before, lent = reclaim_held(w)
    for _ in range(3):
        w.tick()
    assert all(w.phases()[n] is Phase.RETURNING for n in lent)
    assert not any(e.wakes for e in w.engines.values())  # not woken while held
    assert all(set(q) <= set(lent) for q in w.prom.gpu_queries) and w.prom.gpu_queries
    rows = {r["node"]: r for r in status_rows(w.daemon.observe(w.t), w.config)}  # gpu-bridge status says why
    said = [rows[n]["gpu_wait"] or "" for n in lent]
    assert all(t.startswith("wake waits for GPU memory (9,000 MiB free of 70,000); cold in ") for t in said), said
    assert all(0 < int(t.split("cold in ")[1].removesuffix(" s")) < WAIT for t in said), said  # still waiting
    assert {r["gpu_wait"] for n, r in rows.items() if n not in lent} == {None}
    assert "wake waits for GPU memory" in status_table(list(rows.values()))
    w.prom.gpu.update({n: 80_000.0 for n in lent})  # the stuck job's memory is released
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 30, "all serving again")
    assert {p.name for p in w.kube.pods("default") if not p.terminating} == before  # woken, no cold start
    assert not any(e.reason == "GpuBridgeWarmFailed" for e in w.kube.events)
    assert not w.violations
    queries = len(w.prom.gpu_queries)
    for _ in range(5):
        w.tick()
    assert len(w.prom.gpu_queries) == queries  # serving again: no more GPU reads


@pytest.mark.parametrize("crash_at", [None, "gpu_held", "mark_pod", "delete_asleep"])
def test_gpus_held_past_the_give_up_fall_back_cold_like_a_failed_wake(crash_at: str | None) -> None:
    w = world(crash_at=crash_at)
    with info_events() as logs:
        before, lent = reclaim_held(w)
        w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 80, "all serving again")
    assert not any(e.wakes for e in w.engines.values())  # never woken onto held GPUs
    after = {p.name for p in w.kube.pods("default") if not p.terminating}
    assert len(after - before) == 3  # each replaced by a new pod: the cold path
    fallbacks = [e for e in logs if e["event"] == "warm_fallback"]
    assert {e["node"] for e in fallbacks} == set(lent)
    assert all(e["reason"].startswith("gpu_memory_held:") and e["phase"] == "returning" and e["step"] == "gpu_held"
               for e in fallbacks)
    assert all("Slurm shows no research job on it" in e["reason"] for e in fallbacks)  # requeued: held from outside
    assert sum(1 for e in w.kube.events if e.reason == "GpuBridgeWarmFailed" and "gpu_memory_held" in e.message) >= 3
    assert all(v is None for v in w.warm().values())
    assert not w.violations
    assert w.crashes == (crash_at is not None)


def test_unknown_gpus_count_as_held() -> None:
    w = world()
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    lent = sorted(n for n, p in w.phases().items() if p is Phase.LENT)
    w.prom.gpu = {}  # dcgm-exporter not scraped: every node unknown
    w.load = HIGH
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 80, "all serving again")
    assert not any(e.wakes for e in w.engines.values())
    records = [e for e in w.kube.events if e.reason == "GpuBridgeWarmFailed"]
    assert {e.message.split()[0] for e in records} == {"gpu_memory_held:"} and len(records) >= len(lent)
    assert all("unknown" in e.message for e in records)
    assert not w.violations
    assert all(n.warm is None or n.warm.state is not WarmState.ASLEEP for n in w.kube.nodes())


def test_auto_waits_while_the_margin_is_negative_and_wakes_at_zero() -> None:
    """``wake_gpu_free_mib: auto``: FakeProm answers each node's margin beyond the engine's need
    (the adapter's arithmetic is test_wake_gpu_free_auto's); the daemon compares it with 0."""
    w = world("auto")
    w.run_until(lambda: w.count(Phase.LENT) == 3, 120, "lent down to min_serving")
    lent = sorted(n for n, p in w.phases().items() if p is Phase.LENT)
    w.prom.gpu = {n: -9_000.0 for n in lent}  # a stuck job keeps 9,000 MiB more than the engine can spare
    before = {p.name for p in w.kube.pods("default") if not p.terminating}
    w.load = HIGH
    w.run_until(lambda: all(w.phases()[n] is Phase.RETURNING for n in lent), 40, "returning")
    for _ in range(3):
        w.tick()
    assert not any(e.wakes for e in w.engines.values())  # not woken short of the need
    asleep = {n.name: n.warm.pod for n in w.kube.nodes() if n.warm is not None and n.name in lent}
    assert w.prom.gpu_pods and all(q is not None and q.items() <= asleep.items() for q in w.prom.gpu_pods)
    rows = {r["node"]: r for r in status_rows(w.daemon.observe(w.t), w.config)}
    assert all((rows[n]["gpu_wait"] or "").startswith("wake waits for GPU memory (-9,000 MiB beyond the engine's need)")
               for n in lent), [rows[n]["gpu_wait"] for n in lent]
    w.prom.gpu.update({n: 0.0 for n in lent})  # exactly the engine's need free
    w.run_until(lambda: w.count(Phase.SERVING) == 4 and w.ready_pods() == 4, 30, "all serving again")
    assert {p.name for p in w.kube.pods("default") if not p.terminating} == before  # woken, no cold start
    assert not w.violations
