#!/usr/bin/env bash
# The README's test command: installs what is missing (scripts/setup.sh), then runs the whole
# suite, unit and integration (real Slurm, Prometheus and the real Kubernetes control plane).
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not integration"`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
bash scripts/setup.sh
printf '\033[1m[test]\033[0m running pytest (unit + integration)\n'
exec .venv/bin/python -m pytest --durations=20 "$@"
