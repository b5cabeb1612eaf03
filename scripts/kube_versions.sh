# The pinned control-plane release (sourced by build_kube.sh; read by lab/gpu_bridge_lab/sandbox/realkube).
# Change a version here and setup builds it once into its own cache directory.
KUBE_VERSION=${KUBE_VERSION:-1.36.3}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
GPU_BRIDGE_CACHE=${GPU_BRIDGE_CACHE:-/var/cache/gpu-bridge}
KUBE_BIN_DIR=$GPU_BRIDGE_CACHE/kubernetes/v$KUBE_VERSION
ETCD_BIN_DIR=$GPU_BRIDGE_CACHE/etcd/v$ETCD_VERSION
KWOK_BIN_DIR=$GPU_BRIDGE_CACHE/kwok/v$KWOK_VERSION
