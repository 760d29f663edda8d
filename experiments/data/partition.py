"""Seeds and splits: which samples a rank trains on and evaluates, the same on every rank.

Every random choice of the data pipeline draws from its own ``torch.Generator``, seeded by
:func:`derive_seed` from a stream tag and the integers it depends on (the run seed, the
epoch, the rank, the batch), and never from the global RNG. The Dirichlet proportions come
from a ``numpy`` generator seeded the same way, as torch has no seeded Dirichlet sampler.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import Tensor

from experiments.data.schema import PartitionName, check_partition

__all__ = [
    "PARTITIONS",
    "TAG_PARTITION",
    "TAG_ORDER",
    "TAG_AUGMENT",
    "TAG_SYNTHETIC",
    "derive_seed",
    "generator",
    "partition_indices",
    "eval_range",
]

PARTITIONS = tuple(m.value for m in PartitionName)

# Stream tags keep the seeds of independent random streams apart.
TAG_PARTITION = 1
TAG_ORDER = 2
TAG_AUGMENT = 3
TAG_SYNTHETIC = 4


def derive_seed(*parts: int) -> int:
    """Hash integers into a 63-bit seed, stable across processes, platforms and versions.

    Args:
        *parts: The integers the seed depends on, for example ``(tag, seed, epoch, rank)``.

    Returns:
        A non-negative integer below ``2**63``, usable with ``torch.Generator.manual_seed``.
    """
    text = ",".join(str(int(p)) for p in parts).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(*parts: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed` of ``parts``."""
    return torch.Generator().manual_seed(derive_seed(*parts))


def partition_indices(
    labels: Tensor, *, world_size: int, partition: str, alpha: float, seed: int
) -> list[Tensor]:
    """Split the indices of a training set into one shard per rank.

    The result is identical on every rank, since it depends only on the arguments.

    * ``iid``: a seeded permutation of all indices cut into ``world_size`` equal contiguous
      shards; the last ``len(labels) % world_size`` indices of the permutation are dropped.
    * ``dirichlet``: for every class, proportions over the ranks are drawn from
      ``Dir(alpha)`` and the (shuffled) indices of that class are cut accordingly. Smaller
      ``alpha`` gives more skewed class mixes; every sample lands on exactly one rank.

    Args:
        labels: Integer class labels of the training set, shape ``(N,)``.
        world_size: Number of shards.
        partition: ``"iid"`` or ``"dirichlet"``.
        alpha: Dirichlet concentration (used by ``"dirichlet"`` only), positive.
        seed: Seed of the split.

    Returns:
        ``world_size`` int64 tensors of indices into ``labels``.

    Raises:
        ValueError: If ``partition`` is unknown, ``alpha`` is not positive, or a Dirichlet
            shard comes out empty (a larger ``alpha`` spreads classes more evenly).
    """
    check_partition(partition, alpha)
    n = int(labels.numel())
    if partition == "iid":
        perm = torch.randperm(n, generator=generator(TAG_PARTITION, seed))
        size = n // world_size
        return [perm[r * size : (r + 1) * size].clone() for r in range(world_size)]
    rng = np.random.default_rng(derive_seed(TAG_PARTITION, seed))
    label_array = labels.cpu().numpy()
    parts: list[list[np.ndarray]] = [[] for _ in range(world_size)]
    for cls in np.unique(label_array):
        members = np.flatnonzero(label_array == cls)
        rng.shuffle(members)
        proportions = rng.dirichlet(np.full(world_size, float(alpha)))
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        for rank, piece in enumerate(np.split(members, cuts)):
            parts[rank].append(piece)
    shards = [torch.from_numpy(np.sort(np.concatenate(p))).long() for p in parts]
    empty = [r for r, s in enumerate(shards) if s.numel() == 0]
    if empty:
        raise ValueError(
            f"the Dirichlet split with alpha={alpha} left rank(s) {empty} of {world_size} "
            "without training samples; use a larger dataset.alpha"
        )
    return shards


def eval_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous ``[lo, hi)`` of ``n`` evaluation items for ``rank``.

    The ranges of all ranks cover ``[0, n)`` once, in order; their sizes differ by at most one.
    """
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)
