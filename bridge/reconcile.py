"""One snapshot in, what to do about it out, as data: the loop's decisions in one pure function.

``reconcile`` joins the snapshot (``bridge.observe.join``) with the policy memory's history and
calibration, runs the policy when it is due, checks operators' requests, and names each node's
next lifecycle step and each pool's Deployment scale. Nothing is written here: the actuator
applies the ``Intents``, the daemon feeds what they did back into ``LoopState``.

One kind of change per pass, in this order: the policy's actions, then operators' requests,
then lifecycle steps and scales. Each later kind is decided on a snapshot that already shows
the earlier writes (the daemon re-ticks at once), never on one from before them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from bridge.config import Config
from bridge.lifecycle import WAITS, NodeFacts, Step, desired_replicas, next_step
from bridge.manual import check_request
from bridge.model import Action, Phase, Plan
from bridge.observe import Observation, Snapshot, join
from bridge.policy.memory import PoolMemory
from bridge.policy.plan import plan as policy_plan

# Steps that something outside us may refuse for long (a PDB, an administrator's drain):
# retried with exponential backoff up to this, not every iteration.
RETRIED_STEPS = frozenset({Step.EVICT_POD, Step.DELETE_ASLEEP, Step.BLOCKED})
MAX_RETRY_BACKOFF_S = 60.0


@dataclass
class LoopState:
    """What the loop remembers between passes (lost on restart, rebuilt harmlessly)."""

    last_plan_at: float | None = None
    backoff: dict[str, tuple[Step, float, float]] = field(default_factory=dict)  # node -> (step, next try, delay)
    reported_stuck: set[str] = field(default_factory=set)
    # preempt-partition jobs released after a failed launch: one held so again failed for its
    # own reason (a broken prolog, ...) and is left to people, never released in a loop
    released_jobs: set[str] = field(default_factory=set)
    held_again: set[str] = field(default_factory=set)

    def retry_later(self, node: str, step: Step, now: float) -> float:
        """Back off a refused step: 1 s, doubling to a minute. Returns the delay."""
        prev = self.backoff.get(node)
        delay = min(MAX_RETRY_BACKOFF_S, prev[2] * 2) if prev is not None and prev[0] is step else 1.0
        self.backoff[node] = (step, now + delay, delay)
        return delay


@dataclass(frozen=True, slots=True)
class Intents:
    observation: Observation
    plan: Plan | None = None  # the policy's, when it was due
    starts: tuple[Action, ...] = ()  # policy actions: their first transit mark
    requests: tuple[tuple[str, str, Action | str], ...] = ()  # node, request, the Action or why refused
    steps: tuple[tuple[Step, NodeFacts, str], ...] = ()  # step, node facts, pool
    scales: tuple[tuple[str, int], ...] = ()  # pool -> replicas
    releases: tuple[tuple[str, str | None], ...] = ()  # Slurm-held job -> the pool node it last ran on
    held_again: tuple[tuple[str, str | None], ...] = ()  # held again after one release: left to people
    stuck: tuple[tuple[str, str], ...] = ()  # node -> why it is reported not Ready (once)
    deferred: bool = False  # a later kind of change waits for the next pass


def observation(snapshot: Snapshot, memory: Mapping[str, PoolMemory], config: Config) -> Observation:
    """The snapshot joined, each pool with its memory's history, horizon and calibration."""
    obs = join(now=snapshot.now, config=config, kube_nodes=snapshot.kube_nodes, pods=snapshot.pods,
               desired_replicas=snapshot.desired, slurm_nodes=snapshot.slurm_nodes, slurm_jobs=snapshot.slurm_jobs,
               readings=snapshot.readings, pool_problems=snapshot.pool_problems, slurm_now=snapshot.slurm_now,
               gpu_free=snapshot.gpu_free)
    pools = dict(obs.view.pools)
    for name, ps in pools.items():
        if name in memory:
            nodes = sum(1 for n in obs.view.nodes if n.pool == name)
            pools[name] = memory[name].pool_state(ps, snapshot.now, nodes)
    return replace(obs, view=replace(obs.view, pools=pools))


