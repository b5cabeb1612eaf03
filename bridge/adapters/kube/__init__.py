"""Kubernetes adapter: watch-cache reads and intent-level writes over the official client.

``KubeReader``/``KubeWriter`` (``bridge.adapters.protocols``) are the contract; ``KubeAdapter`` the real implementation;
``gpu_bridge_lab.fakes.kube.FakeKube`` an in-memory one that enforces the same rules.
"""

from .calls import ApiCalls, KubeApiError, KubeConflictError
from .client import KubeAdapter, api_client_from_config
from .informer import InformerStatus
from .objects import DeploymentInfo, EvictOutcome, NodeInfo, PodInfo, ScaleInfo, Taint, parse_deployment, parse_node, parse_pod, parse_scale
from ..protocols import CacheStatus, KubeAdapterProtocol, KubeReader, KubeWriter, PoolTarget

__all__ = [
    "ApiCalls",
    "CacheStatus",
    "DeploymentInfo",
    "EvictOutcome",
    "InformerStatus",
    "KubeAdapter",
    "KubeAdapterProtocol",
    "KubeApiError",
    "KubeConflictError",
    "KubeReader",
    "KubeWriter",
    "NodeInfo",
    "PodInfo",
    "PoolTarget",
    "ScaleInfo",
    "Taint",
    "api_client_from_config",
    "parse_deployment",
    "parse_node",
    "parse_pod",
    "parse_scale",
]
