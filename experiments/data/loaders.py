"""Datasets for the experiments: per-rank shards with deterministic, resumable batch orders.

:func:`build_data` reads the ``dataset`` config section and returns a :class:`Data` whose
``train`` loader yields this rank's batches and whose ``test`` loader yields this rank's
slice of the evaluation set. The names are listed in :data:`DATASETS`:

* ``digits`` (the default): scikit-learn's 1,797 real 8x8 handwritten digits, no download.
  A fixed stratified split (``random_state=0``, 20 % test) gives 1,437 training and 360
  test images whatever the run's seed.
* ``cifar10`` / ``cifar100``: the Python pickle batches (``cifar-10-batches-py`` or
  ``cifar-100-python`` under ``root``); torchvision fetches and checksums them when
  ``download`` is true.
* ``imagenet``: ``root/train/<class>/*.JPEG`` and ``root/val/<class>/*.JPEG`` read through
  torchvision's ``ImageFolder`` by a ``DataLoader`` with ``num_workers`` workers.
* ``synthetic``: uniform random images and labels for throughput runs; ``Data.synthetic``
  is true so that reports can label the numbers.

Determinism. Every batch is a pure function of ``(seed, epoch, rank, batch index)``: the
partition, the per-epoch order and the augmentation each draw from their own
``torch.Generator`` (the Dirichlet proportions from a ``numpy`` generator, as torch has no
seeded Dirichlet sampler) and never touch the global RNG, so a CUDA run sees the same
batches as a CPU run. A run resumed at batch ``k`` of epoch ``e`` calls
``train.iterate(e, start=k)`` and sees exactly the batches an uninterrupted run would have
seen.

Equal step counts. ``len(train)`` is ``(train_size // world_size) // batch_size`` on every
rank, also under a Dirichlet split where shard sizes differ, so that decentralized workers
always run the same number of steps and never wait on a peer that has stopped.

Augmentation (``augment``, default false for digits, true for CIFAR and ImageNet; synthetic
data is never augmented): digits are shifted by up to one pixel with zero fill; CIFAR images
get a random 32x32 crop of the 4-pixel zero-padded image and a horizontal flip; ImageNet
uses a random resized crop and a flip. In-memory sets are augmented batch-wise on
``device`` and then normalised with the per-channel mean and standard deviation of their
training set; ImageNet uses the usual ImageNet statistics.

No waiting on the host. Batches of in-memory sets are gathered, augmented and normalised on
the device, so producing a batch neither copies from host memory nor reads a value back
(the sets themselves are copied once, at start). The epoch's index order and the random
offsets of all its augmented batches are drawn on the host when the epoch starts, from the
same per-batch generators as ever, and copied to the device in one go from pinned memory;
image-folder batches come from pinned memory too (``pin_memory``, ``non_blocking=True``).
Pinning is used only when the device is CUDA.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "Data",
    "EvalLoader",
    "ShardLoader",
    "build_data",
    "derive_seed",
    "partition_indices",
]

DATASETS = ("digits", "cifar10", "cifar100", "imagenet", "synthetic")
PARTITIONS = ("iid", "dirichlet")

_MIN_EVAL_BATCH = 256
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_IMAGENET_LAYOUT = "root/train/<class>/*.JPEG and root/val/<class>/*.JPEG"

# Stream tags keep the seeds of independent random streams apart.
_TAG_PARTITION = 1
_TAG_ORDER = 2
_TAG_AUGMENT = 3
_TAG_SYNTHETIC = 4


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


def _generator(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*parts))


def _to_device(t: Tensor, device: torch.device) -> Tensor:
    """Copy a CPU tensor to ``device``; to CUDA asynchronously, through pinned memory."""
    if device.type != "cuda" or t.device == device:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


# --------------------------------------------------------------------------- partitions


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
    n = int(labels.numel())
    if partition == "iid":
        perm = torch.randperm(n, generator=_generator(_TAG_PARTITION, seed))
        size = n // world_size
        return [perm[r * size : (r + 1) * size].clone() for r in range(world_size)]
    if partition != "dirichlet":
        raise ValueError(
            f"dataset.partition must be one of {', '.join(PARTITIONS)}, got {partition!r}"
        )
    if not alpha > 0 or not math.isfinite(alpha):
        raise ValueError(f"dataset.alpha must be a positive number, got {alpha!r}")
    rng = np.random.default_rng(derive_seed(_TAG_PARTITION, seed))
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


def _eval_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous ``[lo, hi)`` of ``n`` items for ``rank``; sizes differ by at most one."""
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


