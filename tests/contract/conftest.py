"""Contract tests of the Kubernetes API: real kubectl (subprocesses, each test with its own
HOME so kubectl's discovery cache is private) and the official client, against the session's
real control plane (``kube_plane``: gpu_bridge_lab.sandbox.realkube) and the kubectl built with
it. Set ``GPU_BRIDGE_CONTRACT_KUBECONFIG=1`` and ``KUBECONFIG`` to run them against another
cluster instead. Either way every test works in its own namespace and on Node objects it
creates itself (names prefixed ``c<6 hex>-``); the few tests that need the sandbox's plane
(its token file, kwok's timing) skip elsewhere."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_contract import BookmarkWatch, Kube, Serving, make_node, serving_objects, wait_for


@pytest.fixture(scope="session")
def contract_plane(request: pytest.FixtureRequest) -> Any:
    """The sandbox's real control plane (shared with the other Kubernetes tests), or None
    when GPU_BRIDGE_CONTRACT_KUBECONFIG points the tests at another cluster."""
    if os.environ.get("GPU_BRIDGE_CONTRACT_KUBECONFIG"):
        return None
    return request.getfixturevalue("kube_plane")


@pytest.fixture
def kube(tmp_path: Path, contract_plane: Any) -> Iterator[Kube]:
    home = tmp_path / "home"
    home.mkdir()
    kc = Path(contract_plane.kubeconfig) if contract_plane is not None else Path(os.environ["KUBECONFIG"])
    k = Kube(kc, home, contract_plane)
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


@pytest.fixture(scope="session", autouse=True)
def bookmark_watch(contract_plane: Any) -> Iterator[BookmarkWatch]:
    """Opened with the first contract test; tests/contract/test_watch_bookmarks.py checks it."""
    kubeconfig = str(contract_plane.kubeconfig) if contract_plane is not None else os.environ["KUBECONFIG"]
    w = BookmarkWatch(kubeconfig)
    yield w
    w.close()
