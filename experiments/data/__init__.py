"""Datasets for the experiments: per-rank shards with deterministic, resumable batch orders.

:func:`build_data` reads the ``dataset`` config section and returns a :class:`Data` whose
``train`` loader yields this rank's batches and whose ``test`` loader yields this rank's
slice of the evaluation set. :data:`DATASETS` maps every name to its family's builder:

* ``digits`` (the default, :mod:`experiments.data.digits`): scikit-learn's 8x8 digits.
* ``cifar10`` / ``cifar100`` (:mod:`experiments.data.cifar`): the Python pickle batches.
* ``imagenet`` (:mod:`experiments.data.imagenet`): image folders.
* ``synthetic`` (:mod:`experiments.data.synthetic`): random images for throughput runs.
* ``tokens`` (:mod:`experiments.data.tokens`): windows of flat token files, for language
  models; its builder returns a :class:`~experiments.data.tokens.TokenData`, whose
  ``block_size`` is the section's (the trainer fills it in from the model when null).

A section with ``_target_`` in place of ``name`` is a user's map-style dataset
(:mod:`experiments.data.target`), sharded like the built-ins; its builder returns a
:class:`~experiments.data.target.TargetData`.

The section's keys and defaults are those of the schemas in
:mod:`experiments.data.schema`; a plain dict is filled in and checked like a composed
config. The split comes from :mod:`experiments.data.partition`, the loaders from
:mod:`experiments.data.loaders`, augmentation from :mod:`experiments.data.augment`.

Determinism. Every batch is a pure function of ``(seed, epoch, rank, batch index)``: the
partition, the per-epoch order and the augmentation each draw from their own
``torch.Generator`` and never touch the global RNG, so a CUDA run sees the same batches as
a CPU run. A run resumed at batch ``k`` of epoch ``e`` calls ``train.iterate(e, start=k)``
and sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from omegaconf import DictConfig

from experiments.data import cifar, digits, imagenet, synthetic, target, tokens
from experiments.data.loaders import Data, EvalLoader, Placement, ShardLoader
from experiments.data.partition import PARTITIONS, derive_seed, partition_indices
from experiments.data.schema import dataset_section
from experiments.schema import is_int, is_target, require

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "Data",
    "EvalLoader",
    "ShardLoader",
    "build_data",
    "builtin_values",
    "derive_seed",
    "partition_indices",
]

DataBuilder = Callable[[DictConfig, Placement], Any]


def _tokens(section: DictConfig, place: Placement) -> tokens.TokenData:
    return tokens.build_tokens(section, placement=place)


DATASETS: Mapping[str, DataBuilder] = {
    "digits": digits.build,
    "cifar10": cifar.build,
    "cifar100": cifar.build,
    "imagenet": imagenet.build,
    "synthetic": synthetic.build,
    "tokens": _tokens,
}
"""The builder of every dataset name: ``builder(section, placement) -> Data`` (or ``TokenData``)."""


def build_data(
    cfg: Mapping[str, Any] | None,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    seed: int,
    device: torch.device,
) -> Any:
    """Build this rank's training and evaluation loaders for the configured dataset.

    Args:
        cfg: The dataset config section (a dict or an OmegaConf ``DictConfig``): ``name``
            (one of :data:`DATASETS`, default ``digits``) and the keys of its schema in
            :mod:`experiments.data.schema`; left-out keys take the schema's defaults. Or a
            ``_target_`` and its arguments (:mod:`experiments.data.target`).
        rank: This process's rank, in ``[0, world_size)``.
        world_size: Number of ranks sharing the training set.
        batch_size: Training samples per batch on each rank.
        seed: Run seed; the partition, the orders and the augmentation derive from it.
        device: Where the batches (and in-memory datasets) live.

    Returns:
        The :class:`Data` of this rank (a :class:`~experiments.data.tokens.TokenData` for
        ``tokens``).

    Raises:
        ValueError: A one-line :class:`~experiments.train.config.ConfigError` for a bad
            section or argument (unknown name or key, a non-positive size or alpha, a rank
            outside ``[0, world_size)``, a ``_target_`` that does not import, raises, or
            returns no map-style dataset of pairs); a plain ``ValueError`` for a per-rank shard smaller
            than one batch, an empty Dirichlet shard, malformed CIFAR files, or an image
            folder without images.
        FileNotFoundError: If CIFAR or ImageNet files are missing (the message names the path
            and how to provide the data).
    """
    section = dataset_section(cfg)
    require("batch_size", batch_size, is_int(batch_size) and batch_size > 0, "an integer > 0")
    require("world_size", world_size, is_int(world_size) and world_size > 0, "an integer > 0")
    ranks = f"an integer in [0, {int(world_size) - 1}]"
    require("rank", rank, is_int(rank) and 0 <= rank < world_size, ranks)
    place = Placement(int(rank), int(world_size), int(batch_size), int(seed), torch.device(device))
    builder = target.build if is_target(section) else DATASETS[str(section.name)]
    return builder(section, place)


def builtin_values(cfg: Mapping[str, Any] | None, model_block: int | None = None) -> dict[str, Any]:
    """What a model gets from a built-in dataset, known without loading it.

    Args:
        cfg: The ``dataset`` section of a registered dataset.
        model_block: The model's block size (the default of ``tokens``' block size).

    Returns:
        ``num_classes``, ``in_channels``, ``image_size``, ``vocab_size`` and ``block_size``,
        ``None`` where the dataset does not give one before it is read (ImageNet's classes
        are its folders).

    Raises:
        ConfigError: For a bad section (``tokens``: no vocabulary size or block size).
    """
    d = dataset_section(cfg)
    name = str(d.name)
    values: dict[str, Any] = dict.fromkeys(
        ("num_classes", "in_channels", "image_size", "vocab_size", "block_size")
    )
    if name == "tokens":
        block, vocab = tokens.token_sizes(d, model_block)
        values.update(vocab_size=vocab, block_size=block)
    elif name == "digits":
        channels, side = digits.IMAGE_SHAPE
        values.update(num_classes=digits.NUM_CLASSES, in_channels=channels, image_size=side)
    elif name in cifar.CIFAR:
        values.update(num_classes=cifar.CIFAR[name].num_classes, in_channels=3, image_size=32)
    elif name == "synthetic":
        values.update(
            num_classes=int(d.num_classes),
            in_channels=int(d.in_channels),
            image_size=int(d.image_size),
        )
    elif name == "imagenet":
        values.update(in_channels=3, image_size=int(d.image_size))
    return values
