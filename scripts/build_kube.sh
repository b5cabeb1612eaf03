#!/usr/bin/env bash
# Builds the sandbox's real Kubernetes control plane from Go modules, with the machine's `go`
# and its module proxy only (nothing else is downloaded): kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl of one pinned release (k8s.io/kubernetes,
# its staging modules pinned to the same release), etcd and kwok. The binaries are cached
# outside the checkout, by version, under ${GPU_BRIDGE_CACHE:-/var/cache/gpu-bridge}, so a fresh
# clone and CI reuse them; when they are there this script does nothing.
# Why a wrapper module: k8s.io/kubernetes requires its staging modules at v0.0.0 and maps them
# to ./staging with replace lines, which a dependency's go.mod cannot use; the wrapper pins each
# one to v0.X.Y, with the list generated from the release's own go.mod (kubernetes#79384).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/kube_versions.sh
. "$here/scripts/kube_versions.sh"
say() { printf '\033[1m[build-kube]\033[0m %s\n' "$*"; }

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
command -v go >/dev/null 2>&1 || { say "go is not installed: cannot build the control plane"; exit 1; }
work=${GPU_BRIDGE_BUILD_DIR:-$GPU_BRIDGE_CACHE/build}
nice_cmd=(nice -n 19)
built_any=0

build_kubernetes() {
    local out=$KUBE_BIN_DIR v=$KUBE_VERSION minor
    if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ] \
        && [ -x "$out/kube-scheduler" ] && [ -x "$out/kubectl" ]; then
        say "Kubernetes v$v: cached in $out"; return 0
    fi
    minor=$(echo "$v" | cut -d. -f2)
    local t0=$SECONDS dir=$work/kubernetes-v$v
    say "building Kubernetes v$v (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl) in $dir; the first build takes 20-40 min on 2 cores"
    rm -rf "$dir"; mkdir -p "$dir" "$out.tmp"
    cd "$dir"
    go mod init local/k8sbins >/dev/null 2>&1
    go mod download -json "k8s.io/kubernetes@v$v" >/dev/null
    local mod
    mod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$v.mod
    # Each staging module (mapped to ./staging in the release's go.mod) pinned to v0.X.Y.
    sed -n "s#^[[:space:]]*\(k8s.io/[A-Za-z0-9._-]*\) => \./staging/.*#replace \1 => \1 v0.${v#1.}#p" \
        "$mod" >>go.mod
    [ "$(grep -c '^replace' go.mod)" -gt 20 ] || { say "no staging modules found in $mod"; exit 1; }
    local cmds=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
                k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
    # go get of the packages themselves (not just the module) records every go.sum entry they need.
    go get "${cmds[@]/%/@v$v}"
    "${nice_cmd[@]}" go build -trimpath -o "$out.tmp/" -ldflags "-s -w \
        -X k8s.io/component-base/version.gitVersion=v$v \
        -X k8s.io/component-base/version.gitMajor=1 \
        -X k8s.io/component-base/version.gitMinor=$minor \
        -X k8s.io/component-base/version.gitTreeState=clean" \
        "${cmds[@]}"
    rm -rf "$out"; mv "$out.tmp" "$out"
    say "Kubernetes v$v built in $((SECONDS - t0)) s"
    built_any=1
}

# One Go binary from one module: build_go_binary NAME VERSION OUT_DIR MODULE PACKAGE
build_go_binary() {
    local name=$1 v=$2 out=$3 module=$4 pkg=$5
    if [ -x "$out/$name" ]; then say "$name v$v: cached in $out"; return 0; fi
    local t0=$SECONDS dir=$work/$name-v$v
    say "building $name v$v in $dir"
    rm -rf "$dir"; mkdir -p "$dir" "$out.tmp"
    cd "$dir"
    go mod init "local/${name}bin" >/dev/null 2>&1
    go get "$module@v$v"
    "${nice_cmd[@]}" go build -trimpath -ldflags "-s -w" -o "$out.tmp/$name" "$pkg"
    rm -rf "$out"; mv "$out.tmp" "$out"
    say "$name v$v built in $((SECONDS - t0)) s"
    built_any=1
}

build_etcd() {
    build_go_binary etcd "$ETCD_VERSION" "$ETCD_BIN_DIR" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3
}

build_kwok() {
    build_go_binary kwok "$KWOK_VERSION" "$KWOK_BIN_DIR" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwok
}

t_all=$SECONDS
mkdir -p "$work"
case "${1:-all}" in
    all) build_etcd; build_kwok; build_kubernetes ;;
    etcd) build_etcd ;;
    kwok) build_kwok ;;
    kubernetes) build_kubernetes ;;
    *) say "usage: $0 [all|etcd|kwok|kubernetes]"; exit 2 ;;
esac
if [ "$built_any" = 1 ]; then
    say "control plane built in $((SECONDS - t_all)) s (cache: $GPU_BRIDGE_CACHE)"
fi
