"""The simulation: served models, their replicas, the load balancer and the load source.

Two clocks: *simulation time* ``t`` (seconds since start; requests are served in it, so
latencies and queue lengths are realistic) and *trace time* ``trace_start_s + t * speed``
(where the load curve is read; ``speed=288`` passes the trace's day in 5 minutes). The
caller advances ``t`` explicitly (``advance``); the server does it from the wall clock.

All methods are safe to call from several threads (one lock around the state).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_bridge_lab.sandbox.vllm.arrivals import ArrivalProcess, sample_sizes
from gpu_bridge_lab.sandbox.vllm.model import DRAINING, GONE, SERVING, Replica, ReplicaParams, Request
from gpu_bridge_lab.sandbox.vllm.sleep import SleepParams, SleepState
from bridge.trace import Trace

DEFAULT_STEP_S = 0.1
# the lab's fault knobs (``PUT /faults``): the replica-name lists, and how long a hung wake waits
FAULT_LISTS = ("wake_fails", "wake_hangs", "sleep_fails", "no_sleep_mode", "unreachable")
DEFAULT_WAKE_HANG_S = 60.0
MAX_WAKE_HANG_S = 3600.0


class SimError(ValueError):
    """A control request the simulation cannot honour (unknown replica, bad value)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ModelLoad:
    """Per-model load state: the arrival stream, live overrides and counters that outlive replicas."""

    name: str
    arrivals: ArrivalProcess
    override_rate: float | None = None
    override_cv: float | None = None
    multiplier: float = 1.0
    arrived_total: int = 0
    rejected_total: int = 0  # arrived while no replica of the model was serving
    aborted_total: int = 0  # aborted at a drain deadline (replica series are gone by then)
    last_rate: float = 0.0
    last_cv: float = 1.0
    # node -> routing weight (default 1): a replica on a node of weight w is kept at about w
    # times the in-flight requests of the others, as sticky sessions or prefix-cache-aware
    # routing make one replica busier than its peers; uneven in-flight work per node.
    node_weights: dict[str, float] = field(default_factory=dict)


def format_clock(trace_time_s: float) -> str:
    """Day and time of day of a trace time (t=0 is local midnight of day 0)."""
    day, rem = divmod(int(trace_time_s), 86400)
    return f"day {day} {rem // 3600:02d}:{rem % 3600 // 60:02d}"


