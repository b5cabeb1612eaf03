"""Where the control plane's binaries are: ``$GPU_BRIDGE_CACHE`` (default
/var/cache/gpu-bridge)/{kubernetes,etcd,kwok}/v<version>/, the versions pinned in
``scripts/kube_versions.sh`` (one source; read here, sourced by build_kube.sh)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import SandboxError

ROOT = Path(__file__).resolve().parents[4]
VERSIONS_FILE = ROOT / "scripts" / "kube_versions.sh"
_DEFAULT = re.compile(r"^(KUBE_VERSION|ETCD_VERSION|KWOK_VERSION)=\$\{\1:-([0-9][0-9A-Za-z.+-]*)\}\s*$")


def versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """The pinned versions (``KUBE_VERSION``, ``ETCD_VERSION``, ``KWOK_VERSION``); the same
    environment variables override them, as they do for build_kube.sh."""
    try:
        text = path.read_text()
    except OSError as e:
        raise SandboxError(f"kube: cannot read the pinned versions in {path}: {e}") from None
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _DEFAULT.match(line.strip())
        if m:
            out[m.group(1)] = os.environ.get(m.group(1)) or m.group(2)
    missing = {"KUBE_VERSION", "ETCD_VERSION", "KWOK_VERSION"} - set(out)
    if missing:
        raise SandboxError(f"kube: {path} pins no {', '.join(sorted(missing))}")
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("GPU_BRIDGE_CACHE") or "/var/cache/gpu-bridge")


@dataclass(frozen=True, slots=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    kube_version: str


def find_binaries() -> Binaries:
    """The cached binaries of the pinned versions; a clear error naming the missing ones and
    the command that builds them."""
    v = versions()
    c = cache_dir()
    k = c / "kubernetes" / f"v{v['KUBE_VERSION']}"
    b = Binaries(
        etcd=c / "etcd" / f"v{v['ETCD_VERSION']}" / "etcd",
        kube_apiserver=k / "kube-apiserver",
        kube_controller_manager=k / "kube-controller-manager",
        kube_scheduler=k / "kube-scheduler",
        kubectl=k / "kubectl",
        kwok=c / "kwok" / f"v{v['KWOK_VERSION']}" / "kwok",
        kube_version=v["KUBE_VERSION"],
    )
    missing = [str(p) for p in (b.etcd, b.kube_apiserver, b.kube_controller_manager, b.kube_scheduler, b.kubectl,
                                b.kwok) if not os.access(p, os.X_OK)]
    if missing:
        raise SandboxError("kube: the real control plane is not built (missing " + ", ".join(missing)
                           + "): run scripts/build_kube.sh (scripts/setup.sh does)")
    return b
