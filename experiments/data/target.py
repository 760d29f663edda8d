"""A user's dataset, ``dataset._target_: their_pkg.module.Name``, sharded like the built-ins.

The target is called with the section's arguments plus ``split="train"``, then
``split="val"`` (:func:`load_splits`). Each call must return a map-style
``torch.utils.data.Dataset`` (``__getitem__`` and ``__len__``, not an ``IterableDataset``)
whose items are ``(input, target)`` pairs:

- ``dataset.task=classification`` (the default): the input a tensor (or numpy array), the
  target an integer class id below ``num_classes``; ``num_classes`` is the section's key,
  else the training set's attribute of that name.
- ``dataset.task=language_model``: input and target 1-d integer tensors of the same length
  (the ids and the next ids), below ``vocab_size`` (the key, else the attribute).

Both splits are built under torch's, Python's and numpy's global generators seeded from the
run's seed, and those restored afterwards, so every rank builds the same data, whatever the
target draws from. Sample 0 of each split is read and checked before any process group
exists; :func:`load_splits` keeps what the check built for the build that follows, so the
target is called once per split and job.

Partition. The training set is split across ranks as the built-ins are
(:func:`~experiments.data.loaders.plan_shard`). ``iid`` needs only its length. ``dirichlet``
and the class histogram need the labels: the dataset's ``targets`` attribute (torchvision's
convention: a sequence of class ids, one per sample), read at no cost; without one, the
labels are read from every sample once (``dataset[i][1]``), which loads each sample.

Batches. Both splits are read by a ``DataLoader`` (``dataset.num_workers`` workers,
``default_collate``) through :class:`~experiments.data.seeded.SeededSamples`: batch ``b``
of epoch ``e`` on rank ``r`` holds the same samples, drawn with the same seeds, on a resumed
run as on an uninterrupted one.

Example::

    data = build({"_target_": "their_pkg.data.Blobs", "num_classes": 4}, place)
    x, y = next(iter(data.train))
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import Tensor

from experiments.data.loaders import Placement, plan_shard
from experiments.data.partition import derive_seed, eval_range
from experiments.data.schema import dataset_section
from experiments.data.seeded import SeededEvalLoader, SeededSamples, SeededShardLoader
from experiments.instantiate import Target, one_line
from experiments.schema import ConfigError, plain

__all__ = ["TAG_TARGET", "SPLITS", "Splits", "TargetData", "load_splits", "build"]

TAG_TARGET = 6
"""Stream tag of the global generators' seed while the target builds its splits."""

SPLITS = ("train", "val")


@dataclass
class Splits:
    """The two datasets a target returned, checked, and what was learned from them.

    Attributes:
        train: The training set.
        val: The evaluation set.
        task: ``classification`` or ``language_model``.
        input_shape: The shape of sample 0's input in the training set.
        num_classes: Classes (classification).
        vocab_size: Token ids are below it (language models).
        labels: The training labels when they were read (``targets``, or ``dirichlet``).
    """

    train: Any
    val: Any
    task: str
    input_shape: tuple[int, ...]
    num_classes: int | None
    vocab_size: int | None
    labels: Tensor | None


@dataclass
class TargetData:
    """Everything the training loop needs to know about a user's dataset on one rank.

    Attributes:
        train: This rank's training shard.
        test: This rank's slice of the evaluation set.
        task: ``classification`` or ``language_model``.
        input_shape: The shape of one input.
        num_classes: Classes (classification), else ``None``.
        in_channels: ``C`` of ``(C, H, W)`` inputs, else ``None``.
        image_size: ``H`` of square ``(C, H, H)`` inputs, else ``None``.
        vocab_size: Token ids are below it (language models), else ``None``.
        block_size: Tokens per input (language models), else ``None``.
        class_histogram: Class counts of this rank's shard; empty when the labels are unknown.
        train_size: Samples in the whole training set.
        synthetic: Always false: the data are the user's.
        unigram_entropy: Unknown for a user's dataset.
    """

    train: SeededShardLoader
    test: SeededEvalLoader
    task: str
    input_shape: tuple[int, ...]
    num_classes: int | None
    in_channels: int | None
    image_size: int | None
    vocab_size: int | None
    block_size: int | None
    class_histogram: list[int] = field(default_factory=list)
    train_size: int = 0
    synthetic: bool = False
    unigram_entropy: float | None = None

    def model_values(self) -> dict[str, int | None]:
        """What a model's target may take from the data (``None``: unknown)."""
        return model_values(self.task, self.input_shape, self.num_classes, self.vocab_size)


