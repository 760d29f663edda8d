"""Augmentation and normalisation: batch-wise on tensors, per image for image folders.

In-memory sets (digits, CIFAR, synthetic) are augmented batch-wise on their device by
:class:`TensorAugment` (a random crop of the zero-padded image, that is a shift, and an
optional horizontal flip) and normalised by :class:`Normalize` with the per-channel
statistics of their training set (:func:`channel_stats`). Image-folder samples are
transformed one by one on the host: :class:`TrainTransform` (random resized crop and flip)
and :class:`EvalTransform` (resize and centre crop), both with the usual ImageNet
statistics. Every random choice is drawn from a generator the caller passes in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "to_unit",
    "channel_stats",
    "TensorAugment",
    "Normalize",
    "random_resized_crop_box",
    "TrainTransform",
    "EvalTransform",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def to_unit(x: Tensor) -> Tensor:
    """Images as float32 in ``[0, 1]`` (uint8 storage is scaled by 1/255)."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


def channel_stats(images: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and (population) standard deviation of ``[0, 1]`` images."""
    channels = images.shape[1]
    total = torch.zeros(channels, dtype=torch.float64)
    squares = torch.zeros(channels, dtype=torch.float64)
    for chunk in images.split(4096):
        unit = to_unit(chunk).double()
        total += unit.sum(dim=(0, 2, 3))
        squares += unit.square().sum(dim=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    std = (squares / count - mean.square()).clamp_min(0).sqrt()
    # A constant channel would divide by zero; leave it unscaled instead.
    std = torch.where(std > 1e-8, std, torch.ones_like(std))
    return mean.float(), std.float()


@dataclass(frozen=True)
class TensorAugment:
    """Batch-wise random crop of the zero-padded image (a shift) and optional flip.

    :meth:`draw` makes a batch's random choices on the host, :meth:`apply` uses them on the
    images' device; the loader draws a whole epoch's at once and copies them together.

    Example::

        augment = TensorAugment(pad=4, flip=True)
        out = augment(images, torch.Generator().manual_seed(0))  # same shape as images
    """

    pad: int
    flip: bool

    def draw(self, batch_size: int, gen: torch.Generator) -> Tensor:
        """``(batch_size, 3)`` int64 on the CPU: row offset, column offset, flip (0 or 1)."""
        offsets = torch.randint(0, 2 * self.pad + 1, (batch_size, 2), generator=gen)
        flips = (
            (torch.rand(batch_size, generator=gen) < 0.5).long()
            if self.flip
            else torch.zeros(batch_size, dtype=torch.long)
        )
        return torch.cat([offsets, flips[:, None]], dim=1)

    def __call__(self, x: Tensor, gen: torch.Generator) -> Tensor:
        return self.apply(x, self.draw(x.shape[0], gen).to(x.device))

    def apply(self, x: Tensor, choices: Tensor) -> Tensor:
        """Shift (and flip) ``x`` as :meth:`draw`'s ``choices``, which live on ``x``'s device."""
        b, _, h, w = x.shape
        offsets = choices[:, :2]
        flips = choices[:, 2].bool() if self.flip else None
        padded = F.pad(x, (self.pad, self.pad, self.pad, self.pad))
        rows = offsets[:, :1] + torch.arange(h, device=x.device)
        cols = offsets[:, 1:] + torch.arange(w, device=x.device)
        batch = torch.arange(b, device=x.device)[:, None, None]
        # Advanced indices around a slice put the broadcast dims first: (B, H, W, C).
        out = padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
        if flips is not None:
            out = torch.where(flips[:, None, None, None], out.flip(3), out)
        return out.contiguous()


class Normalize:
    """``(x - mean) / std`` per channel, with the statistics held on ``device``."""

    def __init__(self, mean: Tensor, std: Tensor, device: torch.device) -> None:
        self.mean = mean.to(device).view(1, -1, 1, 1)
        self.std = std.to(device).view(1, -1, 1, 1)

    def __call__(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std


def random_resized_crop_box(
    width: int,
    height: int,
    gen: torch.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a crop with random area share and log-uniform aspect ratio.

    The same distribution as torchvision's ``RandomResizedCrop``, drawn from ``gen``.
    """
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        u_area, u_ratio = torch.rand(2, generator=gen, dtype=torch.float64).tolist()
        target = area * (scale[0] + (scale[1] - scale[0]) * u_area)
        aspect = math.exp(log_lo + (log_hi - log_lo) * u_ratio)
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=gen))
            left = int(torch.randint(0, width - w + 1, (1,), generator=gen))
            return top, left, h, w
    # Fallback: the largest centred crop with an allowed aspect ratio.
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class TrainTransform:
    """Random resized crop to ``size`` and a horizontal flip, drawn from a given generator.

    torchvision's transform classes draw from the global RNG, so the parameters are drawn
    here and only the image operations come from ``torchvision.transforms.functional``.
    """

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Any, gen: torch.Generator) -> Tensor:
        from torchvision.transforms import functional as TF

        width, height = img.size
        top, left, h, w = random_resized_crop_box(width, height, gen)
        img = TF.resized_crop(img, top, left, h, w, [self.size, self.size], antialias=True)
        if float(torch.rand((), generator=gen)) < 0.5:
            img = TF.hflip(img)
        return TF.normalize(TF.to_tensor(img), IMAGENET_MEAN, IMAGENET_STD)


class EvalTransform:
    """Resize the short side to ``size * 8 / 7`` and take the centred ``size`` crop."""

    def __init__(self, size: int) -> None:
        from torchvision import transforms as T

        self._transform = T.Compose(
            [
                T.Resize(round(size * 8 / 7)),
                T.CenterCrop(size),
                T.ToTensor(),
                T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )

    def __call__(self, img: Any, gen: torch.Generator | None = None) -> Tensor:
        return self._transform(img)
