"""Loaders: a rank's training shard in deterministic, resumable batches, and its test slice.

:class:`ShardLoader` and :class:`EvalLoader` are the bases; the in-memory loaders here
(:class:`TensorShardLoader`, :class:`TensorEvalLoader`) serve digits, CIFAR and the
synthetic set, and ``experiments.data.imagenet`` adds the image-folder ones. A dataset
family's builder loads its images, cuts this rank's :class:`Shard` with :func:`plan_shard`
and returns a :class:`Data`; :func:`build_in_memory` does all of it for images held in
tensors.

Equal step counts. ``len(train)`` is ``(train_size // world_size) // batch_size`` on every
rank, also under a Dirichlet split where shard sizes differ, so that decentralized workers
always run the same number of steps and never wait on a peer that has stopped.

No waiting on the host. Batches of in-memory sets are gathered, augmented and normalised on
the device, so producing a batch neither copies from host memory nor reads a value back
(the sets themselves are copied once, at start). The epoch's index order and the random
offsets of all its augmented batches are drawn on the host when the epoch starts, from the
same per-batch generators as ever, and copied to the device in one go from pinned memory.
Pinning is used only when the device is CUDA.

Worker processes of a ``DataLoader`` (:func:`worker_init`) ignore the stop signals (``SIGTERM``
and the configured pre-emption signal), under every start method: SLURM signals every
process of a job step, and a worker ended by one would end the training process's loop
before the ranks could save the checkpoint of an agreed step.

One module past 500 lines: the bases and the in-memory loaders share one contract
(equal step counts, batches that depend only on ``(seed, epoch, rank, batch)``, resumable
at any batch), which reads best beside its one implementation.
"""

from __future__ import annotations

import functools
import signal
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor

from experiments.data.augment import Normalize, TensorAugment, channel_stats, to_unit
from experiments.data.partition import (
    TAG_AUGMENT,
    TAG_ORDER,
    eval_range,
    generator,
    partition_indices,
)
from experiments.train.preempt import stop_signals

__all__ = [
    "MIN_EVAL_BATCH",
    "Placement",
    "Shard",
    "ShardLoader",
    "EvalLoader",
    "TensorShardLoader",
    "TensorEvalLoader",
    "Data",
    "InMemory",
    "plan_shard",
    "build_in_memory",
    "in_format",
    "set_memory_format",
    "worker_init",
]

MIN_EVAL_BATCH = 256
"""Evaluation batches hold ``max(batch_size, MIN_EVAL_BATCH)`` samples."""


@dataclass(frozen=True)
class Placement:
    """Where one rank stands in the run, as every dataset builder needs it.

    Attributes:
        rank: This process's rank, in ``[0, world_size)``.
        world_size: Number of ranks sharing the training set.
        batch_size: Training samples per batch on each rank.
        seed: Run seed; the partition, the orders and the augmentation derive from it.
        device: Where the batches (and in-memory datasets) live.
    """

    rank: int
    world_size: int
    batch_size: int
    seed: int
    device: torch.device


@dataclass(frozen=True)
class Shard:
    """This rank's training indices and the shape of its epochs.

    Attributes:
        indices: This rank's indices into the training set.
        batch_size: Samples per batch.
        num_batches: Batches per epoch (the same on every rank).
        seed: Run seed.
        rank: This rank.
    """

    indices: Tensor
    batch_size: int
    num_batches: int
    seed: int
    rank: int


def in_format(x: Tensor, memory_format: torch.memory_format) -> Tensor:
    """``x`` in ``memory_format`` when it is a 4-d image batch; as it is otherwise."""
    if memory_format is torch.contiguous_format or x.dim() != 4:
        return x
    return x.contiguous(memory_format=memory_format)


def set_memory_format(data: Any, memory_format: torch.memory_format) -> None:
    """Have ``data``'s image loaders yield their batches in ``memory_format``.

    For a model in ``torch.channels_last``: the batch is then produced in the model's
    format (in the loader's worker processes, where it has some) instead of being
    converted at every step. Loaders without images (tokens) are left alone.
    """
    for loader in (data.train, data.test):
        if isinstance(loader, (ShardLoader, EvalLoader)):
            loader.memory_format = memory_format


def _ignore_stop_signals(
    signums: tuple[int, ...], then: Callable[[int], None] | None, worker_id: int
) -> None:
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
    if then is not None:
        then(worker_id)


