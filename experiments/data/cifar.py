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
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from experiments.data.augment import TensorAugment
from experiments.data.loaders import Data, InMemory, Placement, build_in_memory
from experiments.data.meta_pickle import PlainUnpickler

__all__ = ["CIFAR", "CifarFormat", "read_cifar", "load_cifar", "build"]


# what a batch may name: numpy's array rebuilders (old and new module paths, protocols 2 to 5)
# and the bytes decoder of protocol 2; nothing that can run a command or import a module
CIFAR_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
})  # fmt: skip


class CifarUnpickler(PlainUnpickler):
    """Unpickles a CIFAR batch, looking up only the numpy names of :data:`CIFAR_GLOBALS`.

    A pickle is a program (see :mod:`experiments.data.meta_pickle`): a batch file that names
    ``os.system`` would run it under plain :func:`pickle.load`. Any other global, a
    persistent id or a copyreg extension code is refused before anything is called.
    """

    def __init__(self, data: bytes) -> None:
        super().__init__(data, encoding="latin1")  # the batches were pickled by Python 2

    def find_class(self, module: str, name: str) -> Any:
        """The numpy array builder ``module.name``, when it is allowed.

        Raises:
            pickle.UnpicklingError: For any other global.
        """
        if (module, name) in CIFAR_GLOBALS:
            return pickle.Unpickler.find_class(self, module, name)
        return super().find_class(module, name)


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
        ValueError: If a batch is malformed.
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
                f"{path}: refused to unpickle {exc}; a CIFAR batch holds only numpy arrays, "
                "lists, strings and numbers"
            ) from None
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: a CIFAR batch is a dict, not {type(entry).__name__}")
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
