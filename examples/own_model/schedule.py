"""A scheduler as a function of the optimizer."""

from __future__ import annotations

import torch

__all__ = ["warmup"]


def warmup(optimizer: torch.optim.Optimizer, steps: int = 10) -> torch.optim.lr_scheduler.LambdaLR:
    """A linear warm-up over ``steps`` optimizer steps, then the optimizer's rate.

    Args:
        optimizer: The optimizer whose rate it sets.
        steps: Steps of the warm-up; the first step runs at ``lr / steps``.

    Returns:
        The scheduler.
    """
    if steps < 1:
        raise ValueError(f"steps={steps} is invalid; it must be >= 1")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / steps))
