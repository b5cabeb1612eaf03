"""FakeKube, the in-memory Kubernetes adapter the daemon's tests use: it satisfies the
Protocols and enforces the real rules (idempotent writes, rv conflicts retried then given up,
PDB-blocked eviction, deletion-cost-ordered scale-down, fenced nodes get no new pod)."""

from __future__ import annotations

import pytest

from bridge import wellknown as wk
from gpu_bridge_lab.fakes.kube import FakeKube, FakeLeader, FakeProm
from bridge.adapters.kube.calls import KubeApiError, KubeConflictError
from bridge.adapters.kube.objects import EvictOutcome
from bridge.adapters.protocols import KubeReader, KubeWriter, PoolTarget
from bridge.adapters.prom.types import PromPool
from bridge.adapters.protocols import PromReader
from bridge.model import LoadSignals, Phase

POOL = PoolTarget("llama", "serving", "vllm")


def world(nodes: int = 3, replicas: int = 3, **kw: object) -> FakeKube:
    k = FakeKube(identity="bridge-a")
    for i in range(nodes):
        k.add_node(f"n{i}", "llama")
    k.add_pool(POOL, replicas=replicas, **kw)  # type: ignore[arg-type]
    return k


def test_fakes_satisfy_the_protocols() -> None:
    k = world()
    assert isinstance(k, KubeReader) and isinstance(k, KubeWriter)
    assert isinstance(FakeProm(), PromReader)


def test_set_phase_is_idempotent_and_parsed_back() -> None:
    k = world()
    assert k.set_phase("n0", Phase.LENDING, "low load", 100.0)
    assert not k.set_phase("n0", Phase.LENDING, "low load", 100.0)
    n = k.node("n0")
    assert n is not None and (n.phase, n.phase_since, n.reason, n.owner, n.problem) == (Phase.LENDING, 100.0, "low load", "bridge-a", None)
    assert k.calls[("patch", "nodes")] == 1


def test_fence_then_unfence_restores_the_node_and_keeps_foreign_taints() -> None:
    k = FakeKube()
    k.add_node("n0", "llama", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
    assert k.fence("n0") and not k.fence("n0")
    n = k.node("n0")
    assert n is not None and n.fenced and n.unschedulable and n.cordoned_by_bridge
    assert k.unfence("n0") and not k.unfence("n0")
    n = k.node("n0")
    assert n is not None and not n.fenced and not n.unschedulable and [t.key for t in n.taints] == ["dedicated"]
    assert wk.ANNOTATION_CORDONED not in n.annotations


def test_unfence_leaves_an_admin_cordon() -> None:
    k = FakeKube()
    k.add_node("n0", "llama", unschedulable=True)
    k.fence("n0")
    k.unfence("n0")
    n = k.node("n0")
    assert n is not None and n.unschedulable and not n.fenced


def test_conflicts_are_retried_then_given_up() -> None:
    k = world()
    k.inject_conflicts("node/n0", 2)
    assert k.fence("n0")
    n = k.node("n0")
    assert n is not None and n.fenced
    k.inject_conflicts("node/n1", 99)
    with pytest.raises(KubeConflictError, match="still conflicting after 5 retries"):
        k.fence("n1")


def test_eviction_respects_the_pdb_and_reports_gone() -> None:
    k = world(replicas=3, min_available=2)
    pods = k.pods("llama")
    assert k.evict("serving", pods[0].name) is EvictOutcome.EVICTED
    assert k.evict("serving", pods[1].name) is EvictOutcome.BLOCKED
    assert k.evict("serving", "nope") is EvictOutcome.GONE


def test_scale_down_removes_the_cheapest_pod_and_fenced_nodes_get_no_new_pod() -> None:
    k = world(replicas=3, start_delay_s=30, grace_s=10)
    by_node = {p.node: p for p in k.pods("llama")}
    k.fence("n1")
    assert k.set_pod_deletion_cost("serving", by_node["n1"].name, -1000)
    assert k.scale("serving", "vllm", 2) and not k.scale("serving", "vllm", 2)
    k.step(1.0)
    terminating = [p for p in k.pods("llama") if p.terminating]
    assert [p.node for p in terminating] == ["n1"]
    k.step(11.0)
    assert sorted(p.node or "" for p in k.pods("llama")) == ["n0", "n2"]
    k.scale("serving", "vllm", 3)
    k.step(12.0)
    assert len(k.pods("llama")) == 2  # n1 is fenced: nowhere to go
    k.unfence("n1")
    k.step(13.0)
    new = [p for p in k.pods("llama") if p.node == "n1"]
    assert len(new) == 1 and not new[0].ready
    k.step(43.0)
    assert all(p.ready for p in k.pods("llama"))
    d = k.deployment("llama")
    assert d is not None and (d.replicas, d.ready_replicas) == (3, 3)


def test_events_and_injected_failures() -> None:
    k = world()
    k.emit_event("n0", "Lending", "lend n0: low load")
    assert [(e.node, e.reason, e.event_type) for e in k.events] == [("n0", "Lending", "Normal")]
    k.inject_failures("patch")
    with pytest.raises(KubeApiError, match="no response"):
        k.fence("n0")
    assert k.fence("n0")


def test_fake_prom_and_leader() -> None:
    p = FakeProm()
    s = LoadSignals(t=1.0, running=2, waiting=0, kv_cache_usage_sum=0.5, tokens_per_s=10, replicas_reporting=1)
    p.set("llama", s)
    assert p.current(PromPool("llama", "llama")).signals == s
    assert p.current(PromPool("other", "other")).signals.running is None
    leader = FakeLeader()
    assert leader.try_acquire_or_renew() and leader.release() and not leader.is_leader


def test_fenced_writes_only_while_leader() -> None:
    from bridge.adapters.wrappers import FencedKube, NotLeaderError

    k = world()
    leader = FakeLeader()
    fenced = FencedKube(k, leader)
    assert isinstance(fenced, KubeReader) and isinstance(fenced, KubeWriter)
    assert fenced.fence("n0")
    leader.leader = False  # the Lease lapsed mid-step
    with pytest.raises(NotLeaderError, match=r"^kubernetes: unfence refused: not the leader"):
        fenced.unfence("n0")
    n = fenced.node("n0")  # reads still work
    assert n is not None and n.fenced


def test_scale_down_prefers_a_starting_pod_over_a_cheap_ready_one() -> None:
    """As the real ReplicaSet controller: readiness ranks before pod-deletion-cost, so a lend
    that lowers the cost and scales down must still verify which pod went."""
    k = world(nodes=3, replicas=2, start_delay_s=60)
    k.scale("serving", "vllm", 3)
    k.step(1.0)  # a third pod starts on n2, not Ready for 60 s
    ready = [p for p in k.pods("llama") if p.ready]
    k.set_pod_deletion_cost("serving", ready[0].name, -1000)
    k.scale("serving", "vllm", 2)
    k.step(2.0)
    gone = [p for p in k.pods("llama") if p.terminating]
    assert [p.node for p in gone] == ["n2"]  # the starting one, not the cheap Ready one
