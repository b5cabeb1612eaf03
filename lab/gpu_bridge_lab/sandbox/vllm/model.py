"""One simulated vLLM replica: pure queueing arithmetic advanced by an explicit clock.

The replica is a processor-sharing server in "virtual time": every running sequence
receives the same token rate ``r = min(seq_tokens_per_s, tokens_per_s / running)`` (decode
is one token per sequence per engine step, and the engine's token budget is shared by the
batch). ``V`` is the cumulative per-sequence service since the replica started, so a request
admitted at ``V0`` gets its first token when ``V`` reaches ``V0 + prompt * prefill_cost``
and finishes at ``V0 + prompt * prefill_cost + gen``. Those two thresholds sit in heaps,
so a step costs O(requests that change phase * log n), not O(running requests): cheap
enough for ~20 replicas at hundreds of requests/s on a shared 2-core machine.

KV cache holds every running sequence's prompt plus the tokens it has generated so far;
it is kept as running sums (O(1) per step). When it overflows, the most recently admitted
sequence is preempted (recompute, as vLLM V1 does) and goes back to the head of the queue.

Nothing here reads a clock or does I/O: the caller passes ``t`` and ``dt``.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, fields
from typing import Any

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
REQUEST_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")

STARTING, SERVING, DRAINING, GONE = "starting", "serving", "draining", "gone"

# Request phases.
_WAITING, _PREFILL, _DECODE, _DONE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class ReplicaParams:
    """Capacity of one replica and the request-size distributions (defaults: a 4-GPU
    replica of a 70B-class model; about 21.7 req/s at the default sizes)."""

    max_num_seqs: int = 256  # like vllm --max-num-seqs
    tokens_per_s: float = 6000.0  # engine token budget shared by the batch (decode-token units)
    seq_tokens_per_s: float = 40.0  # per-sequence decode ceiling (inter-token latency 25 ms)
    prefill_cost: float = 0.02  # one prompt token costs this many decode tokens of budget
    kv_cache_tokens: int = 250_000  # KV-cache capacity in tokens (prompt + generated)
    prompt_tokens_mean: float = 1024.0
    prompt_tokens_sigma: float = 1.0  # lognormal sigma
    gen_tokens_mean: float = 256.0
    gen_tokens_sigma: float = 0.8
    max_model_len: int = 8192  # prompts are clipped to this
    max_tokens: int = 2048  # generation longer than this stops with finished_reason="length"
    shutdown_timeout_s: float = 30.0  # like vllm --shutdown-timeout: drain deadline on removal
    warmup_s: float = 0.0  # starting -> serving after this long

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v)):
                problems.append(f"{f.name}: expected a finite number, got {v!r}")
            elif f.name in ("shutdown_timeout_s", "warmup_s", "prompt_tokens_sigma", "gen_tokens_sigma", "prefill_cost"):
                if v < 0:
                    problems.append(f"{f.name}: expected >= 0, got {v!r}")
            elif v <= 0:
                problems.append(f"{f.name}: expected > 0, got {v!r}")
        if problems:
            raise ValueError("; ".join(problems))

    def capacity_rps(self) -> float:
        """Sustainable requests/s at the mean request size (the fluid limit)."""
        work = self.prompt_tokens_mean * self.prefill_cost + self.gen_tokens_mean
        return self.tokens_per_s / work

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Hist:
    """A cumulative-free histogram accumulator: per-bucket counts, sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last slot: above the highest bound
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (le, cumulative count), ending with +Inf."""
        out, acc = [], 0
        for b, c in zip(self.bounds, self.counts):
            acc += c
            out.append((repr(float(b)), acc))
        out.append(("+Inf", self.count))
        return out


class Request:
    __slots__ = (
        "seq", "arrival_t", "prompt", "gen", "reason", "admit_t", "ttft_done",
        "phase", "epoch", "v_first", "v_end",
    )

    def __init__(self, seq: int, arrival_t: float, prompt: int, gen: int, reason: str) -> None:
        self.seq = seq
        self.arrival_t = arrival_t
        self.prompt = prompt
        self.gen = gen
        self.reason = reason
        self.admit_t: float | None = None
        self.ttft_done = False
        self.phase = _WAITING
        self.epoch = 0
        self.v_first = 0.0
        self.v_end = 0.0


class Replica:
    """State and arithmetic of one replica. ``step`` advances it by ``dt`` seconds."""

    def __init__(self, name: str, model: str, params: ReplicaParams, *, node: str = "", t: float = 0.0,
                 warmup_s: float | None = None) -> None:
        self.name = name
        self.model = model
        self.node = node
        self.params = params
        warm = params.warmup_s if warmup_s is None else warmup_s
        self.state = SERVING if warm <= 0 else STARTING
        self.created_t = t
        self.ready_t = t + max(0.0, warm)
        self.drain_deadline: float | None = None
        self.v = 0.0
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # insertion order = admission order
        self._first: list[tuple[float, int, int, Request]] = []
        self._end: list[tuple[float, int, int, Request]] = []
        self._prompt_running = 0  # prompt tokens of running sequences (KV)
        self._dec_count = 0  # sequences in decode
        self._dec_sum_first = 0.0  # sum of v_first of sequences in decode
        self._gen_done = 0  # generated tokens of sequences no longer in decode
        self._gen_reported = 0.0
        self.prompt_tokens_total = 0
        self.preemptions_total = 0
        self.success: dict[str, int] = {r: 0 for r in FINISH_REASONS}
        self.aborted_total = 0
        self.ttft = Hist(TTFT_BUCKETS_S)
        self.e2e = Hist(REQUEST_LATENCY_BUCKETS_S)
        self.queue_time = Hist(REQUEST_LATENCY_BUCKETS_S)
        self.last_pick = 0  # load-balancer tie-break: least recently picked first
        self.paused = False  # asleep, or a sleep/wake in progress (sleep mode: the simulation sets it)
        # in the Service's load balancing: False for a pod that runs but is not Ready (a closed
        # readiness gate): no new requests, in-flight ones go on, the engine lives (it can sleep)
        self.routed = True

    # --- observations ------------------------------------------------------------------
    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def accepting(self) -> bool:
        return self.state == SERVING and not self.paused and self.routed

    @property
    def exposed(self) -> bool:
        """Whether its /metrics series exist (a starting server has no /metrics yet)."""
        return self.state in (SERVING, DRAINING)

    def kv_tokens(self) -> float:
        live = max(0.0, self._dec_count * self.v - self._dec_sum_first)
        return self._prompt_running + live

    def kv_usage(self) -> float:
        return min(1.0, max(0.0, self.kv_tokens() / self.params.kv_cache_tokens))

    def generation_tokens_total(self) -> float:
        """Monotone even under float rounding of the running sums."""
        live = max(0.0, self._dec_count * self.v - self._dec_sum_first)
        self._gen_reported = max(self._gen_reported, self._gen_done + live)
        return self._gen_reported

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name, "model": self.model, "node": self.node or None, "state": self.state,
            "running": len(self.running), "waiting": len(self.waiting),
            "kv_cache_usage": round(self.kv_usage(), 4),
            "finished": dict(self.success), "aborted": self.aborted_total,
            "preemptions": self.preemptions_total,
            "drain_deadline_s": self.drain_deadline, "routed": self.routed,
        }

    # --- inputs --------------------------------------------------------------------------
    def enqueue(self, req: Request) -> None:
        self.waiting.append(req)

    def drain(self, t: float, timeout_s: float | None = None) -> None:
        """Stop taking requests; in-flight ones get ``timeout_s`` (default: the params')."""
        if self.state == GONE:
            return
        timeout = self.params.shutdown_timeout_s if timeout_s is None else max(0.0, timeout_s)
        if self.state == DRAINING:  # a second removal can only bring the deadline forward
            if timeout_s is None:
                return
            assert self.drain_deadline is not None
            self.drain_deadline = min(self.drain_deadline, t + timeout)
        else:
            self.state = DRAINING
            self.drain_deadline = t + timeout
        if self.load == 0 or timeout <= 0:
            self._abort_all()

    def resume(self) -> None:
        """A draining replica that is wanted again serves again (a pod Ready once more)."""
        if self.state == DRAINING:
            self.state = SERVING
            self.drain_deadline = None

    def _abort_all(self) -> None:
        n = len(self.running) + len(self.waiting)
        for req in self.running.values():
            if req.phase == _DECODE:
                self._gen_done += int(self.v - req.v_first)
            req.phase = _DONE
        self.running.clear()
        self.waiting.clear()
        self._first.clear()
        self._end.clear()
        self._prompt_running = 0
        self._dec_count = 0
        self._dec_sum_first = 0.0
        self.aborted_total += n
        self.success["abort"] += n
        self.state = GONE

    # --- the arithmetic ------------------------------------------------------------------
    def step(self, t: float, dt: float) -> None:
        """Advance from ``t`` to ``t + dt``: admit, serve, preempt, finish the drain."""
        if self.state == GONE:
            return
        if self.state == STARTING:
            if t + dt < self.ready_t:
                return
            self.state = SERVING
        p = self.params
        self._admit(t)
        n = len(self.running)
        if n:
            r = min(p.seq_tokens_per_s, p.tokens_per_s / n)
            v0 = self.v
            v1 = v0 + r * dt
            first, end = self._first, self._end
            while first and first[0][0] <= v1:
                v, _, epoch, req = heapq.heappop(first)
                if epoch != req.epoch or req.phase != _PREFILL:
                    continue
                req.phase = _DECODE
                self._dec_count += 1
                self._dec_sum_first += req.v_first
                if not req.ttft_done:
                    req.ttft_done = True
                    self.prompt_tokens_total += req.prompt
                    self.ttft.observe(max(0.0, t + (v - v0) / r - req.arrival_t))
            while end and end[0][0] <= v1:
                v, _, epoch, req = heapq.heappop(end)
                if epoch != req.epoch or req.phase != _DECODE:
                    continue
                self._finish(req, t + (v - v0) / r)
            self.v = v1
            self._preempt_overflow()
            if not self.running:  # re-anchor: no float drift survives an idle moment
                self.v = 0.0
                self._dec_sum_first = 0.0
                first.clear()
                end.clear()
        if self.state == DRAINING:
            assert self.drain_deadline is not None
            if self.load == 0 or t + dt >= self.drain_deadline:
                self._abort_all()

    def _admit(self, t: float) -> None:
        p = self.params
        running, waiting = self.running, self.waiting
        while waiting and len(running) < p.max_num_seqs:
            req = waiting[0]
            if running and self.kv_tokens() + req.prompt > p.kv_cache_tokens:
                break
            waiting.popleft()
            if req.admit_t is None:
                req.admit_t = max(t, req.arrival_t)
            req.phase = _PREFILL
            req.v_first = self.v + req.prompt * p.prefill_cost
            req.v_end = req.v_first + req.gen
            running[req.seq] = req
            self._prompt_running += req.prompt
            heapq.heappush(self._first, (req.v_first, req.seq, req.epoch, req))
            heapq.heappush(self._end, (req.v_end, req.seq, req.epoch, req))

    def _finish(self, req: Request, t_done: float) -> None:
        del self.running[req.seq]
        req.phase = _DONE
        self._prompt_running -= req.prompt
        self._dec_count -= 1
        self._dec_sum_first -= req.v_first
        self._gen_done += req.gen
        self.success[req.reason] += 1
        self.e2e.observe(max(0.0, t_done - req.arrival_t))
        admit = req.admit_t if req.admit_t is not None else t_done
        self.queue_time.observe(max(0.0, admit - req.arrival_t))

    def _preempt_overflow(self) -> None:
        cap = self.params.kv_cache_tokens
        while len(self.running) > 1 and self.kv_tokens() > cap:
            _, req = self.running.popitem()  # the most recently admitted
            if req.phase == _DECODE:
                self._gen_done += int(self.v - req.v_first)
                self._dec_count -= 1
                self._dec_sum_first -= req.v_first
            self._prompt_running -= req.prompt
            req.epoch += 1
            req.phase = _WAITING
            self.waiting.appendleft(req)
            self.preemptions_total += 1
