"""gpu-bridge: lend idle GPU serving nodes to a Slurm preemptible partition and take them back."""

__version__ = "0.1.0"
