"""What the running Slurm must say for gpu-bridge's design, judged from plain data.

``check(config, settings, partitions)`` takes slurmctld's running settings (``scontrol show
config``) and partitions (``scontrol show partition``) as dicts and returns what is missing or
conflicting, each with the key, what was found, why gpu-bridge needs otherwise and the fix.
No I/O: ``gpu-bridge check-slurm`` (bridge.cli.check_slurm) reads Slurm and prints the result.

Why a check and not a slurm.conf to paste: PreemptType, PreemptMode, SlurmctldParameters,
JobSubmitPlugins, CliFilterPlugins and RequeueExit are cluster-wide; a second line appended to
slurm.conf silently replaces the site's own value (its other plugins, its configless mode).
The snippet leaves them to be merged by hand; this says whether the merge is right.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bridge import wellknown
from bridge.adapters.slurm.hostlist import expand
from bridge.config import Config
from bridge.errors import AdapterError


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing missing or conflicting: ``key`` (a slurm.conf key, or ``PartitionName=P Key``),
    what slurmctld runs with, and what to do."""

    key: str
    found: str
    problem: str

    def __str__(self) -> str:
        return f"{self.key} = {self.found or '(not set)'}: {self.problem}"


def _items(value: str) -> list[str]:
    """A comma-separated Slurm list, each item lower-cased; "(null)" is empty."""
    return [v.strip().lower() for v in value.split(",") if v.strip() and v.strip().lower() != "(null)"]


def _plugin_names(value: str) -> set[str]:
    """``lua`` from ``lua``, ``job_submit/lua`` or ``cli_filter/lua``."""
    return {v.rsplit("/", 1)[-1] for v in _items(value)}


def _seconds(value: str) -> float | None:
    """GraceTime as ``scontrol show partition`` prints it: seconds (``120``), or None."""
    try:
        return float(value)
    except ValueError:
        return None


def _nodes(value: str) -> frozenset[str] | None:
    """A partition's node list expanded; None for ``ALL`` (every node of the cluster)."""
    if value.strip().upper() == "ALL":
        return None
    try:
        return frozenset(expand(value))
    except AdapterError:
        return frozenset()


def check(config: Config, settings: Mapping[str, str], partitions: Mapping[str, Mapping[str, str]]) -> list[Finding]:
    """Everything in the running Slurm that gpu-bridge's design needs and does not find."""
    out: list[Finding] = []
    get = settings.get

    preempt_type = get("PreemptType", "")
    if preempt_type != "preempt/partition_prio":
        out.append(Finding("PreemptType", preempt_type, "needs preempt/partition_prio: a hold job in the top-tier "
                                                        "partition is how gpu-bridge preempts research jobs"))
    mode = _items(get("PreemptMode", ""))
    if "gang" in mode or "suspend" in mode:
        out.append(Finding("PreemptMode", get("PreemptMode", ""), "GANG/SUSPEND conflict with gpu-bridge: a GPU "
                                                                  "cannot be shared; preempted jobs must be requeued"))
    if ("preempt_send_user_signal" not in _items(get("SlurmctldParameters", ""))
            and "send_user_signal" not in _items(get("PreemptParameters", ""))):
        out.append(Finding("SlurmctldParameters", get("SlurmctldParameters", ""),
                           "lacks preempt_send_user_signal (24.11: PreemptParameters=send_user_signal): without it a "
                           "preempted job hears its signal only at the end of GraceTime, too late to checkpoint; "
                           "add it to the existing list, do not replace the list"))
    requeue_exit = [v.strip() for v in get("RequeueExit", "").split(",")]
    if str(wellknown.SLURM_REQUEUE_EXIT) not in requeue_exit:
        out.append(Finding("RequeueExit", get("RequeueExit", ""),
                           f"lacks {wellknown.SLURM_REQUEUE_EXIT}: a job that saved its work on the signal and exits "
                           f"{wellknown.SLURM_REQUEUE_EXIT} ends FAILED instead of being requeued"))
    if "lua" not in _plugin_names(get("JobSubmitPlugins", "")):
        out.append(Finding("JobSubmitPlugins", get("JobSubmitPlugins", ""),
                           "lacks lua: job_submit.lua keeps every job of the preemptible partition requeueable and "
                           "the hold partition the bridge's; add lua to the existing list"))
    if "lua" not in _plugin_names(get("CliFilterPlugins", "")):
        out.append(Finding("CliFilterPlugins", get("CliFilterPlugins", ""),
                           "lacks cli_filter/lua: research jobs get no default pre-preemption signal"))

    pname, hname = config.slurm.preempt_partition, config.slurm.hold_partition
    preempt, hold = partitions.get(pname), partitions.get(hname)
    if preempt is None:
        out.append(Finding(f"PartitionName={pname}", "", "missing: research jobs run there (slurm.preempt_partition)"))
    else:
        key = f"PartitionName={pname}"
        out += _preemptible(key, preempt)
        grace = _seconds(preempt.get("GraceTime", ""))
        if grace is None or abs(grace - config.slurm.grace_s) > 0.5:
            out.append(Finding(f"{key} GraceTime", preempt.get("GraceTime", ""),
                               f"differs from slurm.grace_s ({config.slurm.grace_s:g} s in the config): gpu-bridge "
                               "would requeue jobs before their checkpoint time is over, or wait for nothing"))
    if hold is None:
        out.append(Finding(f"PartitionName={hname}", "", "missing: the bridge's hold jobs run there (slurm.hold_partition)"))
    else:
        key = f"PartitionName={hname}"
        if hold.get("PreemptMode", "").upper() != "OFF":
            out.append(Finding(f"{key} PreemptMode", hold.get("PreemptMode", ""), "needs OFF: a hold job is never preempted"))
        if not hold.get("OverSubscribe", "").upper().startswith("EXCLUSIVE"):
            out.append(Finding(f"{key} OverSubscribe", hold.get("OverSubscribe", ""),
                               "needs EXCLUSIVE: a hold job keeps the whole node for serving"))
        if hold.get("MaxTime", "").upper() != "UNLIMITED":
            out.append(Finding(f"{key} MaxTime", hold.get("MaxTime", ""), "needs UNLIMITED: a hold job runs as long as the node serves"))
    if preempt is not None and hold is not None and not _tier_above(hold, preempt):
        out.append(Finding(f"PartitionName={hname} PriorityTier", hold.get("PriorityTier", ""),
                           f"must be higher than {pname}'s ({preempt.get('PriorityTier', '')}): otherwise a hold job "
                           "preempts nothing and no node can be reclaimed"))
    fname = config.slurm.fast_partition
    if fname is not None:
        out += _fast_tier(config, fname, partitions.get(fname), preempt, hold)
    wname = config.slurm.warm_partition  # the memory holds: the bridge's own jobs, cancelled at each reclaim
    if any(p.warm_lending for p in config.pools):
        out += _warm_lending(config, settings, partitions.get(wname), preempt, hold)
    if preempt is not None:
        lendable = _nodes(preempt.get("Nodes", ""))
        fast_nodes = _nodes(partitions[fname].get("Nodes", "")) if fname is not None and fname in partitions else frozenset()
        lendable = lendable | fast_nodes if lendable is not None and fast_nodes is not None else None  # lent nodes move
        for name, part in sorted(partitions.items()):
            if name in (pname, hname, fname, wname):
                continue
            other = _nodes(part.get("Nodes", ""))
            shared = sorted(lendable & other) if lendable is not None and other is not None else None
            if shared is None or shared:
                which = ", ".join(shared[:5]) + (" ..." if len(shared) > 5 else "") if shared else "all nodes"
                out.append(Finding(f"PartitionName={name} Nodes", part.get("Nodes", ""),
                                   f"shares {which} with {pname}: a job of partition {name} on a lent node could not "
                                   "be preempted, and the node could not be reclaimed"))
    return out


