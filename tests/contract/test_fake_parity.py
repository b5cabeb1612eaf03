"""The fakes against their real adapters: the same assertions, through the same Protocols
(``bridge.adapters.protocols``), run on ``FakeSlurm`` and on ``CliSlurm`` driving the sandbox's
real slurmctld, on ``FakeKube`` and on ``KubeAdapter`` driving the contract fixtures' API server,
and on ``FakeLeader`` and ``LeaderElector`` on a real Lease. The daemon's tests trust the fakes;
these tests are why they may: a fake that drifts from the real system fails here.

Only the "outside world" differs per backend (submitting a research job, an administrator's
drain or cordon, letting time pass): each world exposes the same few verbs. The fakes are
driven by a simulated clock, so ``eventually`` advances it where the real side sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kube_contract import Kube, Serving, make_node
from sandbox_fixtures import slurm_only

from bridge import wellknown as wk
from bridge.adapters.kube.calls import KubeApiError
from bridge.adapters.kube.client import KubeAdapter, api_client_from_config
from bridge.adapters.kube.objects import EvictOutcome
from bridge.adapters.protocols import (
    KubeAdapterProtocol,
    Leader,
    PoolTarget,
    SlurmAdapterProtocol,
)
from bridge.adapters.slurm.cli import CliSlurm, NotOursError
from bridge.adapters.kube.lease import LeaderElector
from bridge.model import Phase, Pin
from gpu_bridge_lab.fakes.kube import FakeKube, FakeLeader
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from gpu_bridge_lab.fakes.slurm import holds_of

T = TypeVar("T")
IDENTITY = "parity-bridge"
REAL = pytest.param("real", marks=pytest.mark.integration)


class World:
    """Time as each backend has it: the fakes' simulated clock, or the wall clock."""

    def now(self) -> float:
        raise NotImplementedError

    def sleep(self, seconds: float) -> None:
        raise NotImplementedError

    def eventually(self, check: Callable[[], T], timeout_s: float, what: str) -> T:
        """``check()``'s first truthy value within ``timeout_s`` (of this world's time)."""
        deadline = self.now() + timeout_s
        while True:
            value = check()
            if value:
                return value
            if self.now() >= deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {value!r})")
            self.sleep(0.2)


# --- Slurm ----------------------------------------------------------------------------------


@dataclass
class SlurmWorld(World):
    slurm: SlurmAdapterProtocol
    nodes: tuple[str, ...]
    grace_s: float

    def research_job(self, node: str, mem_mb: int | None = None) -> str:
        """A requeueable research job in the preempt partition, pinned to ``node`` (``--mem``: ``mem_mb``)."""
        raise NotImplementedError

    def admin_drain(self, node: str, reason: str) -> None:
        raise NotImplementedError


@dataclass
class FakeSlurmWorld(SlurmWorld):
    fake: FakeSlurm = field(default_factory=FakeSlurm)

    def now(self) -> float:
        return self.fake.now

    def sleep(self, seconds: float) -> None:
        self.fake.advance(seconds)

    def research_job(self, node: str, mem_mb: int | None = None) -> str:
        return self.fake.add_job(node, mem_mb=mem_mb or 0)

    def admin_drain(self, node: str, reason: str) -> None:
        self.fake.admin_drain(node, reason)


@dataclass
class RealSlurmWorld(SlurmWorld):
    sandbox: Any = None
    tmp: Path = Path("/tmp")

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def research_job(self, node: str, mem_mb: int | None = None) -> str:
        script = self.tmp / "job.sh"
        script.write_text("#!/bin/bash\nwhile true; do sleep 0.2; done\n")
        script.chmod(0o755)
        mem = [f"--mem={mem_mb}"] if mem_mb is not None else []
        out = self.sandbox.run_slurm(["sbatch", "--parsable", "-p", wk.SLURM_PREEMPT_PARTITION, "--requeue",
                                      "--gres=gpu:4", *mem, "-w", node, "-o", "/dev/null", str(script)]).stdout
        return str(out.strip().split(";")[0])

    def admin_drain(self, node: str, reason: str) -> None:
        self.sandbox.run_slurm(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])


@pytest.fixture(params=["fake", REAL, pytest.param("real-24.11", marks=[pytest.mark.integration, pytest.mark.slurm2411,
                                                                    pytest.mark.timeout(600)])])
