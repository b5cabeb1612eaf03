"""Kubernetes adapter: watch-cache reads and intent-level writes over the official client.

``KubeReader``/``KubeWriter`` (``bridge.adapters.protocols``) are the contract; ``client.KubeAdapter`` the real implementation;
``gpu_bridge_lab.fakes.kube.FakeKube`` an in-memory one that enforces the same rules. ``lease``: the leader election on a Lease.
"""
