"""The Slurm adapter: the CLI backend of the Protocols in ``bridge.adapters.protocols``.

    slurm = CliSlurm(env={"SLURM_CONF": "/tmp/gpu-bridge-sandbox/etc/slurm.conf"})
    for n in slurm.nodes(): ...
    slurm.submit_hold("gpu-node-03")
"""

from bridge.names import validate_job_id, validate_node_name

from .cli import CliSlurm, CommandResult, CommandRunner, NotOursError, SubprocessRunner, drain_reason, hold_job_name
from .hostlist import expand
from .parse import checkpoint_time, gpu_count, parse_jobs, parse_nodes
from ..protocols import SlurmAdapterProtocol, SlurmReader, SlurmWriter
from .types import SlurmJobInfo, SlurmNode

__all__ = [
    "CliSlurm", "CommandResult", "CommandRunner", "NotOursError", "SlurmAdapterProtocol", "SlurmJobInfo",
    "SlurmNode", "SlurmReader", "SlurmWriter", "SubprocessRunner", "checkpoint_time", "drain_reason", "expand",
    "gpu_count", "hold_job_name", "parse_jobs", "parse_nodes", "validate_job_id", "validate_node_name",
]