def slurm_world(request: pytest.FixtureRequest, tmp_path: Path) -> SlurmWorld:
    if request.param == "fake":
        fake = FakeSlurm(grace_s=10.0)
        names = tuple(f"gpu-node-{i:02d}" for i in range(1, 5))
        for n in names:
            fake.add_node(n)
        return FakeSlurmWorld(slurm=fake, nodes=names, grace_s=fake.grace_s, fake=fake)
    # the sandbox's Slurm 22.05 (Debian 12's), or 24.11 (Debian 13's, tests/sandbox_fixtures.py)
    sb = request.getfixturevalue("slurm_clean" if request.param == "real" else "slurm2411_clean")
    cli = CliSlurm(env={"SLURM_CONF": str(sb.slurm.slurm_conf)}, timeout_s=10, command_prefix=sb.slurm.command_prefix)
    return RealSlurmWorld(slurm=cli, nodes=tuple(sb.node_names), grace_s=float(sb.grace_s), sandbox=sb, tmp=tmp_path)


def _job(w: SlurmWorld, jid: str) -> Any:
    return next((j for j in w.slurm.jobs() if j.job_id == jid), None)


def test_slurm_reads(slurm_world: SlurmWorld) -> None:
    w, s = slurm_world, slurm_world.slurm
    assert isinstance(s, SlurmAdapterProtocol)
    s.ping()
    nodes = s.nodes()
    assert tuple(n.name for n in nodes) == w.nodes  # sorted by name
    assert all(n.state == "idle" and n.gpus == 4 and n.responding and not n.drained and not n.down for n in nodes)
    assert all({wk.SLURM_PREEMPT_PARTITION, wk.SLURM_HOLD_PARTITION} <= set(n.partitions) for n in nodes)
    assert all(list(n.partitions) == sorted(n.partitions) for n in nodes)
    # a node read twice is the same value (24.11 lists its partitions in no fixed order)
    assert s.nodes([w.nodes[1], w.nodes[0]]) == (s.node(w.nodes[0]), s.node(w.nodes[1])) == nodes[:2]
    with pytest.raises(Exception, match="unknown node"):
        s.nodes(["gpu-node-99"])
    assert s.jobs() == () and holds_of(s) == {}


def test_slurm_drain_resume_with_reason_only_ours(slurm_world: SlurmWorld) -> None:
    w, s = slurm_world, slurm_world.slurm
    a, b = w.nodes[0], w.nodes[1]
    assert s.drain(a, "serving\nsince now") is True
    assert s.drain(a, "serving since now") is False  # same (cleaned) reason: nothing to write
    n = s.node(a)
    assert n.drained and n.drained_by_us and n.reason == "gpu-bridge: serving since now" and n.state == "idle"
    assert s.drain(a, "serving (pool b)") is True  # ours, new reason: rewritten
    assert s.node(a).reason == "gpu-bridge: serving (pool b)"
    w.admin_drain(b, "maintenance: disk")
    assert s.drain(b, "serving") is False  # an administrator's drain is never overwritten
    assert s.node(b).reason == "maintenance: disk" and s.node(b).drained_by_other
    with pytest.raises(NotOursError):
        s.resume(b)
    assert s.node(b).drained_by_other
    assert s.resume(a) is True
    assert s.resume(a) is False
    assert not s.node(a).drained and not s.node(a).drained_by_us  # 24.11 keeps the old reason text


