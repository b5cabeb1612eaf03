"""Past vLLM history for a real Prometheus: the simulator's replicas scraped at past times.

The vLLM simulator (``Simulation``) is run on its own clock over a past span, replaying a
trace at trace time = real time (a day of trace per day of history, no compression): every
``scrape_s`` its collector (the same ``VllmSimCollector`` the sandbox serves) is read and the
samples are written with their past timestamps as OpenMetrics. ``promtool tsdb
create-blocks-from openmetrics`` turns the file into TSDB blocks that a Prometheus started on
that directory serves as if it had scraped them: real timestamps, so ``gpu-bridge simulate
--prometheus`` and ``gpu-bridge forecast`` read it exactly as a site's own history.

Only the families ``simulate --prometheus`` and the policy read are written (the running and
waiting gauges, KV usage, token and request counters, and the end-to-end latency histogram
with its ``+Inf`` bucket, sum and count: the other buckets are dropped to keep the file small).
Faults can be written in: a window where nothing was scraped (Prometheus down), a window
where one replica was not scraped, and a replica restart (its counters start again at 0).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bridge.errors import SandboxError
from gpu_bridge_lab.sandbox.vllm.metrics import VllmSimCollector
from gpu_bridge_lab.sandbox.vllm.model import Replica, ReplicaParams
from gpu_bridge_lab.sandbox.vllm.sim import Simulation
from bridge.trace import Trace

KEEP = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:e2e_request_latency_seconds",
}


@dataclass(frozen=True, slots=True)
class Faults:
    """What goes wrong in the history, in seconds from its start: ``outages`` nothing is
    scraped; ``replica_outages`` (replica index, from, to) one replica is not scraped;
    ``restarts`` (replica index, at) the replica's process restarts (counters from 0)."""

    outages: tuple[tuple[float, float], ...] = ()
    replica_outages: tuple[tuple[int, float, float], ...] = ()
    restarts: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class Backfill:
    """The result: where the OpenMetrics went and what was replayed."""

    path: Path
    start_unix: float
    duration_s: float
    samples: int
    total_arrived: int
    replicas: tuple[str, ...] = field(default_factory=tuple)
    arrived: tuple[tuple[float, int], ...] = ()  # (unix s, requests arrived so far) at each scrape time

    def arrivals_between(self, a: float, b: float, *, scraped: bool = False) -> int:
        """Requests that really arrived from ``a`` to ``b`` (the ground truth), to the scrape
        instants: the first at or after each (``scraped=False``), or the last at or before
        each (``scraped=True``: the samples a query at ``a`` and ``b`` sees)."""
        import bisect

        ts = [t for t, _ in self.arrived]
        if scraped:
            i, j = bisect.bisect_right(ts, a) - 1, bisect.bisect_right(ts, b) - 1
        else:
            i, j = bisect.bisect_left(ts, a), bisect.bisect_left(ts, b)
        if j >= len(ts) or i < 0:
            raise ValueError(f"[{a}, {b}] is not inside the history")
        return self.arrived[j][1] - self.arrived[i][1]


def _fmt_labels(labels: dict[str, str]) -> str:
    items = [(k, v) for k, v in labels.items() if v != ""]
    if not items:
        return ""
    esc = (lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in items) + "}"


def write_history(
    path: Path,
    trace: Trace,
    *,
    start_unix: float,
    duration_s: float,
    replicas: int,
    model: str,
    params: ReplicaParams | None = None,
    trace_start_s: float = 0.0,
    scrape_s: float = 15.0,
    step_s: float = 1.0,
    seed: int = 0,
    max_cv: float | None = None,
    version: str = "v1",
    faults: Faults = Faults(),
    scrape_offset_s: float = 7.0,
    namespace: str = "default",
) -> Backfill:
    """Run the simulator over ``[start_unix, start_unix + duration_s)`` and write what a
    Prometheus scraping every ``scrape_s`` would hold, as OpenMetrics (families grouped, as
    promtool needs). Scrapes fall ``scrape_offset_s`` after the minute, as a real Prometheus
    offsets each target, so minute windows do not line up with samples. Every series carries
    ``namespace`` (the pods' namespace, as Kubernetes service discovery labels it; the
    product's default ``pools[].namespace``), which the daemon selects a pool's series by."""
    if replicas < 1:
        raise ValueError(f"replicas: need at least 1, got {replicas}")
    if not (scrape_s > 0 and duration_s > scrape_s):
        raise ValueError(f"need 0 < scrape_s < duration_s, got {scrape_s} and {duration_s}")
    sim = Simulation(trace, [model], params, speed=1.0, trace_start_s=trace_start_s, seed=seed, step_s=step_s, max_cv=max_cv)
    names = tuple(f"vllm-{i}" for i in range(replicas))
    for n in names:
        sim.add_replica(n, model, node=f"gpu-node-{names.index(n) + 1:02d}")
    col = VllmSimCollector(sim, version)
    lines: dict[str, list[str]] = {}
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    restarts = sorted(faults.restarts, key=lambda r: r[1])
    n_samples = 0
    arrived: list[tuple[float, int]] = []
    k = 0
    while True:
        t = scrape_offset_s + k * scrape_s
        if t >= duration_s:
            break
        k += 1
        sim.advance_to(t)
        arrived.append((start_unix + t, sim.models[model].arrived_total))
        while restarts and restarts[0][1] <= t:
            idx, _ = restarts.pop(0)
            with sim.lock:
                old = sim.replicas[names[idx]]
                sim.replicas[names[idx]] = Replica(old.name, old.model, old.params, node=old.node, t=sim.t, warmup_s=0.0)
        if any(a <= t < b for a, b in faults.outages):
            continue
        hidden = {names[i] for i, a, b in faults.replica_outages if a <= t < b}
        ts = f"{start_unix + t:.3f}"
        for fam in col.collect():
            if fam.name not in KEEP:
                continue
            types[fam.name] = fam.type
            helps[fam.name] = fam.documentation
            buf = lines.setdefault(fam.name, [])
            for smp in fam.samples:
                if smp.labels.get("pod") in hidden:
                    continue
                if smp.name.endswith("_bucket") and smp.labels.get("le") != "+Inf":
                    continue
                if smp.name.endswith("_created"):
                    continue
                v = smp.value
                val = "NaN" if math.isnan(v) else repr(float(v))
                buf.append(f"{smp.name}{_fmt_labels({**smp.labels, 'namespace': namespace})} {val} {ts}\n")
                n_samples += 1
    with open(path, "w", encoding="utf-8") as fh:
        for name, buf in lines.items():
            fh.write(f"# HELP {name} {helps[name]}\n# TYPE {name} {types[name]}\n")
            fh.writelines(buf)
        fh.write("# EOF\n")
    sim.advance_to(duration_s)
    arrived.append((start_unix + duration_s, sim.models[model].arrived_total))
    return Backfill(path, start_unix, duration_s, n_samples, sim.models[model].arrived_total, names, tuple(arrived))


