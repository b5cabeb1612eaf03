"""Contract tests of the Kubernetes API: real kubectl (subprocesses, each test with its own
HOME so kubectl's discovery cache is private) and the official client.

By default they run against an in-process ``KubeServer(port=0)``; with ``GPU_BRIDGE_KUBE=real``
against a real control plane started for the session (gpu_bridge_lab.sandbox.realkube) and the kubectl
built with it. Set
``GPU_BRIDGE_CONTRACT_KUBECONFIG=1`` and ``KUBECONFIG`` to run them against a real cluster
instead: every test then works in its own namespace and on Node objects it creates itself
(names prefixed ``c<6 hex>-``), and the few tests that need the sandbox (compaction,
token auth, fake kubelet timing) skip."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube_contract import Kube, Serving, make_node, serving_objects, wait_for


@pytest.fixture(scope="session")
def real_control_plane() -> Iterator[Path | None]:
    """With GPU_BRIDGE_KUBE=real: one real control plane (etcd, kube-apiserver, controllers,
    kwok; gpu_bridge_lab.sandbox.realkube) for the session; its admin kubeconfig."""
    if os.environ.get("GPU_BRIDGE_KUBE", "real") != "real" or os.environ.get("GPU_BRIDGE_CONTRACT_KUBECONFIG"):
        yield None
        return
    import shutil
    import tempfile

    from gpu_bridge_lab.sandbox.cluster import Sandbox

    d = Path(tempfile.mkdtemp(prefix="gbkc-", dir="/tmp"))
    sb = Sandbox(d, kube=True, kube_impl="real", vllm=False, prometheus=False, nodes=1)
    try:
        sb.up()
        yield sb.kubeconfig
    finally:
        sb.down()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kube(tmp_path: Path, real_control_plane: Path | None) -> Iterator[Kube]:
    home = tmp_path / "home"
    home.mkdir()
    if os.environ.get("GPU_BRIDGE_CONTRACT_KUBECONFIG") or real_control_plane is not None:
        kc = real_control_plane or Path(os.environ["KUBECONFIG"])
        k = Kube(kc, home)
        try:
            yield k
        finally:
            k.close()
        return
    from gpu_bridge_lab.sandbox.kube import KubeServer

    with KubeServer(port=0, pod_start_delay_s=0.3, pod_stop_s=0.5, bookmark_interval_s=0.3) as server:
        kc = server.write_kubeconfig(tmp_path / "kubeconfig")
        k = Kube(kc, home, server)
        try:
            yield k
        finally:
            k.close()


@pytest.fixture
def serving(kube: Kube) -> Iterator[Serving]:
    """Serving nodes with one vLLM replica each plus one spare GPU node, a PDB
    (maxUnavailable 1), all Ready; made through the API so it works on any cluster."""
    client, api = kube.client()
    core, apps, policy = client.CoreV1Api(api), client.AppsV1Api(api), client.PolicyV1Api(api)
    ns, pool = kube.name("serving"), kube.name("pool")
    nodes = [kube.name(f"gpu-node-{i:02d}") for i in range(1, 5)]
    core.create_namespace({"metadata": {"name": ns}})
    for n in nodes:
        make_node(core, client, n, {"gpu-bridge.io/pool": pool})
    dep, pdb = serving_objects(ns, pool, replicas=3)
    apps.create_namespaced_deployment(ns, dep)
    policy.create_namespaced_pod_disruption_budget(ns, pdb)
    s = Serving(ns, pool, nodes, core, apps, policy, client)
    wait_for(lambda: len(s.ready_pods()) == 3, 20, "3 Ready vLLM pods")
    wait_for(lambda: (policy.read_namespaced_pod_disruption_budget(  # noqa: E731
        "vllm", ns).status.disruptions_allowed or 0) == 1, 10, "the PDB to allow one disruption")
    try:
        yield s
    finally:
        for n in nodes:
            try:
                core.delete_node(n)
            except Exception:  # noqa: BLE001 - cleanup of a real cluster is best effort
                pass
        try:
            core.delete_namespace(ns)
        except Exception:  # noqa: BLE001
            pass