def test_slurm_hold_submit_list_cancel(slurm_world: SlurmWorld) -> None:
    w, s = slurm_world, slurm_world.slurm
    node = w.nodes[2]
    hold = s.submit_hold(node)
    assert hold and s.submit_hold(node) == hold  # idempotent: one hold per node
    both = s.submit_holds([node, w.nodes[3]])  # a pass's holds, one read: the one there is returned
    assert both[node] == hold and isinstance(both[w.nodes[3]], str) and both[w.nodes[3]] != hold
    assert s.cancel_hold(w.nodes[3]) == (both[w.nodes[3]],)
    h = w.eventually(lambda: (x := holds_of(s).get(node)) is not None and x.state == "running" and x, 20,
                     "hold running")
    assert h.job_id == hold and h.nodes == (node,) and h.is_hold and h.hold_node == node
    assert h.partition == wk.SLURM_HOLD_PARTITION and h.name == wk.SLURM_HOLD_JOB_PREFIX + node
    assert [j.job_id for j in s.jobs(node=node)] == [hold]
    assert s.jobs(partition=wk.SLURM_PREEMPT_PARTITION) == () and s.jobs(node=w.nodes[0]) == ()
    assert [j.job_id for j in s.jobs(states=["RUNNING"])] == [hold]  # states match case-insensitively
    assert s.node(node).allocated
    with pytest.raises(NotOursError):
        s.requeue(hold)  # a hold is never requeued as if it were a research job
    got = s.requeue_jobs({hold: None, "999999": None})  # in a batch: refused, and a job gone skipped
    assert isinstance(got[hold].error, NotOursError) and not got["999999"].requeued and got["999999"].error is None
    assert s.cancel_hold(w.nodes[3]) == ()  # no hold there
    assert s.cancel_hold(node) == (hold,)
    w.eventually(lambda: node not in holds_of(s), 15, "hold gone")
    assert s.cancel_hold(node) == ()
    w.eventually(lambda: not s.node(node).allocated, 15, "node free again")


def test_slurm_hold_preempts_research_job_and_requeue(slurm_world: SlurmWorld) -> None:
    """The reclaim path: the hold preempts (GraceTime starts), the daemon requeues at its end,
    the job goes back to pending (restart count + 1) and the hold runs."""
    w, s = slurm_world, slurm_world.slurm
    node = w.nodes[0]
    jid = w.research_job(node)
    running = w.eventually(lambda: (j := _job(w, jid)) is not None and j.state == "running" and j, 30, "research job running")
    assert running.nodes == (node,) and running.partition == wk.SLURM_PREEMPT_PARTITION and running.requeueable
    assert running.restart_count == 0 and running.preempt_time is None and not running.is_hold
    assert [j.job_id for j in s.jobs(node=node)] == [jid]
    assert s.requeue("999999") is False  # no such job: nothing to requeue
    hold = s.submit_hold(node)
    victim = w.eventually(lambda: (j := _job(w, jid)) is not None and j.preempt_time is not None and j, 10, "preempt_time set")
    assert victim.state == "running" and victim.end_time is not None
    assert abs(victim.end_time - victim.preempt_time - w.grace_s) <= 1
    assert holds_of(s)[node].job_id == hold and holds_of(s)[node].state == "pending"
    assert not victim.grace_over(w.now())
    while not victim.grace_over(w.now()):
        w.sleep(0.1)
    if s.requeue(jid) is False:  # Slurm may have requeued it itself at the same moment
        assert _job(w, jid).state != "running"
    w.eventually(lambda: (h := holds_of(s).get(node)) is not None and h.state == "running", 20, "hold running")
    requeued = _job(w, jid)
    assert requeued is not None and requeued.state == "pending" and requeued.restart_count == 1
    assert requeued.nodes == () and requeued.preempt_time is None
    assert s.requeue(jid) is False  # pending: not running, nothing to requeue
    assert s.cancel_hold(node) == (hold,)


# warm lending's memory hold needs memory counted and its partition: a Slurm of its own
WARM_SLURM_CONF = "\n".join([
    "SelectTypeParameters=CR_Core_Memory",  # the sandbox's CR_Core replaced (the last line wins)
    f"PartitionName={wk.SLURM_WARM_PARTITION} Nodes=gpu-node-[01-02] PriorityTier=100 PreemptMode=OFF "
    "OverSubscribe=NO MaxTime=INFINITE State=UP",
])


@pytest.fixture(scope="module")
def warm_slurm_sandbox() -> Iterator[Any]:
    with slurm_only(nodes=2, grace_s=3, real_memory_mb=16000, extra_slurm_conf=WARM_SLURM_CONF) as c:
        yield c.sb


@pytest.fixture(params=["fake", REAL])
def mem_world(request: pytest.FixtureRequest, tmp_path: Path) -> SlurmWorld:
    if request.param == "fake":
        fake = FakeSlurm(grace_s=3.0)
        for n in ("gpu-node-01", "gpu-node-02"):
            fake.add_node(n, memory_mb=16000)
        return FakeSlurmWorld(slurm=fake, nodes=("gpu-node-01", "gpu-node-02"), grace_s=3.0, fake=fake)
    sb = request.getfixturevalue("warm_slurm_sandbox")
    cli = CliSlurm(env={"SLURM_CONF": str(sb.slurm.slurm_conf)}, timeout_s=10)
    return RealSlurmWorld(slurm=cli, nodes=tuple(sb.node_names), grace_s=3.0, sandbox=sb, tmp=tmp_path)


