"""An https Prometheus is verified (issue 21 point 2): a real local https endpoint with a
self-signed certificate (openssl) is refused without the CA and read with
``prometheus.ca_file``; a client certificate and a bearer token read from a private file
reach it; a token file others can read, or a token for an http:// URL, is refused; the token
never appears in an error."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bridge.adapters.prom.signals import PromAccess, PromAdapter
from bridge.adapters.prom.types import PromPool
from bridge.config import parse_config
from bridge.errors import AdapterError, ConfigError
from bridge.wiring import prom_adapter

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

POOL = PromPool("llama", "llama")
TOKEN = "s3cr3t-t0ken-0123456789"
EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}


def _cert(d: Path, name: str, *, server: bool) -> tuple[Path, Path]:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    ext = ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"] if server else []
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
         "-keyout", str(key), "-out", str(crt), *ext],
        check=True, capture_output=True, timeout=60,
    )
    key.chmod(0o600)
    return crt, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tls")
    s_crt, s_key = _cert(d, "prometheus", server=True)
    c_crt, c_key = _cert(d, "gpu-bridge", server=False)
    return {"server_crt": s_crt, "server_key": s_key, "client_crt": c_crt, "client_key": c_key}


class Https:
    """A local https endpoint answering every query with an empty vector; it records the
    Authorization header and answers 401 (echoing it, as a debugging proxy might) when
    ``want_token`` is set and the header differs."""

    def __init__(self, certs: dict[str, Path], *, client_ca: Path | None = None, want_token: str | None = None) -> None:
        self.seen: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                auth = self.headers.get("Authorization")
                outer.seen.append(auth)
                ok = want_token is None or auth == f"Bearer {want_token}"
                body = json.dumps(EMPTY if ok else {"status": "error", "error": f"unauthorized: {auth}"}).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certs["server_crt"], certs["server_key"])
        if client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(client_ca)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture()
def https(certs: dict[str, Path]) -> Iterator[Https]:
    srv = Https(certs)
    yield srv
    srv.close()


def test_an_unverified_https_prometheus_is_refused(https: Https) -> None:
    with pytest.raises(AdapterError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        PromAdapter(https.url, timeout_s=5).current(POOL, at=1.0)
    assert https.seen == []  # no query was answered


def test_the_configured_ca_bundle_verifies_it(https: Https, certs: dict[str, Path]) -> None:
    reading = PromAdapter(https.url, timeout_s=5, access=PromAccess(ca_file=str(certs["server_crt"]))).current(POOL, at=1.0)
    assert reading.signals.running is None and https.seen == [None]


def test_a_client_certificate_is_presented(certs: dict[str, Path]) -> None:
    srv = Https(certs, client_ca=certs["client_crt"])
    try:
        without = PromAccess(ca_file=str(certs["server_crt"]))
        with pytest.raises(AdapterError, match="prometheus"):
            PromAdapter(srv.url, timeout_s=5, access=without).current(POOL, at=1.0)
        with_cert = PromAccess(ca_file=str(certs["server_crt"]), cert_file=str(certs["client_crt"]), key_file=str(certs["client_key"]))
        PromAdapter(srv.url, timeout_s=5, access=with_cert).current(POOL, at=1.0)
        assert srv.seen == [None]
    finally:
        srv.close()


def _config(url: str, tmp: Path, ca: Path, token_mode: int = 0o600, token: str = TOKEN) -> Any:
    tok = tmp / "prom-token"
    tok.write_text(token + "\n")
    tok.chmod(token_mode)
    return parse_config({"pools": [{"name": "llama"}],
                         "prometheus": {"url": url, "ca_file": str(ca), "bearer_token_file": str(tok)}})


def test_the_bearer_token_from_a_private_file_is_sent(certs: dict[str, Path], tmp_path: Path) -> None:
    srv = Https(certs, want_token=TOKEN)
    try:
        prom_adapter(_config(srv.url, tmp_path, certs["server_crt"])).current(POOL, at=1.0)
        assert srv.seen == [f"Bearer {TOKEN}"]
        # a wrong token: the 401 body echoes the header; the error never carries our token
        wrong = "wr0ng-t0ken-abcdefghij"
        with pytest.raises(AdapterError) as ei:
            prom_adapter(_config(srv.url, tmp_path, certs["server_crt"], token=wrong)).current(POOL, at=1.0)
        assert "401" in str(ei.value) and wrong not in str(ei.value) and "<redacted>" in str(ei.value)
    finally:
        srv.close()


def test_a_token_file_others_can_read_is_refused(certs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        prom_adapter(_config("https://127.0.0.1:1", tmp_path, certs["server_crt"], token_mode=0o644))
    assert ei.value.problems == [
        f"{tmp_path / 'prom-token'}: prometheus.bearer_token_file is readable by others (mode -rw-r--r--); "
        f"refusing to use it. Fix with: chmod o-rwx {tmp_path / 'prom-token'}"
    ]


def test_a_token_file_readable_by_a_foreign_group_is_refused_the_daemons_own_group_is_fine(
    certs: dict[str, Path], tmp_path: Path
) -> None:
    cfg = _config("https://127.0.0.1:1", tmp_path, certs["server_crt"], token_mode=0o640)
    prom_adapter(cfg)  # 0640, the daemon's own group (the install's root:gpu-bridge)
    if os.geteuid() != 0:
        pytest.skip("chgrp to a foreign group needs root")
    token = tmp_path / "prom-token"
    foreign = 65534 if os.getegid() != 65534 else 65533
    os.chown(token, -1, foreign)
    with pytest.raises(ConfigError) as ei:
        prom_adapter(cfg)
    assert ei.value.problems == [
        f"{token}: prometheus.bearer_token_file is readable by group gid {foreign}, not the daemon's (gid {os.getegid()}); "
        f"refusing to use it. Fix with: chmod g-rwx {token}"
    ]


def test_a_systemd_credential_is_taken_as_systemd_made_it(
    certs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # systemd grants the unit's user by an ACL, which shows as group bits (root:root 0440)
    creds = tmp_path / "credentials"
    creds.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    cfg = _config("https://127.0.0.1:1", creds, certs["server_crt"], token_mode=0o444)
    assert prom_adapter(cfg)._secrets == [TOKEN]


@pytest.mark.parametrize("key", ["ca_file", "cert_file", "bearer_token_file"])
def test_tls_settings_need_an_https_url(key: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"pools": [{"name": "llama"}], "prometheus": {"url": "http://prom:9090", key: "/etc/gpu-bridge/x"}})
    assert ei.value.problems == [
        f'bridge.yaml: prometheus.{key}: needs an https:// url (it would protect nothing, or send the secret in clear), '
        'got url "http://prom:9090"'
    ]


def test_a_key_without_its_certificate_is_refused() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"pools": [{"name": "llama"}], "prometheus": {"url": "https://prom", "key_file": "/k"}})
    assert ei.value.problems == ["bridge.yaml: prometheus.key_file: needs cert_file"]


def test_the_token_is_not_in_the_adapters_repr(certs: dict[str, Path]) -> None:
    assert TOKEN not in repr(PromAccess(bearer_token=TOKEN))


def test_a_password_in_the_url_is_never_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Basic auth in prometheus.url works, but the password stays out of what is printed or logged."""
    from bridge import cli
    from bridge.adapters.prom.signals import PromAdapter
    from bridge.config import redact_url

    assert redact_url("https://ops:s3cret@prom.example:9090/prom") == "https://ops:<redacted>@prom.example:9090/prom"
    assert redact_url("http://prom:9090") == "http://prom:9090" and redact_url("http://ops@prom") == "http://ops@prom"
    assert redact_url("http://[::1") == "http://[::1"  # unparsable: as it is
    adapter = PromAdapter("http://ops:s3cret@127.0.0.1:1")
    assert adapter._redact("GET http://ops:s3cret@127.0.0.1:1/api/v1/query failed") == \
        "GET http://ops:<redacted>@127.0.0.1:1/api/v1/query failed"
    cfg = tmp_path / "gpu-bridge.yaml"
    cfg.write_text('pools: [{name: llama}]\nprometheus: {url: "http://ops:s3cret@127.0.0.1:1", ca_file: /x}\n')
    assert cli.main(["check-config", str(cfg)]) == 1  # an error naming the url
    cfg.write_text('pools: [{name: llama}]\nprometheus: {url: "http://ops:s3cret@127.0.0.1:1"}\n')
    assert cli.main(["check-config", str(cfg)]) == 0  # the resolved config printed
    assert cli.main(["forecast", "--config", str(cfg)]) == 3  # Prometheus unreachable, at its url
    assert cli.main(["simulate", "--prometheus", "http://ops:s3cret@127.0.0.1:1"]) == 3
    out = capsys.readouterr()
    assert "s3cret" not in out.out + out.err and out.out.count("http://ops:<redacted>@127.0.0.1:1") == 1
    assert out.err.count("ops:<redacted>@127.0.0.1:1") == 3, out.err


class _EmptyProm(BaseHTTPRequestHandler):
    """A Prometheus that answers every query with no series (no history to read)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_a_password_in_the_url_is_not_shown_when_prometheus_answers_with_no_history(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The other messages that name the url: no usable history (simulate, forecast) and a bad scheme."""
    from bridge import cli

    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyProm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://ops:s3cret@127.0.0.1:{server.server_address[1]}"
        cfg = tmp_path / "gpu-bridge.yaml"
        cfg.write_text(f'pools: [{{name: llama}}]\nprometheus: {{url: "{url}"}}\n')
        assert cli.main(["simulate", "--prometheus", url, "--since", "1d"]) == 1  # no usable series
        assert cli.main(["forecast", "--config", str(cfg)]) == 1  # nothing to forecast from
    finally:
        server.shutdown()
        server.server_close()
    assert cli.main(["simulate", "--prometheus", "ftp://ops:s3cret@127.0.0.1:1"]) == 2
    out = capsys.readouterr()
    assert "s3cret" not in out.out + out.err, out.err
    assert out.err.count("ops:<redacted>@127.0.0.1:") == 3, out.err
