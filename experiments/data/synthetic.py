"""``dataset=synthetic``: uniform random images and labels, for throughput runs only.

``Data.synthetic`` is true, so that reports can label the numbers; the images are never
augmented. They are drawn from their own seeded stream, so every rank holds the same set.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from experiments.data.loaders import Data, InMemory, Placement, build_in_memory
from experiments.data.partition import TAG_SYNTHETIC, generator

__all__ = ["load_synthetic", "build"]


def load_synthetic(section: DictConfig, seed: int) -> InMemory:
    """Random uint8 images and labels of the sizes the section gives.

    Args:
        section: The checked ``dataset`` section (``num_samples``, ``num_test_samples``,
            ``image_size``, ``num_classes``, ``in_channels``).
        seed: Run seed.

    Returns:
        The dataset in tensors.
    """
    n = int(section.num_samples)
    n_test = max(n // 5, 1) if section.num_test_samples is None else int(section.num_test_samples)
    size, classes = int(section.image_size), int(section.num_classes)
    gen = generator(TAG_SYNTHETIC, seed)
    images = torch.randint(
        0, 256, (n + n_test, int(section.in_channels), size, size), dtype=torch.uint8, generator=gen
    )
    labels = torch.randint(0, classes, (n + n_test,), generator=gen)
    return InMemory(images[:n], labels[:n], images[n:], labels[n:], classes, augment=None)


def build(section: DictConfig, place: Placement) -> Data:
    """This rank's synthetic data."""
    mem = load_synthetic(section, place.seed)
    return build_in_memory(mem, section, place, synthetic=True)
