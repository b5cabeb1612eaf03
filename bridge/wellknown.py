"""Every name gpu-bridge writes into the outside world, in one place.

Kubernetes labels/annotations/taints live under one prefix; Slurm reasons carry one prefix,
so the daemon recognises what it set itself and never touches what an administrator set.
"""

from __future__ import annotations

PREFIX = "gpu-bridge.io"

# --- Kubernetes node labels (selectable) -------------------------------------------------
LABEL_POOL = f"{PREFIX}/pool"  # which lending pool a node belongs to (opt-in marker)
LABEL_PHASE = f"{PREFIX}/phase"  # serving | lending | lent | reclaiming | returning
LABEL_PIN = f"{PREFIX}/pin"  # serving | slurm: operator override, the policy never moves it

# --- Kubernetes node annotations (facts with detail) -------------------------------------
ANNOTATION_PHASE_SINCE = f"{PREFIX}/phase-since"  # unix seconds, float, when the phase began
ANNOTATION_REASON = f"{PREFIX}/reason"  # human-readable reason of the last transition
ANNOTATION_OWNER = f"{PREFIX}/owner"  # identity of the daemon instance that made the change
# An operator's request (`gpu-bridge lend|reclaim NODE`): lend | reclaim. The leader carries it
# out through the same lifecycle and safety checks as its own decisions, then removes it.
ANNOTATION_REQUEST = f"{PREFIX}/request"
REQUESTS = ("lend", "reclaim")
ANNOTATION_CORDONED = f"{PREFIX}/cordoned"  # "true": gpu-bridge set spec.unschedulable, so it may undo it
# warm lending (docs/warm-lending.md): "<asleep|awake|cold>/<pod>", the replica put to sleep on the node
ANNOTATION_WARM = f"{PREFIX}/warm"
# the pod condition of the readiness gate a warm pool's Deployment declares: False keeps a
# sleeping replica out of the Service (needs RBAC patch on pods/status)
CONDITION_AWAKE = f"{PREFIX}/awake"

# --- Kubernetes taint placed on a node while it is not serving ---------------------------
TAINT_KEY = f"{PREFIX}/lent"
TAINT_EFFECT = "NoSchedule"

# Standard Kubernetes keys the bridge reads or writes.
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
GPU_RESOURCE = "nvidia.com/gpu"

# --- Slurm ---------------------------------------------------------------------------------
SLURM_REASON_PREFIX = "gpu-bridge:"  # every drain reason the bridge sets starts with this
SLURM_PREEMPT_PARTITION = "preempt"  # research jobs: PreemptMode=REQUEUE, GraceTime
SLURM_HOLD_PARTITION = "gpu-bridge"  # high PriorityTier, only the bridge's user: placeholder jobs
SLURM_HOLD_JOB_PREFIX = "gpu-bridge-hold:"  # job name of a placeholder holding a node for serving
# warm lending (docs/warm-lending.md): a node lent with its replica asleep carries a memory-hold
# job in its own never-preempted partition, keeping the sleeping weights' host memory from research
SLURM_WARM_PARTITION = "gpu-bridge-warm"
SLURM_WARM_HOLD_JOB_PREFIX = "gpu-bridge-warm:"  # job name of a memory hold: gpu-bridge-warm:<node>
SLURM_CHECKPOINT_COMMENT = "gpu-bridge:checkpoint="  # jobs publish their last checkpoint time
LAST_UNIX_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z: a time beyond it cannot be shown (datetime raises)
# jobs that checkpoint on the preemption signal publish how long that takes (seconds)
SLURM_SIGNAL_SAVE_COMMENT = "gpu-bridge:save-on-signal="
# Exit code of a job that saved its work on the preemption signal and wants to run again:
# slurm.conf's RequeueExit makes slurmctld requeue it, whenever it exits (before, at or after
# the end of GraceTime, with or without gpu-bridge running). 75 is EX_TEMPFAIL (sysexits.h):
# "temporary failure, try again". Exported to jobs as GPU_BRIDGE_REQUEUE_EXIT.
SLURM_REQUEUE_EXIT = 75
# OverTimeLimit (minutes) of the preemptible partition: a job that finishes its work and exits
# 0 after its preemption end time (EndTime = PreemptTime + GraceTime), before Slurm's periodic
# time-limit sweep (30 s on 22.05) has requeued it, ends COMPLETED instead of TIMEOUT.
SLURM_PREEMPT_OVER_TIME_LIMIT_MIN = 2
# Drain reasons slurmctld/slurmd set themselves (22.05 .. 24.11): the only entries
# slurm.own_drain_reasons accepts, so no prefix can take an administrator's reason for Slurm's.
SLURM_OWN_DRAIN_REASONS = ("Duplicate jobid", "Kill task failed", "Prolog error", "Epilog error",
                           "batch job complete failure")


def is_slurm_reason(reason: str, own: str) -> bool:
    """``reason`` is Slurm's ``own`` reason: the whole text, or ``own`` followed by details after
    a space, colon or parenthesis (case-insensitive); never a mere prefix of another word."""
    low, want = reason.strip().lower(), own.strip().lower()
    return bool(want) and (low == want or (low.startswith(want) and low[len(want)] in " :("))

# --- Leader election -----------------------------------------------------------------------
LEASE_NAME = "gpu-bridge"


def is_date(t: float) -> bool:
    """Whether unix time ``t`` is a date that can be shown (1970 to 9999: ``datetime`` raises
    beyond, and NaN compares as nothing). Times from outside (annotations, job comments, Slurm's
    numbers, a flag) are checked with it before they are formatted."""
    return 0 <= t <= LAST_UNIX_S
