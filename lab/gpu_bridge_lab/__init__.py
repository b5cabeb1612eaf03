"""gpu-bridge's lab: what tests, demos and measurements need and an operator never installs.

The local sandbox (real Slurm, Prometheus and a Kubernetes control plane on loopback), the vLLM
simulator, the demo, in-memory fakes of the adapters, crash injection and the reliability
harnesses. It registers ``gpu-bridge sandbox`` and ``gpu-bridge demo`` through the
``gpu_bridge.commands`` entry-point group; the product never imports it.
"""