def worker_init(then: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """A ``DataLoader`` ``worker_init_fn`` under which workers ignore the run's stop signals.

    The stop signals are those of :func:`experiments.train.preempt.stop_signals`: ``SIGTERM``
    and the pre-emption signal that ``SUBMITIT_PREEMPT_SIGNAL`` names (``SIGUSR2`` by
    default), read here, in the training process, so that a worker's own environment (a
    ``forkserver`` started earlier, say) does not matter. The training process handles those
    signals (``experiments.train.preempt``) and stops its loaders itself; a worker that died
    of one would end the loop first. The handler is set explicitly in the worker, because
    under the ``forkserver`` and ``spawn`` start methods a worker does not inherit the
    training process's handlers (under ``fork`` it does). The workers still end with the
    training process: the loader shuts them down as it always does, and a worker whose
    training process died quits within seconds (torch's watchdog).

    Args:
        then: A ``worker_init_fn`` to call afterwards with the worker's id, if any.

    Returns:
        A picklable callable, for ``DataLoader(worker_init_fn=...)``.

    Raises:
        ConfigError: ``SUBMITIT_PREEMPT_SIGNAL`` names no signal that a process can catch.
    """
    signums = tuple(int(sig) for sig in stop_signals())
    return functools.partial(_ignore_stop_signals, signums, then)


def _to_device(t: Tensor, device: torch.device) -> Tensor:
    """Copy a CPU tensor to ``device``; to CUDA asynchronously, through pinned memory."""
    if device.type != "cuda" or t.device == device:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class ShardLoader:
    """Base class of the training loaders: this rank's shard, batched per epoch.

    Every rank yields ``len(loader)`` batches of exactly ``batch_size`` samples per epoch.
    The epoch's order is a seeded permutation of the shard (repeated with fresh
    permutations if the shard is smaller than an epoch, which a Dirichlet split allows),
    and batch ``b`` of epoch ``e`` depends only on ``(seed, e, rank, b)``.

    Args:
        shard: This rank's indices and epoch shape.

    Raises:
        ValueError: If the shard is empty.

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

    memory_format: torch.memory_format = torch.contiguous_format
    """The memory format of the image batches (see :func:`set_memory_format`)."""

    def __init__(self, shard: Shard) -> None:
        if shard.indices.numel() == 0:
            raise ValueError(f"rank {shard.rank} has an empty training shard")
        self.indices = shard.indices.long().cpu()
        self.batch_size = shard.batch_size
        self.num_batches = shard.num_batches
        self.seed = shard.seed
        self.rank = shard.rank

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
        gen = generator(TAG_ORDER, self.seed, epoch, self.rank)
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
        """The generator of batch ``batch`` of ``epoch``'s augmentation on this rank."""
        return generator(TAG_AUGMENT, self.seed, epoch, self.rank, batch)

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
    memory_format: torch.memory_format = torch.contiguous_format
    """The memory format of the image batches (see :func:`set_memory_format`)."""

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:  # pragma: no cover - abstract
        raise NotImplementedError


class TensorShardLoader(ShardLoader):
    """Training loader over an in-memory image tensor held on the device.

    Args:
        shard: This rank's indices and epoch shape.
        images: The whole training set, ``(N, C, H, W)``, uint8 or float in ``[0, 1]``.
        labels: Its labels, ``(N,)``, on the same device.
        normalize: Applied to every batch after the augmentation.
        augment: The random shift and flip, or ``None``.
    """

    def __init__(
        self,
        shard: Shard,
        images: Tensor,
        labels: Tensor,
        *,
        normalize: Normalize,
        augment: TensorAugment | None,
    ) -> None:
        super().__init__(shard)
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
            x = to_unit(self._images[idx])
            if self._augment is not None and choices is not None:
                x = self._augment.apply(x, choices[b - start])
            yield in_format(self._normalize(x), self.memory_format), self._labels[idx]


class TensorEvalLoader(EvalLoader):
    """Evaluation loader over an in-memory slice of the test set held on the device."""

    def __init__(
        self, images: Tensor, labels: Tensor, *, normalize: Normalize, batch_size: int
    ) -> None:
        self._images = images
        self._labels = labels
        self._normalize = normalize
        self.batch_size = batch_size
        self.num_samples = int(labels.numel())

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for lo in range(0, self.num_samples, self.batch_size):
            hi = lo + self.batch_size
            x = self._normalize(to_unit(self._images[lo:hi]))
            yield in_format(x, self.memory_format), self._labels[lo:hi]


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

    @classmethod
    def of(
        cls,
        train: ShardLoader,
        test: EvalLoader,
        train_labels: Tensor,
        *,
        num_classes: int,
        image_shape: tuple[int, int],
        synthetic: bool = False,
    ) -> Data:
        """The :class:`Data` of two loaders, with the counts read from the training labels.

        Args:
            train: This rank's training loader.
            test: This rank's evaluation loader.
            train_labels: The labels of the whole training set.
            num_classes: Number of classes.
            image_shape: ``(channels, side)`` of the images the loaders yield.
            synthetic: Whether the data are random.

        Returns:
            The :class:`Data`.
        """
        return cls(
            train=train,
            test=test,
            num_classes=num_classes,
            in_channels=int(image_shape[0]),
            image_size=int(image_shape[1]),
            synthetic=synthetic,
            class_histogram=torch.bincount(
                train_labels[train.indices], minlength=num_classes
            ).tolist(),
            train_size=int(train_labels.numel()),
        )


@dataclass
class InMemory:
    """A dataset held in tensors: the training and test images and labels."""

    train_images: Tensor
    train_labels: Tensor
    test_images: Tensor
    test_labels: Tensor
    num_classes: int
    augment: TensorAugment | None


def _num_batches(train_size: int, world_size: int, batch_size: int) -> int:
    nominal = train_size // world_size
    if nominal < batch_size:
        raise ValueError(
            f"batch_size={batch_size} is larger than the per-rank shard of {nominal} samples "
            f"({train_size} training samples over {world_size} ranks); use batch_size <= {nominal}"
        )
    return nominal // batch_size


def plan_shard(labels: Tensor, section: DictConfig, place: Placement) -> Shard:
    """Split a training set as the ``dataset`` section says and keep this rank's part.

    Args:
        labels: The labels of the whole training set.
        section: The checked ``dataset`` section (``partition``, ``alpha``).
        place: This rank's placement.

    Returns:
        This rank's :class:`Shard`.

    Raises:
        ValueError: If a rank's nominal shard is smaller than one batch, or a Dirichlet
            shard is empty.
    """
    num_batches = _num_batches(int(labels.numel()), place.world_size, place.batch_size)
    shards = partition_indices(
        labels,
        world_size=place.world_size,
        partition=str(section.partition),
        alpha=float(section.alpha),
        seed=place.seed,
    )
    indices = shards[place.rank]
    if indices.numel() < place.batch_size:
        warnings.warn(
            f"rank {place.rank} holds {indices.numel()} training samples, fewer than "
            f"batch_size={place.batch_size}; its batches repeat samples",
            stacklevel=4,
        )
    return Shard(indices, place.batch_size, num_batches, place.seed, place.rank)


def build_in_memory(
    mem: InMemory, section: DictConfig, place: Placement, *, synthetic: bool = False
) -> Data:
    """This rank's :class:`Data` of a dataset held in tensors.

    The training set moves to the device whole, and this rank's slice of the test set;
    both are normalised with the training set's per-channel statistics.

    Args:
        mem: The dataset.
        section: The checked ``dataset`` section.
        place: This rank's placement.
        synthetic: Whether the data are random.

    Returns:
        The :class:`Data` of this rank.
    """
    device = place.device
    shard = plan_shard(mem.train_labels, section, place)
    mean, std = channel_stats(mem.train_images)
    normalize = Normalize(mean, std, device)
    lo, hi = eval_range(int(mem.test_labels.numel()), place.rank, place.world_size)
    train = TensorShardLoader(
        shard,
        mem.train_images.to(device),
        mem.train_labels.to(device),
        normalize=normalize,
        augment=mem.augment,
    )
    test = TensorEvalLoader(
        mem.test_images[lo:hi].to(device),
        mem.test_labels[lo:hi].to(device),
        normalize=normalize,
        batch_size=max(place.batch_size, MIN_EVAL_BATCH),
    )
    _, channels, height, _ = mem.train_images.shape
    return Data.of(
        train,
        test,
        mem.train_labels,
        num_classes=mem.num_classes,
        image_shape=(channels, height),
        synthetic=synthetic,
    )
