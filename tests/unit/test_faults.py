"""gpu_bridge_lab.faults: crash injection is inert unless explicitly enabled, and kills for real."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_bridge_lab import faults


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
    code = "import os\nfrom gpu_bridge_lab import faults\nhook = faults.LazyInjector(os.environ)\n" + "".join(f"hook({w!r})\n" for w in writes)
    return subprocess.run([sys.executable, "-c", code], env={**env, "PATH": "/usr/bin:/bin"}, timeout=60,
                          capture_output=True).returncode


def test_kills_itself_after_the_nth_write_only() -> None:
    env = {faults.ENABLE_ENV: "1", faults.CRASH_ENV: "drain:2"}
    assert _run(env, ["drain", "fence", "resume"]) == 0  # only one drain: alive
    assert _run(env, ["drain", "fence", "drain", "resume"]) == -9  # SIGKILL at the second drain
    assert _run({faults.CRASH_ENV: "drain:1"}, ["drain"]) == 0  # no opt-in: never


def test_the_actuator_reports_each_changing_write_to_its_hook_and_the_product_sets_none() -> None:
    from bridge.actuate import SCALE_POINT, Actuator
    from gpu_bridge_lab.fakes.kube import FakeKube
    from bridge.adapters.protocols import PoolTarget
    from gpu_bridge_lab.fakes.slurm import FakeSlurm
    from bridge.cli.daemon import register_cli
    import argparse

    kube = FakeKube(now=0.0)
    kube.add_node("gpu-node-01", "default")
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=1)
    seen: list[str] = []
    act = Actuator(kube=kube, slurm=FakeSlurm(), clock=lambda: 0.0, after_write=seen.append)
    target = PoolTarget("default", "serving", "vllm")
    assert act.scale_pool(target, 0) and seen == [SCALE_POINT]
    assert not act.scale_pool(target, 0) and seen == [SCALE_POINT]  # nothing written: not reported
    # `gpu-bridge run` builds its daemon with no hook: the product never injects anything
    sub = argparse.ArgumentParser().add_subparsers()
    register_cli(sub)
    assert getattr(sub.choices["run"].parse_args(["--config", "x"]), "after_write", None) is None
