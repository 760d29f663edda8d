"""Mixing matrices as pure data: spectral gap and contraction over a period.

Every function takes plain float64 matrices, so the analysis runs for any
world size without a process group. The *spectral gap* of a symmetric
mixing matrix ``W`` is defined here as ``1 - max(|λ2|, |λn|)`` with
eigenvalues sorted ``λ1 >= λ2 >= ... >= λn`` (papers disagree on the
definition; this one bounds the per-round contraction towards the mean).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["spectral_gap", "period_contraction", "consensus_rate", "reaches_exact_consensus"]


def spectral_gap(w: torch.Tensor) -> float:
    """Spectral gap ``1 - max(|λ2|, |λn|)`` of a symmetric mixing matrix.

    Eigenvalues are sorted ``λ1 >= λ2 >= ... >= λn`` (``λ1 = 1`` for a doubly
    stochastic ``W``). A gap of 0 means the round alone does not mix
    everything; a gap of 1 means one round reaches exact consensus. A 1x1
    matrix has gap 1.
    """
    if w.shape[0] == 1:
        return 1.0
    ev = torch.linalg.eigvalsh(w.to(torch.float64)).flip(0)
    return max(0.0, float(1.0 - max(abs(ev[1].item()), abs(ev[-1].item()))))


def period_contraction(matrices: Sequence[torch.Tensor]) -> float:
    """Spectral norm of ``W(P-1) ... W(0) - 11^T/n``.

    The factor by which one full period shrinks the distance to consensus in
    the worst case; 0 means the period reaches exact consensus.
    """
    n = matrices[0].shape[0]
    prod = torch.eye(n, dtype=torch.float64)
    for w in matrices:
        prod = w.to(torch.float64) @ prod
    dev = prod - torch.full((n, n), 1.0 / n, dtype=torch.float64)
    return float(torch.linalg.matrix_norm(dev, ord=2).item())


def consensus_rate(matrices: Sequence[torch.Tensor], atol: float = 1e-12) -> float:
    """Average shrink of the disagreement per step: ``1 - contraction^(1/period)``.

    A contraction below ``atol`` is rounding noise of an exact period and gives 1.
    """
    contraction = period_contraction(matrices)
    return 1.0 if contraction <= atol else 1.0 - contraction ** (1.0 / len(matrices))


def reaches_exact_consensus(matrices: Sequence[torch.Tensor], atol: float = 1e-12) -> bool:
    """True when one period maps every starting point to the exact mean (finite-time consensus)."""
    return period_contraction(matrices) <= atol