def reconcile(snapshot: Snapshot, memory: Mapping[str, PoolMemory], config: Config, state: LoopState) -> Intents:
    obs = observation(snapshot, memory, config)
    now = snapshot.now
    stuck = tuple((n, p) for n, p in sorted(obs.problems.items()) if n not in state.reported_stuck
                  and (f := obs.facts.get(n)) is not None and f.phase is Phase.RETURNING and p.startswith("returning for"))
    plan = None
    if state.last_plan_at is None or now - state.last_plan_at >= config.policy.tick_s - 1e-6:
        plan = policy_plan(obs.view, config)
        if plan.actions:
            return Intents(obs, plan, starts=plan.actions, stuck=stuck, deferred=True)
    if obs.requests:
        requests = tuple((n, r, check_request(obs.view, config, n, r)) for n, r in sorted(obs.requests.items()))
        return Intents(obs, plan, requests=requests, stuck=stuck, deferred=True)
    released = [(j, h if h in obs.pool_of else None) for j, h in sorted(obs.slurm_held.items())]
    return Intents(obs, plan, steps=_steps(obs, config, state), scales=_scales(obs, config), stuck=stuck,
                   releases=tuple(r for r in released if r[0] not in state.released_jobs),
                   held_again=tuple(r for r in released if r[0] in state.released_jobs and r[0] not in state.held_again))


def _wants(obs: Observation, config: Config) -> dict[str, int]:
    """Each pool's replicas as its nodes' facts want them (once per pool: per node is O(nodes^2))."""
    return {p.name: desired_replicas([f for n, f in obs.facts.items() if obs.pool_of[n] == p.name]) for p in config.pools}


def _steps(obs: Observation, config: Config, state: LoopState) -> tuple[tuple[Step, NodeFacts, str], ...]:
    """Every node's next lifecycle step; waits left out, refused steps only when their retry is due."""
    wants = _wants(obs, config)
    pools = {p.name: p for p in config.pools}
    now = obs.view.now
    out = []
    for name, facts in sorted(obs.facts.items()):
        if name in obs.problems and facts.phase is None:
            continue  # invalid labels of ours: hold, never guess a phase
        pool = obs.pool_of[name]
        step = next_step(facts, now=now, scaled_down=obs.view.pools[pool].desired_replicas <= wants[pool],
                         grace_s=config.slurm.grace_s, lend_timeout_s=config.policy.lend_timeout_s,
                         drain_saved_after_s=config.slurm.state_save_s, warm=pools[pool].warm_lending,
                         wake_gpu_free_mib=pools[pool].wake_gpu_need_mib, wake_gpu_wait_s=pools[pool].wake_gpu_wait_s)
        due = state.backoff.get(name)
        if step in RETRIED_STEPS and due is not None and due[0] is step and now < due[1]:
            continue  # blocked by something outside us (a PDB, an admin): backing off
        if step is not None and (step not in WAITS or step is Step.BLOCKED):
            out.append((step, facts, pool))
    return tuple(out)


def _scales(obs: Observation, config: Config) -> tuple[tuple[str, int], ...]:
    """Each pool whose Deployment's replicas differ from what its nodes want. Not a pool with
    a node without facts (unknown to Slurm): its share of the scale is unknown too."""
    wants = _wants(obs, config)
    out = []
    for p in config.pools:
        members = [n for n, pool in obs.pool_of.items() if pool == p.name]
        if not any(n in obs.facts for n in members) or any(
            n in obs.problems and (n not in obs.facts or obs.facts[n].phase is None) for n in members
        ):
            continue
        if obs.view.pools[p.name].desired_replicas != wants[p.name]:
            out.append((p.name, wants[p.name]))
    return tuple(out)
