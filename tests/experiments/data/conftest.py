"""The digits split computed directly from scikit-learn, for the data tests to compare with."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


@pytest.fixture(scope="session")
def digits_ref() -> dict:
    """The digits split computed here directly from scikit-learn."""
    bunch = load_digits()
    idx = np.arange(len(bunch.target))
    train_idx, test_idx = train_test_split(
        idx, test_size=0.2, stratify=bunch.target, random_state=0
    )
    train_unit = bunch.images[train_idx] / 16.0
    return {
        "target": bunch.target,
        "train_images": torch.tensor(bunch.images[train_idx]),
        "train_labels": torch.tensor(bunch.target[train_idx]),
        "test_images": torch.tensor(bunch.images[test_idx]),
        "test_labels": torch.tensor(bunch.target[test_idx]),
        "mean": float(train_unit.mean()),
        "std": float(train_unit.std()),  # numpy's default is the population std
    }
