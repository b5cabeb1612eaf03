"""The local sandbox's real daemons: munged, slurmctld + one slurmd per node, Prometheus
(and, as subprocesses, the vLLM simulator and the Kubernetes API server). See docs/sandbox.md.

`gpu-bridge sandbox up | down | status`; Python API: ``Sandbox``.
"""

from gpu_bridge_lab.sandbox.cluster.cli import register_cli
from gpu_bridge_lab.sandbox.cluster.sandbox import DEFAULT_DIR, Sandbox

__all__ = ["DEFAULT_DIR", "Sandbox", "register_cli"]
