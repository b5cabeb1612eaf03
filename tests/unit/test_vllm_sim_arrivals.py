"""Arrival process: mean rate honoured, burstiness from cv, request sizes."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from gpu_bridge_lab.sandbox.vllm.arrivals import ArrivalProcess, sample_sizes
from gpu_bridge_lab.sandbox.vllm.model import ReplicaParams


def counts(cv: float, rate: float = 100.0, windows: int = 2000, seed: int = 3) -> list[int]:
    proc = ArrivalProcess(np.random.default_rng(seed))
    return [len(proc.arrivals(rate, cv, 1.0)) for _ in range(windows)]


def test_poisson_counts_have_unit_dispersion() -> None:
    c = counts(1.0)
    mean = statistics.fmean(c)
    assert mean == pytest.approx(100.0, rel=0.03)
    assert statistics.pvariance(c) / mean == pytest.approx(1.0, abs=0.2)


def test_cv_above_one_is_burstier_than_poisson_with_the_same_mean() -> None:
    poisson, bursty = counts(1.0), counts(4.0, windows=6000)
    assert statistics.fmean(bursty) == pytest.approx(100.0, rel=0.1)
    # renewal process: index of dispersion of counts tends to cv**2 = 16
    assert statistics.pvariance(bursty) / statistics.fmean(bursty) > 5 * statistics.pvariance(poisson) / statistics.fmean(poisson)


def test_cv_below_one_is_smoother_than_poisson() -> None:
    c = counts(0.3)
    assert statistics.pvariance(c) / statistics.fmean(c) < 0.3


def test_rate_changes_take_effect_and_zero_rate_means_no_arrivals() -> None:
    proc = ArrivalProcess(np.random.default_rng(1))
    assert proc.arrivals(0.0, 1.0, 10.0) == []
    n_low = sum(len(proc.arrivals(10.0, 1.0, 1.0)) for _ in range(200))
    n_high = sum(len(proc.arrivals(200.0, 1.0, 1.0)) for _ in range(200))
    assert n_low == pytest.approx(2000, rel=0.1) and n_high == pytest.approx(40000, rel=0.05)


def test_offsets_fall_inside_the_step_in_order() -> None:
    proc = ArrivalProcess(np.random.default_rng(5))
    for _ in range(50):
        offs = proc.arrivals(300.0, 2.0, 0.1)
        assert all(0.0 <= o < 0.1 for o in offs)
        assert offs == sorted(offs)


def test_same_seed_same_arrivals() -> None:
    assert counts(3.0, windows=200, seed=9) == counts(3.0, windows=200, seed=9)
    assert counts(3.0, windows=200, seed=9) != counts(3.0, windows=200, seed=10)


def test_request_sizes_follow_their_means_and_limits() -> None:
    params = ReplicaParams(max_tokens=600, max_model_len=4096)
    sizes = sample_sizes(np.random.default_rng(2), params, 20000)
    prompts = [p for p, _, _ in sizes]
    gens = [g for _, g, _ in sizes]
    assert statistics.fmean(prompts) == pytest.approx(params.prompt_tokens_mean, rel=0.1)
    assert max(prompts) < params.max_model_len
    assert max(gens) <= 600
    reasons = {r for _, _, r in sizes}
    assert reasons == {"stop", "length"}
    assert all(g == min(600, 4096 - p) for p, g, r in sizes if r == "length")
    assert sample_sizes(np.random.default_rng(2), params, 0) == []