def model_values(
    task: str, shape: tuple[int, ...], num_classes: int | None, vocab_size: int | None
) -> dict[str, int | None]:
    """``num_classes``, ``in_channels``, ``image_size``, ``vocab_size`` and ``block_size`` of data.

    Args:
        task: ``classification`` or ``language_model``.
        shape: One input's shape.
        num_classes: Classes, or ``None``.
        vocab_size: Vocabulary, or ``None``.

    Returns:
        The five values, ``None`` where the data do not give one.
    """
    image = task == "classification" and len(shape) == 3
    return {
        "num_classes": num_classes,
        "in_channels": shape[0] if image else None,
        "image_size": shape[1] if image and shape[1] == shape[2] else None,
        "vocab_size": vocab_size,
        "block_size": shape[-1] if task == "language_model" and len(shape) == 1 else None,
    }


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """torch's CPU, Python's and numpy's global generators seeded, and restored after."""
    python, legacy = random.getstate(), np.random.get_state()
    derived = derive_seed(TAG_TARGET, seed)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived)
            random.seed(derived)
            np.random.seed(derived % (1 << 32))
            yield
    finally:
        random.setstate(python)
        np.random.set_state(legacy)


# one entry: the splits the pre-collective check built, for the build of the same job
_KEPT: dict[str, Splits] = {}


def _key(section: Any, seed: int) -> str:
    container = plain(OmegaConf.to_container(section, resolve=True))
    return json.dumps({"section": container, "seed": seed}, sort_keys=True, default=str)


def load_splits(section: Any, seed: int, *, keep: bool = False) -> Splits:
    """Call the target for both splits and check what it returned.

    Args:
        section: The ``dataset`` section with a ``_target_``.
        seed: The run's seed (the global generators' seed while the target runs).
        keep: Keep the result for the next call with the same section and seed (the
            pre-collective check keeps it for the build); without ``keep`` a kept result is
            handed over and forgotten.

    Returns:
        The checked splits.

    Raises:
        ConfigError: One line naming the key and its value: the target does not import,
            a key is no argument of it, it takes no ``split``, it raised, or it returned
            something else than a map-style dataset of ``(input, target)`` pairs.
    """
    d = dataset_section(section)
    key = _key(d, seed)
    if key in _KEPT:
        return _KEPT[key] if keep else _KEPT.pop(key)
    splits = _load(d, seed)
    if keep:
        _KEPT.clear()
        _KEPT[key] = splits
    return splits


def _load(d: Any, seed: int) -> Splits:
    target = Target.of("dataset", d)
    if "split" in target.kwargs:
        raise ConfigError(
            f"dataset.split={target.kwargs['split']} is invalid; it must be left out: the "
            "framework calls dataset._target_ with split=train and split=val"
        )
    if not target.accepts("split"):
        raise ConfigError(
            f"{target.key}={target.path} takes no split argument; it must accept "
            "split='train' and split='val'"
        )
    target.check(extra=["split"])
    task = str(d.task)
    with _seeded(seed):  # what the target draws, building or reading, is the same on every rank
        built = {split: target.call(split=split) for split in SPLITS}
        samples = {split: _sample(target, ds, split) for split, ds in built.items()}
        train = built["train"]
        num_classes = _size(target, d, train, "num_classes") if task == "classification" else None
        vocab = _size(target, d, train, "vocab_size") if task == "language_model" else None
        bound = num_classes if num_classes is not None else vocab
        for split, (x, y) in samples.items():
            _check_pair(target, x, y, split, task, bound)
        need = str(d.partition) == "dirichlet"
        labels = _labels(target, train, need=need) if task == "classification" else None
    if labels is not None:
        _check_labels(target, labels, int(num_classes or 0))
    shape = tuple(int(n) for n in samples["train"][0].shape)
    return Splits(train, built["val"], task, shape, num_classes, vocab, labels)


def _returned(target: Target, split: str, what: str) -> ConfigError:
    return ConfigError(
        f"{target.key}={target.path} returned {what} for split={split}; it must return a "
        "map-style torch.utils.data.Dataset (__getitem__ and __len__) of (input, target) pairs"
    )


def _size(target: Target, d: Any, train: Any, key: str) -> int:
    """``num_classes`` or ``vocab_size``: the section's, else the training set's attribute."""
    value = d.get(key)
    if value is None:
        value = getattr(train, key, None)
        valid = isinstance(value, int | np.integer) and not isinstance(value, bool) and value > 0
        if not valid:
            found = "has none" if value is None else f"has {key}={value!r}"
            raise ConfigError(
                f"dataset.{key}=null is invalid with {target.key}={target.path}: its training "
                f"set {found}; set dataset.{key} (an integer > 0) or give the dataset that attribute"
            )
    return int(value)


def _is_class_id(y: Any) -> bool:
    if isinstance(y, Tensor):
        return (
            y.numel() == 1
            and not y.is_floating_point()
            and not y.is_complex()
            and y.dtype != torch.bool
        )
    return isinstance(y, int | np.integer) and not isinstance(y, bool | np.bool_)


