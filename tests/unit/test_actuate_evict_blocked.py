"""A PDB-blocked eviction is not a write: the actuator must not report it as changed (the
daemon chains changed steps within a tick, so a blocked eviction was retried ~50 times a
second, each with a Kubernetes Event; found by scripts/reliability.py's PDB outage)."""

from __future__ import annotations

from typing import Any

from bridge.actuate import Actuator
from bridge.adapters.protocols import PoolTarget
from bridge.adapters.kube.objects import EvictOutcome
from bridge.lifecycle import LENDING_POD_DELETION_COST, NodeFacts, PodFacts, Step
from bridge.model import Phase


class EvictOnlyKube:
    """The part of KubeWrites an eviction uses; answers every eviction with ``outcome``."""

    def __init__(self, outcome: EvictOutcome) -> None:
        self.outcome = outcome
        self.evictions: list[str] = []
        self.events: list[tuple[str, str]] = []

    def evict(self, namespace: str, pod: str) -> EvictOutcome:
        self.evictions.append(pod)
        return self.outcome

    def emit_event(self, node: str, reason: str, message: str, event_type: str = "Normal") -> None:
        self.events.append((node, reason))


class NoSlurm:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"no Slurm write expected, got {name}")


def _facts() -> NodeFacts:
    pod = PodFacts("vllm-a", ready=True, terminating=False, deletion_cost=LENDING_POD_DELETION_COST)
    return NodeFacts(name="n1", phase=Phase.LENDING, phase_since=0.0, fenced=True, pods=(pod,),
                     slurm_drained_by_us=True, slurm_drained_by_other=False, slurm_down=False,
                     slurm_allocated=False, hold=None, research_jobs=())


def _run(outcome: EvictOutcome) -> tuple[bool, EvictOnlyKube]:
    kube = EvictOnlyKube(outcome)
    act = Actuator(kube=kube, slurm=NoSlurm(), clock=lambda: 1.0)  # type: ignore[arg-type]
    changed = act.execute(Step.EVICT_POD, _facts(), PoolTarget("default", "serving", "vllm"), now=1.0).changed
    return changed, kube


def test_blocked_eviction_is_not_a_change_and_emits_no_event() -> None:
    changed, kube = _run(EvictOutcome.BLOCKED)
    assert kube.evictions == ["vllm-a"]
    assert changed is False
    assert kube.events == []


def test_accepted_eviction_is_a_change_with_an_event() -> None:
    changed, kube = _run(EvictOutcome.EVICTED)
    assert changed is True
    assert kube.events == [("n1", "GpuBridgeEvicting")]
