#!/usr/bin/env bash
# The Kubernetes contract tests (and the adapter's kubectl checks) with Debian 12's kubectl
# (kubernetes-client 1.20.2), the one scripts/setup.sh installs on a fresh bookworm machine
# that has no kubectl. The package is downloaded and unpacked under .cache/, never installed,
# so the machine's own kubectl stays as it is. Needs bookworm's apt sources.
#
#   bash scripts/test_kubectl_debian12.sh [pytest args...]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
dest="$here/.cache/kubectl-debian12"
kubectl="$dest/root/usr/bin/kubectl"
if [[ ! -x "$kubectl" ]]; then
    mkdir -p "$dest"
    (cd "$dest" && apt-get download kubernetes-client=1.20.5+really1.20.2-1.1+deb12u1 2>/dev/null \
        || apt-get download kubernetes-client)
    dpkg -x "$(ls "$dest"/kubernetes-client_*.deb | head -n1)" "$dest/root"
fi
"$kubectl" version --client --short 2>/dev/null || "$kubectl" version --client
export GPU_BRIDGE_KUBECTL="$kubectl" PATH="$dest/root/usr/bin:$PATH"
exec .venv/bin/python -m pytest tests/contract tests/integration/test_kube_adapter.py \
    tests/integration/test_kube_serving_drain.py "$@"
