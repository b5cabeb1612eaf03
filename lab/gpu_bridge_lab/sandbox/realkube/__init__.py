"""A real Kubernetes control plane for the sandbox, from binaries built from Go modules by
``scripts/build_kube.sh`` (cached by version outside the checkout): etcd, kube-apiserver
(TLS, ``--authorization-mode=Node,RBAC``, default admission), kube-controller-manager,
kube-scheduler and kwok (the kubelets: node status and Lease heartbeats, pods Ready after the
configured cold start, gone after their termination grace). See docs/real-kubernetes.md.

Started by ``Sandbox(kube=True)`` and ``gpu-bridge sandbox up``; the serving side (nodes, namespace, Deployment, PDB) is created
through the API, and ``deploy/kubernetes/rbac.yaml`` is applied for the daemon's
ServiceAccount, whose bound token (TokenRequest API) goes into ``DIR/kube/kubeconfig-daemon``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpu_bridge_lab.sandbox.realkube.binaries import Binaries, find_binaries, versions
from gpu_bridge_lab.sandbox.realkube.component import RealKubeComponent, parse_kube_args

__all__ = ["Binaries", "RealKubeComponent", "control_plane", "find_binaries", "parse_kube_args", "versions"]


@contextmanager
def control_plane(**kwargs: Any) -> Iterator[Any]:
    """A bare real control plane (no serving side, no Prometheus, no simulator; the sandbox's
    minimal Slurm comes along) in a fresh /tmp directory, for benchmarks and contract tests:
    ``with control_plane() as sb: sb.kubeconfig``."""
    from gpu_bridge_lab.sandbox.cluster import Sandbox

    d = Path(tempfile.mkdtemp(prefix="gbcp-", dir="/tmp"))
    sb = Sandbox(d, kube=True, vllm=False, prometheus=False, nodes=1, **kwargs)
    try:
        sb.up()
        yield sb
    finally:
        sb.down()
        shutil.rmtree(d, ignore_errors=True)
