"""One writer, always (issue 21, point 4): ``run --dry-run`` never takes or competes for the
Lease; ``run --once`` writes only as the Lease holder (refused, nothing written, while another
instance holds it; the Lease given back after); each Slurm command that changes something runs
only if the leadership outlasts its timeout (renewed first if it would not); ``check-config``
refuses a ``slurm.command_timeout_s`` the leadership after one renewal cannot cover.
The same on the real control plane: tests/integration/test_one_writer_lease.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge import cli
from bridge.cli import daemon as daemon_cli
from bridge import wellknown as wk
from bridge.adapters.prom.types import PromPool
from bridge.adapters.protocols import KubeAdapterProtocol, PoolTarget, SlurmAdapterProtocol
from bridge.adapters.slurm.cli import CliSlurm
from bridge.adapters.slurm.cli import changes_slurm
from bridge.adapters.wrappers import FencedKube, FencedSlurm, NotLeaderError, lease_fence
from bridge.config import default_config, parse_config, to_dict
from bridge.wiring import Adapters
from gpu_bridge_lab.fakes.kube import FakeKube, FakeLeader, FakeProm
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from gpu_bridge_lab.sandbox.daemon_config import write_config
from tests.slurm_script import ScriptedSlurm
from tests.unit.test_kube_adapter_leader import Clock, LeaseStore, elector
from tests.unit.test_slurm_cli_adapter import fixture_runner

NODES = ("gpu-node-01", "gpu-node-02")
POOL = PoolTarget("default", "serving", "vllm")


class World:
    """Fakes for ``build_adapters``: the real write wrappers around them, as the wiring puts
    them, and a FakeLeader (``holds``: whether this instance would get the Lease)."""

    def __init__(self, *, holds: bool) -> None:
        self.kube = FakeKube(now=0.0)
        self.slurm = FakeSlurm(grace_s=5, now=0.0)
        for n in NODES:
            self.kube.add_node(n, "default")
            self.slurm.add_node(n)
        self.kube.add_pool(POOL, replicas=len(NODES), min_available=1, start_delay_s=0, grace_s=2)
        self.holds = holds
        self.asked: list[dict[str, Any]] = []
        self.leaders: list[FakeLeader] = []

    def build_adapters(self, config: Any, *, leader: bool = True, **kw: Any) -> Adapters:
        self.asked.append({"leader": leader})
        kube: KubeAdapterProtocol = self.kube
        slurm: SlurmAdapterProtocol = self.slurm
        elector = None
        if leader:
            elector = FakeLeader(leader=self.holds)
            self.leaders.append(elector)
            kube, slurm = FencedKube(kube, elector), FencedSlurm(slurm, elector)
        return Adapters(kube=kube, slurm=slurm, prom=FakeProm(), prom_pools={"default": PromPool("default", "m")},  # type: ignore[arg-type]
                        leader=elector, identity="test")  # type: ignore[arg-type]

    def phases(self) -> set[str | None]:
        return {(n.labels or {}).get(wk.LABEL_PHASE) for n in self.kube.nodes()}


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    doc = to_dict(default_config())
    doc["daemon"]["metrics_port"] = 0
    return write_config(tmp_path / "gpu-bridge.yaml", doc)


def _world(monkeypatch: pytest.MonkeyPatch, *, holds: bool) -> World:
    w = World(holds=holds)
    monkeypatch.setattr(daemon_cli, "build_adapters", w.build_adapters)
    return w


def test_a_dry_run_asks_for_no_lease(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _world(monkeypatch, holds=True)
    monkeypatch.setattr(daemon_cli, "serve", _no_serve)
    monkeypatch.setattr(daemon_cli.Daemon, "run", lambda self, stop, on_tick=None: None)
    assert cli.main(["run", "--dry-run", "--config", str(cfg)]) == 0
    assert w.asked == [{"leader": False}] and w.leaders == []


def test_a_dry_run_once_neither_takes_the_lease_nor_writes(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _world(monkeypatch, holds=False)  # another instance leads: a dry run still shows its plan
    assert cli.main(["run", "--dry-run", "--once", "--config", str(cfg)]) == 0
    assert w.leaders == [] and w.slurm.writes == [] and w.phases() == {None}


def test_once_is_refused_while_another_instance_holds_the_lease(
    cfg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    w = _world(monkeypatch, holds=False)
    assert cli.main(["run", "--once", "--config", str(cfg)]) == 1
    assert "run --once refused: the Lease is held by" in capsys.readouterr().err
    assert w.slurm.writes == [] and w.phases() == {None}  # nothing written on either side


def test_once_as_the_lease_holder_acts_and_gives_the_lease_back(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _world(monkeypatch, holds=True)
    assert cli.main(["run", "--once", "--config", str(cfg)]) == 0
    assert w.phases() == {"serving"}  # adopted: written through the fence, as the holder
    assert len(w.leaders) == 1 and w.leaders[0].released


def _no_serve(*_a: Any, **_k: Any) -> Any:
    class _S:
        port = 0

        def close(self) -> None:
            pass

    return _S()


# --- the fence before each command that changes Slurm ------------------------------------


@pytest.mark.parametrize(
    "argv, writes",
    [
        (["sinfo", "--json", "--Node"], False),
        (["squeue", "--json"], False),
        (["scontrol", "ping"], False),
        (["scontrol", "--oneliner", "show", "node", "n1"], False),
        (["scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=x"], True),
        (["scontrol", "requeue", "12"], True),
        (["scontrol", "release", "12"], True),
        (["sbatch", "--parsable"], True),
        (["scancel", "--name=x", "12"], True),
        (["scontrol", "hold", "12"], True),  # a write nobody listed is fenced too
    ],
    ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else str(v),
)
def test_what_counts_as_a_slurm_write(argv: list[str], writes: bool) -> None:
    assert changes_slurm(argv) is writes


def _leader_and_slurm(*, timeout_s: float) -> tuple[LeaseStore, Clock, Any, CliSlurm, ScriptedSlurm]:
    store, clock = LeaseStore(), Clock()
    e = elector(store, clock, "a")  # lease 15 s, renew deadline 10 s
    assert e.try_acquire_or_renew()
    runner = fixture_runner()
    slurm = CliSlurm(runner=runner, timeout_s=timeout_s, fence=lease_fence(e))
    return store, clock, e, slurm, runner


def test_a_slurm_write_is_refused_when_the_lease_would_lapse_before_it_ends() -> None:
    store, clock, e, slurm, runner = _leader_and_slurm(timeout_s=5)
    clock.t += 7  # 3 s of leadership left, the write may take 5; renewals fail
    store.down = True
    fenced = FencedSlurm(slurm, e)
    assert e.is_leader  # the check before the write passes ...
    with pytest.raises(NotLeaderError, match="does not hold for the 5 s it may take"):
        fenced.drain("gpu-node-01", "serving")
    assert runner.writes() == []  # ... but the scontrol update never ran
    assert runner.calls[-1][:3] == ["scontrol", "--oneliner", "show"]  # its read did


def test_a_slurm_write_renews_first_when_the_lease_is_short_and_then_runs() -> None:
    store, clock, e, slurm, runner = _leader_and_slurm(timeout_s=5)
    rv = store.rv
    clock.t += 7  # within the retry period of nothing: the throttle would skip a plain step
    assert FencedSlurm(slurm, e).drain("gpu-node-01", "serving")
    assert store.rv == rv + 1 and e.valid_for_s() == pytest.approx(10)  # renewed right before
    assert [w[:2] for w in runner.writes()] == [["scontrol", "update"]]


def test_a_short_lived_fake_leadership_refuses_too() -> None:
    runner = fixture_runner()
    leader = FakeLeader(valid_s=2.0)
    slurm = CliSlurm(runner=runner, timeout_s=5, fence=lease_fence(leader))
    with pytest.raises(NotLeaderError):
        slurm.drain("gpu-node-01", "serving")
    assert runner.writes() == []
    leader.valid_s = 6.0
    slurm.drain("gpu-node-01", "serving")
    assert [w[:2] for w in runner.writes()] == [["scontrol", "update"]]


# --- check-config: the timings that make the fence passable -------------------------------


def test_check_config_refuses_a_command_timeout_the_lease_cannot_cover(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = to_dict(default_config())
    doc["daemon"]["lease_duration_s"] = 6
    doc["slurm"]["command_timeout_s"] = 5
    path = write_config(tmp_path / "gpu-bridge.yaml", doc)
    assert cli.main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert (
        "slurm.command_timeout_s: 5 s is longer than the leader may write after one Lease renewal "
        "(3.5 s: 2/3 of daemon.lease_duration_s 6 s, less 0.5 s for the renewal): every Slurm write would be "
        "refused; lower slurm.command_timeout_s or raise daemon.lease_duration_s to at least 9"
    ) in err


@pytest.mark.parametrize("lease_s, timeout_s", [(15, 5), (6, 3), (15, 9.5)], ids=["defaults", "sandbox", "edge"])
def test_timings_that_leave_room_pass(lease_s: float, timeout_s: float) -> None:
    doc = to_dict(default_config())
    doc["daemon"]["lease_duration_s"] = lease_s
    doc["slurm"]["command_timeout_s"] = timeout_s
    c = parse_config(doc)
    assert (c.daemon.lease_duration_s, c.slurm.command_timeout_s) == (lease_s, timeout_s)
