"""vLLM's sleep mode for one simulated replica: state, memory accounting and wake time (pure).

What vLLM does (``--enable-sleep-mode``, dev endpoints under ``VLLM_SERVER_DEV_MODE=1``):
``POST /sleep?level=1`` copies the weights to (pinned) host memory and frees the GPU memory of
weights and KV cache; ``level=2`` discards the weights too (host memory stays small, and waking
needs the weights loaded again). ``POST /wake_up`` (optional ``tags``: ``weights``,
``kv_cache``) brings back what was asked; ``GET /is_sleeping`` answers ``{"is_sleeping": b}``,
true while any part still sleeps. The engine keeps its process, CUDA context and NCCL buffers:
that is what remains on each GPU while asleep, and why waking takes seconds (a host-to-device
copy) instead of a cold start's minutes (process start, CUDA init, weights from disk,
compilation, CUDA graph capture).

The numbers are parameters (``SleepParams``), defaults for a 70B-class bf16 model in tensor
parallel over 4 x 80 GB GPUs; none is a measurement of this machine. Nothing here reads a
clock: the caller passes the simulation time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

AWAKE, WEIGHTS_OFFLOADED, DISCARD_ALL = "awake", "weights_offloaded", "discard_all"
SLEEP_STATES: tuple[str, ...] = (AWAKE, WEIGHTS_OFFLOADED, DISCARD_ALL)  # vllm:engine_sleep_state's labels
TAGS: tuple[str, ...] = ("weights", "kv_cache")  # what /wake_up?tags= may name
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SleepParams:
    """Memory and bandwidth of one replica (its ``gpus`` GPUs, tensor parallel)."""

    gpus: int = 4
    gpu_total_mib: float = 81559.0  # one 80 GB GPU as nvidia-smi / DCGM report it
    gpu_memory_utilization: float = 0.9  # vllm --gpu-memory-utilization: weights + activations + KV
    weights_mib: float = 133_514.0  # all GPUs together: 70e9 parameters x 2 bytes
    cuda_context_mib: float = 600.0  # per GPU, left while asleep: CUDA context, NCCL, allocator slack
    host_base_mib: float = 6144.0  # the process' host memory awake (Python, tokenizer, CUDA host state)
    h2d_gib_per_s: float = 20.0  # per GPU, host -> device (PCIe Gen4 x16 in practice); also device -> host
    load_gib_per_s: float = 2.0  # weights from local disk / page cache, whole replica (level 2 wake)
    wake_overhead_s: float = 1.0  # reallocate the KV cache, resume the engine
    sleep_overhead_s: float = 0.5

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                problems.append(f"{f.name}: expected a finite number >= 0, got {v!r}")
        if not problems:
            if self.gpus < 1:
                problems.append(f"gpus: expected >= 1, got {self.gpus}")
            if not 0 < self.gpu_memory_utilization <= 1:
                problems.append(f"gpu_memory_utilization: expected in (0, 1], got {self.gpu_memory_utilization}")
            if self.weights_mib / self.gpus + self.cuda_context_mib > self.gpu_total_mib * self.gpu_memory_utilization:
                problems.append("weights_mib: the weights do not fit in gpu_memory_utilization of the GPUs")
            if self.h2d_gib_per_s <= 0 or self.load_gib_per_s <= 0:
                problems.append("h2d_gib_per_s, load_gib_per_s: expected > 0")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def weights_per_gpu_mib(self) -> float:
        return self.weights_mib / self.gpus

    def offload_s(self) -> float:
        """Level 1 sleep: every GPU copies its shard to host memory in parallel."""
        return self.sleep_overhead_s + self.weights_per_gpu_mib / 1024.0 / self.h2d_gib_per_s

    def wake_s(self, level: int) -> float:
        """Waking the weights: a copy back from host memory (level 1), or reading them again
        (level 2, the disk part of a cold start without the process start and compilation)."""
        if level == 1:
            return self.wake_overhead_s + self.weights_per_gpu_mib / 1024.0 / self.h2d_gib_per_s
        return self.wake_overhead_s + self.weights_mib / 1024.0 / self.load_gib_per_s


class SleepState:
    """One replica's sleep state. ``asleep`` holds the parts still sleeping (``weights``,
    ``kv_cache``); ``level`` the level they were put to sleep with; ``busy_until`` the
    simulation time an offload or wake in progress completes (the HTTP call returns then)."""

    def __init__(self, params: SleepParams) -> None:
        self.params = params
        self.level = 0
        self.asleep: set[str] = set()
        self.busy_until = 0.0
        self.sleeps_total = 0
        self.wakes_total = 0

    @property
    def is_sleeping(self) -> bool:
        return bool(self.asleep)

    def serving_blocked(self, t: float) -> bool:
        """No request may be served: a part sleeps, or a sleep/wake is still in progress."""
        return bool(self.asleep) or t < self.busy_until

    def sleep(self, t: float, level: int) -> float:
        """Put every part to sleep with ``level``; returns when the call completes. Sleeping
        again while asleep is a no-op (vLLM's is too)."""
        if level not in (1, 2):
            raise ValueError(f"level: expected 1 or 2, got {level!r}")
        if self.asleep:
            return max(t, self.busy_until)
        self.level = level
        self.asleep = set(TAGS)
        self.sleeps_total += 1
        done = t + (self.params.offload_s() if level == 1 else self.params.sleep_overhead_s)
        self.busy_until = max(self.busy_until, done)
        return self.busy_until

    def wake(self, t: float, tags: list[str] | None = None) -> float:
        """Wake ``tags`` (default: all); returns the time it completes."""
        want = set(TAGS) if not tags else set(tags)
        unknown = want - set(TAGS)
        if unknown:
            raise ValueError(f"tags: unknown {', '.join(sorted(unknown))}; expected {', '.join(TAGS)}")
        waking = want & self.asleep
        if not waking:
            return max(t, self.busy_until)
        cost = self.params.wake_s(self.level) if "weights" in waking else self.params.wake_overhead_s
        self.busy_until = max(t, self.busy_until) + cost
        self.asleep -= waking
        if not self.asleep:
            self.wakes_total += 1
        return self.busy_until

    def sleep_state(self) -> str:
        """``vllm:engine_sleep_state``'s label: awake, weights_offloaded (level 1), discard_all (level 2)."""
        if "weights" not in self.asleep:
            return AWAKE
        return WEIGHTS_OFFLOADED if self.level == 1 else DISCARD_ALL

    # --- memory ---------------------------------------------------------------------------
    def gpu_used_mib(self) -> float:
        """Per GPU: awake, vLLM holds gpu_memory_utilization of it (CUDA context, weights, and
        the KV cache it preallocates whatever the load); each sleeping part frees its share;
        the CUDA context and overheads stay."""
        p = self.params
        kv = p.gpu_total_mib * p.gpu_memory_utilization - p.weights_per_gpu_mib - p.cuda_context_mib
        used = p.cuda_context_mib
        if "weights" not in self.asleep:
            used += p.weights_per_gpu_mib
        if "kv_cache" not in self.asleep:
            used += kv
        return used

    def host_mib(self) -> float:
        """The process' host memory: level 1 keeps every GPU's weight shard in host memory."""
        p = self.params
        held = p.weights_mib if "weights" in self.asleep and self.level == 1 else 0.0
        return p.host_base_mib + held
