"""``dataset=imagenet``: image folders read by a ``DataLoader`` with worker processes.

``root/train/<class>/*.JPEG`` and ``root/val/<class>/*.JPEG`` are read through
torchvision's ``ImageFolder`` (any image type it opens will do) by a ``DataLoader`` with
``num_workers`` workers. Training images get a random resized crop to ``image_size`` and a
flip with ``augment`` (the default), else the evaluation transform: the short side resized
to ``image_size * 8 / 7`` and the centred crop. Both normalise with the ImageNet statistics.

Determinism. A sample is addressed by ``(index, sample_seed)``, its seed drawn from its
batch's generator, so its augmentation depends neither on which worker loads it nor on what
that worker loaded before; a resumed epoch skips batches without reading them. Batches come
from pinned memory on CUDA (``pin_memory``, ``non_blocking=True``). Each loader keeps one
``DataLoader``, whose workers persist across epochs and evaluations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor

from experiments.data.augment import EvalTransform, TrainTransform
from experiments.data.loaders import (
    Data,
    EvalLoader,
    Placement,
    Shard,
    ShardLoader,
    in_format,
    plan_shard,
    worker_init,
)
from experiments.data.partition import eval_range

__all__ = [
    "LAYOUT",
    "SeededImages",
    "FolderShardLoader",
    "FolderEvalLoader",
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


class _Batches(torch.utils.data.Sampler):
    """A batch sampler whose batches are replaced before each pass over the loader."""

    def __init__(self) -> None:
        self.batches: Sequence[list[tuple[int, int]]] = []

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _collate(memory_format: torch.memory_format, samples: list[Any]) -> tuple[Tensor, Tensor]:
    """Stack a batch in the worker, already in the model's memory format."""
    x, y = torch.utils.data.default_collate(samples)
    return in_format(x, memory_format), y


class _Reader:
    """One ``DataLoader`` for every pass of a loader: its worker processes live across
    epochs and evaluations (``persistent_workers``) instead of starting at every pass."""

    def __init__(self, dataset: SeededImages, num_workers: int, device: torch.device) -> None:
        self._dataset = dataset
        self._num_workers = num_workers
        self._device = device
        self._sampler = _Batches()
        self._loader: torch.utils.data.DataLoader | None = None
        self._format = torch.contiguous_format

    def _build(self, memory_format: torch.memory_format) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            self._dataset,
            batch_sampler=self._sampler,
            num_workers=self._num_workers,
            collate_fn=functools.partial(_collate, memory_format),
            pin_memory=self._device.type == "cuda",
            persistent_workers=self._num_workers > 0,
            worker_init_fn=worker_init(),  # the training process alone handles the stop signals
            # The loader draws its worker base seed from this generator instead of the global
            # RNG; the samples themselves are seeded by their keys.
            generator=torch.Generator().manual_seed(0),
        )

    def read(
        self, batches: Sequence[list[tuple[int, int]]], memory_format: torch.memory_format
    ) -> Iterator[tuple[Tensor, Tensor]]:
        if self._loader is None or memory_format != self._format:
            self._loader, self._format = self._build(memory_format), memory_format
        self._sampler.batches = batches
        device = self._device
        for x, y in self._loader:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


class FolderShardLoader(ShardLoader):
    """Training loader over an image folder, read by a ``DataLoader`` with worker processes.

    Resuming at batch ``start`` slices the index list, so skipped batches are never read.

    Args:
        shard: This rank's indices and epoch shape.
        dataset: The training images.
        num_workers: ``DataLoader`` worker processes (0 reads in this process).
        device: Where the batches go.
    """

    def __init__(
        self, shard: Shard, dataset: SeededImages, *, num_workers: int, device: torch.device
    ) -> None:
        super().__init__(shard)
        self._reader = _Reader(dataset, num_workers, device)

    def _batches(self, order: Tensor, epoch: int, start: int) -> Iterator[tuple[Tensor, Tensor]]:
        bs = self.batch_size
        batches = []
        for b in range(start, self.num_batches):
            seeds = torch.randint(0, 1 << 62, (bs,), generator=self._batch_generator(epoch, b))
            batches.append(list(zip(order[b * bs : (b + 1) * bs].tolist(), seeds.tolist())))
        if not batches:
            return iter(())
        return self._reader.read(batches, self.memory_format)


class FolderEvalLoader(EvalLoader):
    """Evaluation loader over the contiguous slice ``[lo, hi)`` of an image folder."""

    def __init__(
        self,
        dataset: SeededImages,
        lo: int,
        hi: int,
        *,
        batch_size: int,
        num_workers: int,
        device: torch.device,
    ) -> None:
        self._reader = _Reader(dataset, num_workers, device)
        self._range = (lo, hi)
        self.batch_size = batch_size
        self.num_samples = hi - lo

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        lo, hi = self._range
        batches = [
            [(i, 0) for i in range(start, min(start + self.batch_size, hi))]
            for start in range(lo, hi, self.batch_size)
        ]
        if not batches:
            return iter(())
        return self._reader.read(batches, self.memory_format)


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
    train = FolderShardLoader(
        plan_shard(labels, section, place),
        SeededImages(train_folder, transform),
        num_workers=num_workers,
        device=place.device,
    )
    lo, hi = eval_range(len(val_folder), place.rank, place.world_size)
    test = FolderEvalLoader(
        SeededImages(val_folder, EvalTransform(size)),
        lo,
        hi,
        batch_size=place.batch_size,
        num_workers=num_workers,
        device=place.device,
    )
    num_classes = len(train_folder.classes)
    return Data.of(train, test, labels, num_classes=num_classes, image_shape=(3, size))