# --------------------------------------------------------------------------- loaders


class ShardLoader:
    """Base class of the training loaders: this rank's shard, batched per epoch.

    Every rank yields ``len(loader)`` batches of exactly ``batch_size`` samples per epoch.
    The epoch's order is a seeded permutation of the shard (repeated with fresh
    permutations if the shard is smaller than an epoch, which a Dirichlet split allows),
    and batch ``b`` of epoch ``e`` depends only on ``(seed, e, rank, b)``.

    Args:
        indices: This rank's indices into the training set.
        batch_size: Samples per batch.
        num_batches: Batches per epoch (the same on every rank).
        seed: Run seed.
        rank: This rank.

    Example::

        data = build_data({"name": "digits"}, rank=0, world_size=4, batch_size=32,
                          seed=0, device=torch.device("cpu"))
        for epoch in range(10):
            for x, y in data.train.iterate(epoch):
                ...
        # resume in the middle of epoch 3, at batch 5
        for x, y in data.train.iterate(3, start=5):
            ...
    """

    def __init__(
        self, indices: Tensor, *, batch_size: int, num_batches: int, seed: int, rank: int
    ) -> None:
        if indices.numel() == 0:
            raise ValueError(f"rank {rank} has an empty training shard")
        self.indices = indices.long().cpu()
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.seed = seed
        self.rank = rank

    def __len__(self) -> int:
        return self.num_batches

    @property
    def shard_size(self) -> int:
        """Number of training samples assigned to this rank."""
        return int(self.indices.numel())

    def epoch_order(self, epoch: int) -> Tensor:
        """The ``len(self) * batch_size`` training-set indices of ``epoch``, in batch order.

        Args:
            epoch: Epoch number (non-negative).

        Returns:
            An int64 CPU tensor; batch ``b`` is ``order[b * batch_size:(b + 1) * batch_size]``.
        """
        gen = _generator(_TAG_ORDER, self.seed, epoch, self.rank)
        need = self.num_batches * self.batch_size
        pieces, have = [], 0
        while have < need:
            pieces.append(self.indices[torch.randperm(self.shard_size, generator=gen)])
            have += self.shard_size
        return torch.cat(pieces)[:need]

    def iterate(self, epoch: int, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield the ``(x, y)`` batches ``start .. len(self) - 1`` of ``epoch`` on the device.

        Args:
            epoch: Epoch number (non-negative).
            start: First batch to yield; ``len(self)`` yields nothing.

        Returns:
            An iterator over ``(images, labels)`` pairs.

        Raises:
            ValueError: If ``epoch`` is negative or ``start`` is outside ``[0, len(self)]``.
        """
        if isinstance(epoch, bool) or int(epoch) != epoch or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        if isinstance(start, bool) or int(start) != start or not 0 <= start <= len(self):
            raise ValueError(f"start must be an integer in [0, {len(self)}], got {start!r}")
        return self._batches(self.epoch_order(int(epoch)), int(epoch), int(start))

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.iterate(0)

    def _batch_generator(self, epoch: int, batch: int) -> torch.Generator:
        return _generator(_TAG_AUGMENT, self.seed, epoch, self.rank, batch)

    def _batches(
        self, order: Tensor, epoch: int, start: int
    ) -> Iterator[tuple[Tensor, Tensor]]:  # pragma: no cover - abstract
        raise NotImplementedError


class EvalLoader:
    """Base class of the evaluation loaders: this rank's contiguous slice of the test set.

    The slices of all ranks cover the test set exactly once, in order; their sizes differ
    by at most one (a rank may get none when the set is smaller than the world). No
    augmentation is applied. Sum correct counts and ``num_samples`` over ranks for the
    global accuracy.

    Example::

        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in data.test)
        accuracy_on_this_rank = correct / max(data.test.num_samples, 1)
    """

    num_samples: int
    batch_size: int

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:  # pragma: no cover - abstract
        raise NotImplementedError


def _to_unit(x: Tensor) -> Tensor:
    """Images as float32 in ``[0, 1]`` (uint8 storage is scaled by 1/255)."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


