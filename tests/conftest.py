"""Shared pytest set-up. Integration tests are marked ``integration`` and start real daemons."""

from sandbox_fixtures import kube_plane, sandbox_dir, slurm2411_clean, slurm2411_sandbox, slurm_clean, slurm_sandbox  # noqa: E402,F401  (shared sandbox fixtures, tests/sandbox_fixtures.py)
