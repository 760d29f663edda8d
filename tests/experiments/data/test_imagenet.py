"""Tests of experiments.data.imagenet: image folders, their transforms, resume, workers."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.experiments.data.common import build, same_batches

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def _write_folder(root: Path, split: str, per_class: int, sizes: list[tuple[int, int]]) -> list:
    """PNG files ``root/split/<class>/<k>.png``; returns (path, label) in sorted order."""
    rng = np.random.default_rng(len(split) * 10 + per_class)
    written = []
    for label, cls in enumerate(["apple", "bee", "cat"]):
        (root / split / cls).mkdir(parents=True)
        for k in range(per_class):
            w, h = sizes[k % len(sizes)]
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            path = root / split / cls / f"{k:02d}.png"
            Image.fromarray(pixels).save(path)
            written.append((path, label))
    return written


@pytest.fixture()
def image_root(tmp_path: Path) -> tuple[Path, list, list]:
    train = _write_folder(tmp_path, "train", 4, [(20, 14), (13, 17), (16, 16)])
    val = _write_folder(tmp_path, "val", 2, [(18, 12), (11, 15)])
    return tmp_path, train, val


def _imagenet(root: Path, **cfg: object) -> dict:
    return {"name": "imagenet", "root": str(root), "image_size": 8, "num_workers": 0, **cfg}


def _eval_reference(path: Path) -> torch.Tensor:
    """Resize the short side to round(8 * 8 / 7) = 9, centre-crop 8, ImageNet-normalise."""
    from torchvision.transforms import functional as TF

    img = Image.open(path).convert("RGB")
    img = TF.center_crop(TF.resize(img, 9), [8, 8])
    return (TF.to_tensor(img) - IMAGENET_MEAN) / IMAGENET_STD


def test_image_folder_shapes_eval_and_shards(image_root: tuple) -> None:
    root, train_files, val_files = image_root
    ranks = [build(_imagenet(root), rank=r, world_size=2, batch_size=3) for r in range(2)]
    d0 = ranks[0]
    assert (d0.num_classes, d0.in_channels, d0.image_size, d0.synthetic) == (3, 3, 8, False)
    assert d0.train_size == 12
    assert [len(d.train) for d in ranks] == [(12 // 2) // 3] * 2
    union = torch.cat([d.train.indices for d in ranks])
    assert union.unique().numel() == 12
    for d in ranks:
        assert sum(d.class_histogram) == 6
        for x, y in d.train:
            assert x.shape == (3, 3, 8, 8) and x.dtype == torch.float32
            assert y.shape == (3,) and y.dtype == torch.int64
    # Together the ranks evaluate every validation image once, in folder order.
    xs = torch.cat([x for d in ranks for x, _ in d.test])
    ys = torch.cat([y for d in ranks for _, y in d.test])
    assert [d.test.num_samples for d in ranks] == [3, 3]
    assert ys.tolist() == [label for _, label in val_files]
    expected = torch.stack([_eval_reference(p) for p, _ in val_files])
    torch.testing.assert_close(xs, expected)


def test_image_folder_without_augmentation_uses_eval_transform(image_root: tuple) -> None:
    root, train_files, _ = image_root
    data = build(_imagenet(root, augment=False), batch_size=12)
    [(x, y)] = list(data.train)
    expected = torch.stack([_eval_reference(p) for p, _ in train_files])
    order = data.train.epoch_order(0)
    torch.testing.assert_close(x, expected[order])
    assert y.tolist() == [train_files[i][1] for i in order.tolist()]


def test_image_folder_resume_and_workers_are_deterministic(image_root: tuple) -> None:
    root = image_root[0]
    state = torch.get_rng_state()
    data = build(_imagenet(root), batch_size=2, seed=9)
    full = list(data.train.iterate(1))
    assert len(full) == 6
    resumed = list(build(_imagenet(root), batch_size=2, seed=9).train.iterate(1, start=4))
    assert same_batches(full[4:], resumed)
    with_workers = list(
        build(_imagenet(root, num_workers=2), batch_size=2, seed=9).train.iterate(1)
    )
    assert same_batches(full, with_workers)
    assert not same_batches(full, list(data.train.iterate(2)))
    assert torch.equal(torch.get_rng_state(), state)


def test_image_folder_missing_and_empty_directories(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        build(_imagenet(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere" / "train") in str(err.value)
    assert "root/train/<class>/*.JPEG" in str(err.value)

    _write_folder(tmp_path, "train", 2, [(9, 9)])
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "val"))):
        build(_imagenet(tmp_path))

    (tmp_path / "val").mkdir()
    with pytest.raises(ValueError, match="no images found in " + re.escape(str(tmp_path / "val"))):
        build(_imagenet(tmp_path))
    (tmp_path / "val" / "apple").mkdir()  # a class folder, still no images
    with pytest.raises(ValueError, match="no images found in " + re.escape(str(tmp_path / "val"))):
        build(_imagenet(tmp_path))


def test_image_folder_class_mismatch(tmp_path: Path) -> None:
    _write_folder(tmp_path, "train", 2, [(9, 9)])
    (tmp_path / "val" / "zebra").mkdir(parents=True)
    Image.new("RGB", (9, 9)).save(tmp_path / "val" / "zebra" / "0.png")
    with pytest.raises(ValueError, match="class folders"):
        build(_imagenet(tmp_path), batch_size=2)
