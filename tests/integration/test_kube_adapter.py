"""KubeAdapter against the sandbox's Kubernetes API server, through the official client and
a kubeconfig (``load_kube_config`` unchanged): watch cache of nodes/pods/deployment, every
write (phase, fence/unfence, deletion cost, scale, eviction vs PDB, events seen by
``kubectl describe node``), a 409 retried, idempotence costing no request, zero requests per
tick at rest, fail closed (unsynced) when the server goes away."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from bridge import wellknown as wk
from bridge.adapters.kube import EvictOutcome, KubeAdapter, PoolTarget, api_client_from_config
from bridge.model import Phase

from test_kube_adapter_support import TcpProxy, proxied_kubeconfig, raw, seed_deployment, seed_node, seed_pdb, start_server, wait_for

pytestmark = pytest.mark.integration

NS = "serving"
POOL = PoolTarget("llama", NS, "vllm")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Any, Path, k8s.ApiClient]]:
    for server, kubeconfig in start_server(tmp_path):
        api = api_client_from_config(kubeconfig=str(kubeconfig))
        for i in range(3):
            seed_node(api, f"gpu-node-{i}", "llama", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}] if i == 2 else None)
        seed_node(api, "cpu-node", "other-pool")
        yield server, kubeconfig, api
        api.close()


@pytest.fixture
def kube(cluster: tuple[Any, Path, k8s.ApiClient]) -> Iterator[KubeAdapter]:
    _, kubeconfig, _ = cluster
    adapter = KubeAdapter(api_client_from_config(kubeconfig=str(kubeconfig)), pools=[POOL], identity="bridge-test", watch_timeout_s=5, request_timeout_s=3)
    yield adapter
    adapter.stop()


def started(kube: KubeAdapter) -> KubeAdapter:
    kube.start()
    assert kube.wait_synced(10)
    return kube


def test_cache_sees_pool_nodes_only_with_parsed_fields(cluster: tuple[Any, Path, k8s.ApiClient], kube: KubeAdapter) -> None:
    _, _, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 0)
    started(kube)
    nodes = kube.nodes()
    assert [n.name for n in nodes] == ["gpu-node-0", "gpu-node-1", "gpu-node-2"]
    n0 = nodes[0]
    assert (n0.pool, n0.phase, n0.allocatable_gpus, n0.unschedulable, n0.problem) == ("llama", None, 4, False, None)
    d = kube.deployment("llama")
    assert d is not None and d.replicas == 0


def test_writes_reach_the_server_and_the_cache(cluster: tuple[Any, Path, k8s.ApiClient], kube: KubeAdapter) -> None:
    _, _, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 0)
    started(kube)
    core = k8s.CoreV1Api(api)
    assert kube.set_phase("gpu-node-0", Phase.LENDING, "low load", 1_800_000_000.0)
    live = raw(core.read_node, "gpu-node-0")
    assert live["metadata"]["labels"][wk.LABEL_PHASE] == "lending"
    assert live["metadata"]["annotations"][wk.ANNOTATION_PHASE_SINCE] == "1800000000.000"
    assert live["metadata"]["annotations"][wk.ANNOTATION_OWNER] == "bridge-test"
    cached = kube.node("gpu-node-0")
    assert cached is not None and cached.phase is Phase.LENDING and cached.reason == "low load"

    before = kube.calls.total()
    assert not kube.set_phase("gpu-node-0", Phase.LENDING, "low load", 1_800_000_000.0)
    assert kube.calls.total() == before  # idempotent: no request at all

    assert kube.fence("gpu-node-2")
    live = raw(core.read_node, "gpu-node-2")
    assert live["spec"]["unschedulable"]
    assert sorted((t["key"], t["effect"]) for t in live["spec"]["taints"]) == [("dedicated", "NoSchedule"), (wk.TAINT_KEY, "NoSchedule")]
    assert kube.unfence("gpu-node-2")
    live = raw(core.read_node, "gpu-node-2")
    assert not live["spec"].get("unschedulable") and [(t["key"], t["value"]) for t in live["spec"]["taints"]] == [("dedicated", "gpu")]
    assert wk.ANNOTATION_CORDONED not in live["metadata"].get("annotations", {})


def test_unfence_keeps_an_administrators_cordon(cluster: tuple[Any, Path, k8s.ApiClient], kube: KubeAdapter) -> None:
    _, _, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 0)
    core = k8s.CoreV1Api(api)
    raw(core.patch_node, "gpu-node-1", {"spec": {"unschedulable": True}})  # kubectl cordon
    started(kube)
    wait_for(lambda: (n := kube.node("gpu-node-1")) is not None and n.unschedulable, what="cordon seen")
    assert kube.fence("gpu-node-1")
    assert kube.unfence("gpu-node-1")
    live = raw(core.read_node, "gpu-node-1")
    assert live["spec"]["unschedulable"] and not live["spec"].get("taints")


def test_conflict_is_reread_and_retried(cluster: tuple[Any, Path, k8s.ApiClient], kube: KubeAdapter) -> None:
    _, _, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 0)
    started(kube)
    kube._node_infs[0].stop()  # freeze the cache so the next write carries a stale rv
    raw(k8s.CoreV1Api(api).patch_node, "gpu-node-0", {"metadata": {"labels": {"someone": "else"}}})
    assert kube.set_phase("gpu-node-0", Phase.LENT, "lent", 1.0)
    calls = kube.calls.snapshot()
    assert calls[("patch", "nodes")] == 2 and calls[("get", "nodes")] == 1
    assert kube.calls.errors() == {("patch", "nodes", "409"): 1}
    live = raw(k8s.CoreV1Api(api).read_node, "gpu-node-0")
    assert live["metadata"]["labels"]["someone"] == "else" and live["metadata"]["labels"][wk.LABEL_PHASE] == "lent"


def test_pods_scale_eviction_and_deletion_cost(cluster: tuple[Any, Path, k8s.ApiClient], kube: KubeAdapter) -> None:
    _, _, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 2)
    seed_pdb(api, NS, "vllm", {"app": "vllm", "pool": "llama"}, min_available=2)
    started(kube)
    pods = wait_for(lambda: (ps := kube.pods("llama")) and len(ps) == 2 and all(p.ready for p in ps) and ps, timeout=20, what="2 Ready pods")
    assert {p.node for p in pods} <= {"gpu-node-0", "gpu-node-1"}  # gpu-node-2 is tainted
    victim = pods[0]
    assert kube.set_pod_deletion_cost(NS, victim.name, -100)
    wait_for(lambda: (p := next((x for x in kube.pods("llama") if x.name == victim.name), None)) is not None and p.deletion_cost == -100, what="cost in cache")
    assert not kube.set_pod_deletion_cost(NS, victim.name, -100)

    assert kube.evict(NS, victim.name) is EvictOutcome.BLOCKED  # PDB: 2 of 2 needed
    assert kube.evict(NS, "no-such-pod") is EvictOutcome.GONE

    scale = kube.read_scale(NS, "vllm")
    assert scale.replicas == 2
    assert kube.scale(NS, "vllm", 1) and not kube.scale(NS, "vllm", 1)
    wait_for(lambda: (d := kube.deployment("llama")) is not None and d.replicas == 1, what="deployment replicas in cache")
    wait_for(lambda: [p.name for p in kube.pods("llama") if not p.terminating] == [pods[1].name], timeout=20, what="cheapest pod removed")


def test_eviction_allowed_by_the_pdb(cluster: tuple[Any, Path, k8s.ApiClient], kube: KubeAdapter) -> None:
    _, _, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 2)
    seed_pdb(api, NS, "vllm", {"app": "vllm", "pool": "llama"}, min_available=1)
    started(kube)
    pods = wait_for(lambda: (ps := kube.pods("llama")) and len(ps) == 2 and all(p.ready for p in ps) and ps, timeout=20, what="2 Ready pods")
    wait_for(lambda: raw(k8s.PolicyV1Api(api).read_namespaced_pod_disruption_budget, "vllm", NS).get("status", {}).get("disruptionsAllowed", 0) >= 1, what="PDB status")
    assert kube.evict(NS, pods[0].name) is EvictOutcome.EVICTED
    wait_for(lambda: any(p.name == pods[0].name and p.terminating for p in kube.pods("llama")) or all(p.name != pods[0].name for p in kube.pods("llama")), what="evicted pod terminating")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")
def test_events_show_in_kubectl_describe_node(cluster: tuple[Any, Path, k8s.ApiClient], kube: KubeAdapter, tmp_path: Path) -> None:
    _, kubeconfig, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 0)
    started(kube)
    kube.emit_event("gpu-node-1", "GpuBridgeLending", "lend gpu-node-1: forecast peak 1.2 replicas < 3 serving - 1")
    kube.emit_event("gpu-node-1", "GpuBridgeReclaimFailed", "not Ready in 300 s", event_type="Warning")
    home = tmp_path / "home"
    home.mkdir()
    out = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", "describe", "node", "gpu-node-1"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "HOME": str(home)},
    )
    assert out.returncode == 0, out.stderr
    assert "GpuBridgeLending" in out.stdout and "forecast peak 1.2 replicas" in out.stdout
    assert "Warning  GpuBridgeReclaimFailed" in out.stdout


def test_reading_costs_no_request_and_writes_cost_one(cluster: tuple[Any, Path, k8s.ApiClient], kube: KubeAdapter) -> None:
    _, _, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 0)
    started(kube)
    def per_tick_calls() -> dict[tuple[str, str], int]:
        # watches are re-opened on a timer (watch_timeout_s), not per tick: leave them out
        return {k: v for k, v in kube.calls.snapshot().items() if k[0] != "watch"}

    at_rest = per_tick_calls()
    for _ in range(100):  # 100 "ticks" of observation
        kube.nodes()
        kube.pods("llama")
        kube.deployment("llama")
        kube.cache_status()
    assert per_tick_calls() == at_rest
    kube.fence("gpu-node-0")
    after = per_tick_calls()
    assert {k: v - at_rest.get(k, 0) for k, v in after.items() if v != at_rest.get(k, 0)} == {("patch", "nodes"): 1}


def test_cache_goes_unsynced_when_the_server_is_gone(cluster: tuple[Any, Path, k8s.ApiClient], tmp_path: Path) -> None:
    server, kubeconfig, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 0)
    proxy = TcpProxy(server.port)
    via_proxy = proxied_kubeconfig(kubeconfig, proxy.port, tmp_path / "kubeconfig-proxy")
    kube = KubeAdapter(api_client_from_config(kubeconfig=str(via_proxy)), pools=[POOL], identity="bridge-test", watch_timeout_s=5, request_timeout_s=2)
    try:
        started(kube)
        assert kube.cache_status().synced
        proxy.cut()
        wait_for(lambda: not kube.cache_status().synced, timeout=10, what="unsynced after the connection is cut")
        st = kube.cache_status()
        assert any(i.errors > 0 and i.last_error for i in st.informers)
        assert kube.nodes()  # the last known state is still there, but the daemon must not act on it
    finally:
        kube.stop()


def test_watch_resumed_after_compaction_relists(tmp_path: Path) -> None:
    """The server keeps only a few events: an informer that reconnects after a drop with an
    rv older than that gets 410 Gone, re-lists, and ends up with every change."""
    from functools import partial

    from bridge.adapters.kube.calls import ApiCalls
    from bridge.adapters.kube.informer import Informer
    from bridge.adapters.kube.objects import parse_node
    from gpu_bridge_lab.sandbox.kube.server import KubeServer

    with KubeServer(port=0, event_log_size=3) as server:
        kubeconfig = tmp_path / "kubeconfig"
        server.write_kubeconfig(str(kubeconfig))
        api = api_client_from_config(kubeconfig=str(kubeconfig))
        seed_node(api, "gpu-node-0", "llama")
        proxy = TcpProxy(server.port)
        via = api_client_from_config(kubeconfig=str(proxied_kubeconfig(kubeconfig, proxy.port, tmp_path / "kc-proxy")))
        inf = Informer(
            "nodes", "nodes", partial(k8s.CoreV1Api(via).list_node, label_selector=f"{wk.LABEL_POOL}=llama"), parse_node,
            calls=ApiCalls(), watch_timeout_s=30, request_timeout_s=2, backoff_initial_s=1.0,
        )
        try:
            inf.start()
            assert inf.wait_synced(5)
            proxy.outage(1.5)  # drop the watch, refuse reconnects for 1.5 s
            wait_for(lambda: not inf.synced, timeout=5, what="outage noticed")
            for i in range(1, 8):  # more changes than the server remembers
                seed_node(api, f"gpu-node-{i}", "llama")
            wait_for(lambda: len(inf.items()) == 8 and inf.synced, timeout=10, what="all 8 nodes after relist")
            st = inf.status()
            assert st.relists == 2, st
        finally:
            inf.stop()
            proxy.cut()
            via.close()
            api.close()


def test_bearer_token_auth_and_no_token_in_errors_or_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bridge.errors import AdapterError
    from gpu_bridge_lab.sandbox.kube.server import KubeServer

    secret = "s3cr3t-t0ken-value"
    with KubeServer(port=0, token=secret) as server:
        good = server.write_kubeconfig(tmp_path / "good")
        api = api_client_from_config(kubeconfig=str(good))
        seed_node(api, "gpu-node-0", "llama")
        seed_deployment(api, NS, "vllm", "llama", 0)
        kube = KubeAdapter(api_client_from_config(kubeconfig=str(good)), pools=[POOL], identity="t", watch_timeout_s=5)
        try:
            started(kube)
            assert [n.name for n in kube.nodes()] == ["gpu-node-0"]
        finally:
            kube.stop()
        bad = tmp_path / "bad"
        bad.write_text(good.read_text().replace(secret, "wrong-" + secret))
        denied = KubeAdapter(api_client_from_config(kubeconfig=str(bad)), pools=[POOL], identity="t")
        with pytest.raises(AdapterError, match="HTTP 401") as info:
            denied.start()
        assert secret not in str(info.value)
        denied.stop()
        api.close()
    out = capsys.readouterr()
    assert secret not in out.out and secret not in out.err


def test_pools_with_their_own_node_selector(tmp_path: Path) -> None:
    from gpu_bridge_lab.sandbox.kube.server import KubeServer

    with KubeServer(port=0) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kc")
        api = api_client_from_config(kubeconfig=str(kubeconfig))
        core = k8s.CoreV1Api(api)
        for name, labels in (("h100-a", {"gpu": "h100"}), ("m-b", {wk.LABEL_POOL: "mistral"}), ("both-c", {"gpu": "h100", wk.LABEL_POOL: "mistral"}), ("none-d", {})):
            raw(core.create_node, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
        seed_deployment(api, NS, "vllm", "llama", 0)
        seed_deployment(api, NS, "mistral", "mistral", 0)
        pools = [PoolTarget("llama", NS, "vllm", node_selector={"gpu": "h100"}), PoolTarget("mistral", NS, "mistral")]
        kube = KubeAdapter(api_client_from_config(kubeconfig=str(kubeconfig)), pools=pools, identity="t", watch_timeout_s=5)
        try:
            started(kube)
            got = {n.name: (n.pool, n.problem) for n in kube.nodes()}
            assert got["h100-a"] == ("llama", None) and got["m-b"] == ("mistral", None)
            assert got["both-c"][1] == "node matches the node selectors of several pools: llama, mistral"
            assert "none-d" not in got
            assert kube.fence("h100-a")
            n = kube.node("h100-a")
            assert n is not None and n.fenced and n.pool == "llama"
        finally:
            kube.stop()
            api.close()


def test_lend_and_return_one_node_through_the_adapter(cluster: tuple[Any, Path, k8s.ApiClient], kube: KubeAdapter) -> None:
    """The adapter's side of a lend and a return on the sandbox's scheduler and controllers:
    fence + cheapest pod + scale down empties exactly that node and nothing lands on it; unfence
    + scale up brings a Ready replica back onto it."""
    _, _, api = cluster
    seed_deployment(api, NS, "vllm", "llama", 2)  # gpu-node-2 carries a foreign taint: 0 and 1 serve
    started(kube)
    wait_for(lambda: len([p for p in kube.pods("llama") if p.ready]) == 2, timeout=20, what="2 Ready replicas")
    target = "gpu-node-1"
    victim = next(p for p in kube.pods("llama") if p.node == target)

    assert kube.fence(target)
    assert kube.set_pod_deletion_cost(NS, victim.name, -1000)
    assert kube.scale(NS, "vllm", 1)
    assert kube.set_phase(target, Phase.LENDING, "low load", 100.0)
    wait_for(lambda: not any(p.node == target for p in kube.pods("llama")), timeout=20, what="no serving pod left on the lent node")
    assert [p.node for p in kube.pods("llama")] == ["gpu-node-0"]
    kube.emit_event(target, "GpuBridgeLent", "lent to Slurm")

    assert kube.unfence(target)
    assert kube.scale(NS, "vllm", 2)
    assert kube.set_phase(target, Phase.RETURNING, "spike", 200.0)
    back = wait_for(
        lambda: next((p for p in kube.pods("llama") if p.node == target and p.ready and not p.terminating), None),
        timeout=20, what="a Ready replica back on the node",
    )
    assert back.name != victim.name
    n = kube.node(target)
    assert n is not None and not n.fenced and not n.unschedulable and n.phase is Phase.RETURNING
