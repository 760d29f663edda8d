"""``dataset=imagenet``: image folders read by a ``DataLoader`` with worker processes.

``root/train/<class>/*.JPEG`` and ``root/val/<class>/*.JPEG`` are read through
torchvision's ``ImageFolder`` (any image type it opens will do) by a ``DataLoader`` with
``num_workers`` workers. Training images get a random resized crop to ``image_size`` and a
flip with ``augment`` (the default), else the evaluation transform: the short side resized
to ``image_size * 8 / 7`` and the centred crop. Both normalise with the ImageNet statistics.

Determinism. A sample is addressed by ``(index, sample_seed)``, its seed drawn from its
batch's generator, and read by the loaders of :mod:`experiments.data.seeded`, so its
augmentation depends neither on which worker loads it nor on what that worker loaded before;
a resumed epoch skips batches without reading them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor

from experiments.data.augment import EvalTransform, TrainTransform
from experiments.data.loaders import Data, Placement, plan_shard
from experiments.data.partition import eval_range
from experiments.data.seeded import SeededEvalLoader, SeededShardLoader

__all__ = [
    "LAYOUT",
    "SeededImages",
    "image_folder",
    "build",
]

LAYOUT = "root/train/<class>/*.JPEG and root/val/<class>/*.JPEG"
"""The folder layout, as messages state it."""


class SeededImages(torch.utils.data.Dataset):
    """Image-folder samples addressed by ``(index, sample_seed)`` keys.

    Carrying the seed in the key makes a sample's augmentation independent of which
    worker loads it and of what that worker loaded before.

    Args:
        folder: A torchvision ``ImageFolder``.
        transform: Called as ``transform(image, generator)``.
    """

    def __init__(self, folder: Any, transform: Callable[..., Tensor]) -> None:
        self.folder = folder
        self.transform = transform

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, key: tuple[int, int]) -> tuple[Tensor, int]:
        index, sample_seed = key
        path, target = self.folder.samples[index]
        gen = torch.Generator().manual_seed(sample_seed)
        return self.transform(self.folder.loader(path), gen), target


def image_folder(path: Path) -> Any:
    """A torchvision ``ImageFolder`` of ``path``.

    Raises:
        FileNotFoundError: If ``path`` is not a directory.
        ValueError: If it holds no images.
    """
    from torchvision.datasets import ImageFolder

    if not path.is_dir():
        raise FileNotFoundError(f"ImageNet directory {path} not found; expected {LAYOUT}")
    try:
        return ImageFolder(str(path))
    except FileNotFoundError as exc:  # the directory exists, so it holds no usable images
        raise ValueError(f"no images found in {path}; expected {LAYOUT} ({exc})") from None


def build(section: DictConfig, place: Placement) -> Data:
    """This rank's ImageNet (keys ``root``, ``num_workers``, ``augment``, ``image_size``, ...).

    Raises:
        FileNotFoundError: If ``root/train`` or ``root/val`` is missing.
        ValueError: If a folder holds no images, or the two hold different classes.
    """
    root = Path(str(section.root)).expanduser()
    size, num_workers = int(section.image_size), int(section.num_workers)
    train_folder = image_folder(root / "train")
    val_folder = image_folder(root / "val")
    if val_folder.class_to_idx != train_folder.class_to_idx:
        raise ValueError(
            f"the class folders of {root / 'val'} differ from those of {root / 'train'}; "
            "both need the same <class> subdirectories"
        )
    labels = torch.tensor(train_folder.targets, dtype=torch.int64)
    transform = TrainTransform(size) if section.augment else EvalTransform(size)
    train = SeededShardLoader(
        plan_shard(labels, section, place),
        SeededImages(train_folder, transform),
        num_workers=num_workers,
        device=place.device,
    )
    lo, hi = eval_range(len(val_folder), place.rank, place.world_size)
    test = SeededEvalLoader(
        SeededImages(val_folder, EvalTransform(size)),
        lo,
        hi,
        batch_size=place.batch_size,
        num_workers=num_workers,
        device=place.device,
    )
    num_classes = len(train_folder.classes)
    return Data.of(train, test, labels, num_classes=num_classes, image_shape=(3, size))
