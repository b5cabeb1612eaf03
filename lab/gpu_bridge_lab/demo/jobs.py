"""The research job stream: what researchers submit to the preemptible partition.

The mix (durations in demo seconds, scaled with ``--minutes``; a 5-minute demo day):

| kind | share | nodes | runs | on reclaim |
| --- | --- | --- | --- | --- |
| ``train`` | 50 % | 1 | 25-50 s | checkpoints on SIGUSR1, resumes after requeue (slurm_conf/examples template) |
| ``train-2n`` | 20 % | 2 | 25-40 s | the same, on two nodes |
| ``sweep`` | 30 % | 1 | 15-30 s | no checkpoint: requeued, starts over |

Jobs arrive while fewer than ``max_pending`` of ours wait, one every ``gap_s`` at most
(researchers do not flood the queue: a realistic backlog of a few jobs). Each job asks for a
``--time`` of about four times its work, so Slurm's backfill can start short jobs while a
two-node job waits for a second lent node. Every job is
``sbatch -p preempt --requeue --gres=gpu:4``; argv lists only, never a shell string.
"""

from __future__ import annotations

import math
import random
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bridge import logs, wellknown

log = logs.get(__name__)

EXAMPLES = Path(__file__).resolve().parents[3] / "slurm_conf" / "examples"
TEMPLATE = "train-checkpointing.sbatch"
STEP_S = 0.5
SWEEP_SCRIPT = """#!/bin/bash
# A parameter-sweep point with no checkpoint: after a requeue it starts over.
#SBATCH --open-mode=append
echo "job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on ${SLURMD_NODENAME:-$(hostname -s)} at $(date -u +%FT%TZ)"
sleep "${JOB_S:-20}" &
child=$!
trap 'echo "SIGUSR1: no checkpoint, this run is lost"' USR1
trap 'kill -TERM "$child" 2>/dev/null; exit 143' TERM
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
echo "done after restart ${SLURM_RESTART_COUNT:-0}"
"""


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    kind: str  # train | train-2n | sweep
    nodes: int
    duration_s: float  # demo seconds of work
    checkpoints: bool


MIX: tuple[tuple[str, float, int, float, float, bool], ...] = (
    # kind, weight, nodes, min_s, max_s, checkpoints  (for a 5-minute day)
    ("train", 0.5, 1, 25.0, 50.0, True),
    ("train-2n", 0.2, 2, 25.0, 40.0, True),
    ("sweep", 0.3, 1, 15.0, 30.0, False),
)


def job_plan(n: int, *, seed: int, time_scale: float) -> list[JobSpec]:
    """``n`` jobs drawn from the mix; durations multiplied by ``time_scale`` (minutes / 5)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind, _w, nodes, lo, hi, ckpt = rng.choices(MIX, weights=[m[1] for m in MIX])[0]
        dur = max(6.0, round(rng.uniform(lo, hi) * time_scale))
        out.append(JobSpec(f"{kind}-{i + 1:02d}", kind, nodes, dur, ckpt))
    return out


class JobSubmitter:
    """Submits the plan as the queue drains; remembers every job id it submitted."""

    def __init__(self, work: Path, env: Mapping[str, str], plan: list[JobSpec], *, max_pending: int, gap_s: float,
                 timeout_s: float = 15.0) -> None:
        self.work = work
        self.env = dict(env)
        self.plan = list(plan)
        self.max_pending = max_pending
        self.gap_s = gap_s
        self.timeout_s = timeout_s
        self.submitted: dict[str, JobSpec] = {}  # job id -> spec
        self.errors: list[str] = []
        self._last = -1e9
        self.out_dir = work / "out"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for f in ("train.py", TEMPLATE):
            shutil.copy(EXAMPLES / f, work / f)
        sweep = work / "sweep.sbatch"
        sweep.write_text(SWEEP_SCRIPT)
        sweep.chmod(0o755)

    def argv(self, spec: JobSpec) -> list[str]:
        common = ["sbatch", "--parsable", "-p", wellknown.SLURM_PREEMPT_PARTITION, "--requeue", "--gres=gpu:4",
                  "-N", str(spec.nodes), "-J", spec.name, "-o", str(self.out_dir / f"{spec.name}-%j.out"),
                  "--open-mode=append", f"--time={math.ceil(spec.duration_s * 4 / 60) + 1}"]
        if spec.checkpoints:
            steps = max(4, int(spec.duration_s / STEP_S))
            every = max(2, steps // 8)
            export = f"--export=ALL,TRAIN_STEPS={steps},STEP_S={STEP_S},CKPT_EVERY={every}"
            return [*common, export, str(self.work / TEMPLATE)]
        return [*common, f"--export=ALL,JOB_S={int(spec.duration_s)}", str(self.work / "sweep.sbatch")]

    def maybe_submit(self, now: float, pending_ours: int) -> JobSpec | None:
        """Submit the next job if the backlog is short and the gap has passed."""
        if not self.plan or pending_ours >= self.max_pending or now - self._last < self.gap_s:
            return None
        spec = self.plan.pop(0)
        self._last = now
        try:
            res = subprocess.run(self.argv(spec), env=self.env, cwd=self.work, capture_output=True, text=True,
                                 timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.errors.append(f"{spec.name}: {exc}")
            return None
        if res.returncode != 0:
            self.errors.append(f"{spec.name}: sbatch rc {res.returncode}: {res.stderr.strip()[-300:]}")
            log.warning("job_submit_failed", job=spec.name, error=res.stderr.strip()[-300:])
            return None
        job_id = res.stdout.strip().split(";")[0]
        self.submitted[job_id] = spec
        return spec