def create_blocks(openmetrics: Path, data_dir: Path, timeout_s: float = 600.0) -> None:
    """``promtool tsdb create-blocks-from openmetrics`` into ``data_dir`` (argv, no shell)."""
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(promtool, os.X_OK):
        raise SandboxError("promtool not found: install the Debian package 'prometheus' (scripts/setup.sh)")
    data_dir.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(openmetrics), str(data_dir)],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    if r.returncode != 0:
        raise SandboxError(f"promtool create-blocks-from openmetrics failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")


class HistoryPrometheus:
    """A real Prometheus (the sandbox's binary and flags) serving a backfilled TSDB."""

    def __init__(self, data_dir: Path, port: int, *, retention: str = "30d") -> None:
        from gpu_bridge_lab.sandbox.cluster import prometheus as prom

        self.data_dir = data_dir
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        cfg = data_dir.parent / "prometheus-history.yml"
        cfg.write_text(prom.render_config([prom.ScrapeTarget("prometheus", (f"127.0.0.1:{port}",))]))
        self._log = open(data_dir.parent / "prometheus-history.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(prom.argv(cfg, data_dir, port, retention=retention), stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SandboxError(f"prometheus exited with {self.proc.returncode}; see {self._log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as r:  # noqa: S310 - loopback
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise SandboxError(f"prometheus at {self.url} not ready after {timeout_s:g} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(
    workdir: Path,
    trace: Trace,
    *,
    start_unix: float,
    end_unix: float,
    replicas: int,
    model: str,
    params: ReplicaParams | None = None,
    trace_zero_unix: float | None = None,
    seed: int = 0,
    max_cv: float | None = None,
    scrape_s: float = 15.0,
    faults: Faults = Faults(),
    version: str = "v1",
) -> Backfill:
    """Write the history of [start_unix, end_unix) and create its TSDB blocks in
    ``workdir/data``. The trace's t = 0 is ``trace_zero_unix`` (default: the UTC midnight at or
    before the start), so the trace's time of day is the UTC clock's; before it, the trace
    wraps around (its last day)."""
    zero = trace_zero_unix if trace_zero_unix is not None else math.floor(start_unix / 86400.0) * 86400.0
    om = workdir / "history.om"
    bf = write_history(
        om, trace, start_unix=start_unix, duration_s=end_unix - start_unix, replicas=replicas, model=model,
        params=params, trace_start_s=start_unix - zero, scrape_s=scrape_s, seed=seed, max_cv=max_cv, faults=faults,
        version=version,
    )
    create_blocks(om, workdir / "data")
    om.unlink()
    return bf


def scaled_trace_csv(trace: Trace, path: Path, max_cv: float | None = None) -> None:
    """The trace as the simulator replays it (rates as given, cv capped) as a trace CSV."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("window_start_s,rate_req_per_s,cv,clients_active\n")
        for t, r, c in zip(trace.starts_s, trace.rates, trace.cvs):
            cc = c if max_cv is None else min(c, max_cv)
            fh.write(f"{t:.0f},{r:.6f},{cc:.6f},1\n")


def tempdir(prefix: str = "gpu-bridge-history-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


__all__: Sequence[str] = (
    "Backfill", "Faults", "HistoryPrometheus", "build", "create_blocks", "free_port", "scaled_trace_csv", "write_history",
)
