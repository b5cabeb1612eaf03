"""Outage scenarios on the serving sandbox: each fault injected mid-lend or mid-reclaim, the
daemon watched while it lasts, then healed; what the daemon did, logged and exported, and
whether anything was lost. Used by scripts/reliability.py and the tests.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge import wellknown as wk
from gpu_bridge_lab.sandbox import serving
from gpu_bridge_lab.sandbox.e2e import DaemonProc, event_time, poll, read_events
from gpu_bridge_lab.sandbox.faultproxy import FaultProxy, proxied_kubeconfig
from gpu_bridge_lab.sandbox.reliability import HIGH, LOW, Harness

# Metrics shown per outage (what the alert rules in deploy/prometheus/gpu-bridge-rules.yml read).
SHOWN_METRICS = (
    ("gpu_bridge_adapter_errors_total", "GpuBridgeAdapterErrors"),
    ("gpu_bridge_pool_signal_staleness_seconds", "GpuBridgeLoadSignalsStale"),
    ("gpu_bridge_pool_reclaim_in_progress_seconds", "GpuBridgeReclaimStuck"),
    ("gpu_bridge_reclaim_failures_total", "GpuBridgeReclaimFailures"),
    ("gpu_bridge_lend_failures_total", "GpuBridgeLendFailures"),
    ("gpu_bridge_nodes_held", "-"),
)


@dataclass
class OutageRow:
    fault: str
    when: str  # mid-lend | mid-reclaim | while lent
    did: str = ""  # what the daemon did during the fault (phases, transitions)
    logged: str = ""  # warning/error events during the fault, with counts
    metrics: str = ""  # non-zero metrics at the end of the fault, with the alert that reads them
    recovered: bool = False
    recover_s: float | None = None
    violations: list[str] = field(default_factory=list)
    jobs_lost: int = 0
    nodes_lost: int = 0


def _metrics_text(d: DaemonProc) -> str:
    import urllib.request

    url = d.metrics_url(1.0)
    if url is None:
        return ""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback only
            return str(resp.read().decode())
    except OSError:
        return ""


def nonzero_metrics(d: DaemonProc) -> str:
    out = []
    for line in _metrics_text(d).splitlines():
        for name, alert in SHOWN_METRICS:
            if line.startswith(name) and not line.startswith("#"):
                try:
                    v = float(line.rsplit(" ", 1)[1])
                except ValueError:
                    continue
                if v:
                    label = line.rsplit(" ", 1)[0].replace(name, name.replace("gpu_bridge_", ""), 1)
                    out.append(f"{label}={v:g} ({alert})")
    return "; ".join(out)


def warnings_between(d: DaemonProc, t0: float, t1: float) -> str:
    c: Counter[str] = Counter()
    for doc in read_events(d.log_path):
        if not t0 <= event_time(doc) <= t1:
            continue
        if doc.get("level") in ("warning", "error"):
            c[str(doc.get("event"))] += 1
        elif doc.get("event") == "pool_decision" and str(doc.get("reason")).startswith(("signals", "problem")):
            c[f"pool_decision(reason={doc.get('reason')})"] += 1
    return ", ".join(f"{k} x{v}" for k, v in c.most_common(6)) or "(none)"


def transitions_between(d: DaemonProc, t0: float, t1: float) -> str:
    c: Counter[str] = Counter()
    for doc in read_events(d.log_path):
        if not t0 <= event_time(doc) <= t1:
            continue
        if doc.get("event") == "node_transition_started":
            c[f"start {doc.get('phase')} ({doc.get('reason')})"] += 1
        elif doc.get("event") == "node_step" and doc.get("changed"):
            c[f"{doc.get('step')}"] += 1
    return ", ".join(f"{k} x{v}" for k, v in c.items()) or "no write"


def in_transit(h: Harness, phase: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            for n, p in h.w.phases().items():
                if p == phase:
                    return n
        except Exception:  # noqa: BLE001
            return None
        return None

    return check


def run_outage(h: Harness, fault: str, when: str, inject: Callable[[], None], heal: Callable[[], None], *,
               hold_s: float = 12.0, config: Any = None, observe: Callable[[], str] | None = None,
               converge_timeout_s: float = 120.0) -> OutageRow:
    """Bring the sandbox to the start state of ``when`` with a daemon running, inject, wait
    ``hold_s``, record, heal, wait for a settled state, record."""
    assert h.watcher is not None
    if when == "mid-lend" and not h.all_serving():
        settle(h, HIGH)  # a node to lend
    elif when == "mid-reclaim" and not any(v == "lent" for v in h.owners().values()):
        settle(h, LOW)  # a node to reclaim
    row = OutageRow(fault, when)
    mark = h.watcher.mark()
    d = h.daemon(f"outage-{fault}-{when}".replace(" ", "_").replace("/", "_"), config=config)
    if when == "mid-lend":
        h.load(LOW)
        node = poll(in_transit(h, "lending"), 60, 0.1)
    elif when == "mid-reclaim":
        h.ensure_jobs_on_lent()
        h.load(HIGH)
        node = poll(in_transit(h, "reclaiming"), 60, 0.1)
    else:
        node = "-"
    if node is None:
        last = [f"{e.get('event')}: {e.get('error') or e.get('detail') or ''}"[:200]
                for e in read_events(d.log_path) if e.get("level") in ("warning", "error")][-3:]
        row.did = f"could not reach {when} (phases {h.w.phases()}; daemon alive {d.alive()}; last warnings {last})"
        d.stop()
        return row
    t0 = time.time()
    inject()
    time.sleep(hold_s)
    t1 = time.time()
    phases = h.owners()
    row.did = (f"{node} {when}; after {hold_s:.0f} s: " + transitions_between(d, t0, t1)
               + "; " + ", ".join(f"{n}={v.split(':')[0]}" for n, v in sorted(phases.items())))
    if observe is not None:
        row.did += "; " + observe()
    row.logged = warnings_between(d, t0, t1)
    row.metrics = nonzero_metrics(d) or "(none)"
    heal()
    t2 = time.monotonic()
    target = h.all_serving if h.sb.vllm_url and _load_is_high(h) else h.settled
    ok = poll(target, converge_timeout_s, 0.25)
    row.recovered = bool(ok)
    row.recover_s = time.monotonic() - t2 if ok else None
    d.stop()
    row.violations = h.watcher.violations[mark:]
    row.jobs_lost = len(h.lost_jobs())
    row.nodes_lost = 0 if ok else sum(1 for v in h.owners().values() if v not in ("serving", "lent"))
    return row


def _load_is_high(h: Harness) -> bool:
    return h.last_load == "high"


def settle(h: Harness, load: dict[str, float], timeout_s: float = 120.0) -> None:
    """A plain daemon until every node rests (all serving under high load)."""
    h.load(load)
    d = h.daemon("settle")
    target = h.all_serving if load is HIGH else h.lent_down_to_min
    poll(target, timeout_s, 0.25)
    d.stop()


# --- the faults ---------------------------------------------------------------------------------

def prometheus_down(h: Harness, when: str, *, blind_after_s: float = 10.0, hold_s: float = 25.0) -> OutageRow:
    prom = next(c for c in h.sb.components if c.name == "prometheus")
    cfg = h.write_config(h.dir / "blind.yaml", blind_after_s=blind_after_s)

    def inject() -> None:
        h.sb.stop_process("prometheus")

    def heal() -> None:
        prom.start(h.sb)
        prom.wait_ready(h.sb, 30)

    return run_outage(h, "prometheus down", when, inject, heal, hold_s=hold_s, config=cfg)


def signals_stale(h: Harness, when: str, *, blind_after_s: float = 10.0, hold_s: float = 25.0) -> OutageRow:
    """The vLLM scrape target down: Prometheus answers, but with no fresh sample."""
    vllm = next(c for c in h.sb.components if c.name == "vllm-sim")
    cfg = h.write_config(h.dir / "blind.yaml", blind_after_s=blind_after_s)
    load = [LOW if when == "mid-lend" else HIGH]

    def inject() -> None:
        h.sb.stop_process("vllm-sim")

    def heal() -> None:
        vllm.start(h.sb)
        vllm.wait_ready(h.sb, 30)
        h.load(load[0])

    return run_outage(h, "vLLM metrics stale", when, inject, heal, hold_s=hold_s, config=cfg)


def kube_api(h: Harness, mode: str, when: str, *, hold_s: float = 12.0) -> OutageRow:
    proxy = FaultProxy(h.sb.ports["kube"], tls=h.sb.kube_tls)
    kc = proxied_kubeconfig(h.sb.daemon_kubeconfig, proxy.port, h.dir / "kubeconfig-proxy")
    cfg = h.write_config(h.dir / "proxied.yaml", kubeconfig=kc)
    try:
        return run_outage(h, f"kube API {mode}", when, lambda: proxy.set_mode(mode), lambda: proxy.set_mode("pass"),
                          hold_s=hold_s, config=cfg)
    finally:
        proxy.close()


def slurmctld_down(h: Harness, when: str, *, hold_s: float = 12.0) -> OutageRow:
    from gpu_bridge_lab.sandbox.cluster import slurm as sandbox_slurm

    def heal() -> None:
        h.sb.start_slurmctld()
        h.sb.wait(lambda: sandbox_slurm.ctld_up(h.sb.slurm), 30, "slurmctld to answer", "slurmctld")

    return run_outage(h, "slurmctld down", when, lambda: h.sb.stop_process("slurmctld"), heal, hold_s=hold_s)


def slurmd_dies_on_lent(h: Harness, *, hold_s: float = 20.0) -> OutageRow:
    """A lent node (running a research job) loses its slurmd; then serving load returns."""
    lent = [n for n, v in h.owners().items() if v == "lent"]
    if not lent:
        return OutageRow("lent node's slurmd dies", "while lent", did="no lent node")
    node = lent[0]
    h.ensure_jobs_on_lent()
    state: dict[str, Any] = {}

    def inject() -> None:
        h.sb.stop_process(f"slurmd:{node}")
        h.load(HIGH)

    def heal() -> None:
        h.sb.start_slurmd(node)

    def observe() -> str:
        state["slurm"] = h.w.slurm_states().get(node)
        return f"{node} Slurm state {state['slurm']}"

    return run_outage(h, "lent node's slurmd dies", "while lent, then reclaim", inject, heal, hold_s=hold_s,
                      observe=observe)


def pod_never_ready(h: Harness, *, hold_s: float = 140.0) -> OutageRow:
    """The returning node's new vLLM pod never becomes Ready (here: the Kubernetes node reports
    NotReady, so the pod stays Pending), for longer than the daemon's ready timeout."""
    target: dict[str, str] = {}

    def set_ready(node: str, status: str) -> None:
        h.w.core.patch_node_status(node, {"status": {"conditions": [
            {"type": "Ready", "status": status, "reason": "Injected" if status == "False" else "KubeletReady"}]}})

    def inject() -> None:
        node = next((n for n, p in h.w.phases().items() if p == "reclaiming"), None)
        if node:
            target["node"] = node
            set_ready(node, "False")

    def heal() -> None:
        if "node" in target:
            set_ready(target["node"], "True")

    return run_outage(h, "returned node's pod never Ready", "mid-reclaim", inject, heal, hold_s=hold_s,
                      observe=lambda: f"node {target.get('node')} phase {h.w.phases().get(target.get('node', ''))}")


