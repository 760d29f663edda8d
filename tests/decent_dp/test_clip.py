"""Global-norm clipping of the end of backward, against a float64 reference."""

from __future__ import annotations

import pytest
import torch

from decent_dp._engine.clip import clip_grads_


def _reference(grads: list[torch.Tensor], max_norm: float) -> tuple[float, list[torch.Tensor]]:
    dense = [g.to_dense().double() for g in grads]
    total = torch.cat([g.flatten() for g in dense]).norm()
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    return float(total), [g * coef for g in dense]


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clips_mixed_dtypes_and_sparse_gradients_to_the_global_norm(max_norm: float) -> None:
    gen = torch.Generator().manual_seed(0)
    grads = [
        torch.randn(7, 5, generator=gen),
        torch.randn(3, generator=gen, dtype=torch.float64),
        torch.randn(4, 2, generator=gen).to(torch.bfloat16),
        # an uncoalesced sparse gradient: index 1 appears twice and must be summed first
        torch.sparse_coo_tensor([[1, 1, 4]], [0.5, 2.0, -1.5], (6,), check_invariants=True),
    ]
    total, expected = _reference(grads, max_norm)
    norm = clip_grads_(grads, max_norm)
    assert norm.dtype == torch.float64
    assert float(norm) == pytest.approx(total, rel=1e-6)
    # bfloat16 keeps 8 bits: its product is rounded to about 4e-3
    for g, e, tol in zip(grads, expected, (1e-6, 1e-6, 8e-3, 1e-6)):
        torch.testing.assert_close(g.to_dense().double(), e, rtol=tol, atol=tol)


def test_float64_gradients_are_clipped_exactly() -> None:
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(4)]
    total, expected = _reference(grads, 0.1)
    assert float(clip_grads_(grads, 0.1)) == pytest.approx(total, rel=1e-14)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-14, atol=0.0)
