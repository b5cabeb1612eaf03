"""Arrival process and request sizes.

Arrivals are a gamma renewal process in *operational time* (time-rescaling): operational
time advances by ``rate * dt``, and inter-arrival gaps in operational time are gamma with
mean 1 and coefficient of variation ``cv`` (shape ``1/cv**2``). So the mean rate follows the
trace (or the live override) exactly, while ``cv`` > 1 gives the bursts the trace measured
(cv = 1 is Poisson, cv < 1 is smoother than Poisson). Rate changes need no special case:
the current gap simply elapses faster or slower. The trace's cv (median ~2.9, some windows
above 50) is honoured as is unless capped with ``max_cv``.
"""

from __future__ import annotations

import math

import numpy as np

from gpu_bridge_lab.sandbox.vllm.model import ReplicaParams

_BUF = 512
_MIN_CV = 0.01  # below this the gaps are deterministic


class ArrivalProcess:
    """Arrival instants for one model's stream. Deterministic for a given generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._op = 0.0  # operational time so far
        self._next: float | None = None  # operational time of the next arrival
        self._shape = -1.0
        self._buf: list[float] = []
        self._i = 0

    def _gap(self, cv: float) -> float:
        if cv < _MIN_CV:
            return 1.0
        shape = 1.0 / (cv * cv)
        if shape != self._shape or self._i >= len(self._buf):
            self._shape = shape
            self._buf = self._rng.gamma(shape, 1.0 / shape, _BUF).tolist()
            self._i = 0
        g = self._buf[self._i]
        self._i += 1
        return g

    def arrivals(self, rate: float, cv: float, dt: float) -> list[float]:
        """Offsets in [0, dt) of the arrivals during the next ``dt`` seconds at ``rate``/s."""
        if not (rate > 0 and math.isfinite(rate)) or dt <= 0:
            return []
        start = self._op
        end = start + rate * dt
        if self._next is None:
            # Start in equilibrium-ish: a uniform fraction of a gap, not an arrival at t=0.
            self._next = start + self._gap(cv) * float(self._rng.random())
        out: list[float] = []
        nxt = self._next
        while nxt < end:
            out.append((nxt - start) / rate)
            nxt += self._gap(cv)
        self._next = nxt
        self._op = end
        return out


def lognormal_mu(mean: float, sigma: float) -> float:
    """mu of a lognormal with the given mean and sigma."""
    return math.log(mean) - sigma * sigma / 2.0


def sample_sizes(rng: np.random.Generator, params: ReplicaParams, n: int) -> list[tuple[int, int, str]]:
    """(prompt tokens, generation tokens, finish reason) for ``n`` requests."""
    if n <= 0:
        return []
    p = params
    prompts = rng.lognormal(lognormal_mu(p.prompt_tokens_mean, p.prompt_tokens_sigma), p.prompt_tokens_sigma, n)
    gens = rng.lognormal(lognormal_mu(p.gen_tokens_mean, p.gen_tokens_sigma), p.gen_tokens_sigma, n)
    max_prompt = max(1, min(p.max_model_len - 1, p.kv_cache_tokens // 2))
    out = []
    for pr, g in zip(prompts.tolist(), gens.tolist()):
        prompt = min(max_prompt, max(1, int(pr)))
        gen = max(1, int(g))
        limit = min(p.max_tokens, max(1, p.max_model_len - prompt))
        if gen >= limit:
            out.append((prompt, limit, "length"))
        else:
            out.append((prompt, gen, "stop"))
    return out
