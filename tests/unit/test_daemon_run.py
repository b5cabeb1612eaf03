"""The e2e tests' common ending (tests/sandbox_fixtures.py's ``daemon_run``) on a stand-in
daemon and watcher: it fails on each thing it checks, and cleans up whatever the block did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sandbox_fixtures import assert_requeued, daemon_run

from gpu_bridge_lab.sandbox import e2e


class _Daemon:
    exit_code = 0
    stopped = 0

    def __init__(self, cfg: Path, log_path: Path, env: Any) -> None:
        self.log_path = log_path

    def start(self) -> _Daemon:
        self.log_path.write_text("the daemon's log\n")
        return self

    def stop(self) -> int:
        type(self).stopped += 1
        return type(self).exit_code


class _Watcher:
    def __init__(self, started: bool = True, **seen: Any) -> None:
        self.ident = 1 if started else None
        self.closed = False
        self.violations: list[str] = []
        self.samples, self.min_ready, self.warm_samples, self.mem_hold_samples = 30, 1, 1, 1
        self.__dict__.update(seen)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _Daemon.exit_code, _Daemon.stopped = 0, 0
    monkeypatch.setattr(e2e, "DaemonProc", _Daemon)
    return tmp_path / "daemon.log"


def _run(log: Path, watcher: Any = None, **checks: Any) -> None:
    with daemon_run(log.with_suffix(".yaml"), log, {}, watcher=watcher, **checks):
        pass


def test_a_clean_run_passes_and_stops_the_daemon_and_the_watcher(log: Path) -> None:
    w = _Watcher()
    _run(log, w, samples_over=20, min_ready=1, saw_warm=True)
    assert w.closed and _Daemon.stopped == 1


@pytest.mark.parametrize(("watcher", "checks"), [
    (None, {}),  # the daemon's exit code alone
    (_Watcher(violations=["only 0 Ready serving pods"]), {}),
    (_Watcher(samples=20), {"samples_over": 20}),
    (_Watcher(min_ready=0), {"min_ready": 1}),
    (_Watcher(warm_samples=0), {"saw_warm": True}),
    (_Watcher(mem_hold_samples=0), {"saw_warm": True}),
])
def test_each_check_fails(log: Path, watcher: Any, checks: dict[str, Any]) -> None:
    if watcher is None:
        _Daemon.exit_code = 1
    with pytest.raises(AssertionError):
        _run(log, watcher, **checks)


def test_a_failed_block_stops_the_daemon_explains_and_keeps_its_own_error(
        log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    told = []
    w = _Watcher(started=False)  # failed before the watcher started: not joined (that would raise)
    with pytest.raises(ValueError, match="the block's"):
        with daemon_run(log, log, {}, watcher=w, explain=lambda: told.append(1)):
            raise ValueError("the block's")
    assert _Daemon.stopped == 1 and told == [1] and not w.closed
    assert "the daemon's log" in capsys.readouterr().out


class _World:
    def __init__(self, *jobs: dict[str, Any]) -> None:
        self._jobs = list(jobs)

    def jobs(self) -> list[dict[str, Any]]:
        return self._jobs


def test_assert_requeued_fails_on_a_lost_a_never_requeued_or_an_unexpected_state() -> None:
    w = _World({"job_id": 7, "job_state": "PENDING", "restart_cnt": 1})
    assert_requeued(w, ["7"], ("PENDING",))  # type: ignore[arg-type]
    for jobs, states in (([], None), ([{"job_id": 7, "job_state": "PENDING", "restart_cnt": 0}], None),
                         ([{"job_id": 7, "job_state": "RUNNING", "restart_cnt": 1}], ("PENDING",))):
        with pytest.raises(AssertionError):
            assert_requeued(_World(*jobs), ["7"], states)  # type: ignore[arg-type]
