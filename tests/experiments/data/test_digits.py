"""Tests of experiments.data.digits: the fixed split, its normalisation and the one-pixel shift."""

from __future__ import annotations

import numpy as np
import torch

from tests.experiments.data.common import build, digits, multiset


def _digits_to_counts(x: torch.Tensor, ref: dict) -> torch.Tensor:
    """Undo the normalisation and the 1/16 scaling: back to the integer pixel values."""
    counts = (x.double() * ref["std"] + ref["mean"]) * 16.0
    assert torch.allclose(counts, counts.round(), atol=1e-3)
    return counts.round().squeeze(1)


def test_digits_split_sizes_content_and_normalisation(digits_ref: dict) -> None:
    data = build(digits(), batch_size=1437, seed=3)
    assert data.train_size == 1437
    assert data.test.num_samples == 360
    assert (data.num_classes, data.in_channels, data.image_size) == (10, 1, 8)
    assert data.synthetic is False
    assert len(data.train) == 1
    [(x, y)] = list(data.train)
    assert x.shape == (1437, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    # Normalised with the training set's own statistics.
    assert abs(x.mean().item()) < 1e-5
    assert abs(x.std(unbiased=False).item() - 1.0) < 1e-4
    assert multiset(_digits_to_counts(x, digits_ref), y) == multiset(
        digits_ref["train_images"], digits_ref["train_labels"]
    )
    assert data.class_histogram == torch.bincount(digits_ref["train_labels"]).tolist()

    test = list(data.test)
    tx = torch.cat([b[0] for b in test])
    ty = torch.cat([b[1] for b in test])
    assert torch.equal(_digits_to_counts(tx, digits_ref), digits_ref["test_images"])
    assert torch.equal(ty, digits_ref["test_labels"])
    # Stratified: every class holds its 20 % share of the test set, to within one image.
    per_class_all = np.bincount(digits_ref["target"])
    per_class_test = torch.bincount(ty, minlength=10).numpy()
    assert np.all(np.abs(per_class_test - 0.2 * per_class_all) <= 1)


def test_digits_split_does_not_depend_on_seed() -> None:
    a = torch.cat([y for _, y in build(digits(), seed=0).test])
    b = torch.cat([y for _, y in build(digits(), seed=123).test])
    assert torch.equal(a, b)


def _shift(img: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``img`` moved down ``dy`` and right ``dx`` pixels, with zeros shifted in."""
    out = torch.zeros_like(img)
    h, w = img.shape[-2:]
    out[..., max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = img[
        ..., max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


def test_digits_augmentation_is_a_one_pixel_shift(digits_ref: dict) -> None:
    plain = list(build(digits(augment=False), seed=2).train.iterate(1))
    aug = list(build(digits(augment=True), seed=2).train.iterate(1))
    shifts_seen = set()
    for (xp, yp), (xa, ya) in list(zip(plain, aug))[:3]:
        assert torch.equal(yp, ya)  # augmentation leaves the order alone
        src, out = _digits_to_counts(xp, digits_ref), _digits_to_counts(xa, digits_ref)
        for s, o in zip(src, out):
            matches = [
                (dy, dx)
                for dy in (-1, 0, 1)
                for dx in (-1, 0, 1)
                if torch.equal(_shift(s, dy, dx), o)
            ]
            assert matches, "augmented digit is not a one-pixel shift of its source"
            shifts_seen.add(matches[0])
    assert len(shifts_seen) >= 5