LEND_TIMEOUT_S = 30.0


def pdb_blocks_eviction(h: Harness, *, hold_s: float = 45.0) -> OutageRow:
    """Force the eviction path, then block it: crash right after the lending pod is marked,
    give another serving pod a lower deletion cost (so the ReplicaSet removes that one), and
    set the PDB to allow no disruption; the restarted daemon must evict, and cannot."""
    assert h.watcher is not None
    row = OutageRow("PDB blocks eviction forever", "mid-lend")
    mark = h.watcher.mark()
    # min_serving = n - 1: exactly one node may be lent, so no second lend absorbs the removal;
    # a short lend timeout, so the row shows the stuck lend abandoned within the hold
    cfg = h.write_config(h.dir / "pdb.yaml", min_serving=h.n - 1, lend_timeout_s=LEND_TIMEOUT_S)
    h.load(LOW)
    armed = h.daemon("pdb-armed", crash_at="mark_pod:1", config=cfg)
    armed.wait_exit(90)
    lending = next((n for n, p in h.w.phases().items() if p == "lending"), None)
    pods = h.w.pods_by_node()
    other = next((pods[n][0] for n, p in h.w.phases().items() if p == "serving" and n in pods), None)
    if lending is None or other is None:
        row.did = "could not set up (no lending node / no other serving pod)"
        return row
    h.w.core.patch_namespaced_pod(other, serving.NAMESPACE,
                                  {"metadata": {"annotations": {wk.POD_DELETION_COST: "-20000"}}})
    policy = k8s_policy(h)
    pdbs = policy.list_namespaced_pod_disruption_budget(serving.NAMESPACE).items
    # the apiserver refuses a PDB with both fields: minAvailable replaces maxUnavailable (null
    # deletes it in a merge patch), and both are put back afterwards
    saved = {p.metadata.name: {"minAvailable": p.spec.min_available, "maxUnavailable": p.spec.max_unavailable}
             for p in pdbs}
    for p in pdbs:
        policy.patch_namespaced_pod_disruption_budget(p.metadata.name, serving.NAMESPACE,
                                                      {"spec": {"minAvailable": h.n, "maxUnavailable": None}})
    d = h.daemon("pdb", config=cfg)
    t0 = time.time()
    time.sleep(hold_s)
    t1 = time.time()
    row.did = (f"{lending} lending, other pod {other} removed by the scale-down; after {hold_s:.0f} s: "
               + transitions_between(d, t0 - 1, t1) + "; phases "
               + ", ".join(f"{n}={v.split(':')[0]}" for n, v in sorted(h.owners().items())))
    steps = read_events(d.log_path, "node_step")
    evicts = [e for e in steps if e.get("step") == "evict_pod"]
    if evicts:
        row.did += f"; evict_pod tried {len(evicts)}x, last: {evicts[-1].get('detail')}"
    aborts = [e for e in steps if e.get("step") == "abort_lend" and e.get("changed")]
    if aborts:
        row.did += f"; lend abandoned after lend_timeout_s {LEND_TIMEOUT_S:g} s: {aborts[0].get('node')}"
    row.logged = warnings_between(d, t0 - 1, t1)
    row.metrics = nonzero_metrics(d) or "(none)"
    for name, spec in saved.items():
        policy.patch_namespaced_pod_disruption_budget(name, serving.NAMESPACE, {"spec": spec})
    t2 = time.monotonic()
    ok = poll(h.settled, 90, 0.25)
    row.recovered = bool(ok)
    row.recover_s = time.monotonic() - t2 if ok else None
    d.stop()
    row.violations = h.watcher.violations[mark:]
    row.jobs_lost = len(h.lost_jobs())
    row.nodes_lost = 0 if ok else sum(1 for v in h.owners().values() if v not in ("serving", "lent"))
    return row


def k8s_policy(h: Harness) -> Any:
    from kubernetes import client as k8s

    return k8s.PolicyV1Api(h.w.api)


def format_outages(rows: list[OutageRow]) -> str:
    out = []
    for r in rows:
        ok = "yes" if r.recovered else "NO"
        out.append(f"* {r.fault} [{r.when}]: recovered {ok}"
                   + (f" in {r.recover_s:.1f} s" if r.recover_s is not None else "")
                   + f"; invariant violations {len(r.violations)}; jobs lost {r.jobs_lost}; nodes lost {r.nodes_lost}")
        out.append(f"    did:     {r.did}")
        out.append(f"    logged:  {r.logged}")
        out.append(f"    metrics: {r.metrics}")
        if r.violations:
            out.append(f"    first violation: {r.violations[0]}")
    return "\n".join(out)
