"""Which lent nodes to take back: the cheapest in lost research work.

Cost of preempting a job = GPU-hours since its last checkpoint (``checkpoint_time``, else
its start) x every GPU it holds (all its nodes). A node is free once every job on it is
preempted, so a 2-node job's preemption frees both nodes and, if both are reclaimed, its
loss is paid once. Order of preference:

1. nodes idle in Slurm (no jobs): free;
2. nodes whose jobs all ran at least ``min_runtime_s``, choosing the set with the least lost
   GPU-hours: nodes linked by multi-node jobs form groups; within a group the cheapest way to
   free j nodes is found greedily (exact when a group is one job), and a small knapsack over
   the groups picks how many nodes each group gives (exact across groups);
3. only when ``allow_young`` (urgent demand) and still short: nodes with younger jobs or
   jobs the view does not know (unknown = assumed expensive, fail safe).

With ``fast_first`` (a surprise, with the fast-grace tier on) fast-tier nodes come before
normal ones within each of 2 and 3: they are back one normal grace sooner.

Ties break by node name, so the same view always gives the same victims. The naive
``newest_first`` rule (most recently started job first) exists for comparison.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bridge.config import VictimRule
from bridge.model import NodeState, SlurmJob, Tier

UNKNOWN_JOB_HOURS = 24.0  # a job we cannot see is assumed to lose this many hours per GPU


@dataclass(frozen=True, slots=True)
class VictimChoice:
    nodes: tuple[str, ...]  # in reclaim order
    jobs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # node -> jobs its reclaim preempts first
    lost_gpu_hours: float = 0.0  # total estimated loss of every preempted job
    short: int = 0  # nodes wanted but not choosable
    short_because_young: int = 0  # of those, blocked only by min_runtime_s


def saves_within_grace(job: SlurmJob, grace_s: float | None) -> bool:
    """A requeueable job that checkpoints on the preemption signal (``signal_save_s``) within
    the grace period loses nothing to a preemption."""
    return grace_s is not None and job.signal_save_s is not None and job.requeueable and job.signal_save_s <= grace_s


def job_loss_gpu_hours(job: SlurmJob, now: float, grace_s: float | None = None) -> float:
    """GPU-hours a preemption of ``job`` throws away (all its nodes); none if it saves on the
    signal within ``grace_s``."""
    if saves_within_grace(job, grace_s):
        return 0.0
    since = job.checkpoint_time if job.checkpoint_time is not None and job.requeueable else job.start_time
    if since is None or not math.isfinite(since):
        return 0.0 if job.state == "pending" else UNKNOWN_JOB_HOURS * job.gpus_per_node * max(1, len(job.nodes))
    hours = max(0.0, now - since) / 3600.0
    return hours * job.gpus_per_node * max(1, len(job.nodes))


def choose_victims(
    candidates: Sequence[NodeState], count: int, jobs: Mapping[str, SlurmJob], now: float, *,
    rule: VictimRule = VictimRule.LEAST_LOST_WORK, min_runtime_s: float = 0.0, allow_young: bool = False,
    grace_s: float | None = None, fast_first: bool = False,
) -> VictimChoice:
    """Pick up to ``count`` nodes among ``candidates`` (already filtered: lent, not pinned);
    ``fast_first``: fast-tier nodes before normal ones (``NodeState.tier``)."""
    if count <= 0 or not candidates:
        return VictimChoice((), short=max(0, count))
    cands = sorted(candidates, key=lambda n: n.name)
    node_jobs: dict[str, frozenset[str]] = {n.name: frozenset(n.jobs) for n in cands}
    loss: dict[str, float] = {}
    young: set[str] = set()
    for js in node_jobs.values():
        for j in js:
            if j in loss:
                continue
            job = jobs.get(j)
            if job is None:
                loss[j] = UNKNOWN_JOB_HOURS * 4
                young.add(j)  # unknown: only as a last resort
                continue
            loss[j] = job_loss_gpu_hours(job, now, grace_s)
            if job.start_time is None or now - job.start_time < min_runtime_s:
                if job.state != "pending":
                    young.add(j)
    idle = [n.name for n in cands if not node_jobs[n.name]]
    old = [n.name for n in cands if node_jobs[n.name] and not (node_jobs[n.name] & young)]
    rest = [n.name for n in cands if node_jobs[n.name] & young]

    pick = _Picking(count, node_jobs, loss, idle[:count])
    tiers = [old] + ([rest] if allow_young else [])
    if fast_first:
        fast = {n.name for n in cands if n.tier is Tier.FAST}
        tiers = [part for t in tiers for part in ([n for n in t if n in fast], [n for n in t if n not in fast])]
    for tier in tiers:
        if len(pick.chosen) >= count:
            break
        if rule is VictimRule.NEWEST_FIRST:
            _newest_first(tier, pick, jobs)
        else:
            _least_lost_groups(tier, pick)
    if rule is VictimRule.LEAST_LOST_WORK:
        _trim(pick)
    chosen, preempted = pick.chosen, pick.preempted
    per_node = {n: tuple(sorted(node_jobs[n])) for n in chosen if node_jobs[n]}
    short = count - len(chosen)
    blocked_young = min(short, len([n for n in rest if n not in chosen])) if short > 0 and not allow_young else 0
    return VictimChoice(tuple(chosen), per_node, sum(loss[j] for j in sorted(preempted)), short, blocked_young)


@dataclass
class _Picking:
    """A choice being made: ``count`` nodes wanted, those ``chosen`` so far and the jobs
    ``preempted`` to free them, over each candidate's jobs and each job's loss."""

    count: int
    node_jobs: Mapping[str, frozenset[str]]
    loss: Mapping[str, float]
    chosen: list[str] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)


def _least_lost(tier: list[str], pick: _Picking) -> None:
    count, chosen, preempted, node_jobs, loss = pick.count, pick.chosen, pick.preempted, pick.node_jobs, pick.loss
    # Greedy: the step (preempt one node's remaining jobs) with the lowest loss per node it
    # frees, counting at most the nodes still needed. Nodes freed on the way join in name order.
    while len(chosen) < count:
        need = count - len(chosen)
        left = [n for n in tier if n not in chosen]
        if not left:
            return
        best: tuple[float, float, str] | None = None
        best_frees: list[str] = []
        best_jobs: frozenset[str] = frozenset()
        for n in left:
            new = node_jobs[n] - preempted
            cost = sum(loss[j] for j in new)
            after = preempted | new
            frees = [m for m in left if node_jobs[m] <= after]
            gain = min(len(frees), need)
            key = (cost / gain, cost, n)
            if best is None or key < best:
                best, best_frees, best_jobs = key, frees, new
        preempted |= best_jobs
        # the node picked first, then the others it freed
        first = best[2]  # type: ignore[index]
        order = [first] + [m for m in best_frees if m != first]
        for m in order:
            if len(chosen) < count:
                chosen.append(m)


def _groups(tier: list[str], node_jobs: Mapping[str, frozenset[str]]) -> list[list[str]]:
    """Nodes linked by shared jobs, each group sorted, groups by their first name."""
    parent = {n: n for n in tier}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    by_job: dict[str, str] = {}
    for n in tier:
        for j in sorted(node_jobs[n]):
            if j in by_job:
                a, b = find(n), find(by_job[j])
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                by_job[j] = n
    groups: dict[str, list[str]] = {}
    for n in tier:
        groups.setdefault(find(n), []).append(n)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


def _least_lost_groups(tier: list[str], pick: _Picking) -> None:
    count, chosen, preempted, node_jobs, loss = pick.count, pick.chosen, pick.preempted, pick.node_jobs, pick.loss
    need = count - len(chosen)
    if need <= 0:
        return
    left = [n for n in tier if n not in chosen]
    # options[g][j] = (cost, nodes, jobs) to free j nodes of group g
    options: list[dict[int, tuple[float, tuple[str, ...], frozenset[str]]]] = []
    for g in _groups(left, node_jobs):
        opts: dict[int, tuple[float, tuple[str, ...], frozenset[str]]] = {}
        for j in range(1, min(len(g), need) + 1):
            trial = _Picking(j, node_jobs, loss, preempted=set(preempted))
            _least_lost(g, trial)
            new = frozenset(trial.preempted - preempted)
            opts[j] = (sum(loss[x] for x in new), tuple(trial.chosen), new)
        options.append(opts)
    # knapsack over groups: best[k] = (cost, names, picks) freeing exactly k nodes
    Best = tuple[float, tuple[str, ...], tuple[tuple[int, int], ...]]
    best: dict[int, Best] = {0: (0.0, (), ())}
    for gi, opts in enumerate(options):
        nxt = dict(best)
        for k, (cost, names, picks) in best.items():
            for j, (c, ns, _) in opts.items():
                if k + j > need:
                    continue
                cand = (round(cost + c, 9), tuple(sorted(names + ns)), picks + ((gi, j),))
                cur = nxt.get(k + j)
                if cur is None or cand[:2] < cur[:2]:
                    nxt[k + j] = cand
        best = nxt
    k = max(best)
    for gi, j in best[k][2]:
        _, ns, js = options[gi][j]
        chosen.extend(ns)
        preempted |= js


def _newest_first(tier: list[str], pick: _Picking, jobs: Mapping[str, SlurmJob]) -> None:
    def newest(n: str) -> float:
        starts = [jobs[j].start_time or 0.0 for j in pick.node_jobs[n] if j in jobs]
        return max(starts) if starts else math.inf

    for n in sorted(tier, key=lambda n: (-newest(n), n)):
        if len(pick.chosen) >= pick.count:
            return
        if n not in pick.chosen:
            pick.chosen.append(n)
            pick.preempted |= pick.node_jobs[n]


def _trim(pick: _Picking) -> None:
    """Drop preempted jobs no chosen node needs (a greedy step may have freed extra nodes)."""
    needed = set().union(*(pick.node_jobs[n] for n in pick.chosen)) if pick.chosen else set()
    pick.preempted &= needed