class Simulation:
    def __init__(
        self,
        trace: Trace,
        models: Iterable[str],
        params: ReplicaParams | None = None,
        *,
        speed: float = 1.0,
        trace_start_s: float = 0.0,
        seed: int = 0,
        step_s: float = DEFAULT_STEP_S,
        max_cv: float | None = None,
        sleep_params: SleepParams | None = None,
    ) -> None:
        model_names = list(dict.fromkeys(models))
        if not model_names:
            raise ValueError("models: at least one served model name is needed")
        if not (speed > 0 and math.isfinite(speed)):
            raise ValueError(f"speed: expected a positive number, got {speed!r}")
        if not (step_s > 0 and math.isfinite(step_s)):
            raise ValueError(f"step_s: expected a positive number, got {step_s!r}")
        self.trace = trace
        self.params = params if params is not None else ReplicaParams()
        self.speed = float(speed)
        self.trace_start_s = float(trace_start_s)
        self.step_s = float(step_s)
        self.max_cv = max_cv
        self.t = 0.0
        self.lock = threading.RLock()
        root = np.random.SeedSequence(seed)
        children = root.spawn(2 * len(model_names))
        self._size_rng = {m: np.random.default_rng(children[2 * i + 1]) for i, m in enumerate(model_names)}
        self.models: dict[str, ModelLoad] = {
            m: ModelLoad(m, ArrivalProcess(np.random.default_rng(children[2 * i]))) for i, m in enumerate(model_names)
        }
        self.replicas: dict[str, Replica] = {}
        # vLLM's sleep mode (--enable-sleep-mode): None = off, as vLLM's default
        self.sleep_params = sleep_params
        self.sleep: dict[str, SleepState] = {}
        # lab faults (``PUT /faults``, ``set_faults``), each a set of replica names:
        # wake_fails: ``/wake_up`` answers 500, the engine left asleep (a wake that hits a CUDA
        # error or GPU memory still held); wake_hangs: ``/wake_up`` answers only after
        # ``wake_hang_s`` of wall time (the server's part, ``SimServer``); sleep_fails: ``/sleep``
        # answers 500, the engine left awake; no_sleep_mode: the sleep routes answer vLLM's 404
        # for a route it did not register (an engine restarted without --enable-sleep-mode);
        # unreachable: the engine's own address refuses connections (a dead engine's port:
        # ``PodPorts`` closes its listener; the lab's ``/replicas/{name}/...`` still answer)
        self.wake_fails: set[str] = set()
        self.wake_hangs: set[str] = set()
        self.wake_hang_s = DEFAULT_WAKE_HANG_S
        self.sleep_fails: set[str] = set()
        self.no_sleep_mode: set[str] = set()
        self.unreachable: set[str] = set()
        self.on_faults: list[Callable[[], None]] = []  # called after each change of the faults
        self._seq = 0
        self._picks = 0

    # --- clocks and load -------------------------------------------------------------------
    def trace_time(self, t: float | None = None) -> float:
        return self.trace_start_s + (self.t if t is None else t) * self.speed

    def rate_and_cv(self, model: str, t: float | None = None) -> tuple[float, float]:
        """The arrival rate (req/s) and cv the model gets at simulation time ``t``."""
        m = self.models[model]
        tt = self.trace_time(t)
        rate = m.override_rate if m.override_rate is not None else self.trace.rate_at(tt)
        cv = m.override_cv if m.override_cv is not None else self.trace.cv_at(tt)
        if self.max_cv is not None:
            cv = min(cv, self.max_cv)
        return rate * m.multiplier, cv

    def set_load(self, body: dict[str, Any]) -> dict[str, Any]:
        """Apply a load override: keys ``model`` (default: all), ``rate`` (req/s, null clears),
        ``multiplier`` (>= 0), ``cv`` (> 0, null clears), ``reset`` (true: back to the trace)."""
        if not isinstance(body, dict):
            raise SimError("load: expected a JSON object")
        unknown = set(body) - {"model", "rate", "multiplier", "cv", "reset", "node_weights"}
        if unknown:
            raise SimError(f"load: unknown key(s) {', '.join(sorted(unknown))}; "
                           "expected model, rate, multiplier, cv, reset, node_weights")
        with self.lock:
            model = body.get("model")
            if model is not None and model not in self.models:
                raise SimError(f"load.model: unknown model {model!r}; served: {', '.join(self.models)}", 404)
            targets = [self.models[model]] if model is not None else list(self.models.values())
            updates: dict[str, Any] = {}
            if body.get("reset"):
                updates.update(override_rate=None, override_cv=None, multiplier=1.0, node_weights={})
            if "node_weights" in body:
                updates["node_weights"] = _node_weights(body["node_weights"])
            if "rate" in body:
                updates["override_rate"] = _opt_number(body["rate"], "load.rate", allow_zero=True)
            if "cv" in body:
                updates["override_cv"] = _opt_number(body["cv"], "load.cv", allow_zero=False)
            if "multiplier" in body:
                mult = _opt_number(body["multiplier"], "load.multiplier", allow_zero=True)
                updates["multiplier"] = 1.0 if mult is None else mult
            for m in targets:
                for k, v in updates.items():
                    setattr(m, k, dict(v) if isinstance(v, dict) else v)
            return self.load_status()

    def load_status(self) -> dict[str, Any]:
        with self.lock:
            tt = self.trace_time()
            out: dict[str, Any] = {
                "sim_time_s": round(self.t, 3),
                "trace_time_s": round(tt, 1),
                "trace_clock": format_clock(tt),
                "speed": self.speed,
                "trace_rate": self.trace.rate_at(tt),
                "trace_cv": self.trace.cv_at(tt),
                "models": {},
            }
            for name, m in self.models.items():
                rate, cv = self.rate_and_cv(name)
                out["models"][name] = {
                    "rate": rate, "cv": cv, "override_rate": m.override_rate, "override_cv": m.override_cv,
                    "multiplier": m.multiplier, "node_weights": dict(m.node_weights), "arrived": m.arrived_total, "rejected": m.rejected_total,
                    "aborted": m.aborted_total,
                    "capacity_rps": round(self.params.capacity_rps() * sum(
                        1 for r in self.replicas.values() if r.model == name and r.accepting), 2),
                }
            return out

    # --- replicas ----------------------------------------------------------------------------
    def add_replica(self, name: str, model: str | None = None, node: str = "", warmup_s: float | None = None) -> Replica:
        """A new replica (serving after ``warmup_s``); re-adding a draining one resumes it."""
        if not isinstance(name, str) or not name:
            raise SimError("replica.name: expected a non-empty string")
        with self.lock:
            model = model if model is not None else next(iter(self.models))
            if model not in self.models:
                raise SimError(f"replica.model: unknown model {model!r}; served: {', '.join(self.models)}")
            existing = self.replicas.get(name)
            if existing is not None:
                if existing.state == DRAINING and existing.model == model:
                    existing.resume()
                    existing.routed = True  # its pod is Ready: in the load balancing again
                    if node:
                        existing.node = node
                    return existing
                raise SimError(f"replica {name!r} already exists ({existing.state})", 409)
            if warmup_s is not None and not (warmup_s >= 0 and math.isfinite(warmup_s)):
                raise SimError(f"replica.warmup_s: expected a number >= 0, got {warmup_s!r}")
            rep = Replica(name, model, self.params, node=node or "", t=self.t, warmup_s=warmup_s)
            self.replicas[name] = rep
            if self.sleep_params is not None:
                self.sleep[name] = SleepState(self.sleep_params)
            return rep

    def remove_replica(self, name: str, shutdown_timeout_s: float | None = None) -> Replica:
        """Drain ``name``: no new requests; in-flight ones finish or are aborted at the deadline."""
        with self.lock:
            rep = self.replicas.get(name)
            if rep is None:
                raise SimError(f"replica {name!r} not found", 404)
            if shutdown_timeout_s is not None and not (shutdown_timeout_s >= 0 and math.isfinite(shutdown_timeout_s)):
                raise SimError(f"shutdown_timeout_s: expected a number >= 0, got {shutdown_timeout_s!r}")
            rep.drain(self.t, shutdown_timeout_s)
            self._reap()
            return rep

    def set_routed(self, name: str, routed: bool) -> Replica:
        """In or out of the load balancing (its pod Ready or not), the engine left running."""
        with self.lock:
            rep = self.replicas.get(name)
            if rep is None:
                raise SimError(f"replica {name!r} not found", 404)
            rep.routed = routed
            return rep

    def replica_list(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r.snapshot() for r in self.replicas.values()]

    def _reap(self) -> None:
        for name in [n for n, r in self.replicas.items() if r.state == GONE]:
            rep = self.replicas.pop(name)
            self.models[rep.model].aborted_total += rep.aborted_total
            self.sleep.pop(name, None)

    # --- sleep mode (vLLM's dev endpoints /sleep, /wake_up, /is_sleeping) ---------------------
    def _sleep_state(self, name: str) -> tuple[Replica, SleepState]:
        rep = self.replicas.get(name)
        if rep is None:
            raise SimError(f"replica {name!r} not found", 404)
        st = self.sleep.get(name)
        if st is None:
            raise SimError("Not Found", 404)  # vLLM without sleep mode: no such route
        return rep, st

    def sleep_replica(self, name: str, level: int = 1) -> float:
        """``POST /sleep?level=``: the simulation time the offload completes. Refused while
        requests are in flight (the caller drains traffic first) or the replica is not serving."""
        with self.lock:
            rep, st = self._sleep_state(name)
            if level not in (1, 2):
                raise SimError(f"level: expected 1 or 2, got {level!r}", 400)
            if rep.state != SERVING:
                raise SimError(f"replica {name!r} is {rep.state}: only a serving engine can sleep", 409)
            if rep.load and not st.is_sleeping:
                raise SimError("Cannot put engine to sleep while requests are being processed", 500)
            if name in self.sleep_fails and not st.is_sleeping:
                raise SimError(f"sleep of {name} failed: CUDA error: an illegal memory access was encountered "
                               "(an injected fault: PUT /faults)", 500)
            done = st.sleep(self.t, level)
            rep.paused = True
            return done

    def wake_replica(self, name: str, tags: list[str] | None = None) -> float:
        """``POST /wake_up[?tags=weights|kv_cache]``: the simulation time the wake completes."""
        with self.lock:
            rep, st = self._sleep_state(name)
            if name in self.wake_fails and st.is_sleeping:
                raise SimError(f"wake_up of {name} failed: CUDA error: out of memory (an injected fault: PUT /faults)", 500)
            try:
                done = st.wake(self.t, tags)
            except ValueError as exc:
                raise SimError(str(exc), 400) from exc
            rep.paused = st.serving_blocked(self.t)
            return done

    def set_faults(self, body: Any) -> dict[str, Any]:
        """``PUT /faults`` (lab only): each key given replaces that fault, the others stay:
        ``wake_fails``, ``wake_hangs``, ``sleep_fails``, ``no_sleep_mode``, ``unreachable``
        (lists of replica names; [] clears) and ``wake_hang_s`` (a number > 0, at most
        ``MAX_WAKE_HANG_S``). The whole body is checked before any of it applies. The current faults."""
        if not isinstance(body, dict):
            raise SimError("faults: expected a JSON object")
        keys = (*FAULT_LISTS, "wake_hang_s")
        unknown = set(body) - set(keys)
        if unknown:
            raise SimError(f"faults: unknown key(s) {', '.join(sorted(unknown))}; expected {', '.join(keys)}")
        lists: dict[str, set[str]] = {}
        for key in FAULT_LISTS:
            if key in body:
                names = body[key]
                if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
                    raise SimError(f"faults.{key}: expected a list of replica names, got {names!r}")
                lists[key] = set(names)
        hang_s = body.get("wake_hang_s")
        if "wake_hang_s" in body and (isinstance(hang_s, bool) or not isinstance(hang_s, (int, float))
                                      or not math.isfinite(hang_s) or not 0 < hang_s <= MAX_WAKE_HANG_S):
            raise SimError(f"faults.wake_hang_s: expected a number of seconds > 0 and <= {MAX_WAKE_HANG_S:g}, got {hang_s!r}")
        with self.lock:
            for key, names in lists.items():
                setattr(self, key, names)
            if hang_s is not None:
                self.wake_hang_s = float(hang_s)
            listeners = list(self.on_faults)
        for notify in listeners:
            notify()
        return self.faults()

    def faults(self) -> dict[str, Any]:
        with self.lock:
            out: dict[str, Any] = {key: sorted(getattr(self, key)) for key in FAULT_LISTS}
            out["wake_hang_s"] = self.wake_hang_s
            return out

    def wake_hang(self, name: str) -> float:
        """Seconds of wall time this replica's ``/wake_up`` waits before it is done (0: none)."""
        with self.lock:
            return self.wake_hang_s if name in self.wake_hangs else 0.0

    def is_sleeping(self, name: str) -> bool:
        with self.lock:
            return self._sleep_state(name)[1].is_sleeping

    # --- the clock -----------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Advance simulation time by ``seconds`` in steps of at most ``step_s``."""
        with self.lock:
            target = self.t + seconds
            while target - self.t > 1e-9:
                dt = min(self.step_s, target - self.t)
                self._step(dt)
            self.t = max(self.t, target)  # no float drift in the clock itself

    def advance_to(self, t: float) -> None:
        if t > self.t:
            self.advance(t - self.t)

    def _step(self, dt: float) -> None:
        t = self.t
        for name, m in self.models.items():
            rate, cv = self.rate_and_cv(name)
            m.last_rate, m.last_cv = rate, cv
            offsets = m.arrivals.arrivals(rate, cv, dt)
            if offsets:
                self._dispatch(m, t, offsets)
        for name, st in self.sleep.items():  # a finished wake serves again from this step on
            rep = self.replicas.get(name)
            if rep is not None:
                rep.paused = st.serving_blocked(t)
        for rep in self.replicas.values():
            rep.step(t, dt)
        self.t = t + dt
        self._reap()

    def _dispatch(self, m: ModelLoad, t: float, offsets: list[float]) -> None:
        """Least-loaded routing (running + waiting, over the node's weight), ties to the least
        recently picked."""
        m.arrived_total += len(offsets)
        targets = [r for r in self.replicas.values() if r.model == m.name and r.accepting]
        if not targets:
            m.rejected_total += len(offsets)
            return
        sizes = sample_sizes(self._size_rng[m.name], self.params, len(offsets))
        weights = m.node_weights
        for off, (prompt, gen, reason) in zip(offsets, sizes):
            best = min(targets, key=lambda r: _lb_key(r, weights.get(r.node, 1.0)))
            self._seq += 1
            self._picks += 1
            best.last_pick = self._picks
            best.enqueue(Request(self._seq, t + off, prompt, gen, reason))


def _lb_key(r: Replica, weight: float = 1.0) -> tuple[float, int]:
    return ((len(r.running) + len(r.waiting)) / weight, r.last_pick)


def _node_weights(v: Any) -> dict[str, float]:
    """``{"node": weight > 0, ...}``; an empty object clears them."""
    if not isinstance(v, dict):
        raise SimError(f"load.node_weights: expected an object of node -> weight, got {v!r}")
    out: dict[str, float] = {}
    for node, w in v.items():
        weight = _opt_number(w, f"load.node_weights.{node}", allow_zero=False)
        if weight is None:
            raise SimError(f"load.node_weights.{node}: expected a number > 0, got null")
        out[str(node)] = weight
    return out


def _opt_number(v: Any, key: str, *, allow_zero: bool) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SimError(f"{key}: expected a number or null, got {v!r}")
    if v < 0 or (v == 0 and not allow_zero):
        raise SimError(f"{key}: expected a number {'>=' if allow_zero else '>'} 0, got {v!r}")
    return float(v)