def _tier_above(high: Mapping[str, str], low: Mapping[str, str]) -> bool:
    """``high``'s PriorityTier is above ``low``'s (a hold job preempts its jobs); False unless both are numbers."""
    try:
        return int(high.get("PriorityTier", "")) > int(low.get("PriorityTier", ""))
    except ValueError:
        return False


def _preemptible(key: str, part: Mapping[str, str]) -> list[Finding]:
    """What both research tiers need: requeue on preemption, and an OverTimeLimit that lets a
    job finishing during its GraceTime complete."""
    out: list[Finding] = []
    if "REQUEUE" not in part.get("PreemptMode", "").upper().split(","):
        out.append(Finding(f"{key} PreemptMode", part.get("PreemptMode", ""),
                           "needs REQUEUE: a reclaimed node's jobs are requeued, never cancelled"))
    over = part.get("OverTimeLimit", "")
    if over.upper() != "UNLIMITED" and (_seconds(over) or 0) < wellknown.SLURM_PREEMPT_OVER_TIME_LIMIT_MIN:
        out.append(Finding(f"{key} OverTimeLimit", over,
                           f"needs at least {wellknown.SLURM_PREEMPT_OVER_TIME_LIMIT_MIN} (minutes): a preempted job "
                           "that finishes its work during GraceTime otherwise ends TIMEOUT"))
    return out


def _memory_default(value: str) -> bool:
    """A DefMemPerCPU/DefMemPerNode that gives a job less than the whole node: a number of MB."""
    return value.strip().rstrip("M").isdigit()


