"""bridge.faults: crash injection is inert unless explicitly enabled, and kills for real."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bridge import faults


def test_parse() -> None:
    assert faults.parse_crash_at("fence:2") == ("fence", 2)
    assert faults.parse_crash_at("resume") == ("resume", 1)
    for bad, word in (("fence:x", "integer"), (":1", "empty"), ("fence:0", ">= 1")):
        with pytest.raises(ValueError, match=word):
            faults.parse_crash_at(bad)


def test_not_armed_without_the_opt_in() -> None:
    inj = faults.CrashInjector({faults.CRASH_ENV: "fence:1"})  # GPU_BRIDGE_FAULTS missing
    assert inj.point is None
    inj.after_write("fence")  # would kill this test process if armed


def test_malformed_value_is_refused() -> None:
    inj = faults.CrashInjector({faults.ENABLE_ENV: "1", faults.CRASH_ENV: "fence:two"})
    assert inj.point is None


def _run(env: dict[str, str], writes: list[str]) -> int:
    code = "from bridge import faults\n" + "".join(f"faults.after_write({w!r})\n" for w in writes)
    return subprocess.run([sys.executable, "-c", code], env={**env, "PATH": "/usr/bin:/bin"}, timeout=60,
                          capture_output=True).returncode


def test_kills_itself_after_the_nth_write_only() -> None:
    env = {faults.ENABLE_ENV: "1", faults.CRASH_ENV: "drain:2"}
    assert _run(env, ["drain", "fence", "resume"]) == 0  # only one drain: alive
    assert _run(env, ["drain", "fence", "drain", "resume"]) == -9  # SIGKILL at the second drain
    assert _run({faults.CRASH_ENV: "drain:1"}, ["drain"]) == 0  # no opt-in: never