def test_slurm_memory_hold_keeps_its_memory_from_research_jobs(mem_world: SlurmWorld) -> None:
    """Warm lending's memory hold: pinned, 1 CPU, no GPU, never a serving hold or a research job
    (no requeue), cancelled by name and partition; its memory kept from research jobs: one asking
    for more than it leaves waits until it is cancelled, and a hold that finds too little free
    preempts that job (REQUEUE) and runs; a job within what it leaves runs beside it."""
    w, s = mem_world, mem_world.slurm
    node, other = w.nodes
    hold = s.submit_mem_hold(node, 12_000)
    assert hold and s.submit_mem_hold(node, 12_000) == hold  # idempotent: one memory hold per node
    h = w.eventually(lambda: (j := _job(w, hold)) is not None and j.state == "running" and j, 20, "memory hold running")
    assert h.nodes == (node,) and h.partition == wk.SLURM_WARM_PARTITION and h.name == wk.SLURM_WARM_HOLD_JOB_PREFIX + node
    assert holds_of(s) == {} and not h.is_hold  # not a serving hold
    with pytest.raises(NotOursError):
        s.requeue(hold)  # a memory hold is never requeued as if it were a research job
    big = w.research_job(node, mem_mb=5000)  # 4,000 MB left beside the hold
    w.sleep(4.0)
    assert _job(w, big).state == "pending" and _job(w, hold).state == "running"
    assert s.cancel_mem_hold(other) == ()
    assert s.cancel_mem_hold(node) == (hold,)
    w.eventually(lambda: (j := _job(w, hold)) is None or j.state not in ("running", "pending"), 15, "memory hold gone")
    assert s.cancel_mem_hold(node) == ()
    w.eventually(lambda: (j := _job(w, big)) is not None and j.state == "running", 30, "the big job once the memory is free")
    again = s.submit_mem_hold(node, 12_000)  # a lend's hold finding the big job there: its tier preempts it
    w.eventually(lambda: (j := _job(w, again)) is not None and j.state == "running", 40, "the hold after the job's grace")
    requeued = _job(w, big)
    assert requeued.state == "pending" and requeued.restart_count == 1  # requeued, never cancelled
    fits = w.research_job(node, mem_mb=3000)
    w.eventually(lambda: (j := _job(w, fits)) is not None and j.state == "running", 30, "a job within what the hold leaves")
    assert _job(w, big).state == "pending" and s.cancel_mem_hold(node) == (again,)


# --- Kubernetes -----------------------------------------------------------------------------


@dataclass
class KubeWorld(World):
    kube: KubeAdapterProtocol
    pool: str
    namespace: str
    nodes: tuple[str, ...]
    node_controller: bool = True  # a node lifecycle controller runs (not the in-process emulator)

    def add_node(self, name: str, pool: str) -> None:
        """A GPU node labelled for ``pool`` (not one the adapter was given)."""
        raise NotImplementedError

    def cordon(self, node: str) -> None:
        """An administrator's ``kubectl cordon``."""
        raise NotImplementedError

    def events(self, node: str) -> list[tuple[str, str, str]]:
        """(reason, message, type) of the Events gpu-bridge wrote on ``node``."""
        raise NotImplementedError


@dataclass
class FakeKubeWorld(KubeWorld):
    fake: FakeKube = field(default_factory=FakeKube)

    def now(self) -> float:
        return self.fake.now

    def sleep(self, seconds: float) -> None:
        self.fake.step(self.fake.now + seconds)

    def add_node(self, name: str, pool: str) -> None:
        self.fake.add_node(name, pool)

    def cordon(self, node: str) -> None:
        self.fake.set_unschedulable(node, True)

    def events(self, node: str) -> list[tuple[str, str, str]]:
        return [(e.reason, e.message, e.event_type) for e in self.fake.events if e.node == node]


@dataclass
class RealKubeWorld(KubeWorld):
    serving: Any = None

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def add_node(self, name: str, pool: str) -> None:
        make_node(self.serving.core, self.serving.client, name, {wk.LABEL_POOL: pool})
        self.serving.nodes.append(name)  # deleted with the fixture's own

    def cordon(self, node: str) -> None:
        self.serving.core.patch_node(node, {"spec": {"unschedulable": True}})

    def events(self, node: str) -> list[tuple[str, str, str]]:
        items = self.serving.core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
        # the node controller and kwok write their own Events on the node: only ours count
        return [(e.reason, e.message, e.type) for e in items if e.source and e.source.component == "gpu-bridge"]


