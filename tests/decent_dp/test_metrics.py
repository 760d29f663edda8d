"""The consensus metrics as pure functions: exact value and the sketch's documented error."""

from __future__ import annotations

import statistics

import pytest
import torch

from decent_dp.metrics import (
    consensus_distance_exact,
    consensus_distance_sketch,
    count_sketch,
    sketch_relative_error,
)


def workers(n: int = 4, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(50, 20, generator=g), torch.randn(300, generator=g)]
    return [[t + 0.1 * torch.randn(t.shape, generator=g) for t in base] for _ in range(n)]


def test_exact_matches_definition() -> None:
    ws = workers()
    vecs = torch.stack([torch.cat([t.reshape(-1) for t in w]).double() for w in ws])
    mean = vecs.mean(0)
    by_hand = sum(float(((v - mean) ** 2).sum()) for v in vecs) / len(vecs)
    assert consensus_distance_exact(ws) == pytest.approx(by_hand, rel=1e-12)


def test_identical_workers_have_zero_distance() -> None:
    w = workers(1)[0]
    assert consensus_distance_exact([w, w, w]) == 0.0
    assert consensus_distance_sketch([w, w, w], k=64) == 0.0


def test_sketch_is_deterministic_per_seed_and_linear() -> None:
    w = workers(1)[0]
    assert torch.equal(count_sketch(w, 32, seed=5), count_sketch(w, 32, seed=5))
    doubled = [2 * t for t in w]
    torch.testing.assert_close(count_sketch(doubled, 32, 5), 2 * count_sketch(w, 32, 5))


@pytest.mark.parametrize("k", [64, 256])
def test_sketch_is_unbiased_with_the_documented_error(k: int) -> None:
    ws = workers(4, seed=1)
    exact = consensus_distance_exact(ws)
    est = [consensus_distance_sketch(ws, k, seed=s) / exact for s in range(200)]
    mean, sd = statistics.fmean(est), statistics.stdev(est)
    assert abs(mean - 1) < 4 * sketch_relative_error(k) / 200**0.5  # unbiased
    assert sd <= sketch_relative_error(k) * 1.15  # documented bound on the relative error


def test_bad_sketch_size() -> None:
    with pytest.raises(ValueError, match="k=0"):
        count_sketch([torch.ones(3)], 0, 0)
