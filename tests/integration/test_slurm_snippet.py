"""slurm_conf/slurm.conf.snippet, as an administrator would add it, on a real slurmctld: the
daemon accepts it, the partitions and preemption settings are what gpu-bridge relies on, and a
hold job in `gpu-bridge` preempts a research job in `preempt` (default signal at once, requeue).

Only site-specific values are adapted: the node list (the snippet's `gpu-node-[01-16]` line is
replaced by this cluster's nodes) and AllowGroups (the test runs as root).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_fixtures import SlurmOnly, slurm_only

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = ROOT / "slurm_conf" / "slurm.conf.snippet"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
]


def adapted_snippet(nodes: str) -> str:
    text = SNIPPET.read_text()
    text = re.sub(r"^NodeName=gpu-node-\[01-16\].*$", "", text, flags=re.M)  # the cluster's own node lines stay
    text = text.replace("gpu-node-[01-16]", nodes).replace("AllowGroups=gpu-bridge", "AllowGroups=root")
    return text


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmOnly]:
    with slurm_only(nodes=1, slurm_snippet=adapted_snippet("gpu-node-01"),
                    job_submit_lua=ROOT / "slurm_conf" / "job_submit.lua",
                    cli_filter_lua=ROOT / "slurm_conf" / "cli_filter.lua") as c:
        yield c


def kv(text: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", text))


def test_config_is_what_the_bridge_relies_on(cluster: SlurmOnly) -> None:
    config = cluster.run(["scontrol", "show", "config"]).stdout
    assert re.search(r"PreemptType\s+= preempt/partition_prio", config)
    assert re.search(r"PreemptMode\s+= REQUEUE", config)
    assert re.search(r"JobRequeue\s+= 1", config)
    assert re.search(r"SlurmctldParameters\s+= preempt_send_user_signal", config)
    assert re.search(r"JobSubmitPlugins\s+= lua", config)
    preempt = kv(cluster.run(["scontrol", "-o", "show", "partition", "preempt"]).stdout)
    assert preempt["PriorityTier"] == "1" and preempt["PreemptMode"] == "REQUEUE"
    assert preempt["GraceTime"] == "120"
    hold = kv(cluster.run(["scontrol", "-o", "show", "partition", "gpu-bridge"]).stdout)
    assert hold["PriorityTier"] == "100" and hold["PreemptMode"] == "OFF"
    assert hold["OverSubscribe"] == "EXCLUSIVE" and hold["AllowGroups"] == "root"
    assert hold.get("Hidden", "NO") == "NO"  # squeue must show researchers who holds a node


def test_hold_job_preempts_research_job(cluster: SlurmOnly) -> None:
    out = cluster.work / "victim.out"
    script = "trap 'echo URG' URG; echo start; for i in $(seq 400); do sleep 0.25; done"
    r = cluster.run(["sbatch", "--parsable", "-p", "preempt", "-o", str(out), "--wrap", script])
    assert r.returncode == 0, r.stderr
    victim = r.stdout.strip()
    deadline = time.monotonic() + 20
    while not (out.exists() and "start" in out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    r = cluster.run(["sbatch", "--parsable", "-p", "gpu-bridge", "-J", "gpu-bridge-hold:gpu-node-01",
                     "-w", "gpu-node-01", "-o", "/dev/null", "--wrap", "sleep 300"])
    assert r.returncode == 0, r.stderr
    hold = r.stdout.strip()
    deadline = time.monotonic() + 10
    while "URG" not in out.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "URG" in out.read_text()  # signalled at the start of its 120 s GraceTime
    # gpu-bridge requeues once the grace has passed; here at once.
    assert cluster.run(["scontrol", "requeue", victim]).returncode == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if kv(cluster.run(["scontrol", "-o", "show", "job", hold]).stdout).get("JobState") == "RUNNING":
            break
        time.sleep(0.3)
    job = kv(cluster.run(["scontrol", "-o", "show", "job", victim]).stdout)
    assert job["JobState"] == "PENDING" and job["Restarts"] == "1"
    queue = cluster.run(["squeue", "-h", "-o", "%i %P %j %T %N"]).stdout
    assert f"{hold} gpu-bridge gpu-bridge-hold:gpu-node-01 RUNNING gpu-node-01" in queue  # who holds the node