@pytest.fixture(params=["fake", REAL])
def kube_world(request: pytest.FixtureRequest) -> Iterator[KubeWorld]:
    if request.param == "fake":
        fake = FakeKube(identity=IDENTITY, now=1000.0)
        pool, ns = "parity", "serving"
        names = tuple(f"gpu-node-{i:02d}" for i in range(1, 5))
        for n in names:
            fake.add_node(n, pool)
        # the contract fixture's Deployment: 3 replicas, PDB maxUnavailable 1, 5 s grace
        fake.add_pool(PoolTarget(pool, ns, "vllm"), replicas=3, min_available=2, start_delay_s=1.0, grace_s=5.0)
        yield FakeKubeWorld(kube=fake, pool=pool, namespace=ns, nodes=names, fake=fake)
        return
    kube: Kube = request.getfixturevalue("kube")
    serving: Serving = request.getfixturevalue("serving")
    api = api_client_from_config(kubeconfig=str(kube.kubeconfig))
    adapter = KubeAdapter(api, pools=[PoolTarget(serving.pool, serving.ns, "vllm")], identity=IDENTITY,
                          watch_timeout_s=5, request_timeout_s=5)
    try:
        adapter.start()
        assert adapter.wait_synced(20)
        yield RealKubeWorld(kube=adapter, pool=serving.pool, namespace=serving.ns, nodes=tuple(sorted(serving.nodes)),
                            node_controller=not kube.sandbox, serving=serving)
    finally:
        adapter.stop()
        api.close()


UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def _has_taint(k: KubeAdapterProtocol, node: str, key: str) -> bool:
    n = k.node(node)
    return n is not None and any(t.key == key and t.effect == "NoSchedule" for t in n.taints)


def _live(w: KubeWorld) -> list[Any]:
    return [p for p in w.kube.pods(w.pool) if not p.terminating]


def _ready(w: KubeWorld) -> list[Any]:
    return [p for p in w.kube.pods(w.pool) if p.ready and not p.terminating]


def test_kube_reads(kube_world: KubeWorld) -> None:
    w, k = kube_world, kube_world.kube
    assert isinstance(k, KubeAdapterProtocol)
    assert k.cache_status().synced
    nodes = k.nodes()
    assert tuple(n.name for n in nodes) == w.nodes
    assert all(n.pool == w.pool and n.phase is None and not n.fenced and not n.unschedulable and n.ready for n in nodes)
    assert all(n.allocatable_gpus == 4 and n.problem is None for n in nodes)
    assert k.node("no-such-node") is None
    pods = w.eventually(lambda: len(_ready(w)) == 3 and _ready(w), 20, "3 Ready pods")
    assert all(p.pool == w.pool and p.namespace == w.namespace and p.node in w.nodes for p in pods)
    assert len({p.node for p in pods}) == 3  # one replica per node (4 GPUs each)
    dep = k.deployment(w.pool)
    assert dep is not None and dep.replicas == 3 and dep.namespace == w.namespace and dep.problem is None
    scale = k.read_scale(w.namespace, "vllm")
    assert scale.replicas == 3
    with pytest.raises(ValueError, match="not configured"):
        k.pods("no-such-pool")


def test_kube_lists_only_the_configured_pools_nodes(kube_world: KubeWorld) -> None:
    w, k = kube_world, kube_world.kube
    other = f"{w.nodes[0]}-other"
    w.add_node(other, f"{w.pool}-other")
    w.cordon(w.nodes[0])  # a change the watch delivers after the new node's creation
    w.eventually(lambda: k.node(w.nodes[0]).unschedulable, 10, "the cache caught up")  # type: ignore[union-attr]
    assert tuple(n.name for n in k.nodes()) == w.nodes
    assert k.node(other) is None
    assert k.read_node(other).pool == f"{w.pool}-other"  # a GET reads any node, now
    assert k.read_node(w.nodes[0]).unschedulable
    with pytest.raises(KubeApiError) as info:
        k.read_node(f"{other}-none")
    assert info.value.status == 404


