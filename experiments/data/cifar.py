"""``dataset=cifar10`` / ``cifar100``: the Python pickle batches under ``root``.

The batches live in ``root/cifar-10-batches-py`` or ``root/cifar-100-python``; with
``download`` true, torchvision fetches and checksums them first (one process per node,
while the others wait). With ``augment`` (the default) the training images get a random
32x32 crop of the 4-pixel zero-padded image and a horizontal flip.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from experiments.data.augment import TensorAugment
from experiments.data.loaders import Data, InMemory, Placement, build_in_memory
from experiments.data.safe_pickle import ArrayUnpickler

__all__ = ["CIFAR", "CifarFormat", "read_cifar", "load_cifar", "build"]


class CifarUnpickler(ArrayUnpickler):
    """Unpickles a CIFAR batch: plain data and numpy arrays of plain dtypes, nothing else.

    A pickle is a program (see :mod:`experiments.data.meta_pickle`): a batch file that names
    ``os.system`` would run it under plain :func:`pickle.load`, and one that gives numpy's
    ``dtype`` a hostile state makes numpy write out of bounds. Any global but numpy's array
    builders, which get inert stand-ins (see :mod:`experiments.data.safe_pickle`), is
    refused before anything is called; the arrays are built and checked after the load.
    """

    def __init__(self, data: bytes) -> None:
        super().__init__(data, encoding="latin1")  # the batches were pickled by Python 2


@dataclass(frozen=True)
class CifarFormat:
    """Where a CIFAR variant keeps its batches, and how it names its labels."""

    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    label_key: str
    num_classes: int


CIFAR = {
    "cifar10": CifarFormat(
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        "labels",
        10,
    ),
    "cifar100": CifarFormat("cifar-100-python", ("train",), ("test",), "fine_labels", 100),
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


def read_cifar(
    folder: Path, files: Sequence[str], fmt: CifarFormat, hint: str
) -> tuple[Tensor, Tensor]:
    """Read CIFAR pickle batches: dicts with ``data`` uint8 ``(N, 3072)`` (R, G, B planes of
    32x32, row-major) and a list of labels under ``labels`` or ``fine_labels``.

    Args:
        folder: The variant's folder.
        files: The batch files to read, in order.
        fmt: The variant's format.
        hint: How to provide missing files, for the message.

    Returns:
        uint8 images ``(N, 3, 32, 32)`` and int64 labels ``(N,)``.

    Raises:
        FileNotFoundError: If a batch file is missing.
        ValueError: One line naming the file, if a batch is malformed or refused (a global
            other than numpy's array builders, or an array that is not plain); nothing
            from a refused file runs.
    """
    images, labels = [], []
    for name in files:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"CIFAR file {path} is missing; {hint}")
        try:
            entry = CifarUnpickler(path.read_bytes()).load()
        except pickle.UnpicklingError as exc:
            raise ValueError(
                f"{path}: refused to unpickle {exc}; a CIFAR batch holds only numpy arrays "
                "of plain dtypes, lists, strings and numbers"
            ) from None
        except Exception as exc:  # a damaged file fails in many ways; each is one line here
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ValueError(f"{path}: not a readable CIFAR batch: {reason}") from None
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: a CIFAR batch is a dict, not {type(entry).__name__}")
        missing = [key for key in ("data", fmt.label_key) if key not in entry]
        if missing:
            raise ValueError(
                f"{path}: a CIFAR batch holds 'data' and {fmt.label_key!r}, not {missing}"
            )
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


def load_cifar(name: str, root: Path, download: bool, augment: bool) -> InMemory:
    """The training and test batches of ``name`` under ``root``, downloaded first if asked.

    Args:
        name: ``cifar10`` or ``cifar100``.
        root: The folder that holds (or will hold) the variant's folder.
        download: Let torchvision fetch and check the archive.
        augment: Whether the training batches get the padded crop and flip.

    Returns:
        The dataset in tensors.

    Raises:
        FileNotFoundError: If the folder or a batch file is missing (the message names the
            path and how to provide it).
    """
    fmt = CIFAR[name]
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
    train_x, train_y = read_cifar(folder, fmt.train_files, fmt, hint)
    test_x, test_y = read_cifar(folder, fmt.test_files, fmt, hint)
    return InMemory(
        train_x,
        train_y,
        test_x,
        test_y,
        num_classes=fmt.num_classes,
        augment=TensorAugment(pad=4, flip=True) if augment else None,
    )


def build(section: DictConfig, place: Placement) -> Data:
    """This rank's CIFAR-10 or CIFAR-100 (keys ``root``, ``download``, ``augment``, ...)."""
    root = Path(str(section.root)).expanduser()
    mem = load_cifar(str(section.name), root, bool(section.download), bool(section.augment))
    return build_in_memory(mem, section, place)
