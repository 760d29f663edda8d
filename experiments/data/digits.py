"""``dataset=digits``: scikit-learn's 1,797 real 8x8 handwritten digits, no download.

A fixed stratified split (``random_state=0``, 20 % test) gives 1,437 training and 360 test
images whatever the run's seed. With ``augment`` the training digits are shifted by up to
one pixel, with zero fill.
"""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from experiments.data.augment import TensorAugment
from experiments.data.loaders import Data, InMemory, Placement, build_in_memory

__all__ = ["NUM_CLASSES", "IMAGE_SHAPE", "load_digits", "build"]

NUM_CLASSES = 10
IMAGE_SHAPE = (1, 8)
"""``(channels, side)`` of the images."""


def load_digits(augment: bool) -> InMemory:
    """The digits split, as ``[0, 1]`` float images of shape ``(N, 1, 8, 8)``.

    Args:
        augment: Whether the training batches get the one-pixel shift.

    Returns:
        The dataset in tensors.
    """
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).div_(16.0).unsqueeze(1)
    labels = torch.tensor(bunch.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=0.2, stratify=bunch.target, random_state=0
    )
    train_idx, test_idx = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    return InMemory(
        images[train_idx],
        labels[train_idx],
        images[test_idx],
        labels[test_idx],
        num_classes=NUM_CLASSES,
        augment=TensorAugment(pad=1, flip=False) if augment else None,
    )


def build(section: DictConfig, place: Placement) -> Data:
    """This rank's digits (keys ``partition``, ``alpha``, ``augment``)."""
    return build_in_memory(load_digits(bool(section.augment)), section, place)
