"""Samples addressed by ``(index, sample_seed)`` keys, read by a ``DataLoader`` with workers.

A sample's seed is drawn from its batch's generator (:meth:`ShardLoader._batch_generator`),
so its random transform depends neither on which worker loads it nor on what that worker
loaded before, and a resumed epoch skips batches without reading them. Image folders
(:mod:`experiments.data.imagenet`) pass the seed to their transforms; a user's dataset
(:mod:`experiments.data.target`) is read through :class:`SeededSamples`, under which
torch's and Python's global generators are seeded by it. Batches come from pinned memory on
CUDA (``pin_memory``, ``non_blocking=True``). Each loader keeps one ``DataLoader``, whose
workers persist across epochs and evaluations.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from experiments.data.loaders import EvalLoader, Shard, ShardLoader, in_format, worker_init

__all__ = ["SeededSamples", "SeededShardLoader", "SeededEvalLoader"]


class SeededSamples(torch.utils.data.Dataset):
    """A map-style dataset read by ``(index, sample_seed)`` keys, its randomness seeded by them.

    ``dataset[index]`` is read with torch's CPU generator and Python's ``random`` seeded by
    the key's seed, and both restored afterwards: a transform that draws from them gives the
    same sample on a resumed run, and the training process's own draws are untouched.

    Args:
        dataset: Any map-style dataset.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, sample_seed = key
        state = random.getstate()
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(sample_seed)
                random.seed(sample_seed)
                return self.dataset[index]
        finally:
            random.setstate(state)


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

    def __init__(
        self, dataset: torch.utils.data.Dataset, num_workers: int, device: torch.device
    ) -> None:
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


class SeededShardLoader(ShardLoader):
    """Training loader over samples keyed by ``(index, sample_seed)``, read by a ``DataLoader``.

    Resuming at batch ``start`` slices the index list, so skipped batches are never read.

    Args:
        shard: This rank's indices and epoch shape.
        dataset: The training samples, addressed by ``(index, sample_seed)`` keys.
        num_workers: ``DataLoader`` worker processes (0 reads in this process).
        device: Where the batches go.
    """

    def __init__(
        self,
        shard: Shard,
        dataset: torch.utils.data.Dataset,
        *,
        num_workers: int,
        device: torch.device,
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


class SeededEvalLoader(EvalLoader):
    """Evaluation loader over the contiguous slice ``[lo, hi)`` of keyed samples (seed 0)."""

    def __init__(
        self,
        dataset: torch.utils.data.Dataset,
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
