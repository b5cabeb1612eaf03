"""Warm lending's memory hold at the edges: the Slurm adapter's commands (argv lists, names and
sizes validated before they reach them, only our jobs cancelled) and how the tick's one squeue
read tells a memory hold from a research job (partition + name + ``slurm.hold_user``).
The daemon's use of it is tested over the fakes in test_daemon_warm.py."""

from __future__ import annotations

import pytest

from bridge import wellknown as wk
from bridge.adapters.slurm.cli import CliSlurm, CommandResult, NotOursError
from bridge.config import Config, default_config, replace
from bridge.errors import AdapterError
from bridge.lifecycle import HoldFacts
from bridge.model import SlurmJob
from bridge.observe import Observation, Readings, join
from gpu_bridge_lab.fakes.kube import FakeKube
from gpu_bridge_lab.fakes.slurm import FakeSlurm
from tests.slurm_script import ScriptedSlurm
from tests.unit.test_slurm_cli_adapter import fixture_runner

NODE = "gpu-node-01"


def held_runner(held: str | None = None) -> ScriptedSlurm:
    """The fixture's cluster, plus our memory hold 77 (user root) on ``held`` in squeue's text output."""
    r = fixture_runner()
    if held:
        r.on(lambda argv: argv[:2] == ["squeue", "--noheader"] and wk.SLURM_WARM_HOLD_JOB_PREFIX + held in argv,
             CommandResult(0, f"77|root|{wk.SLURM_WARM_HOLD_JOB_PREFIX}{held}\n", ""))
    return r


def test_submit_mem_hold_argv_pinned_one_cpu_no_gpu_and_idempotent() -> None:
    r = held_runner(held="gpu-node-02")
    a = CliSlurm(runner=r, warm_partition="warm-x")
    assert a.submit_mem_hold("gpu-node-02", 12_000) == "77"  # already there: nothing submitted
    assert r.writes() == []
    assert a.submit_mem_hold(NODE, 12_000) == "42"
    (argv,) = r.writes()
    assert argv[0] == "sbatch" and "--parsable" in argv
    assert argv[argv.index("--partition") + 1] == "warm-x"
    assert argv[argv.index("--nodelist") + 1] == NODE and argv[argv.index("--nodes") + 1] == "1"
    assert argv[argv.index("--cpus-per-task") + 1] == "1" and "--mem=12000" in argv
    assert argv[argv.index("--job-name") + 1] == "gpu-bridge-warm:gpu-node-01"
    assert not any("gres" in x or "gpu:" in x for x in argv) and "--exclusive" not in argv  # beside research jobs
    assert argv[-2:] == ["--wrap", "exec sleep infinity"]  # fixed text, nothing from data
    looked = [c for c in r.calls if c[:2] == ["squeue", "--noheader"]]
    assert looked[-1][looked[-1].index("--partition") + 1] == "warm-x"  # its own partition, not the serving holds'


def test_cancel_mem_hold_only_ours_by_name_partition_and_user() -> None:
    r = held_runner(held="gpu-node-02")
    a = CliSlurm(runner=r, hold_user="root")
    assert a.cancel_mem_hold(NODE) == ()
    assert r.writes() == []
    assert a.cancel_mem_hold("gpu-node-02") == ("77",)
    assert r.writes() == [["scancel", "--name=gpu-bridge-warm:gpu-node-02", "--partition=gpu-bridge-warm", "--user=root", "77"]]
    other = held_runner(held="gpu-node-02")
    assert CliSlurm(runner=other, hold_user="gpu-bridge").cancel_mem_hold("gpu-node-02") == ()  # root's: not ours
    assert other.writes() == []


@pytest.mark.parametrize("node", ["gpu-node-01;reboot", "-w", "", "gpu node"])
def test_bad_node_names_never_reach_argv(node: str) -> None:
    r = held_runner()
    a = CliSlurm(runner=r)
    for call in (lambda: a.submit_mem_hold(node, 1000), lambda: a.cancel_mem_hold(node)):
        with pytest.raises(AdapterError):
            call()
    assert r.calls == []


