#!/usr/bin/env python3
"""Kubernetes API calls per tick: proportional to changes, not to nodes.

Starts a real control plane (gpu_bridge_lab.sandbox.realkube: kube-apiserver, controllers,
scheduler, kwok), seeds N pool nodes, starts the real KubeAdapter
(watch cache), then runs ticks that read every node and pod (as the daemon's observe step
does) and change C nodes per tick (set_phase + fence or unfence). Prints the API requests
per tick by verb/resource for each N, and the time a cache read of all nodes takes:

    .venv/bin/python scripts/bench_kube_calls.py [--nodes 10,100,400] [--changes 2] [--ticks 20]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kubernetes import client as k8s

from bridge import logs
from bridge import wellknown as wk
from bridge.adapters.kube.client import KubeAdapter, api_client_from_config
from bridge.adapters.protocols import PoolTarget
from bridge.model import Phase


def seed(api: k8s.ApiClient, n: int) -> None:
    core = k8s.CoreV1Api(api)
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "serving"}})
    except k8s.exceptions.ApiException as e:
        if e.status != 409:
            raise
    k8s.AppsV1Api(api).create_namespaced_deployment("serving", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm", "namespace": "serving"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "vllm"}},
                 "template": {"metadata": {"labels": {"app": "vllm"}}, "spec": {"containers": [{"name": "vllm", "image": "x"}]}}},
    })
    for i in range(n):
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-node-{i:04d}", "labels": {wk.LABEL_POOL: "llama"}}})


def run(n: int, changes: int, ticks: int) -> None:
    from gpu_bridge_lab.sandbox.realkube import control_plane

    with control_plane() as sb:
        measure(sb.kubeconfig, n, changes, ticks)


def measure(kubeconfig: Path, n: int, changes: int, ticks: int) -> None:
    seeder = api_client_from_config(kubeconfig=str(kubeconfig))
    seed(seeder, n)
    kube = KubeAdapter(api_client_from_config(kubeconfig=str(kubeconfig)), pools=[PoolTarget("llama", "serving", "vllm")], identity="bench")
    t0 = time.perf_counter()
    kube.start()
    assert kube.wait_synced(60), "cache never synced"
    sync_s = time.perf_counter() - t0
    base = kube.calls.snapshot()
    read_s = 0.0
    for tick in range(ticks):
        r0 = time.perf_counter()
        nodes = kube.nodes()
        kube.pods("llama")
        kube.deployment("llama")
        read_s += time.perf_counter() - r0
        for j in range(changes):
            name = nodes[(tick * changes + j) % len(nodes)].name
            kube.set_phase(name, Phase.LENDING, "bench", float(tick))
            if tick % 2 == 0:
                kube.fence(name)
            else:
                kube.unfence(name)
    after = kube.calls.snapshot()
    delta = {f"{v} {r}": after[(v, r)] - base.get((v, r), 0) for (v, r) in sorted(after) if after[(v, r)] != base.get((v, r), 0)}
    per_tick = sum(delta.values()) / ticks
    print(f"nodes={n:5d} changes/tick={changes} ticks={ticks}: {per_tick:5.2f} API calls/tick {delta}; "
          f"initial sync {sync_s * 1000:.0f} ms ({sum(base.values())} calls); cache read of all nodes+pods {read_s / ticks * 1e6:.0f} us/tick")
    kube.stop()
    seeder.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="10,100,400", help="comma-separated pool sizes")
    ap.add_argument("--changes", type=int, default=2, help="nodes changed per tick")
    ap.add_argument("--ticks", type=int, default=20)
    args = ap.parse_args()
    logs.configure(json=False, level="warning")
    for n in (int(x) for x in args.nodes.split(",")):
        run(n, args.changes, args.ticks)


if __name__ == "__main__":
    main()
