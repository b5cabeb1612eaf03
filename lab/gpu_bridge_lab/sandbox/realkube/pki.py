"""Keys and certificates of the sandbox's control plane, made with the openssl CLI (argv
lists only): a CA, the apiserver's serving certificate for 127.0.0.1/localhost, the
ServiceAccount signing key, and random bearer tokens for the components' static identities.
EC P-256 keys: generated in milliseconds, where RSA would cost seconds on a busy machine."""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import SandboxError


@dataclass(frozen=True, slots=True)
class Pki:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def server_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    @property
    def tokens_csv(self) -> Path:
        return self.dir / "tokens.csv"


def _openssl(argv: list[str], cwd: Path) -> None:
    res = subprocess.run(["openssl", *argv], cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    if res.returncode != 0:
        raise SandboxError(f"kube pki: openssl {argv[0]} failed (rc {res.returncode}): {res.stderr.strip()[-400:]}")


def _ec_key(path: Path) -> None:
    _openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)], path.parent)
    path.chmod(0o600)


def make(dir: Path) -> Pki:
    """Write a fresh CA, serving certificate and SA key into ``dir`` (mode 0700)."""
    dir.mkdir(parents=True, exist_ok=True)
    dir.chmod(0o700)
    p = Pki(dir)
    _ec_key(p.ca_key)
    _openssl(["req", "-x509", "-new", "-key", str(p.ca_key), "-out", str(p.ca_crt), "-days", "3650",
              "-subj", "/CN=gpu-bridge-sandbox-ca",
              "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign",
              "-addext", "subjectKeyIdentifier=hash"], dir)
    _ec_key(p.server_key)
    csr = dir / "apiserver.csr"
    _openssl(["req", "-new", "-key", str(p.server_key), "-out", str(csr), "-subj", "/CN=kube-apiserver"], dir)
    ext = dir / "apiserver.ext"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n"
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc\n")
    _openssl(["x509", "-req", "-in", str(csr), "-CA", str(p.ca_crt), "-CAkey", str(p.ca_key), "-CAcreateserial",
              "-out", str(p.server_crt), "-days", "3650", "-extfile", str(ext)], dir)
    _ec_key(p.sa_key)
    # --service-account-key-file reads public keys (or PKCS#1/SEC1 private keys), not PKCS#8.
    _openssl(["pkey", "-in", str(p.sa_key), "-pubout", "-out", str(p.sa_pub)], dir)
    return p


def write_tokens(p: Pki, users: dict[str, tuple[str, str]]) -> dict[str, str]:
    """The apiserver's ``--token-auth-file``: one random token per identity. ``users`` maps a
    key to (user name, comma-separated groups); returns key -> token."""
    out: dict[str, str] = {}
    lines = []
    for i, (key, (user, groups)) in enumerate(sorted(users.items()), start=1):
        tok = secrets.token_hex(24)
        out[key] = tok
        lines.append(f'{tok},{user},uid-{i},"{groups}"' if groups else f"{tok},{user},uid-{i}")
    p.tokens_csv.write_text("\n".join(lines) + "\n")
    p.tokens_csv.chmod(0o600)
    return out