def test_kube_phase_owner_request_pin_on_the_node(kube_world: KubeWorld) -> None:
    """The node's labels and annotations are the daemon's only state: phase, since, reason,
    owner; and an operator's request and pin."""
    w, k = kube_world, kube_world.kube
    node = w.nodes[0]
    assert k.set_phase(node, Phase.LENDING, "lend: load low\nfor 10 min", 1700000000.25) is True
    assert k.set_phase(node, Phase.LENDING, "lend: load low\nfor 10 min", 1700000000.25) is False
    n = k.node(node)
    assert n is not None and n.phase is Phase.LENDING and n.phase_since == pytest.approx(1700000000.25)
    assert n.labels[wk.LABEL_PHASE] == "lending" and n.owner == IDENTITY and n.annotations[wk.ANNOTATION_OWNER] == IDENTITY
    assert n.reason is not None and "\n" not in n.reason and n.reason.startswith("lend: load low")
    assert k.set_phase(node, Phase.LENT, "lent", 1700000100.0) is True
    assert k.node(node).phase is Phase.LENT  # type: ignore[union-attr]

    assert k.set_request(node, "reclaim") is True
    assert k.set_request(node, "reclaim") is False
    assert k.node(node).annotations[wk.ANNOTATION_REQUEST] == "reclaim"  # type: ignore[union-attr]
    assert k.set_request(node, None) is True
    assert wk.ANNOTATION_REQUEST not in k.node(node).annotations  # type: ignore[union-attr]
    assert k.set_request(node, None) is False

    assert k.set_pin(node, Pin.SERVING) is True
    assert k.set_pin(node, Pin.SERVING) is False
    assert k.node(node).pin is Pin.SERVING  # type: ignore[union-attr]
    assert k.set_pin(node, None) is True
    assert k.node(node).pin is None  # type: ignore[union-attr]

    with pytest.raises(KubeApiError) as info:
        k.set_phase("no-such-node", Phase.LENDING, "x", 1.0)
    assert info.value.status == 404


def test_kube_fence_unfence_keeps_an_administrators_cordon(kube_world: KubeWorld) -> None:
    w, k = kube_world, kube_world.kube
    a, b = w.nodes[0], w.nodes[1]
    assert k.fence(a) is True and k.fence(a) is False
    n = k.node(a)
    assert n is not None and n.fenced and n.unschedulable and n.cordoned_by_bridge
    assert any(t.key == wk.TAINT_KEY and t.effect == wk.TAINT_EFFECT for t in n.taints)
    # the node lifecycle controller taints a cordoned node too (TaintNodesByCondition): a
    # write racing with it conflicts (409) and is rebuilt; its taint is kept by ours
    if w.node_controller:
        w.eventually(lambda: _has_taint(k, a, UNSCHEDULABLE_TAINT), 10, "the controller's unschedulable taint")
    assert k.unfence(a) is True and k.unfence(a) is False
    n = k.node(a)
    assert n is not None and not n.fenced and not n.unschedulable and not n.cordoned_by_bridge
    assert not _has_taint(k, a, wk.TAINT_KEY)
    w.eventually(lambda: not k.node(a).taints, 10, "the controller's taint lifted after the uncordon")  # type: ignore[union-attr]

    w.cordon(b)
    w.eventually(lambda: k.node(b).unschedulable, 10, "the cordon seen by the cache")  # type: ignore[union-attr]
    assert k.fence(b) is True
    n = k.node(b)
    assert n is not None and n.fenced and not n.cordoned_by_bridge  # the cordon is not ours
    assert k.unfence(b) is True
    n = k.node(b)
    assert n is not None and not n.fenced and n.unschedulable  # the administrator's cordon stays


