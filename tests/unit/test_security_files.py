"""The daemon refuses a config or credential (kubeconfig) file that others can write: whoever
can write it controls what gpu-bridge does to two schedulers. Checked through the commands
an operator runs (`gpu-bridge run` / `status` / `plan`): exit 1, and the message names the
file and the fix; nothing is started (no connection is attempted)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bridge import cli
from bridge.errors import ConfigError
from bridge.wiring import check_private_file

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def write_config(tmp: Path, *, kubeconfig: Path | None = None, mode: int = 0o600) -> Path:
    cfg = {"pools": [{"name": "default"}], "prometheus": {"url": "http://127.0.0.1:9", "timeout_s": 0.5},
           "kubernetes": {"timeout_s": 0.5, **({"kubeconfig": str(kubeconfig)} if kubeconfig else {})},
           "daemon": {"metrics_port": 0}}
    p = tmp / "gpu-bridge.yaml"
    p.write_text(yaml.safe_dump(cfg))
    p.chmod(mode)
    return p


def write_kubeconfig(tmp: Path, mode: int) -> Path:
    # a server nobody listens on: if the check failed to stop the command, it would try it
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
           "users": [{"name": "c", "user": {"token": "s3cr3t-token-value"}}],
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "c"}}]}
    p = tmp / "kubeconfig"
    p.write_text(yaml.safe_dump(doc))
    p.chmod(mode)
    return p


BAD_MODES = [0o660, 0o620, 0o602, 0o666, 0o777, 0o622]


@pytest.mark.parametrize("mode", BAD_MODES, ids=[oct(m) for m in BAD_MODES])
@pytest.mark.parametrize("command", ["run", "status", "plan"])
def test_writable_config_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, mode: int) -> None:
    cfg = write_config(tmp_path, mode=mode)
    assert cli.main([command, "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert str(cfg) in err and "writable by group or others" in err
    assert f"chmod go-w {cfg}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("mode", [0o660, 0o606, 0o666], ids=oct)
@pytest.mark.parametrize("command", ["run", "status"])
def test_writable_kubeconfig_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, mode: int) -> None:
    kc = write_kubeconfig(tmp_path, mode)
    cfg = write_config(tmp_path, kubeconfig=kc)
    assert cli.main([command, "--config", str(cfg), *(["--once"] if command == "run" else [])]) == 1
    err = capsys.readouterr().err
    assert f"{kc}: kubeconfig is writable by group or others" in err and f"chmod go-w {kc}" in err
    assert "s3cr3t-token-value" not in err


def test_writable_kubeconfig_from_the_environment_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No kubeconfig in the config: the client reads $KUBECONFIG (or ~/.kube/config), and
    that file gets the same check."""
    kc = write_kubeconfig(tmp_path, 0o666)
    cfg = write_config(tmp_path)
    from kubernetes.config import kube_config

    # the client reads $KUBECONFIG once, at import (as in a daemon started with it set)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", f"{tmp_path / 'absent'}{os.pathsep}{kc}")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli.main(["status", "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert f"{kc}: kubeconfig is writable by group or others" in err


def test_writable_home_kubeconfig_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    kc = write_kubeconfig(home / ".kube", 0o664)
    kc = kc.rename(home / ".kube" / "config")
    cfg = write_config(tmp_path)
    from kubernetes.config import kube_config

    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", "~/.kube/config")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli.main(["status", "--config", str(cfg)]) == 1
    assert f"{kc}: kubeconfig is writable by group or others" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_file_owned_by_another_user_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0600 but owned by someone else: that someone can write it."""
    cfg = write_config(tmp_path, mode=0o600)
    os.chown(cfg, NOBODY, NOBODY)
    assert cli.main(["status", "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert str(cfg) in err and f"owned by uid {NOBODY}" in err and "chown" in err


def test_private_files_pass(tmp_path: Path) -> None:
    for mode in (0o600, 0o640, 0o644, 0o400):
        p = tmp_path / f"f{mode:o}"
        p.write_text("x")
        p.chmod(mode)
        check_private_file(p, what="config")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check_private_file(tmp_path / "nope.yaml", what="config")
    assert str(tmp_path / "nope.yaml") in info.value.problems[0] and "cannot read config" in info.value.problems[0]


def test_the_installed_command_refuses_it_too(tmp_path: Path) -> None:
    """The console script as systemd starts it: exit 1, one line naming file and fix."""
    cfg = write_config(tmp_path, mode=0o666)
    exe = Path(sys.executable).parent / "gpu-bridge"
    proc = subprocess.run([str(exe), "run", "--config", str(cfg)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 1
    assert f"{cfg}: config is writable by group or others (mode -rw-rw-rw-); refusing to use it. Fix with: chmod go-w {cfg}" \
        in proc.stderr
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o666  # never "fixed" behind the operator's back
