#!/usr/bin/env bash
# The README's main command: installs what is missing, then runs the demo on a local sandbox.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
bash scripts/setup.sh
exec .venv/bin/gpu-bridge demo "$@"
