"""``bridge.observe.join`` on generated clusters: which reason holds a node when it has several
(the first, in a fixed order), what a node's pods count for, and a 2,000-node cluster joined the
same whatever order the adapters list it in, each of our nodes once and no other."""

from __future__ import annotations

import random
from collections.abc import Collection

from bridge import wellknown as wk
from bridge.adapters.kube.objects import NodeInfo, PodInfo
from bridge.adapters.slurm.types import SlurmNode
from bridge.config import default_config
from bridge.model import Phase, SlurmJob
from bridge.observe import Observation, Readings, join

NOW = 2e9
CONFIG = default_config("default", "broken")  # the "broken" pool's Deployment cannot be trusted
RETURN_TIMEOUT_S = 2 * 300.0 + 120.0  # twice the default cold start plus two minutes

# Every reason a node is held for, in the order join looks for them; a node that has several
# reports the first. (Slurm unreadable is a reason of the whole tick: tested on its own.)
REASONS = ("label", "name", "unknown to Slurm", "drained", "pod", "pool", "returning")
EXPECTED = {"label": "label gpu-bridge.io/phase: expected", "name": "slurm: node name", "unknown to Slurm": "node unknown to Slurm",
            "drained": "drained in Slurm by someone else", "pod": "serving pod", "pool": "deployment broken",
            "returning": "returning for"}


def _node(name: str, reasons: Collection[str] = (), *, pool: str = "default", phase: Phase = Phase.SERVING) -> NodeInfo:
    returning = "returning" in reasons
    return NodeInfo(name=("bad name " + name) if "name" in reasons else name, uid=name, resource_version="1",
                    pool="broken" if "pool" in reasons else pool, phase=Phase.RETURNING if returning else phase,
                    phase_since=NOW - RETURN_TIMEOUT_S - 60 if returning else NOW - 3600,
                    problem="label gpu-bridge.io/phase: expected one of ..., got \"x\"" if "label" in reasons else None)


def _pod(name: str, node: str | None, *, ready: bool = True, terminating: bool = False, problem: str | None = None) -> PodInfo:
    return PodInfo(name=name, namespace="serving", uid=name, resource_version="1", pool="default", node=node, phase="Running",
                   ready=ready, deletion_timestamp="2026-01-01T00:00:00Z" if terminating else None, problem=problem)


def _slurm(name: str, *, drained_by: str = "us") -> SlurmNode:
    reason = wk.SLURM_REASON_PREFIX + " serving" if drained_by == "us" else "maintenance"
    return SlurmNode(name=name, state="idle", flags=frozenset({"DRAIN"}), reason=reason, gpus=4)


def _join(nodes: list[NodeInfo], pods: list[PodInfo], slurm: list[SlurmNode] | None, *,
          inflight: dict[str, float] | None = None, jobs: list[SlurmJob] | None = None) -> Observation:
    return join(now=NOW, config=CONFIG, kube_nodes=nodes, pods={"default": pods}, desired_replicas={"default": len(nodes)},
                slurm_nodes=slurm, slurm_jobs=None if slurm is None else (jobs or []),
                readings={"default": Readings(None, inflight_by_pod=inflight or {})},
                pool_problems={"broken": "deployment broken"})


def test_a_node_with_several_reasons_is_held_for_the_first() -> None:
    nodes, pods, slurm = [], [], []
    for i, first in enumerate(REASONS):
        reasons = set(REASONS[i:]) - ({"drained"} if first == "unknown to Slurm" else set())  # unknown: no drain either
        n = _node(f"gpu-node-{i:02d}", reasons)
        nodes.append(n)
        if "unknown to Slurm" not in reasons:
            slurm.append(_slurm(n.name, drained_by="admin" if "drained" in reasons else "us"))
        pods.append(_pod(f"vllm-{i}", n.name, ready=False, problem="annotation x: bad" if "pod" in reasons else None))
    obs = _join(nodes, pods, slurm)
    held = {n.name.removeprefix("bad name "): obs.problems[n.name] for n in nodes}
    assert {name: next(r for r in REASONS if held[name].startswith(EXPECTED[r])) for name in held} == {
        f"gpu-node-{i:02d}": r for i, r in enumerate(REASONS)}
    # Slurm unreadable comes after the node's own label and name, before everything else
    unread = _join(nodes, pods, None).problems
    assert [unread[n.name].startswith("Slurm state unknown") for n in nodes] == [False, False] + [True] * (len(REASONS) - 2)


