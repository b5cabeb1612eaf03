#!/usr/bin/env python3
"""A tiny, deterministic stand-in for a training loop that survives preemption.

What a real job should copy from it:
  * checkpoint periodically, and at once on SIGUSR1 (the pre-preemption signal gpu-bridge's
    Slurm setup sends at the start of GraceTime) and on SIGTERM (end of GraceTime; SIGKILL
    follows KillWait seconds later);
  * after saving on the signal, exit with GPU_BRIDGE_REQUEUE_EXIT (75, slurm.conf's
    RequeueExit): Slurm then requeues the job whenever it exits, before or after the end of
    its GraceTime (exit 0 would end it COMPLETED with its work unfinished, any other code
    FAILED), and the node is free for serving at once;
  * write checkpoints atomically (temp file + rename), so a kill mid-write leaves the old one;
  * publish the checkpoint time in the job's comment, `gpu-bridge:checkpoint=<unix time>`,
    and how long a checkpoint on the signal takes, `gpu-bridge:save-on-signal=<seconds>`:
    gpu-bridge preempts the jobs that lose the least work first (one that saves within the
    grace period loses nothing);
  * on start, resume from the checkpoint if there is one (after a requeue, SLURM_RESTART_COUNT
    is 1, 2, ...), so the result is the same as an uninterrupted run.

Only the standard library; configuration from the environment:
  TRAIN_STEPS (200), STEP_S (0.5), CKPT_EVERY (20 steps), CKPT_DIR (./ckpt-$SLURM_JOB_ID),
  RESULT_FILE (./result-$SLURM_JOB_ID.txt).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REQUEUE_EXIT = int(os.environ.get("GPU_BRIDGE_REQUEUE_EXIT", "75"))  # bridge.wellknown.SLURM_REQUEUE_EXIT
COMMENT_PREFIX = "gpu-bridge:checkpoint="  # bridge.wellknown.SLURM_CHECKPOINT_COMMENT
SAVE_PREFIX = "gpu-bridge:save-on-signal="  # bridge.wellknown.SLURM_SIGNAL_SAVE_COMMENT
MASK = (1 << 64) - 1


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def step_fn(state: int, step: int) -> int:
    """One deterministic 'training step' (an LCG over the step number)."""
    return (state * 6364136223846793005 + 1442695040888963407 + step) & MASK


def save(ckpt: Path, step: int, state: int) -> float:
    tmp = ckpt.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "state": state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt)
    return time.time()


def publish(job_id: str | None, t: float, save_s: float) -> None:
    """Tell gpu-bridge (through Slurm) how fresh our checkpoint is and how long saving on the
    signal takes; failure is not fatal."""
    if not job_id:
        return
    comment = f"{COMMENT_PREFIX}{int(t)},{SAVE_PREFIX}{math.ceil(save_s)}"
    argv = ["scontrol", "update", f"JobId={job_id}", f"Comment={comment}"]
    try:
        subprocess.run(argv, check=True, timeout=10, capture_output=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"could not publish checkpoint time: {exc}")


def main() -> int:
    job_id = os.environ.get("SLURM_JOB_ID")
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    steps = int(os.environ.get("TRAIN_STEPS", "200"))
    step_s = float(os.environ.get("STEP_S", "0.5"))
    every = int(os.environ.get("CKPT_EVERY", "20"))
    tag = job_id or str(os.getpid())
    ckpt_dir = Path(os.environ.get("CKPT_DIR", f"ckpt-{tag}"))
    result_file = Path(os.environ.get("RESULT_FILE", f"result-{tag}.txt"))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_dir / "checkpoint.json"

    pending: list[str] = []
    signal.signal(signal.SIGUSR1, lambda *_: pending.append("USR1"))
    signal.signal(signal.SIGTERM, lambda *_: pending.append("TERM"))

    step, state = 0, 0
    if ckpt.exists():
        saved = json.loads(ckpt.read_text())
        step, state = int(saved["step"]), int(saved["state"])
        log(f"resumed from step {step} (restart {restarts})")
    else:
        log(f"starting from step 0 (restart {restarts})")

    while step < steps:
        if pending:
            why = pending[-1]
            pending.clear()
            t0 = time.monotonic()
            t = save(ckpt, step, state)
            publish(job_id, t, step_s + (time.monotonic() - t0) + 1.0)
            log(f"checkpoint at step {step} on SIG{why}")
            log(f"exiting {REQUEUE_EXIT}: Slurm requeues the job and it resumes from this checkpoint")
            return REQUEUE_EXIT
        time.sleep(step_s)
        state = step_fn(state, step)
        step += 1
        if step % every == 0:
            t0 = time.monotonic()
            t = save(ckpt, step, state)
            # on a signal: noticed within one step, then one save like this one
            publish(job_id, t, step_s + (time.monotonic() - t0) + 1.0)
            log(f"checkpoint at step {step}")

    result = f"{state:016x}"
    result_file.write_text(result + "\n")
    log(f"done: {steps} steps, result {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
