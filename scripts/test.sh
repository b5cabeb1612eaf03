#!/usr/bin/env bash
# The README's test command: installs what is missing (scripts/setup.sh), then runs the whole
# suite, unit and integration (real Slurm, Prometheus and the real Kubernetes control plane).
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not integration"`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
bash scripts/setup.sh
# The integration tests mostly wait on daemons (cold starts, grace times, ticks): two workers,
# one test file each at a time (a file's module fixtures stay in one process), each with its own
# sandboxes; GPU_BRIDGE_TEST_WORKERS=0 runs in one process.
workers=${GPU_BRIDGE_TEST_WORKERS:-2}
printf '\033[1m[test]\033[0m running pytest (unit + integration, %s workers)\n' "$workers"
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --durations=20 "$@"
