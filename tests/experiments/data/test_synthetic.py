"""Tests of experiments.data.synthetic: the flag, the shapes and the seeding."""

from __future__ import annotations

import torch

from tests.experiments.data.common import build, same_batches


def test_synthetic_flag_shapes_and_seeding() -> None:
    cfg = {
        "name": "synthetic",
        "num_samples": 50,
        "image_size": 6,
        "num_classes": 3,
        "in_channels": 2,
    }
    data = build(cfg, world_size=2, batch_size=5, seed=1)
    assert data.synthetic is True
    assert (data.num_classes, data.in_channels, data.image_size, data.train_size) == (3, 2, 6, 50)
    assert len(data.train) == 5 and data.test.num_samples == 5  # half of 50 // 5
    x, y = next(iter(data.train))
    assert x.shape == (5, 2, 6, 6) and int(y.max()) < 3
    again = build(cfg, world_size=2, batch_size=5, seed=1)
    assert same_batches(list(data.train), list(again.train))
    other = build(cfg, world_size=2, batch_size=5, seed=2)
    assert not torch.equal(next(iter(other.train))[0], x)


def test_num_test_samples_sizes_the_test_set_and_defaults_to_a_fifth() -> None:
    cfg = {"name": "synthetic", "num_samples": 20, "image_size": 4}
    assert build({**cfg, "num_test_samples": 3}, batch_size=4).test.num_samples == 3
    assert build(cfg, batch_size=4).test.num_samples == 4
    assert build({**cfg, "num_samples": 4}, batch_size=4).test.num_samples == 1
