"""Names gpu-bridge puts into Slurm's argv and job names: node names and job ids.

Pure (no I/O): the join holds a node whose name could never be passed to Slurm, and the Slurm
adapter refuses to run a command with one. An invalid name raises AdapterError naming it.
"""

from __future__ import annotations

import re

from bridge.errors import AdapterError

# matched whole (fullmatch): "$" also matches before a trailing newline
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_JOB_ID = re.compile(r"[0-9]{1,12}(_[0-9]{1,9})?")


def validate_node_name(name: object) -> str:
    """A node name safe to put in argv and in a job name; AdapterError naming the problem."""
    if not isinstance(name, str):
        raise AdapterError("slurm", f"node name: expected a string, got {type(name).__name__}")
    if not _NODE_NAME.fullmatch(name):
        shown = name[:80] + ("..." if len(name) > 80 else "")
        raise AdapterError(
            "slurm", f"node name {shown!r}: invalid (letters, digits, '.', '_', '-'; at most 63 characters)"
        )
    return name


def validate_job_id(job_id: object) -> str:
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        job_id = str(job_id)
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise AdapterError("slurm", f"job id {str(job_id)[:40]!r}: invalid (digits, optionally _TASK)")
    return job_id
