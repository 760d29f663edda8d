"""What the data tests share: building a rank's data on the CPU and comparing batches."""

from __future__ import annotations

from typing import Any

import torch

from experiments.data import Data, build_data

CPU = torch.device("cpu")


def digits(**cfg: object) -> dict:
    """A ``digits`` section with the given keys."""
    return {"name": "digits", **cfg}


def build(
    cfg: Any, rank: int = 0, world_size: int = 1, batch_size: int = 32, seed: int = 0
) -> Data:
    """``build_data`` on the CPU."""
    return build_data(
        cfg, rank=rank, world_size=world_size, batch_size=batch_size, seed=seed, device=CPU
    )


def same_batches(a: list, b: list) -> bool:
    """Whether two lists of ``(x, y)`` batches are equal, element by element."""
    return len(a) == len(b) and all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b)
    )


def multiset(images: torch.Tensor, labels: torch.Tensor) -> list[tuple[int, bytes]]:
    """Order-free view of (integer image, label) pairs, duplicates kept."""
    flat = images.reshape(images.shape[0], -1).to(torch.int16).numpy()
    return sorted((int(y), row.tobytes()) for row, y in zip(flat, labels.tolist()))
