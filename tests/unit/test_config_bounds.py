"""Every number of the config has an upper bound (issue 21 point 8): a
``policy.calibration.window_s`` of 1e300 used to pass the loader and crash every tick
(numpy: "Maximum allowed dimension exceeded"). Now it is refused naming the key, and every
numeric key set to the largest value the loader accepts still runs a daemon tick (lab fakes)."""

from __future__ import annotations

import copy
import re
import typing
from typing import Any

import pytest

from bridge.adapters.prom.types import PromPool
from bridge.adapters.protocols import PoolTarget
from bridge.config import MAX_NUMBER, Config, _bare, _fields, parse_config
from bridge.daemon import Daemon
from bridge.errors import ConfigError
from bridge.model import LoadSignals
from gpu_bridge_lab.fakes.kube import FakeKube, FakeProm
from gpu_bridge_lab.fakes.slurm import FakeSlurm

T0 = 1_800_000_000.0
BASE: dict[str, Any] = {"pools": [{"name": "default", "namespace": "serving", "deployment": "vllm", "model_name": "m"}]}


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        ("policy.calibration.window_s", 1e300, "policy.calibration.window_s: must be <= 10000000, got 1e+300"),
        ("policy.tick_s", 1e300, "policy.tick_s: must be <= 10000000, got 1e+300"),
        ("pools.0.min_serving", 10**30, "pools[0].min_serving: must be <= 10000000, got 1000000000000000000000000000000"),
        ("policy.calibration.step_s", 0.001,
         "policy.calibration.window_s: must be <= 1,000,000 steps of step_s (0.001 s), got 1,209,600,000"),
        ("policy.forecast.burst_history_s", 9e6,
         "policy.forecast.burst_history_s: must be <= 1,000,000 steps of burst_step_s (0.001 s), got 9,000,000,000"),
    ],
    ids=["window_1e300", "tick_1e300", "huge_int", "window_steps", "burst_steps"],
)
def test_a_huge_number_is_refused_naming_the_key(path: str, value: object, problem: str) -> None:
    doc = copy.deepcopy(BASE)
    _set(doc, path, value)
    if path.endswith("burst_history_s"):
        _set(doc, "policy.forecast.burst_step_s", 0.001)
    with pytest.raises(ConfigError) as ei:
        parse_config(doc)
    assert ei.value.problems == [f"bridge.yaml: {problem}"]


def _set(doc: dict[str, Any], path: str, value: object) -> None:
    node: Any = doc
    parts = path.split(".")
    for p in parts[:-1]:
        node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
    node[parts[-1]] = value


def _numeric_keys(cls: Any = Config, prefix: str = "") -> list[str]:
    """Dotted paths of every number of the config (the first pool's; list items aside)."""
    out: list[str] = []
    for name, f in _fields(cls).items():
        tp = _bare(f.annotation)
        path = f"{prefix}{name}"
        if name == "pools":
            out += _numeric_keys(_bare(typing.get_args(tp)[0]), "pools.0.")
        elif _fields(tp):
            out += _numeric_keys(tp, path + ".")
        elif tp in (int, float):
            out.append(path)
    return out


def _tick(cfg: Config) -> None:
    kube = FakeKube(now=T0)
    slurm = FakeSlurm(grace_s=5, now=T0)
    for n in ("gpu-node-01", "gpu-node-02", "gpu-node-03"):
        kube.add_node(n, "default")
        slurm.add_node(n)
    kube.add_pool(PoolTarget("default", "serving", "vllm"), replicas=3)
    prom = FakeProm()
    prom.set("default", LoadSignals(T0, 10.0, 0.0, 0.5, None, 3))
    daemon = Daemon(cfg, kube=kube, slurm=slurm, prom=prom, prom_pools={"default": PromPool("default", "m")}, clock=lambda: T0)
    daemon.iterate()


KEYS = _numeric_keys()
# keys a cross-field check ties to another: (the other key's value, this key's value)
PARTNERS: dict[str, tuple[dict[str, float], float]] = {
    "pools.0.drain_s": ({"policy.lend_timeout_s": MAX_NUMBER}, MAX_NUMBER - 100),  # lend_timeout_s > drain_s + 20
    "policy.forecast.ratio_min": ({"policy.forecast.ratio_max": MAX_NUMBER}, MAX_NUMBER),  # ratio_min <= ratio_max
    # a Slurm write must end while the leader still leads: at most 2/3 of the Lease less 0.5 s
    "slurm.command_timeout_s": ({"daemon.lease_duration_s": MAX_NUMBER}, MAX_NUMBER * 2 // 3 - 1),
}


def test_every_numeric_key_is_found() -> None:
    assert len(KEYS) > 40 and "policy.calibration.window_s" in KEYS and "pools.0.blind_serving" in KEYS


@pytest.mark.parametrize("path", KEYS)
def test_every_numeric_key_at_its_largest_accepted_value_runs_a_tick(path: str) -> None:
    doc = copy.deepcopy(BASE)
    partners, value = PARTNERS.get(path, ({}, MAX_NUMBER))
    for other, v in partners.items():
        _set(doc, other, v)
    _set(doc, path, value)
    try:
        cfg = parse_config(doc)
    except ConfigError as exc:
        # a tighter bound of its own: use it (just below for a strict one)
        m = re.search(r"must be (<=|<) ([0-9.e+-]+)", exc.problems[0])
        assert m is not None and exc.problems[0].startswith(f"bridge.yaml: {path.replace('.0.', '[0].')}: "), exc.problems
        bound = float(m.group(2))
        _set(doc, path, bound if m.group(1) == "<=" else bound * 0.999)
        cfg = parse_config(doc)
    _tick(cfg)
