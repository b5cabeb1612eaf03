"""A throw-away self-signed certificate for the server (kubectl sends a bearer token only
over TLS), made with the openssl command line so no extra Python dependency is needed."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from bridge.errors import SandboxError


def self_signed(host: str, directory: Path | None = None) -> tuple[Path, Path]:
    """(cert, key) PEM files for ``host`` (an IP or DNS name) valid for 30 days."""
    d = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="gpu-bridge-kube-tls-"))
    cert, key = d / "apiserver.crt", d / "apiserver.key"
    san = f"IP:{host}" if host.replace(".", "").isdigit() or ":" in host else f"DNS:{host}"
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "30", "-subj", "/CN=gpu-bridge-sandbox-apiserver",
            "-addext", f"subjectAltName={san},DNS:localhost,IP:127.0.0.1"]
    try:
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"kube tls: openssl could not make a certificate: {exc}") from exc
    return cert, key
