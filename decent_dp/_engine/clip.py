"""Global-norm gradient clipping with multi-tensor kernels, as the end of backward runs it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["by_device_and_dtype", "clip_grads_"]


def by_device_and_dtype(
    tensors: list[torch.Tensor],
) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    """The tensors grouped as multi-tensor kernels take them: one list per (device, dtype)."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        groups[(t.device, t.dtype)].append(t)
    return groups


@torch.no_grad()
def clip_grads_(grads: list[torch.Tensor], max_norm: float, group: Any = None) -> torch.Tensor:
    """Scale ``grads`` in place by ``min(1, max_norm / (||grads|| + 1e-6))``; return the norm.

    Each tensor's norm is taken in its own dtype (as ``clip_grad_norm_`` does; in
    float32 for 16-bit dtypes) and the per-tensor norms are combined in float64: one multi-tensor kernel per
    (device, dtype) for the norms and one for the scaling, instead of a cast to
    float64 and two kernels per gradient. Sparse gradients take the per-tensor path.

    Args:
        grads: The gradients, on one device, dense or sparse.
        max_norm: The threshold, ``> 0``.
        group: A process group whose ranks each hold a part of the model (the shard
            ranks of a replica): the norm is over all their parts. ``None``: this rank's.

    Returns:
        The global 2-norm before clipping, a float64 scalar tensor on the gradients' device.
    """
    dense = by_device_and_dtype([g for g in grads if not g.is_sparse])
    sparse = [g for g in grads if g.is_sparse]
    norms = [
        n
        for (_, dtype), gs in dense.items()
        # half-precision norms are summed in float32, as they lose too much in their own dtype
        for n in torch._foreach_norm(gs, 2, dtype=torch.float32 if dtype.itemsize < 4 else None)
    ]
    norms += [torch.linalg.vector_norm(g.coalesce().values()) for g in sparse]
    # one cast per dtype, not one per tensor (every float32 or float16 value is exact in float64)
    by_dtype = by_device_and_dtype(norms)
    parts = [torch.stack(ns).to(torch.float64) for ns in by_dtype.values()]
    total = torch.cat(parts).norm() if parts else torch.zeros((), dtype=torch.float64)
    if group is not None:
        sq = total.pow(2)
        dist.all_reduce(sq, group=group)
        total = sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for (_, dtype), gs in dense.items():
        torch._foreach_mul_(gs, coef.to(dtype))
    for g in sparse:
        g.mul_(coef.to(g.dtype))
    return total