def _channel_stats(images: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and (population) standard deviation of ``[0, 1]`` images."""
    channels = images.shape[1]
    total = torch.zeros(channels, dtype=torch.float64)
    squares = torch.zeros(channels, dtype=torch.float64)
    for chunk in images.split(4096):
        unit = _to_unit(chunk).double()
        total += unit.sum(dim=(0, 2, 3))
        squares += unit.square().sum(dim=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    std = (squares / count - mean.square()).clamp_min(0).sqrt()
    # A constant channel would divide by zero; leave it unscaled instead.
    std = torch.where(std > 1e-8, std, torch.ones_like(std))
    return mean.float(), std.float()


@dataclass(frozen=True)
class _TensorAugment:
    """Batch-wise random crop of the zero-padded image (a shift) and optional flip.

    :meth:`draw` makes a batch's random choices on the host, :meth:`apply` uses them on the
    images' device; the loader draws a whole epoch's at once and copies them together.
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


class _Normalize:
    def __init__(self, mean: Tensor, std: Tensor, device: torch.device) -> None:
        self.mean = mean.to(device).view(1, -1, 1, 1)
        self.std = std.to(device).view(1, -1, 1, 1)

    def __call__(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std


class TensorShardLoader(ShardLoader):
    """Training loader over an in-memory image tensor held on the device."""

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        indices: Tensor,
        *,
        normalize: _Normalize,
        augment: _TensorAugment | None,
        batch_size: int,
        num_batches: int,
        seed: int,
        rank: int,
    ) -> None:
        super().__init__(
            indices, batch_size=batch_size, num_batches=num_batches, seed=seed, rank=rank
        )
        self._images = images
        self._labels = labels
        self._normalize = normalize
        self._augment = augment

    def _batches(self, order: Tensor, epoch: int, start: int) -> Iterator[tuple[Tensor, Tensor]]:
        device = self._images.device
        bs = self.batch_size
        # one host-to-device copy per epoch instead of one per batch
        order = _to_device(order, device)
        choices = None
        if self._augment is not None and start < self.num_batches:
            drawn = [
                self._augment.draw(bs, self._batch_generator(epoch, b))
                for b in range(start, self.num_batches)
            ]
            choices = _to_device(torch.stack(drawn), device)
        for b in range(start, self.num_batches):
            idx = order[b * bs : (b + 1) * bs]
            x = _to_unit(self._images[idx])
            if self._augment is not None and choices is not None:
                x = self._augment.apply(x, choices[b - start])
            yield self._normalize(x), self._labels[idx]


class TensorEvalLoader(EvalLoader):
    """Evaluation loader over an in-memory slice of the test set held on the device."""

    def __init__(
        self, images: Tensor, labels: Tensor, *, normalize: _Normalize, batch_size: int
    ) -> None:
        self._images = images
        self._labels = labels
        self._normalize = normalize
        self.batch_size = batch_size
        self.num_samples = int(labels.numel())

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for lo in range(0, self.num_samples, self.batch_size):
            hi = lo + self.batch_size
            yield self._normalize(_to_unit(self._images[lo:hi])), self._labels[lo:hi]


# --------------------------------------------------------------------------- image folders


def _random_resized_crop_box(
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


class _TrainTransform:
    """Random resized crop to ``size`` and a horizontal flip, drawn from a given generator.

    torchvision's transform classes draw from the global RNG, so the parameters are drawn
    here and only the image operations come from ``torchvision.transforms.functional``.
    """

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Any, gen: torch.Generator) -> Tensor:
        from torchvision.transforms import functional as TF

        width, height = img.size
        top, left, h, w = _random_resized_crop_box(width, height, gen)
        img = TF.resized_crop(img, top, left, h, w, [self.size, self.size], antialias=True)
        if float(torch.rand((), generator=gen)) < 0.5:
            img = TF.hflip(img)
        return TF.normalize(TF.to_tensor(img), _IMAGENET_MEAN, _IMAGENET_STD)


class _EvalTransform:
    """Resize the short side to ``size * 8 / 7`` and take the centred ``size`` crop."""

    def __init__(self, size: int) -> None:
        from torchvision import transforms as T

        self._transform = T.Compose(
            [
                T.Resize(round(size * 8 / 7)),
                T.CenterCrop(size),
                T.ToTensor(),
                T.Normalize(_IMAGENET_MEAN, _IMAGENET_STD),
            ]
        )

    def __call__(self, img: Any, gen: torch.Generator | None = None) -> Tensor:
        return self._transform(img)


class _SeededImages(torch.utils.data.Dataset):
    """Image-folder samples addressed by ``(index, sample_seed)`` keys.

    Carrying the seed in the key makes a sample's augmentation independent of which
    worker loads it and of what that worker loaded before.
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


def _folder_loader(
    dataset: _SeededImages,
    batches: Sequence[list[tuple[int, int]]],
    num_workers: int,
    device: torch.device,
) -> Iterator[tuple[Tensor, Tensor]]:
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batches,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        # The loader draws its worker base seed from this generator instead of the global
        # RNG; the samples themselves are seeded by their keys.
        generator=torch.Generator().manual_seed(0),
    )
    for x, y in loader:
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


class FolderShardLoader(ShardLoader):
    """Training loader over an image folder, read by a ``DataLoader`` with worker processes.

    Resuming at batch ``start`` slices the index list, so skipped batches are never read.
    """

    def __init__(
        self,
        dataset: _SeededImages,
        indices: Tensor,
        *,
        num_workers: int,
        device: torch.device,
        batch_size: int,
        num_batches: int,
        seed: int,
        rank: int,
    ) -> None:
        super().__init__(
            indices, batch_size=batch_size, num_batches=num_batches, seed=seed, rank=rank
        )
        self._dataset = dataset
        self._num_workers = num_workers
        self._device = device

    def _batches(self, order: Tensor, epoch: int, start: int) -> Iterator[tuple[Tensor, Tensor]]:
        bs = self.batch_size
        batches = []
        for b in range(start, self.num_batches):
            seeds = torch.randint(0, 1 << 62, (bs,), generator=self._batch_generator(epoch, b))
            batches.append(list(zip(order[b * bs : (b + 1) * bs].tolist(), seeds.tolist())))
        if not batches:
            return iter(())
        return _folder_loader(self._dataset, batches, self._num_workers, self._device)


class FolderEvalLoader(EvalLoader):
    """Evaluation loader over a contiguous slice of an image folder."""

    def __init__(
        self,
        dataset: _SeededImages,
        lo: int,
        hi: int,
        *,
        batch_size: int,
        num_workers: int,
        device: torch.device,
    ) -> None:
        self._dataset = dataset
        self._range = (lo, hi)
        self._num_workers = num_workers
        self._device = device
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
        return _folder_loader(self._dataset, batches, self._num_workers, self._device)


# --------------------------------------------------------------------------- datasets


@dataclass
class Data:
    """Everything the training loop needs to know about the data of one rank.

    Attributes:
        train: This rank's training shard.
        test: This rank's slice of the test/validation set (sum counts over ranks).
        num_classes: Number of classes.
        in_channels: Channels of the images.
        image_size: Side of the square images the loaders yield.
        synthetic: True only for the synthetic dataset.
        class_histogram: Class counts of this rank's training shard (non-IID diagnostics).
        train_size: Samples in the whole training set.

    Example::

        data = build_data({"name": "digits"}, rank=0, world_size=1, batch_size=32,
                          seed=0, device=torch.device("cpu"))
        x, y = next(iter(data.train))  # x: (32, 1, 8, 8), y: (32,)
    """

    train: ShardLoader
    test: EvalLoader
    num_classes: int
    in_channels: int
    image_size: int
    synthetic: bool
    class_histogram: list[int]
    train_size: int


@dataclass
class _InMemory:
    train_images: Tensor
    train_labels: Tensor
    test_images: Tensor
    test_labels: Tensor
    num_classes: int
    augment: _TensorAugment | None


def _get(cfg: Mapping[str, Any] | None, key: str, default: Any) -> Any:
    """Read ``key`` from a dict or DictConfig, falling back to ``default`` when absent or null."""
    if cfg is None:
        return default
    value = cfg.get(key, default)
    return default if value is None else value


def _positive_int(value: Any, what: str) -> int:
    try:
        ok = not isinstance(value, bool) and int(value) == value and int(value) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _load_digits(augment: bool) -> _InMemory:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).div_(16.0).unsqueeze(1)
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=0.2, stratify=bunch.target, random_state=0
    )
    train_idx, test_idx = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    return _InMemory(
        images[train_idx],
        labels[train_idx],
        images[test_idx],
        labels[test_idx],
        num_classes=10,
        augment=_TensorAugment(pad=1, flip=False) if augment else None,
    )


@dataclass(frozen=True)
class _CifarFormat:
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    label_key: str
    num_classes: int


_CIFAR = {
    "cifar10": _CifarFormat(
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        "labels",
        10,
    ),
    "cifar100": _CifarFormat("cifar-100-python", ("train",), ("test",), "fine_labels", 100),
}


def _once_per_node(fn: Callable[[], None]) -> None:
    """Run ``fn`` on one process per node while the others wait (avoids racing downloads)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        fn()
        return
    leader = int(os.environ.get("LOCAL_RANK", dist.get_rank())) == 0
    error: BaseException | None = None
    if leader:
        try:
            fn()
        except Exception as exc:  # re-raised after the barrier so that no rank hangs
            error = exc
    dist.barrier()
    if error is not None:
        raise error


def _read_cifar(
    folder: Path, files: Sequence[str], fmt: _CifarFormat, hint: str
) -> tuple[Tensor, Tensor]:
    """Read CIFAR pickle batches: dicts with ``data`` uint8 ``(N, 3072)`` (R, G, B planes of
    32x32, row-major) and a list of labels under ``labels`` or ``fine_labels``."""
    images, labels = [], []
    for name in files:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"CIFAR file {path} is missing; {hint}")
        with path.open("rb") as fh:
            entry = pickle.load(fh, encoding="latin1")
        data = np.asarray(entry["data"])
        targets = np.asarray(entry[fmt.label_key], dtype=np.int64)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise ValueError(
                f"{path}: 'data' must be uint8 of shape (N, 3072), got {data.dtype} {data.shape}"
            )
        if targets.shape != (data.shape[0],):
            raise ValueError(
                f"{path}: {len(targets)} labels under {fmt.label_key!r} for {data.shape[0]} images"
            )
        if targets.size and (targets.min() < 0 or targets.max() >= fmt.num_classes):
            raise ValueError(f"{path}: labels must lie in [0, {fmt.num_classes - 1}]")
        images.append(torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()))
        labels.append(torch.from_numpy(targets))
    return torch.cat(images), torch.cat(labels)


