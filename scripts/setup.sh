#!/usr/bin/env bash
# Installs everything gpu-bridge needs on a Debian 12/13 machine (run as root), idempotently:
# the Debian packages of the local sandbox (munge, Slurm, Prometheus, kubectl; systemd-nspawn
# and debootstrap for the tests that boot a real systemd and run Debian 13's Slurm 24.11 in
# cached Debian trees, built on first use: `python -m gpu_bridge_lab.sandbox.nspawn build` builds them
# ahead; chromium and chromium-driver for the browser test of `gpu-bridge web`) and a virtualenv at .venv with the project and its test extras. Safe to run again.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

need_pkgs=()
for pair in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client \
            prometheus:prometheus promtool:prometheus systemd-analyze:systemd openssl:openssl \
            systemd-nspawn:systemd-container debootstrap:debootstrap \
            chromium:chromium chromedriver:chromium-driver; do
    cmd=${pair%%:*}; pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || need_pkgs+=("$pkg")
done
command -v kubectl >/dev/null 2>&1 || need_pkgs+=(kubernetes-client)
py=""
for cand in python3.13 python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        py=$(command -v "$cand"); break
    fi
done
[ -n "$py" ] || need_pkgs+=(python3)
if [ -n "$py" ] && ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then need_pkgs+=(python3-venv); fi

if [ ${#need_pkgs[@]} -gt 0 ]; then
    # shellcheck disable=SC2207
    uniq_pkgs=($(printf '%s\n' "${need_pkgs[@]}" | sort -u))
    say "installing Debian packages: ${uniq_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # slurm-wlm-emulator must never be installed: it replaces the real daemons.
    apt-get install -y -qq --no-install-recommends "${uniq_pkgs[@]}" >/dev/null
else
    say "Debian packages already present (munge, Slurm, Prometheus, kubectl)"
fi
if [ -z "$py" ]; then py=$(command -v python3); fi

if [ ! -x .venv/bin/python ]; then
    say "creating virtualenv .venv with $("$py" --version)"
    "$py" -m venv .venv
fi
stamp=.venv/.gpu-bridge-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ lab/pyproject.toml -nt "$stamp" ]; then
    say "installing gpu-bridge (with its test and plot extras) and its lab into .venv (pip)"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e '.[test,plot]'
    # the lab (sandbox, demo, fakes, fault injection): tests and the demo need it, operators do not
    .venv/bin/python -m pip install -q -e ./lab
    touch "$stamp"
else
    say "virtualenv .venv is up to date"
fi
# The sandbox's real Kubernetes control plane, built from Go modules and cached by version
# outside the checkout (a no-op when cached; the first build takes 20-40 min on 2 cores).
bash "$here/scripts/build_kube.sh"
say "ready: $(.venv/bin/gpu-bridge --version)"