@pytest.mark.parametrize("mem_mb", [0, -1, True, "12000", 1.5, 1 << 41])
def test_bad_sizes_never_reach_argv(mem_mb: object) -> None:
    r = held_runner()
    with pytest.raises(AdapterError, match="not a positive number of MB"):
        CliSlurm(runner=r).submit_mem_hold(NODE, mem_mb)  # type: ignore[arg-type]
    assert r.writes() == []


def test_a_memory_hold_is_never_requeued_or_released_as_research() -> None:
    fake = FakeSlurm()
    fake.add_node(NODE)
    job = fake.submit_mem_hold(NODE, 1000)
    with pytest.raises(NotOursError):
        fake.requeue(job)
    with pytest.raises(NotOursError):
        fake.release(job, "launch_failed_requeued_held")


# --- the join: a memory hold by partition, name and user -------------------------------------


def _join(config: Config, jobs: list[SlurmJob]) -> Observation:
    kube = FakeKube()
    slurm = FakeSlurm()
    for n in ("gpu-node-01", "gpu-node-02"):
        kube.add_node(n, "default", labels={wk.LABEL_PHASE: "lent"}, annotations={wk.ANNOTATION_PHASE_SINCE: "1"})
        slurm.add_node(n)
    return join(now=2e9, config=config, kube_nodes=kube.nodes(), pods={"default": ()}, desired_replicas={"default": 0},
                slurm_nodes=slurm.nodes(), slurm_jobs=jobs, readings={"default": Readings(None)})


def _job(job_id: str, name: str, partition: str, state: str = "running", user: str = "root") -> SlurmJob:
    nodes = () if state == "pending" else (NODE,)
    return SlurmJob(job_id, name, user, partition, state, nodes, start_time=None, gpus_per_node=0)


def test_the_join_tells_a_memory_hold_from_research_jobs() -> None:
    name = wk.SLURM_WARM_HOLD_JOB_PREFIX + NODE
    obs = _join(default_config(), [_job("7", name, wk.SLURM_WARM_PARTITION), _job("8", "train", wk.SLURM_PREEMPT_PARTITION)])
    f = obs.facts[NODE]
    assert f.mem_hold == HoldFacts("7", running=True) and f.research_jobs == ("8",) and "7" not in obs.view.jobs
    assert obs.facts["gpu-node-02"].mem_hold is None
    pending = _join(default_config(), [_job("7", name, wk.SLURM_WARM_PARTITION, state="pending")])
    assert pending.facts[NODE].mem_hold == HoldFacts("7", running=False) and pending.view.pending_research_nodes == 0
    gone = _join(default_config(), [_job("7", name, wk.SLURM_WARM_PARTITION, state="completing")])  # cancelled
    assert gone.facts[NODE].mem_hold is None and gone.facts[NODE].research_jobs == ()


@pytest.mark.parametrize(
    ("partition", "user"),
    [(wk.SLURM_PREEMPT_PARTITION, "root"), (wk.SLURM_HOLD_PARTITION, "root"), (wk.SLURM_WARM_PARTITION, "mallory")],
    ids=["named-so-in-preempt", "named-so-in-the-hold-partition", "another-users-with-hold_user-set"],
)
def test_a_job_only_named_like_a_memory_hold_is_research(partition: str, user: str) -> None:
    c = default_config()
    config = replace(c, slurm=replace(c.slurm, hold_user="root"))
    obs = _join(config, [_job("7", wk.SLURM_WARM_HOLD_JOB_PREFIX + NODE, partition, user=user)])
    assert obs.facts[NODE].mem_hold is None and obs.facts[NODE].research_jobs == ("7",)


def test_the_warm_partition_comes_from_the_config() -> None:
    c = default_config()
    config = replace(c, slurm=replace(c.slurm, warm_partition="site-warm"))
    name = wk.SLURM_WARM_HOLD_JOB_PREFIX + NODE
    assert _join(config, [_job("7", name, "site-warm")]).facts[NODE].mem_hold == HoldFacts("7", running=True)
    assert _join(config, [_job("7", name, wk.SLURM_WARM_PARTITION)]).facts[NODE].research_jobs == ("7",)