def _load_cifar(name: str, root: Path, download: bool, augment: bool) -> _InMemory:
    fmt = _CIFAR[name]
    if download:
        from torchvision import datasets

        cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
        # torchvision fetches the archive and checks its md5 sums; the batches are then read
        # below by the same reader as locally provided files.
        _once_per_node(lambda: cls(str(root), train=True, download=True))
    folder = root / fmt.folder
    hint = f"set dataset.download=true or place {fmt.folder} under {root}"
    if not folder.is_dir():
        raise FileNotFoundError(f"{name} data not found at {folder}; {hint}")
    train_x, train_y = _read_cifar(folder, fmt.train_files, fmt, hint)
    test_x, test_y = _read_cifar(folder, fmt.test_files, fmt, hint)
    return _InMemory(
        train_x,
        train_y,
        test_x,
        test_y,
        num_classes=fmt.num_classes,
        augment=_TensorAugment(pad=4, flip=True) if augment else None,
    )


def _load_synthetic(cfg: Mapping[str, Any] | None, seed: int) -> _InMemory:
    n = _positive_int(_get(cfg, "num_samples", 4096), "dataset.num_samples")
    n_test = _positive_int(
        _get(cfg, "num_test_samples", max(n // 5, 1)), "dataset.num_test_samples"
    )
    size = _positive_int(_get(cfg, "image_size", 32), "dataset.image_size")
    classes = _positive_int(_get(cfg, "num_classes", 10), "dataset.num_classes")
    channels = _positive_int(_get(cfg, "in_channels", 3), "dataset.in_channels")
    gen = _generator(_TAG_SYNTHETIC, seed)
    images = torch.randint(
        0, 256, (n + n_test, channels, size, size), dtype=torch.uint8, generator=gen
    )
    labels = torch.randint(0, classes, (n + n_test,), generator=gen)
    return _InMemory(images[:n], labels[:n], images[n:], labels[n:], classes, augment=None)


def _num_batches(train_size: int, world_size: int, batch_size: int) -> int:
    nominal = train_size // world_size
    if nominal < batch_size:
        raise ValueError(
            f"batch_size={batch_size} is larger than the per-rank shard of {nominal} samples "
            f"({train_size} training samples over {world_size} ranks); use batch_size <= {nominal}"
        )
    return nominal // batch_size


def _shard(
    labels: Tensor,
    rank: int,
    world_size: int,
    batch_size: int,
    cfg: Mapping[str, Any] | None,
    seed: int,
) -> tuple[Tensor, int]:
    partition = str(_get(cfg, "partition", "iid"))
    if partition not in PARTITIONS:
        raise ValueError(
            f"dataset.partition must be one of {', '.join(PARTITIONS)}, got {partition!r}"
        )
    alpha = float(_get(cfg, "alpha", 0.5))
    num_batches = _num_batches(int(labels.numel()), world_size, batch_size)
    shards = partition_indices(
        labels, world_size=world_size, partition=partition, alpha=alpha, seed=seed
    )
    shard = shards[rank]
    if shard.numel() < batch_size:
        warnings.warn(
            f"rank {rank} holds {shard.numel()} training samples, fewer than batch_size="
            f"{batch_size}; its batches repeat samples",
            stacklevel=3,
        )
    return shard, num_batches


def _build_in_memory(
    mem: _InMemory,
    cfg: Mapping[str, Any] | None,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    seed: int,
    device: torch.device,
    synthetic: bool,
) -> Data:
    shard, num_batches = _shard(mem.train_labels, rank, world_size, batch_size, cfg, seed)
    mean, std = _channel_stats(mem.train_images)
    normalize = _Normalize(mean, std, device)
    lo, hi = _eval_range(int(mem.test_labels.numel()), rank, world_size)
    train = TensorShardLoader(
        mem.train_images.to(device),
        mem.train_labels.to(device),
        shard,
        normalize=normalize,
        augment=mem.augment,
        batch_size=batch_size,
        num_batches=num_batches,
        seed=seed,
        rank=rank,
    )
    test = TensorEvalLoader(
        mem.test_images[lo:hi].to(device),
        mem.test_labels[lo:hi].to(device),
        normalize=normalize,
        batch_size=max(batch_size, _MIN_EVAL_BATCH),
    )
    _, channels, height, _ = mem.train_images.shape
    return Data(
        train=train,
        test=test,
        num_classes=mem.num_classes,
        in_channels=int(channels),
        image_size=int(height),
        synthetic=synthetic,
        class_histogram=torch.bincount(mem.train_labels[shard], minlength=mem.num_classes).tolist(),
        train_size=int(mem.train_labels.numel()),
    )


def _image_folder(path: Path) -> Any:
    from torchvision.datasets import ImageFolder

    if not path.is_dir():
        raise FileNotFoundError(f"ImageNet directory {path} not found; expected {_IMAGENET_LAYOUT}")
    try:
        return ImageFolder(str(path))
    except FileNotFoundError as exc:  # the directory exists, so it holds no usable images
        raise ValueError(
            f"no images found in {path}; expected {_IMAGENET_LAYOUT} ({exc})"
        ) from None


def _build_imagenet(
    cfg: Mapping[str, Any] | None,
    *,
    root: Path,
    augment: bool,
    rank: int,
    world_size: int,
    batch_size: int,
    seed: int,
    device: torch.device,
) -> Data:
    size = _positive_int(_get(cfg, "image_size", 224), "dataset.image_size")
    num_workers = int(_get(cfg, "num_workers", 4))
    if num_workers < 0:
        raise ValueError(f"dataset.num_workers must be >= 0, got {num_workers}")
    train_folder = _image_folder(root / "train")
    val_folder = _image_folder(root / "val")
    if val_folder.class_to_idx != train_folder.class_to_idx:
        raise ValueError(
            f"the class folders of {root / 'val'} differ from those of {root / 'train'}; "
            "both need the same <class> subdirectories"
        )
    labels = torch.tensor(train_folder.targets, dtype=torch.int64)
    num_classes = len(train_folder.classes)
    shard, num_batches = _shard(labels, rank, world_size, batch_size, cfg, seed)
    train_transform = _TrainTransform(size) if augment else _EvalTransform(size)
    train = FolderShardLoader(
        _SeededImages(train_folder, train_transform),
        shard,
        num_workers=num_workers,
        device=device,
        batch_size=batch_size,
        num_batches=num_batches,
        seed=seed,
        rank=rank,
    )
    lo, hi = _eval_range(len(val_folder), rank, world_size)
    test = FolderEvalLoader(
        _SeededImages(val_folder, _EvalTransform(size)),
        lo,
        hi,
        batch_size=batch_size,
        num_workers=num_workers,
        device=device,
    )
    return Data(
        train=train,
        test=test,
        num_classes=num_classes,
        in_channels=3,
        image_size=size,
        synthetic=False,
        class_histogram=torch.bincount(labels[shard], minlength=num_classes).tolist(),
        train_size=int(labels.numel()),
    )


def build_data(
    cfg: Mapping[str, Any] | None,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    seed: int,
    device: torch.device,
) -> Data:
    """Build this rank's training and evaluation loaders for the configured dataset.

    Args:
        cfg: The dataset config section (a dict or an OmegaConf ``DictConfig``): ``name``
            (one of :data:`DATASETS`, default ``digits``), ``root`` (default ``data``),
            ``download`` (false), ``num_workers`` (4, ImageNet only), ``partition``
            (``iid`` or ``dirichlet``), ``alpha`` (0.5), ``augment`` (default per dataset),
            ``image_size`` (synthetic 32, ImageNet 224), and for ``synthetic``:
            ``num_samples`` (4096), ``num_test_samples`` (num_samples // 5),
            ``num_classes`` (10), ``in_channels`` (3).
        rank: This process's rank, in ``[0, world_size)``.
        world_size: Number of ranks sharing the training set.
        batch_size: Training samples per batch on each rank.
        seed: Run seed; the partition, the orders and the augmentation derive from it.
        device: Where the batches (and in-memory datasets) live.

    Returns:
        The :class:`Data` of this rank.

    Raises:
        ValueError: For an unknown name or partition, a non-positive batch size or alpha, a
            rank outside ``[0, world_size)``, a per-rank shard smaller than one batch, an empty
            Dirichlet shard, malformed CIFAR files, or an image folder without images.
        FileNotFoundError: If CIFAR or ImageNet files are missing (the message names the path
            and how to provide the data).
    """
    name = str(_get(cfg, "name", "digits"))
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    batch_size = _positive_int(batch_size, "batch_size")
    world_size = _positive_int(world_size, "world_size")
    if isinstance(rank, bool) or int(rank) != rank or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, {world_size - 1}], got {rank!r}")
    rank, seed, device = int(rank), int(seed), torch.device(device)
    augment_cfg = _get(cfg, "augment", None)
    root = Path(str(_get(cfg, "root", "data"))).expanduser()

    if name == "imagenet":
        return _build_imagenet(
            cfg,
            root=root,
            augment=True if augment_cfg is None else bool(augment_cfg),
            rank=rank,
            world_size=world_size,
            batch_size=batch_size,
            seed=seed,
            device=device,
        )
    if name == "digits":
        mem = _load_digits(augment=bool(augment_cfg) if augment_cfg is not None else False)
    elif name in _CIFAR:
        mem = _load_cifar(
            name,
            root,
            download=bool(_get(cfg, "download", False)),
            augment=True if augment_cfg is None else bool(augment_cfg),
        )
    else:
        mem = _load_synthetic(cfg, seed)
    return _build_in_memory(
        mem,
        cfg,
        rank=rank,
        world_size=world_size,
        batch_size=batch_size,
        seed=seed,
        device=device,
        synthetic=name == "synthetic",
    )