def test_a_nodes_pods_count_only_while_live() -> None:
    nodes = [_node("gpu-node-00"), _node("gpu-node-01"), _node("gpu-node-02"), _node("gpu-node-03")]
    pods = [_pod("a", "gpu-node-00"), _pod("b", "gpu-node-00", ready=False),  # two live pods, one Ready
            _pod("c", "gpu-node-01", terminating=True),  # only a terminating one: no replica, not Ready
            _pod("d", "gpu-node-02", ready=False), _pod("e", "gpu-node-02", terminating=True),
            _pod("f", "gpu-node-03"), _pod("g", None)]  # unscheduled: on no node
    obs = _join(nodes, pods, [_slurm(n.name) for n in nodes], inflight={"a": 1.5, "b": 2.0, "c": 9.0, "e": 9.0})
    state = {s.name: s for s in obs.view.nodes}
    assert [(state[n.name].serving_pods, state[n.name].serving_ready) for n in nodes] == [(2, True), (0, False), (1, False), (1, True)]
    # in-flight requests: the live pods' sum; unknown (never "idle") when a live pod has no reading
    assert [state[n.name].inflight for n in nodes] == [3.5, None, None, None]
    assert [p.name for p in obs.facts["gpu-node-02"].pods] == ["d", "e"]  # the lifecycle sees terminating pods too
    assert obs.view.pools["default"].ready_replicas == 2


def _cluster(size: int, seed: int) -> tuple[list[NodeInfo], list[PodInfo], list[SlurmNode], list[SlurmJob], dict[str, float]]:
    rnd = random.Random(seed)
    nodes, pods, slurm, jobs = [], [], [], []
    for i in range(size):
        name = f"gpu-node-{i:04d}"
        reasons = {r for r in REASONS if rnd.random() < 0.02}
        lent = rnd.random() < 0.1
        nodes.append(_node(name, reasons, pool="other-team" if rnd.random() < 0.05 else "default",
                           phase=Phase.LENT if lent else Phase.SERVING))
        if "unknown to Slurm" not in reasons:
            slurm.append(_slurm(nodes[-1].name, drained_by="admin" if "drained" in reasons else "us"))
        if lent:
            jobs.append(SlurmJob(str(1000 + i), "train", "alice", wk.SLURM_PREEMPT_PARTITION, "running", (name,), NOW - 600))
        else:
            jobs.append(SlurmJob(str(5000 + i), wk.SLURM_HOLD_JOB_PREFIX + name, "root", wk.SLURM_HOLD_PARTITION, "running",
                                 (name,), NOW - 86400))
            pods += [_pod(f"vllm-{i}-{k}", nodes[-1].name, ready=rnd.random() < 0.9, terminating=rnd.random() < 0.05,
                          problem="bad" if "pod" in reasons and k == 0 else None)  # one named whatever the order
                     for k in range(rnd.choice((1, 1, 1, 2)))]
    inflight = {p.name: float(rnd.randint(0, 40)) for p in pods if rnd.random() < 0.97}
    return nodes, pods, slurm, jobs, inflight


def test_a_generated_cluster_joins_the_same_in_any_order_each_node_of_ours_once() -> None:
    nodes, pods, slurm, jobs, inflight = _cluster(2000, seed=24)
    obs = _join(nodes, pods, slurm, inflight=inflight, jobs=jobs)
    ours = sorted(n.name for n in nodes if n.pool in ("default", "broken"))
    assert [s.name for s in obs.view.nodes] == ours and list(obs.pool_of) == ours
    assert set(obs.facts) == set(ours) & {s.name for s in slurm}
    assert obs.problems == {s.name: s.problem for s in obs.view.nodes if s.problem} and 0 < len(obs.problems) < len(ours)
    for seed in (1, 2):
        rnd = random.Random(seed)
        again = _join(rnd.sample(nodes, len(nodes)), rnd.sample(pods, len(pods)), rnd.sample(slurm, len(slurm)),
                      inflight=inflight, jobs=rnd.sample(jobs, len(jobs)))
        assert (again.view, again.facts, again.problems, again.pool_of) == (obs.view, obs.facts, obs.problems, obs.pool_of)
    # a node's own problem is never lost for another: the label's is kept whole
    assert all(obs.problems[n.name] == n.problem for n in nodes if n.problem and n.name in obs.pool_of)
    ready = {s.name for s in obs.view.nodes if s.pool == "default" and s.serving_ready}
    assert obs.view.pools["default"].ready_replicas == len(ready) > 0
