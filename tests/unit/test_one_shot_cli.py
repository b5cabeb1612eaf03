"""``gpu-bridge status`` and ``gpu-bridge plan``: a failure of the outside systems (or of the
daemon's set-up) is a one-line error and exit 1, and the adapters (watches, connections) are
closed on every path."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bridge import cli
from bridge.cli import daemon as daemon_cli
from bridge.config import default_config, to_dict
from bridge.errors import AdapterError
from gpu_bridge_lab.sandbox.daemon_config import write_config


def _setup(monkeypatch: pytest.MonkeyPatch, daemon: Any) -> list[str]:
    closed: list[str] = []
    adapters = SimpleNamespace(
        kube=SimpleNamespace(cache_status=lambda: SimpleNamespace(synced=True)),
        slurm=None, prom=None, prom_pools={}, replicas=None, close=lambda: closed.append("closed"),
    )
    monkeypatch.setattr(daemon_cli, "build_adapters", lambda *a, **k: adapters)
    monkeypatch.setattr(daemon_cli, "Daemon", daemon)
    monkeypatch.setattr(daemon_cli, "policy_memory", lambda *a, **k: {})
    return closed


class _Down:
    def __init__(self, *_a: Any, **_k: Any) -> None:
        pass

    def observe(self, _now: float) -> None:
        raise AdapterError("kubernetes", "GET /api/v1/nodes: connection refused")

    def iterate(self) -> None:
        raise AdapterError("slurm", "squeue failed (rc 1): slurm_load_jobs error")


class _Broken:
    def __init__(self, *_a: Any, **_k: Any) -> None:
        raise AdapterError("prometheus", "query_range answered garbage")


@pytest.mark.parametrize("command, said", [("status", "kubernetes: GET /api/v1/nodes"), ("plan", "slurm: squeue failed")])
def test_an_outside_failure_is_one_line_and_exit_1_and_the_adapters_are_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str, said: str
) -> None:
    cfg = write_config(tmp_path / "gpu-bridge.yaml", to_dict(default_config()))
    closed = _setup(monkeypatch, _Down)
    assert cli.main([command, "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpu-bridge: " + said) and err.count("\n") == 1, err
    assert closed == ["closed"]


@pytest.mark.parametrize("command", ["status", "plan"])
def test_a_daemon_that_cannot_be_set_up_still_closes_the_adapters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    cfg = write_config(tmp_path / "gpu-bridge.yaml", to_dict(default_config()))
    closed = _setup(monkeypatch, _Broken)
    assert cli.main([command, "--config", str(cfg)]) == 1
    assert "prometheus: query_range answered garbage" in capsys.readouterr().err
    assert closed == ["closed"]


def test_a_bad_config_names_the_key_and_opens_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = to_dict(default_config())
    doc["policy"]["tick_s"] = -1
    cfg = write_config(tmp_path / "gpu-bridge.yaml", doc)
    closed = _setup(monkeypatch, _Down)
    assert cli.main(["plan", "--config", str(cfg)]) == 1
    assert "policy.tick_s" in capsys.readouterr().err
    assert closed == []


@pytest.mark.parametrize("argv", [["lend", "bad node!"], ["reclaim", "../x"], ["pin", "a/b", "serving"], ["unpin", ""],
                                  ["lend", "n" * 64]])
def test_a_bad_node_argument_is_refused_before_anything_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    cfg = write_config(tmp_path / "gpu-bridge.yaml", to_dict(default_config()))
    opened: list[str] = []
    monkeypatch.setattr(daemon_cli, "build_adapters", lambda *a, **k: opened.append("opened"))
    assert cli.main([*argv, "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("NODE: node name ") and "invalid (letters, digits" in err and err.count("\n") == 1, err
    assert opened == []


def test_a_config_that_is_not_utf8_is_one_error_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gpu-bridge.yaml"
    cfg.write_bytes(b"pools:\n  - name: \xff\xfe\n")
    assert cli.main(["check-config", str(cfg)]) == 1
    err = capsys.readouterr()
    assert f"{cfg}: not UTF-8 text (byte 17: invalid start byte); expected a YAML config" in err.out + err.err


@pytest.mark.parametrize("wait", ["nan", "-5", "inf", "1e400", "soon"])
def test_a_bad_wait_is_a_usage_error_before_anything_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], wait: str
) -> None:
    """``--wait nan`` and ``--wait -5`` wrote the request and did not wait at all; ``--wait inf``
    (or 1e400) waited forever. Each is now argparse's usage error: exit 2, nothing written."""
    cfg = write_config(tmp_path / "gpu-bridge.yaml", to_dict(default_config()))
    opened: list[str] = []
    monkeypatch.setattr(daemon_cli, "build_adapters", lambda *a, **k: opened.append("opened"))
    with pytest.raises(SystemExit) as info:
        cli.main(["reclaim", "gpu-node-01", "--config", str(cfg), "--wait", wait])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --wait:" in err and repr(wait) in err and "Traceback" not in err, err
    assert opened == []
    assert daemon_cli.wait_seconds("0") == 0.0 and daemon_cli.wait_seconds("90") == 90.0