def _sample(target: Target, ds: Any, split: str) -> tuple[Any, Any]:
    """Sample 0 of a split, after checking the split is a non-empty map-style dataset."""
    if isinstance(ds, torch.utils.data.IterableDataset):
        raise _returned(target, split, f"an IterableDataset ({type(ds).__name__})")
    if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
        raise _returned(target, split, f"an object of type {type(ds).__name__}")
    try:
        size = len(ds)
    except Exception as exc:
        raise _returned(target, split, f"a dataset whose len() raised {one_line(exc)}") from None
    if size < 1:
        raise _returned(target, split, "an empty dataset")
    where = f"sample 0 of split={split}"
    try:
        sample = ds[0]
    except Exception as exc:
        raise ConfigError(
            f"{target.key}={target.path} raised {one_line(exc)} reading {where}"
        ) from None
    if not (isinstance(sample, tuple | list) and len(sample) == 2):
        length = f" of length {len(sample)}" if isinstance(sample, tuple | list) else ""
        raise _returned(
            target, split, f"a dataset whose {where} is of type {type(sample).__name__}{length}"
        )
    x, y = sample
    if not isinstance(x, Tensor | np.ndarray):
        raise _returned(
            target,
            split,
            f"a dataset whose {where} has an input of type {type(x).__name__}, not a tensor",
        )
    return x, y


def _check_pair(target: Target, x: Any, y: Any, split: str, task: str, bound: int | None) -> None:
    """Sample 0's target: a class id below ``bound``, or token ids like the input's."""
    where = f"sample 0 of split={split}"
    if task == "classification":
        if not _is_class_id(y):
            raise ConfigError(
                f"{target.key}={target.path} returned a target of type {type(y).__name__} in {where}; "
                "with dataset.task=classification it must be an integer class id "
                "(dataset.task=language_model for token sequences)"
            )
        label = int(y)
        if bound is not None and not 0 <= label < bound:
            raise ConfigError(
                f"{target.key}={target.path} returned class {label} in {where}; it must be in "
                f"[0, {bound - 1}] for dataset.num_classes={bound}"
            )
        return
    ids = [torch.as_tensor(v) for v in (x, y)]
    tokens = all(t.dim() == 1 and not t.is_floating_point() and t.dtype != torch.bool for t in ids)
    if not tokens or ids[0].shape != ids[1].shape:
        raise ConfigError(
            f"{target.key}={target.path} returned input {tuple(ids[0].shape)} and target "
            f"{tuple(ids[1].shape)} in {where}; with dataset.task=language_model both must be "
            "1-d integer token ids of the same length"
        )
    top = max(int(t.max()) for t in ids)
    if bound is not None and top >= bound:
        raise ConfigError(
            f"{target.key}={target.path} returned token id {top} in {where}; it must be below "
            f"dataset.vocab_size={bound}"
        )


def _labels(target: Target, train: Any, *, need: bool) -> Tensor | None:
    """The training labels: the ``targets`` attribute, else (when ``need``) every sample's."""
    n = len(train)
    found = getattr(train, "targets", None)
    if found is not None:
        labels = torch.as_tensor(found).long().reshape(-1)
        if labels.numel() != n:
            raise ConfigError(
                f"{target.key}={target.path}: its training set's targets attribute holds "
                f"{labels.numel()} labels for {n} samples; it must hold one per sample"
            )
        return labels
    if not need:
        return None
    return torch.tensor([int(train[i][1]) for i in range(n)], dtype=torch.long)


def _check_labels(target: Target, labels: Tensor, num_classes: int) -> None:
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        bad = low if low < 0 else high
        raise ConfigError(
            f"{target.key}={target.path}: its training labels hold class {bad}; they must be "
            f"in [0, {num_classes - 1}] for dataset.num_classes={num_classes}"
        )


def build(section: Any, place: Placement) -> TargetData:
    """This rank's :class:`TargetData` of the user's dataset.

    Args:
        section: The ``dataset`` section with a ``_target_``.
        place: This rank's placement.

    Returns:
        The data of this rank.

    Raises:
        ConfigError: As :func:`load_splits`.
        ValueError: A per-rank shard smaller than one batch, or an empty Dirichlet shard.
    """
    d = dataset_section(section)
    splits = load_splits(d, place.seed)
    n = len(splits.train)
    # iid reads only how many samples there are
    labels = splits.labels if splits.labels is not None else torch.zeros(n, dtype=torch.long)
    shard = plan_shard(labels, d, place)
    num_workers = int(d.num_workers)
    train = SeededShardLoader(
        shard, SeededSamples(splits.train), num_workers=num_workers, device=place.device
    )
    lo, hi = eval_range(len(splits.val), place.rank, place.world_size)
    test = SeededEvalLoader(
        SeededSamples(splits.val),
        lo,
        hi,
        batch_size=place.batch_size,
        num_workers=num_workers,
        device=place.device,
    )
    histogram: list[int] = []
    if splits.labels is not None and splits.num_classes is not None:
        counts = torch.bincount(splits.labels[shard.indices], minlength=splits.num_classes)
        histogram = counts.tolist()
    values = model_values(splits.task, splits.input_shape, splits.num_classes, splits.vocab_size)
    return TargetData(
        train=train,
        test=test,
        task=splits.task,
        input_shape=splits.input_shape,
        num_classes=splits.num_classes,
        in_channels=values["in_channels"],
        image_size=values["image_size"],
        vocab_size=splits.vocab_size,
        block_size=values["block_size"],
        class_histogram=histogram,
        train_size=n,
    )
