#!/usr/bin/env python3
"""Benchmark the sandbox Kubernetes API server at the daemon's scale: 2,000 nodes and
10,000 pods. Prints list / watch / patch throughput (numbers, no assertions).

    .venv/bin/python scripts/bench_kube_api.py [--nodes 2000] [--pods 10000] [--patches 2000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import resource
import threading
import time
from typing import Any

from gpu_bridge_lab.sandbox.kube import KubeServer
from gpu_bridge_lab.sandbox.kube import resources as R
from gpu_bridge_lab.sandbox.kube.defaults import on_create
from gpu_bridge_lab.sandbox.kube.serving_model import node_object


def _pod(i: int, node: str) -> dict[str, Any]:
    ts = "2026-01-01T00:00:00Z"
    body = {"metadata": {"name": f"vllm-{i:05d}", "namespace": "serving", "labels": {"app": "vllm", "shard": str(i % 10)}},
            "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
                                                       "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}
    on_create(R.core("pods"), body)
    body["status"] = {"phase": "Running", "podIP": f"10.1.{i // 250}.{i % 250}", "startTime": ts,
                      "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ts}],
                      "containerStatuses": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6.3", "imageID": "",
                                             "ready": True, "started": True, "restartCount": 0,
                                             "state": {"running": {"startedAt": ts}}}]}
    return body


class Conn:
    def __init__(self, port: int) -> None:
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def req(self, method: str, path: str, body: Any = None, ct: str = "application/json") -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        self.c.request(method, path, body=data, headers={"Content-Type": ct, "Accept": "application/json"})
        r = self.c.getresponse()
        return r.status, r.read()


def timed(label: str, n: int, fn: Any, unit: str = "req") -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t0
    print(f"{label:<58} {n:>6} {unit:<5} {dt:8.3f} s  {n / dt:10.1f} {unit}/s  ({dt / n * 1000:.2f} ms each)")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--patches", type=int, default=2000)
    args = ap.parse_args()
    with KubeServer(port=0, event_log_size=200_000) as server:
        store = server.store
        t0 = time.perf_counter()
        store.bulk_load(R.core("nodes"), (node_object(f"gpu-node-{i:04d}", "bench", 4, i % 250)
                                         for i in range(1, args.nodes + 1)))
        store.create(R.core("namespaces"), {"metadata": {"name": "serving"}})
        store.bulk_load(R.core("pods"), (_pod(i, f"gpu-node-{i % args.nodes + 1:04d}") for i in range(args.pods)))
        assert server.controllers is not None
        server.controllers.wait_idle(120)
        print(f"loaded {args.nodes} nodes + {args.pods} pods in {time.perf_counter() - t0:.2f} s "
              f"(incl. controllers settling); rv={store.rv}")
        c = Conn(server.port)
        size = {}

        def lst(path: str) -> Any:
            def go() -> None:
                code, body = c.req("GET", path)
                assert code == 200, body[:200]
                size[path] = len(body)
            return go
        timed(f"LIST nodes ({args.nodes})", 20, lst("/api/v1/nodes"))
        print(f"{'':<58} response {size['/api/v1/nodes'] / 1e6:.1f} MB")
        timed(f"LIST pods all namespaces ({args.pods})", 5, lst("/api/v1/pods"))
        print(f"{'':<58} response {size['/api/v1/pods'] / 1e6:.1f} MB")
        timed("LIST pods fieldSelector=spec.nodeName=N (drain's list)", 200,
              lst("/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-0007&limit=500"))
        timed("LIST pods labelSelector=app=vllm,shard in (3) ", 20,
              lst("/api/v1/namespaces/serving/pods?labelSelector=app%3Dvllm%2Cshard+in+%283%29"))
        def paged() -> None:
            cont = ""
            while True:
                code, body = c.req("GET", "/api/v1/pods?limit=500" + (f"&continue={cont}" if cont else ""))
                cont = json.loads(body)["metadata"].get("continue", "")
                if not cont:
                    return
        timed(f"LIST pods paged limit=500 (all {args.pods})", 3, paged, "list")
        timed("GET one node", 2000, lst("/api/v1/nodes/gpu-node-0042"))

        # PATCH throughput (strategic merge on node labels, as the daemon writes phases)
        names = [f"gpu-node-{i % args.nodes + 1:04d}" for i in range(args.patches)]
        it = iter(range(args.patches))

        def patch_node() -> None:
            i = next(it)
            code, body = c.req("PATCH", f"/api/v1/nodes/{names[i]}",
                               {"metadata": {"labels": {"gpu-bridge.io/phase": f"p{i}"}}},
                               "application/strategic-merge-patch+json")
            assert code == 200, body[:200]

        # a live watch on nodes, to count the events that arrive while patching
        got = {"n": 0, "t_last": 0.0}
        rv = store.rv
        ready = threading.Event()

        def watcher() -> None:
            wc = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
            wc.request("GET", f"/api/v1/nodes?watch=true&resourceVersion={rv}&timeoutSeconds=120")
            r = wc.getresponse()
            ready.set()
            while got["n"] < args.patches:
                line = r.readline()
                if not line:
                    break
                if line.strip():
                    got["n"] += 1
                    got["t_last"] = time.perf_counter()
            wc.close()
        wt = threading.Thread(target=watcher, daemon=True)
        wt.start()
        ready.wait(10)
        t_start = time.perf_counter()
        timed("PATCH node (strategic merge, label), 1 client", args.patches, patch_node)
        wt.join(60)
        dt = got["t_last"] - t_start
        print(f"{'WATCH nodes: events received during the patches':<58} {got['n']:>6} ev    {dt:8.3f} s  "
              f"{got['n'] / dt if dt > 0 else 0:10.1f} ev/s")

        # watch replay: rv=0 sends every pod as ADDED
        def replay() -> None:
            wc = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
            wc.request("GET", "/api/v1/pods?watch=true&resourceVersion=0&timeoutSeconds=1")
            r = wc.getresponse()
            n = sum(1 for line in r if line.strip())
            assert n >= args.pods, n
            wc.close()
        t0 = time.perf_counter()
        replay()
        dt = time.perf_counter() - t0 - 1.0  # the stream stays open until timeoutSeconds=1
        print(f"{'WATCH pods from rv=0 (replay of every pod as ADDED)':<58} {args.pods:>6} ev    {max(dt, 1e-3):8.3f} s  "
              f"{args.pods / max(dt, 1e-3):10.1f} ev/s")

        # pod status patches with 4 concurrent clients (kubelet-like load)
        per = args.patches // 4

        def worker(k: int) -> None:
            wc = Conn(server.port)
            for j in range(per):
                code, _ = wc.req("PATCH", f"/api/v1/namespaces/serving/pods/vllm-{(k * per + j) % args.pods:05d}",
                                 {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": str(j)}}},
                                 "application/merge-patch+json")
                assert code == 200
        t0 = time.perf_counter()
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        print(f"{'PATCH pod (merge, annotation), 4 clients':<58} {per * 4:>6} req   {dt:8.3f} s  "
              f"{per * 4 / dt:10.1f} req/s")
        c.c.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of the benchmark process (server + client): {rss:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