def test_kube_deletion_cost_picks_the_pod_a_scale_down_removes(kube_world: KubeWorld) -> None:
    w, k = kube_world, kube_world.kube
    pods = w.eventually(lambda: len(_ready(w)) == 3 and _ready(w), 20, "3 Ready pods")
    victim = sorted(pods, key=lambda p: p.name)[1]
    assert k.set_pod_deletion_cost(w.namespace, victim.name, -1000) is True
    assert k.set_pod_deletion_cost(w.namespace, victim.name, -1000) is False
    assert {p.name: p.deletion_cost for p in k.pods(w.pool)}[victim.name] == -1000
    with pytest.raises(KubeApiError) as info:
        k.set_pod_deletion_cost(w.namespace, "no-such-pod", 1)
    assert info.value.status == 404

    assert k.scale(w.namespace, "vllm", 2) is True
    assert k.scale(w.namespace, "vllm", 2) is False
    assert k.read_scale(w.namespace, "vllm").replicas == 2
    w.eventually(lambda: (d := k.deployment(w.pool)) is not None and d.replicas == 2, 10, "the Deployment at 2")
    live = w.eventually(lambda: len(_live(w)) == 2 and _live(w), 20, "2 live pods")
    assert victim.name not in {p.name for p in live}  # the cheapest Ready pod went
    w.eventually(lambda: victim.name not in {p.name for p in k.pods(w.pool)}, 20, "the pod gone")

    assert k.scale(w.namespace, "vllm", 3) is True
    w.eventually(lambda: len(_ready(w)) == 3, 30, "3 Ready pods again")


def test_kube_evictions_honour_the_pdb(kube_world: KubeWorld) -> None:
    """PDB maxUnavailable 1 over 3 Ready replicas: one eviction goes, the next is refused
    (429, BLOCKED) until the replacement is Ready; a pod already gone is GONE."""
    w, k = kube_world, kube_world.kube
    pods = sorted(w.eventually(lambda: len(_ready(w)) == 3 and _ready(w), 20, "3 Ready pods"), key=lambda p: p.name)
    w.eventually(lambda: k.evict(w.namespace, pods[0].name) is EvictOutcome.EVICTED, 20,
                 "the first eviction allowed (the PDB's status is computed by a controller)")
    assert w.eventually(lambda: next(p for p in k.pods(w.pool) if p.name == pods[0].name).terminating, 10,
                        "the evicted pod terminating")
    assert k.evict(w.namespace, pods[1].name) is EvictOutcome.BLOCKED
    assert not next(p for p in k.pods(w.pool) if p.name == pods[1].name).terminating
    assert k.evict(w.namespace, "no-such-pod") is EvictOutcome.GONE
    # the replacement Ready again: the budget allows one more
    w.eventually(lambda: len(_ready(w)) == 3, 30, "the replacement Ready")
    w.eventually(lambda: k.evict(w.namespace, pods[1].name) is EvictOutcome.EVICTED, 30, "the second eviction allowed")


def test_kube_events_on_the_node(kube_world: KubeWorld) -> None:
    w, k = kube_world, kube_world.kube
    node = w.nodes[0]
    k.emit_event(node, "GpuBridgeLending", "lending:\nload low", "Normal")
    k.emit_event(node, "GpuBridgeBlocked", "x" * 50, "Warning")
    got = w.eventually(lambda: len(w.events(node)) == 2 and w.events(node), 10, "2 events")
    assert sorted(got) == [("GpuBridgeBlocked", "x" * 50, "Warning"), ("GpuBridgeLending", "lending: load low", "Normal")]
    with pytest.raises(ValueError):
        k.emit_event(node, "GpuBridgeLending", "m", "Error")
    gone = f"{node}-gone"
    k.emit_event(gone, "GpuBridgeLending", "an Event needs no live object", "Normal")
    assert w.eventually(lambda: w.events(gone), 10, "the event on a node not (or no longer) there")


# --- the Lease ------------------------------------------------------------------------------


@pytest.fixture(params=["fake", REAL])
def leader(request: pytest.FixtureRequest) -> Iterator[Leader]:
    if request.param == "fake":
        yield FakeLeader(identity=IDENTITY)
        return
    kube: Kube = request.getfixturevalue("kube")
    client, api = kube.client()
    ns = kube.name("lease")
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    elector = LeaderElector(api_client_from_config(kubeconfig=str(kube.kubeconfig)), namespace=ns, identity=IDENTITY,
                            lease_duration_s=15, retry_period_s=0.0)
    yield elector
    client.CoreV1Api(api).delete_namespace(ns)


def test_lease_acquire_release_reacquire(leader: Leader) -> None:
    assert isinstance(leader, Leader)
    assert leader.try_acquire_or_renew() is True and leader.is_leader
    assert leader.try_acquire_or_renew() is True  # renewal
    assert leader.release() is True and not leader.is_leader
    assert leader.release() is False  # nothing held any more
    assert leader.try_acquire_or_renew() is True and leader.is_leader  # a free Lease is taken again
    assert leader.release() is True
