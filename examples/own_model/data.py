"""Stripes: small generated images of stripes in one of four orientations."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["Stripes"]


class Stripes(torch.utils.data.Dataset):
    """``(1, size, size)`` images of stripes, two pixels wide, and their orientation.

    The classes are horizontal, vertical, and the two diagonals; each image has a random
    phase and Gaussian noise. The set is a pure function of ``(split, seed)``. Training
    samples get fresh noise every time they are read (drawn from torch's global
    generator, which the framework seeds per sample).

    Args:
        split: ``"train"`` or ``"val"``.
        size: Side of the images.
        samples: Number of images; ``None`` is 1,024 for ``train`` and 256 for ``val``.
        noise: Standard deviation of the fixed noise.
        jitter: Standard deviation of the noise added at every read of a training sample.
        seed: Seed of the images.

    Attributes:
        num_classes: 4.
        targets: The class of every image (read by the framework for non-IID splits).

    Example::

        train = Stripes("train")
        image, label = train[0]  # (1, 8, 8) float32, an int in [0, 4)
    """

    num_classes = 4

    def __init__(
        self,
        split: str,
        size: int = 8,
        samples: int | None = None,
        noise: float = 0.5,
        jitter: float = 0.1,
        seed: int = 0,
    ) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"split={split!r} is invalid; it must be 'train' or 'val'")
        n = samples if samples is not None else (1024 if split == "train" else 256)
        gen = torch.Generator().manual_seed(2 * seed + (split == "val"))
        self.train = split == "train"
        self.jitter = jitter
        self.targets = torch.randint(0, self.num_classes, (n,), generator=gen)
        phase = torch.randint(0, 4, (n, 1, 1), generator=gen)
        i = torch.arange(size).view(size, 1).expand(size, size)
        j = torch.arange(size).view(1, size).expand(size, size)
        # the coordinate each orientation's stripes vary along
        along = torch.stack([i, j, i + j, i - j + size])
        clean = ((along[self.targets] + phase) // 2 % 2).float()
        self.images = (clean + noise * torch.randn(n, size, size, generator=gen)).unsqueeze(1)

    def __len__(self) -> int:
        return int(self.targets.numel())

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image = self.images[index]
        if self.train and self.jitter > 0:
            image = image + self.jitter * torch.randn_like(image)
        return image, int(self.targets[index])
