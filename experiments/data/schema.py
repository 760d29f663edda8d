"""The ``dataset`` group's schemas, each checking the values a type cannot express.

One schema per dataset family: ``conf/dataset/<name>.yaml`` starts its defaults list with
``/schema/dataset/<schema>@_here_``, and :data:`SCHEMAS` names the schema of every
dataset, so that :func:`dataset_section` fills a plain dict (as tests and benchmarks pass
to :func:`experiments.data.build_data`) with the same defaults. Each schema checks its
values in ``__post_init__`` (a positive size, a Dirichlet concentration), so a section is
checked wherever it becomes its dataclass. The token files' schema,
:class:`TokensConfig`, is here too; :mod:`experiments.data.tokens` re-exports it. ``experiments.train.config``
imports this module, registers its schemas in Hydra's ConfigStore and re-exports its names;
import them from there.

A section with ``_target_`` instead of ``name`` is a user's dataset
(:mod:`experiments.data.target`); :class:`DatasetTargetConfig` types the keys the framework
reads from it, and every other key is an argument of the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig

from experiments.schema import name_enum, require, require_number, typed_section

__all__ = [
    "DatasetName",
    "PartitionName",
    "TaskName",
    "DatasetConfig",
    "DatasetTargetConfig",
    "CifarConfig",
    "ImageNetConfig",
    "SyntheticConfig",
    "TokensConfig",
    "SCHEMAS",
    "tokens_section",
    "check_partition",
    "check_dataset",
    "dataset_section",
]

DatasetName = name_enum(
    "DatasetName", ["digits", "cifar10", "cifar100", "imagenet", "synthetic", "tokens"], __name__
)
PartitionName = name_enum("PartitionName", ["iid", "dirichlet"], __name__)
TaskName = name_enum("TaskName", ["classification", "language_model"], __name__)


@dataclass
class DatasetConfig:
    """``dataset`` group, and ``dataset=digits`` (scikit-learn's 8x8 digits).

    Attributes:
        name: Registered dataset name.
        root: Directory holding the files (unused by digits, which ships with scikit-learn).
        download: Let torchvision download missing files.
        num_workers: DataLoader worker processes (for datasets read from disk).
        partition: ``iid`` (equal random shards) or ``dirichlet`` (non-IID label skew).
        alpha: Dirichlet concentration; smaller is more skewed.
        augment: Random shifts / crops and flips on the training batches.
    """

    name: DatasetName = MISSING  # type: ignore[valid-type]
    root: str = "data"
    download: bool = False
    num_workers: int = 0
    partition: PartitionName = PartitionName["iid"]  # type: ignore[valid-type]
    alpha: float = 0.5
    augment: bool = False

    def __post_init__(self) -> None:
        require_number("dataset.num_workers", self.num_workers, at_least=0)
        check_partition(self.partition, self.alpha)
        _check_sizes(self, _SIZES)


@dataclass
class CifarConfig(DatasetConfig):
    """``dataset=cifar10`` / ``cifar100``: the Python batches under ``root``; augmented by default."""

    augment: bool = True


@dataclass
class ImageNetConfig(DatasetConfig):
    """``dataset=imagenet``: ``root/train/<class>/*.JPEG`` and ``root/val/<class>/*.JPEG``."""

    num_workers: int = 4
    augment: bool = True
    image_size: int = 224


@dataclass
class SyntheticConfig(DatasetConfig):
    """``dataset=synthetic``: random labelled images, for throughput runs only (never augmented).

    ``num_test_samples`` null means ``num_samples // 5`` (at least one).
    """

    num_samples: int = 4096
    num_test_samples: int | None = None
    image_size: int = 32
    num_classes: int = 10
    in_channels: int = 3


@dataclass
class TokensConfig:
    """``dataset=tokens``: windows of flat ``uint16`` token files (``train.bin``, ``val.bin``).

    Attributes:
        name: Registered dataset name.
        root: Directory holding ``train.bin``, ``val.bin`` and optionally ``meta.json``
            (or nanoGPT's ``meta.pkl``).
        vocab_size: Token ids are below this; null takes ``vocab_size`` from ``meta.json``
            or ``meta.pkl`` (a folder with neither, such as nanoGPT's OpenWebText, needs
            it: 50257 for GPT-2's BPE).
        block_size: Tokens per window; null takes the model's block size.
        tokens_per_epoch: Training tokens in one epoch, summed over all ranks.
        eval_tokens: Validation tokens predicted per evaluation, split across ranks.
        num_workers: Accepted like the other families' key; the windows are read in the
            training process, since a batch is ``batch_size`` slices of a memory map.
    """

    name: str = "tokens"
    root: str = "data/tokens"
    vocab_size: int | None = None
    block_size: int | None = None
    tokens_per_epoch: int = 1_000_000
    eval_tokens: int = 65_536
    num_workers: int = 0

    def __post_init__(self) -> None:
        _check_sizes(self, ("vocab_size", "block_size", "tokens_per_epoch", "eval_tokens"))
        require_number("dataset.num_workers", self.num_workers, at_least=0)


@dataclass
class DatasetTargetConfig:
    """A user's dataset, ``_target_: their_pkg.module.Name``: the keys the framework reads.

    The target is called twice, with its arguments (``kwargs``: every other key of the
    section) and ``split="train"``, then ``split="val"``; each call returns a map-style
    ``torch.utils.data.Dataset`` of ``(input, target)`` pairs (:mod:`experiments.data.target`).

    Attributes:
        _target_: The class or function, as a dotted import path.
        name: Set to the ``_target_`` path, for logs and summaries.
        task: ``classification`` (integer class targets: cross-entropy, accuracy) or
            ``language_model`` (token ids in, the next ids as targets).
        partition: ``iid`` or ``dirichlet``, as for the built-in datasets.
        alpha: Dirichlet concentration.
        num_workers: ``DataLoader`` worker processes reading the dataset (0: in the
            training process).
        num_classes: Classes of a classification set; null takes the dataset's
            ``num_classes`` attribute.
        vocab_size: Token ids of a language-model set are below it; null takes the
            dataset's ``vocab_size`` attribute.
        kwargs: The target's own arguments.
    """

    _target_: str = MISSING
    name: str = MISSING
    task: TaskName = TaskName["classification"]  # type: ignore[valid-type]
    partition: PartitionName = PartitionName["iid"]  # type: ignore[valid-type]
    alpha: float = 0.5
    num_workers: int = 0
    num_classes: int | None = None
    vocab_size: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require_number("dataset.num_workers", self.num_workers, at_least=0)
        check_partition(self.partition, self.alpha)
        lm = self.task == "language_model"
        iid = "iid for task=language_model"
        require("dataset.partition", self.partition, not lm or self.partition == "iid", iid)
        for key in ("num_classes", "vocab_size"):
            value = getattr(self, key)
            require_number(f"dataset.{key}", value, above=0, kind="integer", nullable=True)


# sizes that only some schemas have; each must be a positive integer where present
_SIZES = ("image_size", "num_samples", "num_test_samples", "num_classes", "in_channels")


def _check_sizes(schema: Any, keys: tuple[str, ...]) -> None:
    """Each of ``keys`` that ``schema`` has and sets (not null) is an integer > 0."""
    for key in keys:
        value = getattr(schema, key, None)
        if value is not None:
            require_number(f"dataset.{key}", value, above=0, kind="integer")


def tokens_section(section: Any) -> DictConfig:
    """The ``dataset=tokens`` section with the defaults of :class:`TokensConfig`, checked.

    Args:
        section: A dict, a ``DictConfig`` or ``None``.

    Returns:
        A ``DictConfig`` of :class:`TokensConfig`.

    Raises:
        ConfigError: A one-line message naming the key, the bad value and what is allowed.
    """
    return typed_section(section, "dataset", {"tokens": TokensConfig}, default="tokens")


SCHEMAS: dict[str, type] = {
    "digits": DatasetConfig,
    "cifar10": CifarConfig,
    "cifar100": CifarConfig,
    "imagenet": ImageNetConfig,
    "synthetic": SyntheticConfig,
    "tokens": TokensConfig,
}
"""The schema of every dataset name, in the order of :data:`DatasetName`."""


def check_partition(partition: Any, alpha: Any) -> None:
    """Check a partition name and its Dirichlet concentration.

    Args:
        partition: ``iid`` or ``dirichlet``.
        alpha: The concentration, which ``dirichlet`` needs finite and positive.

    Raises:
        ConfigError: A one-line message naming ``dataset.partition`` or ``dataset.alpha``.
    """
    names = [m.value for m in PartitionName]
    require("dataset.partition", partition, partition in names, "one of " + ", ".join(names))
    finite = isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0
    valid = partition != "dirichlet" or finite
    require("dataset.alpha", alpha, valid, "> 0 (and finite) for the dirichlet partition")


def dataset_section(section: Any) -> DictConfig:
    """The ``dataset`` section with its schema's defaults, checked by its schema.

    Args:
        section: A dict, a ``DictConfig`` or ``None`` (``digits`` with its defaults).

    Returns:
        A ``DictConfig`` of the schema that ``section``'s name selects
        (:class:`DatasetTargetConfig` for a ``_target_``).

    Raises:
        ConfigError: A one-line message naming the key, the bad value and what is allowed.
    """
    return typed_section(section, "dataset", SCHEMAS, "digits", target=DatasetTargetConfig)


def check_dataset(section: Any) -> None:
    """Check the ``dataset`` section's values beyond their types.

    Args:
        section: A dict or ``DictConfig``; left-out keys take their schema's defaults.

    Raises:
        ConfigError: A one-line message naming the key, the bad value and what is allowed.
    """
    dataset_section(section)
