"""KubeAdapter against the real control plane (the session's ``kube_plane``: kube-apiserver,
controllers, scheduler, kwok), through the official client and a kubeconfig
(``load_kube_config`` unchanged): watch cache of nodes/pods/deployment, every write (phase,
fence/unfence, deletion cost, scale, eviction vs PDB, events seen by ``kubectl describe
node``), a 409 retried, idempotence costing no request, zero requests per tick at rest, fail
closed (unsynced) when the server goes away. Each test works on nodes, a pool and a namespace
of its own (``Corner``)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from bridge import wellknown as wk
from bridge.adapters.kube.client import KubeAdapter, api_client_from_config
from bridge.adapters.kube.objects import EvictOutcome
from bridge.adapters.protocols import PoolTarget
from bridge.model import Phase
from gpu_bridge_lab.sandbox.faultproxy import FaultProxy

from test_kube_adapter_support import Corner, corner, kubectl, outage, proxied_kubeconfig, raw, seed_deployment, seed_node, seed_pdb, wait_for  # noqa: F401 (corner: fixture)

pytestmark = pytest.mark.integration


class Site:
    """The classic test site, in this test's corner: gpu nodes 0-2 in the pool (2 carries a
    foreign NoSchedule taint) and a cpu node in another pool."""

    def __init__(self, c: Corner) -> None:
        self.c, self.api, self.kubeconfig = c, c.api, c.kubeconfig
        self.pool, self.ns = c.name("llama"), c.name("serving")
        self.target = PoolTarget(self.pool, self.ns, "vllm")

    def node(self, i: int | str) -> str:
        return self.c.name(f"gpu-node-{i}")

    def seed_nodes(self) -> None:
        for i in range(3):
            seed_node(self.api, self.node(i), self.pool, corner=self.c,
                      taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}] if i == 2 else None)
        seed_node(self.api, self.c.name("cpu-node"), self.c.name("other-pool"), corner=self.c)

    def deployment(self, replicas: int) -> None:
        seed_deployment(self.api, self.ns, "vllm", self.pool, replicas, corner=self.c)


@pytest.fixture
def cluster(corner: Corner) -> Iterator[Site]:
    site = Site(corner)
    site.seed_nodes()
    yield site


@pytest.fixture
def kube(cluster: Site) -> Iterator[KubeAdapter]:
    adapter = KubeAdapter(api_client_from_config(kubeconfig=str(cluster.kubeconfig)), pools=[cluster.target], identity="bridge-test",
                          watch_timeout_s=5, request_timeout_s=3)
    yield adapter
    adapter.stop()


def own_taints(node: dict[str, Any]) -> list[dict[str, str]]:
    """The node's taints but those the node lifecycle controller manages itself
    (``node.kubernetes.io/unschedulable`` follows ``spec.unschedulable``, asynchronously)."""
    return [t for t in node["spec"].get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")]


def started(kube: KubeAdapter) -> KubeAdapter:
    kube.start()
    assert kube.wait_synced(10)
    return kube


def test_cache_sees_pool_nodes_only_with_parsed_fields(cluster: Site, kube: KubeAdapter) -> None:
    cluster.deployment(0)
    started(kube)
    nodes = kube.nodes()
    assert [n.name for n in nodes] == [cluster.node(0), cluster.node(1), cluster.node(2)]
    n0 = nodes[0]
    assert (n0.pool, n0.phase, n0.allocatable_gpus, n0.unschedulable, n0.problem) == (cluster.pool, None, 4, False, None)
    d = kube.deployment(cluster.pool)
    assert d is not None and d.replicas == 0


def test_writes_reach_the_server_and_the_cache(cluster: Site, kube: KubeAdapter) -> None:
    cluster.deployment(0)
    started(kube)
    core = k8s.CoreV1Api(cluster.api)
    n0, n2 = cluster.node(0), cluster.node(2)
    assert kube.set_phase(n0, Phase.LENDING, "low load", 1_800_000_000.0)
    live = raw(core.read_node, n0)
    assert live["metadata"]["labels"][wk.LABEL_PHASE] == "lending"
    assert live["metadata"]["annotations"][wk.ANNOTATION_PHASE_SINCE] == "1800000000.000"
    assert live["metadata"]["annotations"][wk.ANNOTATION_OWNER] == "bridge-test"
    cached = kube.node(n0)
    assert cached is not None and cached.phase is Phase.LENDING and cached.reason == "low load"

    before = kube.calls.total()
    assert not kube.set_phase(n0, Phase.LENDING, "low load", 1_800_000_000.0)
    assert kube.calls.total() == before  # idempotent: no request at all

    assert kube.fence(n2)
    live = raw(core.read_node, n2)
    assert live["spec"]["unschedulable"]
    assert sorted((t["key"], t["effect"]) for t in own_taints(live)) == [("dedicated", "NoSchedule"), (wk.TAINT_KEY, "NoSchedule")]
    assert kube.unfence(n2)
    live = raw(core.read_node, n2)
    assert not live["spec"].get("unschedulable") and [(t["key"], t["value"]) for t in own_taints(live)] == [("dedicated", "gpu")]
    # the controller lifts its own unschedulable taint once the cordon is gone
    wait_for(lambda: [t["key"] for t in raw(core.read_node, n2)["spec"].get("taints") or []] == ["dedicated"], what="system taint lifted")
    assert wk.ANNOTATION_CORDONED not in live["metadata"].get("annotations", {})


def test_unfence_keeps_an_administrators_cordon(cluster: Site, kube: KubeAdapter) -> None:
    cluster.deployment(0)
    core = k8s.CoreV1Api(cluster.api)
    n1 = cluster.node(1)
    raw(core.patch_node, n1, {"spec": {"unschedulable": True}})  # kubectl cordon
    started(kube)
    wait_for(lambda: (n := kube.node(n1)) is not None and n.unschedulable, what="cordon seen")
    assert kube.fence(n1)
    assert kube.unfence(n1)
    live = raw(core.read_node, n1)
    assert live["spec"]["unschedulable"] and not own_taints(live)


def test_conflict_is_reread_and_retried(cluster: Site, kube: KubeAdapter) -> None:
    cluster.deployment(0)
    started(kube)
    n0 = cluster.node(0)
    kube._node_infs[0].stop()  # freeze the cache so the next write carries a stale rv
    raw(k8s.CoreV1Api(cluster.api).patch_node, n0, {"metadata": {"labels": {"someone": "else"}}})
    assert kube.set_phase(n0, Phase.LENT, "lent", 1.0)
    calls = kube.calls.snapshot()
    assert calls[("patch", "nodes")] == 2 and calls[("get", "nodes")] == 1
    assert kube.calls.errors() == {("patch", "nodes", "409"): 1}
    live = raw(k8s.CoreV1Api(cluster.api).read_node, n0)
    assert live["metadata"]["labels"]["someone"] == "else" and live["metadata"]["labels"][wk.LABEL_PHASE] == "lent"


def test_pods_scale_eviction_and_deletion_cost(cluster: Site, kube: KubeAdapter) -> None:
    """The real ReplicaSet controller removes the pod with the lowest pod-deletion-cost first."""
    pool, ns = cluster.pool, cluster.ns
    cluster.deployment(2)
    seed_pdb(cluster.api, ns, "vllm", {"app": "vllm", "pool": pool}, min_available=2)
    started(kube)
    pods = wait_for(lambda: (ps := kube.pods(pool)) and len(ps) == 2 and all(p.ready for p in ps) and ps, timeout=30, what="2 Ready pods")
    assert {p.node for p in pods} <= {cluster.node(0), cluster.node(1)}  # gpu-node-2 is tainted
    victim = pods[0]
    assert kube.set_pod_deletion_cost(ns, victim.name, -100)
    wait_for(lambda: (p := next((x for x in kube.pods(pool) if x.name == victim.name), None)) is not None and p.deletion_cost == -100, what="cost in cache")
    assert not kube.set_pod_deletion_cost(ns, victim.name, -100)

    # PDB: 2 of 2 needed (once the disruption controller has computed its status)
    wait_for(lambda: raw(k8s.PolicyV1Api(cluster.api).read_namespaced_pod_disruption_budget, "vllm", ns).get("status", {}).get("currentHealthy") == 2,
             what="PDB status")
    assert kube.evict(ns, victim.name) is EvictOutcome.BLOCKED
    assert kube.evict(ns, "no-such-pod") is EvictOutcome.GONE

    scale = kube.read_scale(ns, "vllm")
    assert scale.replicas == 2
    assert kube.scale(ns, "vllm", 1) and not kube.scale(ns, "vllm", 1)
    wait_for(lambda: (d := kube.deployment(pool)) is not None and d.replicas == 1, what="deployment replicas in cache")
    wait_for(lambda: [p.name for p in kube.pods(pool) if not p.terminating] == [pods[1].name], timeout=20, what="cheapest pod removed")


def test_eviction_allowed_by_the_pdb(cluster: Site, kube: KubeAdapter) -> None:
    pool, ns = cluster.pool, cluster.ns
    cluster.deployment(2)
    seed_pdb(cluster.api, ns, "vllm", {"app": "vllm", "pool": pool}, min_available=1)
    started(kube)
    pods = wait_for(lambda: (ps := kube.pods(pool)) and len(ps) == 2 and all(p.ready for p in ps) and ps, timeout=30, what="2 Ready pods")
    wait_for(lambda: raw(k8s.PolicyV1Api(cluster.api).read_namespaced_pod_disruption_budget, "vllm", ns).get("status", {}).get("disruptionsAllowed", 0) >= 1, what="PDB status")
    assert kube.evict(ns, pods[0].name) is EvictOutcome.EVICTED
    wait_for(lambda: any(p.name == pods[0].name and p.terminating for p in kube.pods(pool)) or all(p.name != pods[0].name for p in kube.pods(pool)), what="evicted pod terminating")


def test_events_show_in_kubectl_describe_node(cluster: Site, kube: KubeAdapter, tmp_path: Path) -> None:
    cluster.deployment(0)
    started(kube)
    n1 = cluster.node(1)
    kube.emit_event(n1, "GpuBridgeLending", f"lend {n1}: forecast peak 1.2 replicas < 3 serving - 1")
    kube.emit_event(n1, "GpuBridgeReclaimFailed", "not Ready in 300 s", event_type="Warning")
    home = tmp_path / "home"
    home.mkdir()
    out = subprocess.run(
        [kubectl(), f"--kubeconfig={cluster.kubeconfig}", "describe", "node", n1],
        capture_output=True, text=True, timeout=30, env={**os.environ, "HOME": str(home)},
    )
    assert out.returncode == 0, out.stderr
    assert "GpuBridgeLending" in out.stdout and "forecast peak 1.2 replicas" in out.stdout
    assert re.search(r"Warning\s+GpuBridgeReclaimFailed", out.stdout), out.stdout


def test_reading_costs_no_request_and_writes_cost_one(cluster: Site, kube: KubeAdapter) -> None:
    cluster.deployment(0)
    started(kube)

    def per_tick_calls() -> dict[tuple[str, str], int]:
        # watches are re-opened on a timer (watch_timeout_s), not per tick: leave them out
        return {k: v for k, v in kube.calls.snapshot().items() if k[0] != "watch"}

    at_rest = per_tick_calls()
    for _ in range(100):  # 100 "ticks" of observation
        kube.nodes()
        kube.pods(cluster.pool)
        kube.deployment(cluster.pool)
        kube.cache_status()
    assert per_tick_calls() == at_rest
    kube.fence(cluster.node(0))
    after = per_tick_calls()
    assert {k: v - at_rest.get(k, 0) for k, v in after.items() if v != at_rest.get(k, 0)} == {("patch", "nodes"): 1}


def test_cache_goes_unsynced_when_the_server_is_gone(cluster: Site, tmp_path: Path) -> None:
    cluster.deployment(0)
    proxy = FaultProxy(cluster.c.port)  # byte level: TLS passes through to the apiserver
    via_proxy = proxied_kubeconfig(cluster.kubeconfig, proxy.port, tmp_path / "kubeconfig-proxy")
    kube = KubeAdapter(api_client_from_config(kubeconfig=str(via_proxy)), pools=[cluster.target], identity="bridge-test",
                       watch_timeout_s=5, request_timeout_s=2)
    try:
        started(kube)
        assert kube.cache_status().synced
        proxy.close()
        wait_for(lambda: not kube.cache_status().synced, timeout=10, what="unsynced after the connection is cut")
        st = kube.cache_status()
        assert any(i.errors > 0 and i.last_error for i in st.informers)
        assert kube.nodes()  # the last known state is still there, but the daemon must not act on it
    finally:
        kube.stop()
        proxy.close()


def test_watch_resumed_after_an_outage_catches_up(corner: Corner, tmp_path: Path) -> None:
    """An informer whose watch is dropped, and whose reconnects are refused while nodes are
    added, ends up with every change. On the real apiserver the resourceVersion is still in
    its watch cache, so it resumes the watch without a re-list; the 410 Gone -> re-list path
    (a compacted rv, which cannot be forced here) is tests/unit/test_kube_adapter_informer.py's
    ``test_410_gone_relists``."""
    from functools import partial

    from bridge.adapters.kube.calls import ApiCalls
    from bridge.adapters.kube.informer import Informer
    from bridge.adapters.kube.objects import parse_node

    pool = corner.name("llama")
    seed_node(corner.api, corner.name("gpu-node-0"), pool, corner=corner)
    proxy = FaultProxy(corner.port)
    via = api_client_from_config(kubeconfig=str(proxied_kubeconfig(corner.kubeconfig, proxy.port, tmp_path / "kc-proxy")))
    inf = Informer(
        "nodes", "nodes", partial(k8s.CoreV1Api(via).list_node, label_selector=f"{wk.LABEL_POOL}={pool}"), parse_node,
        calls=ApiCalls(), watch_timeout_s=30, request_timeout_s=2, backoff_initial_s=1.0,
    )
    try:
        inf.start()
        assert inf.wait_synced(5)
        outage(proxy, 1.5)  # drop the watch, refuse reconnects for 1.5 s
        wait_for(lambda: not inf.synced, timeout=5, what="outage noticed")
        for i in range(1, 8):
            seed_node(corner.api, corner.name(f"gpu-node-{i}"), pool, corner=corner)
        wait_for(lambda: len(inf.items()) == 8 and inf.synced, timeout=15, what="all 8 nodes after the outage")
        st = inf.status()
        assert st.errors >= 1 and st.relists in (1, 2), st
    finally:
        inf.stop()
        proxy.close()
        via.close()


def test_bearer_token_auth_and_no_token_in_errors_or_logs(cluster: Site, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from bridge.errors import AdapterError

    cluster.deployment(0)
    good = cluster.kubeconfig
    secret = yaml.safe_load(good.read_text())["users"][0]["user"]["token"]
    kube = KubeAdapter(api_client_from_config(kubeconfig=str(good)), pools=[cluster.target], identity="t", watch_timeout_s=5)
    try:
        started(kube)
        assert [n.name for n in kube.nodes()] == [cluster.node(i) for i in range(3)]
    finally:
        kube.stop()
    bad = tmp_path / "bad"
    bad.write_text(good.read_text().replace(secret, "wrong-" + secret))
    bad.chmod(0o600)
    denied = KubeAdapter(api_client_from_config(kubeconfig=str(bad)), pools=[cluster.target], identity="t")
    with pytest.raises(AdapterError, match="HTTP 401") as info:
        denied.start()
    assert secret not in str(info.value)
    denied.stop()
    out = capsys.readouterr()
    assert secret not in out.out and secret not in out.err


def test_pools_with_their_own_node_selector(corner: Corner) -> None:
    api, ns = corner.api, corner.name("serving")
    llama, mistral, gpu = corner.name("llama"), corner.name("mistral"), corner.name("h100")
    core = k8s.CoreV1Api(api)
    names = {k: corner.name(k) for k in ("h100-a", "m-b", "both-c", "none-d")}
    for key, labels in (("h100-a", {"gpu": gpu}), ("m-b", {wk.LABEL_POOL: mistral}), ("both-c", {"gpu": gpu, wk.LABEL_POOL: mistral}), ("none-d", {})):
        raw(core.create_node, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": names[key], "labels": labels}})
        corner.nodes.append(names[key])
    seed_deployment(api, ns, "vllm", llama, 0, corner=corner)
    seed_deployment(api, ns, "mistral", mistral, 0, corner=corner)
    pools = [PoolTarget(llama, ns, "vllm", node_selector={"gpu": gpu}), PoolTarget(mistral, ns, "mistral")]
    kube = KubeAdapter(api_client_from_config(kubeconfig=str(corner.kubeconfig)), pools=pools, identity="t", watch_timeout_s=5)
    try:
        started(kube)
        got = {n.name: (n.pool, n.problem) for n in kube.nodes()}
        assert got[names["h100-a"]] == (llama, None) and got[names["m-b"]] == (mistral, None)
        assert got[names["both-c"]][1] == f"node matches the node selectors of several pools: {llama}, {mistral}"
        assert names["none-d"] not in got
        assert kube.fence(names["h100-a"])
        n = kube.node(names["h100-a"])
        assert n is not None and n.fenced and n.pool == llama
    finally:
        kube.stop()


def test_lend_and_return_one_node_through_the_adapter(cluster: Site, kube: KubeAdapter) -> None:
    """The adapter's side of a lend and a return on the real scheduler and controllers: fence +
    cheapest pod + scale down empties exactly that node and nothing lands on it; unfence +
    scale up brings a Ready replica back onto it."""
    pool, ns = cluster.pool, cluster.ns
    cluster.deployment(2)  # gpu-node-2 carries a foreign taint: 0 and 1 serve
    started(kube)
    wait_for(lambda: len([p for p in kube.pods(pool) if p.ready]) == 2, timeout=30, what="2 Ready replicas")
    target = cluster.node(1)
    victim = next(p for p in kube.pods(pool) if p.node == target)

    assert kube.fence(target)
    assert kube.set_pod_deletion_cost(ns, victim.name, -1000)
    assert kube.scale(ns, "vllm", 1)
    assert kube.set_phase(target, Phase.LENDING, "low load", 100.0)
    wait_for(lambda: not any(p.node == target for p in kube.pods(pool)), timeout=20, what="no serving pod left on the lent node")
    assert [p.node for p in kube.pods(pool)] == [cluster.node(0)]
    kube.emit_event(target, "GpuBridgeLent", "lent to Slurm")

    assert kube.unfence(target)
    assert kube.scale(ns, "vllm", 2)
    assert kube.set_phase(target, Phase.RETURNING, "spike", 200.0)
    back = wait_for(
        lambda: next((p for p in kube.pods(pool) if p.node == target and p.ready and not p.terminating), None),
        timeout=30, what="a Ready replica back on the node",
    )
    assert back.name != victim.name
    n = kube.node(target)
    assert n is not None and not n.fenced and not n.unschedulable and n.phase is Phase.RETURNING