def _warm_lending(config: Config, settings: Mapping[str, str], warm: Mapping[str, str] | None,
                  preempt: Mapping[str, str] | None, hold: Mapping[str, str] | None) -> list[Finding]:
    """What warm lending's memory hold needs (docs/warm-lending.md, "How Slurm is told"): its
    partition, never preempted, above the research tier, beside research jobs on every lendable
    node; memory counted; and a default memory for jobs without --mem."""
    wname, pname = config.slurm.warm_partition, config.slurm.preempt_partition
    key = f"PartitionName={wname}"
    out: list[Finding] = []
    if "MEMORY" not in settings.get("SelectTypeParameters", "").upper():
        out.append(Finding("SelectTypeParameters", settings.get("SelectTypeParameters", ""),
                           "needs a *_Memory value (e.g. CR_Core_Memory) for warm lending: without it Slurm does not "
                           "count memory and the memory hold keeps none from research jobs"))
    if preempt is not None and not any(_memory_default(v) for v in (
            preempt.get("DefMemPerCPU", ""), preempt.get("DefMemPerNode", ""),
            settings.get("DefMemPerCPU", ""), settings.get("DefMemPerNode", ""))):
        out.append(Finding(f"PartitionName={pname} DefMemPerCPU", preempt.get("DefMemPerCPU", preempt.get("DefMemPerNode", "")),
                           "needs a value (RealMemory / CPUs) for warm lending: a job without --mem is given the whole "
                           "node's memory and never runs beside a memory hold"))
    if warm is None:
        return [*out, Finding(key, "", "missing: pools[].warm_lending needs it for its memory holds (slurm.warm_partition); "
                                       "add the gpu-bridge-warm line of slurm_conf/slurm.conf.snippet")]
    if warm.get("PreemptMode", "").upper() != "OFF":
        out.append(Finding(f"{key} PreemptMode", warm.get("PreemptMode", ""), "needs OFF: a memory hold is never preempted"))
    if warm.get("OverSubscribe", "").upper().startswith("EXCLUSIVE"):
        out.append(Finding(f"{key} OverSubscribe", warm.get("OverSubscribe", ""),
                           "must not be EXCLUSIVE: a memory hold runs beside the research jobs"))
    if warm.get("MaxTime", "").upper() != "UNLIMITED":
        out.append(Finding(f"{key} MaxTime", warm.get("MaxTime", ""), "needs UNLIMITED: a memory hold runs as long as the node is lent"))
    if preempt is not None and not _tier_above(warm, preempt):
        out.append(Finding(f"{key} PriorityTier", warm.get("PriorityTier", ""),
                           f"must be higher than {pname}'s ({preempt.get('PriorityTier', '')}): a memory hold must "
                           "preempt a research job that leaves it too little memory"))
    if hold is not None:
        mine, held = _nodes(warm.get("Nodes", "")), _nodes(hold.get("Nodes", ""))
        if mine is not None and (held is None or not held <= mine):
            out.append(Finding(f"{key} Nodes", warm.get("Nodes", ""),
                               f"must include every lendable node ({config.slurm.hold_partition}'s, {hold.get('Nodes', '')}): "
                               "a node lent warm needs its memory hold"))
    return out


def _fast_tier(config: Config, fname: str, fast: Mapping[str, str] | None, preempt: Mapping[str, str] | None,
               hold: Mapping[str, str] | None) -> list[Finding]:
    """The fast-grace partition (slurm.fast_partition): a second `preempt` over the same nodes
    whose GraceTime is the config's fast_grace_s, shorter than the normal tier's; the policy
    plans its nodes with that grace, so a partition that releases slower breaks the plan."""
    key = f"PartitionName={fname}"
    if fast is None:
        return [Finding(key, "", "missing: slurm.fast_partition names it (the fast-grace tier); add the "
                                 "preempt-fast line of slurm_conf/slurm.conf.snippet or set fast_partition: null")]
    out = _preemptible(key, fast)
    grace = _seconds(fast.get("GraceTime", ""))
    fast_grace = config.slurm.fast_grace_s
    if grace is None or abs(grace - fast_grace) > 0.5:
        out.append(Finding(f"{key} GraceTime", fast.get("GraceTime", ""),
                           f"differs from slurm.fast_grace_s ({fast_grace:g} s in the config): gpu-bridge would plan "
                           "the tier's nodes as released sooner or later than Slurm releases them"))
    normal = _seconds(preempt.get("GraceTime", "")) if preempt is not None else None
    if grace is not None and normal is not None and grace >= normal:
        out.append(Finding(f"{key} GraceTime", fast.get("GraceTime", ""),
                           f"must be shorter than {config.slurm.preempt_partition}'s ({normal:g} s): the fast tier "
                           "exists to give nodes back sooner"))
    if hold is not None and not _tier_above(hold, fast):
        out.append(Finding(f"{key} PriorityTier", fast.get("PriorityTier", ""),
                           f"must be lower than {config.slurm.hold_partition}'s ({hold.get('PriorityTier', '')}): "
                           "otherwise a hold job cannot preempt its jobs and the node cannot be reclaimed"))
    if preempt is not None and hold is not None:
        # gpu-bridge moves each lent node into its tier's partition only: what stays fixed is that
        # the two cover the lendable nodes (the hold partition's) and nothing else
        mine, theirs, held = (_nodes(p.get("Nodes", "")) for p in (fast, preempt, hold))
        if mine is None or held is None or not mine <= held or (theirs is not None and mine | theirs != held):
            out.append(Finding(f"{key} Nodes", fast.get("Nodes", ""),
                               f"with {config.slurm.preempt_partition} ({preempt.get('Nodes', '')}) must cover exactly "
                               f"the lendable nodes ({config.slurm.hold_partition}'s, {hold.get('Nodes', '')}): a node "
                               "is lent to one tier or the other, and only lendable nodes may be in either"))
    return out
