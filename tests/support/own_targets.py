"""Classes and functions that configs name by ``_target_`` in the tests.

:class:`Digits` is the built-in ``dataset=digits`` as a map-style dataset, normalised as its
loader normalises it, so a run on it can be compared with a run on the built-in, sample for
sample. The rest are datasets and models that go wrong in one way each.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from experiments.data.augment import Normalize, channel_stats, to_unit
from experiments.data.digits import load_digits

CPU = torch.device("cpu")


class Digits(torch.utils.data.Dataset):
    """scikit-learn's digits split as ``dataset=digits`` splits and normalises it.

    Args:
        split: ``"train"`` or ``"val"``.
        labelled: Whether the set has a ``targets`` attribute (without it the framework
            reads each sample's label).
        jitter: Noise added at each read of a training sample, from torch's global generator.
    """

    num_classes = 10

    def __init__(self, split: str, labelled: bool = True, jitter: float = 0.0) -> None:
        mem = load_digits(augment=False)
        mean, std = channel_stats(mem.train_images)
        images = mem.train_images if split == "train" else mem.test_images
        labels = mem.train_labels if split == "train" else mem.test_labels
        self.images = Normalize(mean, std, CPU)(to_unit(images))
        self.labels = labels
        self.jitter = jitter if split == "train" else 0.0
        if labelled:
            self.targets = labels

    def __len__(self) -> int:
        return int(self.labels.numel())

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image = self.images[index]
        if self.jitter:
            image = image + self.jitter * torch.randn_like(image)
        return image, int(self.labels[index])


class Tokens(torch.utils.data.Dataset):
    """Windows of a repeating sequence of ids: ``x`` a window, ``y`` the same shifted by one."""

    vocab_size = 16

    def __init__(self, split: str, block: int = 8, samples: int = 64) -> None:
        stream = torch.arange(samples + block + 1) % self.vocab_size
        self.x = torch.stack([stream[i : i + block] for i in range(samples)])
        self.y = torch.stack([stream[i + 1 : i + block + 1] for i in range(samples)])

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.x[index], self.y[index]


class TokenModel(nn.Module):
    """Embeddings to logits: a language model called as ``model(x)``."""

    def __init__(self, vocab_size: int, block_size: int, width: int = 8) -> None:
        super().__init__()
        self.block_size = block_size
        self.embed = nn.Embedding(vocab_size, width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.embed(x))


class Unpaired(torch.utils.data.Dataset):
    """Items that are bare tensors, not ``(input, target)`` pairs."""

    def __init__(self, split: str) -> None:
        self.split = split

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Tensor:
        return torch.zeros(4)


class Stream(torch.utils.data.IterableDataset):
    """An iterable dataset, which cannot be sharded by index."""

    def __init__(self, split: str) -> None:
        self.split = split

    def __iter__(self) -> Any:
        return iter([(torch.zeros(4), 0)])


class FloatTargets(Unpaired):
    """Pairs whose targets are floats: no class ids."""

    def __getitem__(self, index: int) -> Any:
        return torch.zeros(4), 0.5


class NoSplit(torch.utils.data.Dataset):
    """A dataset whose constructor takes no ``split``."""

    def __init__(self, size: int = 4) -> None:
        self.size = size


def a_list(split: str) -> list[int]:
    """A function returning a list of numbers, not of pairs."""
    return [1, 2, 3]


def broken(split: str) -> Any:
    """A dataset function that raises."""
    raise RuntimeError(f"cannot read the {split} files")


class NotAModule:
    """A model target that returns no ``nn.Module``."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes


class NeedsRealTensors(nn.Module):
    """A model whose constructor reads a value, which the ``meta`` device cannot give."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int) -> None:
        super().__init__()
        self.scale = float(torch.ones(()).sum().item())
        self.head = nn.Linear(in_channels * image_size * image_size, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(x.flatten(1)) * self.scale


def constant_schedule(optimizer: torch.optim.Optimizer, factor: float = 1.0) -> Any:
    """A scheduler function of the optimizer: the rate times ``factor`` throughout."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor)


class Drawn(torch.utils.data.Dataset):
    """A set drawn from torch's global generator when it is built."""

    num_classes = 3

    def __init__(self, split: str, samples: int = 32) -> None:
        self.x = torch.randn(samples, 4)
        self.targets = torch.randint(0, self.num_classes, (samples,))

    def __len__(self) -> int:
        return int(self.targets.numel())

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.x[index], int(self.targets[index])
