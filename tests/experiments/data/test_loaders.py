"""Tests of experiments.data.loaders: splits, shards, deterministic resumable orders, file formats."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from experiments.data.loaders import DATASETS, build_data

CPU = torch.device("cpu")
IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def _digits(**cfg: object) -> dict:
    return {"name": "digits", **cfg}


def _build(cfg: dict, rank: int = 0, world_size: int = 1, batch_size: int = 32, seed: int = 0):
    return build_data(
        cfg, rank=rank, world_size=world_size, batch_size=batch_size, seed=seed, device=CPU
    )


def _same_batches(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b)
    )


def _multiset(images: torch.Tensor, labels: torch.Tensor) -> list[tuple[int, bytes]]:
    """Order-free view of (integer image, label) pairs, duplicates kept."""
    flat = images.reshape(images.shape[0], -1).to(torch.int16).numpy()
    return sorted((int(y), row.tobytes()) for row, y in zip(flat, labels.tolist()))


@pytest.fixture(scope="module")
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


def _digits_to_counts(x: torch.Tensor, ref: dict) -> torch.Tensor:
    """Undo the normalisation and the 1/16 scaling: back to the integer pixel values."""
    counts = (x.double() * ref["std"] + ref["mean"]) * 16.0
    assert torch.allclose(counts, counts.round(), atol=1e-3)
    return counts.round().squeeze(1)


# --------------------------------------------------------------------------- digits


def test_digits_split_sizes_content_and_normalisation(digits_ref: dict) -> None:
    data = _build(_digits(), batch_size=1437, seed=3)
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
    assert _multiset(_digits_to_counts(x, digits_ref), y) == _multiset(
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
    a = torch.cat([y for _, y in _build(_digits(), seed=0).test])
    b = torch.cat([y for _, y in _build(_digits(), seed=123).test])
    assert torch.equal(a, b)


def test_iid_shards_equal_length_disjoint_and_covering() -> None:
    world, bs = 4, 32
    ranks = [_build(_digits(), rank=r, world_size=world, batch_size=bs, seed=7) for r in range(4)]
    expected_len = (1437 // world) // bs
    assert [len(d.train) for d in ranks] == [expected_len] * world
    shards = [d.train.indices for d in ranks]
    assert all(s.numel() == 1437 // world for s in shards)
    union = torch.cat(shards)
    assert union.unique().numel() == union.numel() == world * (1437 // world)
    assert union.min() >= 0 and union.max() < 1437
    for d in ranks:
        assert sum(d.class_histogram) == 1437 // world
        batches = list(d.train)
        assert len(batches) == expected_len
        assert all(x.shape == (bs, 1, 8, 8) and y.shape == (bs,) for x, y in batches)
        labels = torch.cat([y for _, y in batches])
        # One epoch draws distinct samples of the shard, so no class exceeds its shard count.
        assert torch.all(torch.bincount(labels, minlength=10) <= torch.tensor(d.class_histogram))
        order = d.train.epoch_order(0)
        assert order.unique().numel() == order.numel() == expected_len * bs
        assert torch.isin(order, d.train.indices).all()


@pytest.mark.parametrize("augment", [False, True])
def test_resume_from_batch_matches_uninterrupted_run(augment: bool) -> None:
    cfg = _digits(augment=augment)
    state = torch.get_rng_state()
    full = list(_build(cfg, rank=1, world_size=2, seed=5).train.iterate(3))
    # A resumed run builds its loaders afresh.
    resumed = list(_build(cfg, rank=1, world_size=2, seed=5).train.iterate(3, start=7))
    assert len(full) == (1437 // 2) // 32
    assert _same_batches(full[7:], resumed)
    # The data pipeline never draws from the global RNG.
    assert torch.equal(torch.get_rng_state(), state)


def test_iteration_changes_with_epoch_and_seed_and_iter_is_epoch_zero() -> None:
    data = _build(_digits(), world_size=2)
    e0, e1 = list(data.train.iterate(0)), list(data.train.iterate(1))
    assert _same_batches(list(data.train), e0)
    assert not torch.equal(data.train.epoch_order(0), data.train.epoch_order(1))
    # Both epochs draw from the same shard.
    assert torch.isin(data.train.epoch_order(1), data.train.epoch_order(0)).float().mean() > 0.9
    assert torch.isin(data.train.epoch_order(1), data.train.indices).all()
    assert not torch.equal(e0[0][0], e1[0][0])
    other = _build(_digits(), world_size=2, seed=1)
    assert not torch.equal(data.train.indices, other.train.indices)
    assert list(data.train.iterate(0, start=len(data.train))) == []


def _shift(img: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``img`` moved down ``dy`` and right ``dx`` pixels, with zeros shifted in."""
    out = torch.zeros_like(img)
    h, w = img.shape[-2:]
    out[..., max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = img[
        ..., max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


def test_digits_augmentation_is_a_one_pixel_shift(digits_ref: dict) -> None:
    plain = list(_build(_digits(augment=False), seed=2).train.iterate(1))
    aug = list(_build(_digits(augment=True), seed=2).train.iterate(1))
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


# --------------------------------------------------------------------------- dirichlet


def _dirichlet_ranks(alpha: float, world: int = 4, bs: int = 16, seed: int = 0) -> list:
    cfg = _digits(partition="dirichlet", alpha=alpha)
    return [_build(cfg, rank=r, world_size=world, batch_size=bs, seed=seed) for r in range(world)]


def _skew(ranks: list) -> float:
    """Mean over ranks of the largest class share of the rank's shard."""
    return float(np.mean([max(d.class_histogram) / sum(d.class_histogram) for d in ranks]))


@pytest.mark.filterwarnings("ignore:rank .* holds")
def test_dirichlet_shards_sizes_lengths_and_histograms(digits_ref: dict) -> None:
    world, bs = 4, 16
    ranks = _dirichlet_ranks(0.1, world, bs)
    shards = [d.train.indices for d in ranks]
    union = torch.cat(shards)
    # Every training sample lands on exactly one rank.
    assert union.numel() == 1437 and union.unique().numel() == 1437
    assert sum(sum(d.class_histogram) for d in ranks) == 1437
    assert [sum(d.class_histogram) for d in ranks] == [s.numel() for s in shards]
    assert np.array_equal(
        np.sum([d.class_histogram for d in ranks], axis=0),
        np.bincount(digits_ref["train_labels"].numpy()),
    )
    assert len({tuple(d.class_histogram) for d in ranks}) == world
    assert len({s.numel() for s in shards}) > 1

    expected_len = (1437 // world) // bs
    need = expected_len * bs
    for d in ranks:
        assert len(d.train) == expected_len
        batches = list(d.train.iterate(2))
        assert len(batches) == expected_len
        assert all(x.shape[0] == bs and y.shape[0] == bs for x, y in batches)
        present = {c for c, n in enumerate(d.class_histogram) if n > 0}
        assert set(torch.cat([y for _, y in batches]).tolist()) <= present
        order = d.train.epoch_order(2)
        assert order.numel() == need and torch.isin(order, d.train.indices).all()
        counts = torch.bincount(order, minlength=1437)[d.train.indices]
        if d.train.shard_size >= need:
            assert counts.max() <= 1
        else:  # cycles through reshuffled copies: every sample floor or ceil times
            lo = need // d.train.shard_size
            assert counts.min() >= lo and counts.max() <= lo + 1


def test_dirichlet_smaller_alpha_is_more_skewed() -> None:
    skewed, even = _dirichlet_ranks(0.05), _dirichlet_ranks(1000.0)
    assert _skew(skewed) > 0.3  # a uniform mix of 10 classes gives about 0.1
    assert _skew(skewed) > _skew(even) + 0.2
    total = np.sum([d.class_histogram for d in even], axis=0)
    for d in even:
        share = np.array(d.class_histogram) / sum(d.class_histogram)
        assert np.abs(share - total / total.sum()).max() < 0.05


def test_dirichlet_partition_is_identical_on_every_rank_and_seeded() -> None:
    a = _dirichlet_ranks(0.5, seed=4)
    b = _dirichlet_ranks(0.5, seed=4)
    c = _dirichlet_ranks(0.5, seed=5)
    assert all(torch.equal(x.train.indices, y.train.indices) for x, y in zip(a, b))
    assert any(not torch.equal(x.train.indices, y.train.indices) for x, y in zip(a, c))


def test_dirichlet_empty_shard_suggests_larger_alpha() -> None:
    # 10 classes with alpha=1e-3 reach only a handful of the 64 ranks.
    cfg = _digits(partition="dirichlet", alpha=1e-3)
    with pytest.raises(ValueError, match="larger dataset.alpha"):
        _build(cfg, rank=0, world_size=64, batch_size=8)


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("world", [3, 4, 7])
def test_eval_shards_cover_test_set_once(world: int) -> None:
    full = list(_build(_digits(), batch_size=32).test)
    fx, fy = torch.cat([b[0] for b in full]), torch.cat([b[1] for b in full])
    xs, ys, sizes = [], [], []
    for r in range(world):
        test = _build(_digits(), rank=r, world_size=world, batch_size=32).test
        batches = list(test)
        assert len(batches) == len(test)
        assert batches[0][0].shape[0] == min(256, test.num_samples)
        xs += [b[0] for b in batches]
        ys += [b[1] for b in batches]
        sizes.append(test.num_samples)
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 360
    assert torch.equal(torch.cat(xs), fx) and torch.equal(torch.cat(ys), fy)


def test_eval_batch_size_is_at_least_256_else_batch_size() -> None:
    assert _build(_digits(), batch_size=32).test.batch_size == 256
    assert _build(_digits(), batch_size=300).test.batch_size == 300


# --------------------------------------------------------------------------- CIFAR


def _pickle(path: Path, obj: dict) -> None:
    with path.open("wb") as fh:
        pickle.dump(obj, fh, protocol=2)


def _write_cifar10(root: Path, per_batch: int = 6, n_test: int = 7) -> dict:
    """The on-disk CIFAR-10 python layout, with random images; returns the arrays written."""
    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    out: dict = {"train_x": [], "train_y": []}
    for i in range(1, 6):
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        names = [f"img_{i}_{k}.png" for k in range(per_batch)]
        batch = {"batch_label": f"training batch {i} of 5", "labels": labels, "data": data}
        _pickle(folder / f"data_batch_{i}", {**batch, "filenames": names})
        out["train_x"].append(data)
        out["train_y"] += labels
    data = rng.integers(0, 256, (n_test, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, n_test).tolist()
    _pickle(
        folder / "test_batch",
        {"batch_label": "testing batch 1 of 1", "labels": labels, "data": data},
    )
    names = ["airplane", "automobile", "bird", "cat", "deer"]
    names += ["dog", "frog", "horse", "ship", "truck"]
    _pickle(
        folder / "batches.meta",
        {"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072},
    )
    out["train_x"] = np.concatenate(out["train_x"])
    out.update(test_x=data, test_y=labels)
    return out


def _write_cifar100(root: Path, n_train: int = 24, n_test: int = 5) -> dict:
    rng = np.random.default_rng(1)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        fine = rng.integers(0, 100, n).tolist()
        fine[0] = 99  # make sure the top label is exercised
        entry = {"filenames": [f"{split}_{k}.png" for k in range(n)], "batch_label": split}
        entry.update(fine_labels=fine, coarse_labels=[f // 5 for f in fine], data=data)
        _pickle(folder / split, entry)
        out[f"{split}_x"], out[f"{split}_y"] = data, fine
    meta = {"fine_label_names": [f"f{k}" for k in range(100)]}
    _pickle(folder / "meta", {**meta, "coarse_label_names": [f"c{k}" for k in range(20)]})
    return out


def _cifar_stats(train_x: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    unit = train_x.reshape(-1, 3, 32, 32) / 255.0
    mean = unit.mean(axis=(0, 2, 3))
    std = unit.std(axis=(0, 2, 3))
    return torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)


def _cifar_to_bytes(x: torch.Tensor, stats: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    pixels = (x.double() * stats[1] + stats[0]) * 255.0
    assert torch.allclose(pixels, pixels.round(), atol=1e-3)
    return pixels.round()


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_reads_the_python_batches(tmp_path: Path, name: str) -> None:
    ref = _write_cifar10(tmp_path) if name == "cifar10" else _write_cifar100(tmp_path)
    n_train = len(ref["train_y"])
    cfg = {"name": name, "root": str(tmp_path), "download": False, "augment": False}
    data = _build(cfg, batch_size=n_train)
    assert data.train_size == n_train
    assert data.num_classes == (10 if name == "cifar10" else 100)
    assert (data.in_channels, data.image_size, data.synthetic) == (3, 32, False)
    stats = _cifar_stats(ref["train_x"])
    [(x, y)] = list(data.train)
    assert x.shape == (n_train, 3, 32, 32)
    expected = torch.tensor(ref["train_x"].reshape(-1, 3, 32, 32))
    assert _multiset(_cifar_to_bytes(x, stats), y) == _multiset(
        expected, torch.tensor(ref["train_y"])
    )
    [(tx, ty)] = list(data.test)
    assert torch.equal(
        _cifar_to_bytes(tx, stats), torch.tensor(ref["test_x"].reshape(-1, 3, 32, 32)).double()
    )
    assert ty.tolist() == ref["test_y"]


def test_cifar_augmentation_is_padded_crop_and_flip(tmp_path: Path) -> None:
    ref = _write_cifar10(tmp_path)
    stats = _cifar_stats(ref["train_x"])
    cfg = {"name": "cifar10", "root": str(tmp_path)}
    plain = list(_build({**cfg, "augment": False}, batch_size=10).train.iterate(1))
    aug = list(_build(cfg, batch_size=10).train.iterate(1))  # augment defaults to true
    flips, offsets = set(), set()
    for (xp, yp), (xa, ya) in zip(plain, aug):
        assert torch.equal(yp, ya)
        padded = np.pad(_cifar_to_bytes(xp, stats).numpy(), ((0, 0), (0, 0), (4, 4), (4, 4)))
        out = _cifar_to_bytes(xa, stats).numpy()
        for src, o in zip(padded, out):
            found = [
                (dy, dx, flip)
                for dy in range(9)
                for dx in range(9)
                for flip in (False, True)
                if np.array_equal(
                    src[:, dy : dy + 32, dx : dx + 32][:, :, ::-1]
                    if flip
                    else src[:, dy : dy + 32, dx : dx + 32],
                    o,
                )
            ]
            assert found, "augmented image is not a crop (and flip) of the padded source"
            flips.add(found[0][2])
            offsets.add(found[0][:2])
    assert flips == {False, True} and len(offsets) > 5
    # The full 4-pixel range is used, not a narrower one.
    assert any(0 in o or 8 in o for o in offsets)


@pytest.mark.parametrize(
    "name,folder", [("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python")]
)
def test_cifar_missing_data_names_path_and_remedy(tmp_path: Path, name: str, folder: str) -> None:
    for root in (tmp_path / "absent", tmp_path):  # a missing and an empty root
        with pytest.raises(FileNotFoundError) as err:
            _build({"name": name, "root": str(root), "download": False})
        message = str(err.value)
        assert str(root) in message and "dataset.download=true" in message and folder in message
        assert "\n" not in message


def test_cifar_missing_batch_file_is_named(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        _build({"name": "cifar10", "root": str(tmp_path)})


# --------------------------------------------------------------------------- image folders


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
    ranks = [_build(_imagenet(root), rank=r, world_size=2, batch_size=3) for r in range(2)]
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
    data = _build(_imagenet(root, augment=False), batch_size=12)
    [(x, y)] = list(data.train)
    expected = torch.stack([_eval_reference(p) for p, _ in train_files])
    order = data.train.epoch_order(0)
    torch.testing.assert_close(x, expected[order])
    assert y.tolist() == [train_files[i][1] for i in order.tolist()]


def test_image_folder_resume_and_workers_are_deterministic(image_root: tuple) -> None:
    root = image_root[0]
    state = torch.get_rng_state()
    data = _build(_imagenet(root), batch_size=2, seed=9)
    full = list(data.train.iterate(1))
    assert len(full) == 6
    resumed = list(_build(_imagenet(root), batch_size=2, seed=9).train.iterate(1, start=4))
    assert _same_batches(full[4:], resumed)
    with_workers = list(
        _build(_imagenet(root, num_workers=2), batch_size=2, seed=9).train.iterate(1)
    )
    assert _same_batches(full, with_workers)
    assert not _same_batches(full, list(data.train.iterate(2)))
    assert torch.equal(torch.get_rng_state(), state)


def test_image_folder_missing_and_empty_directories(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        _build(_imagenet(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere" / "train") in str(err.value)
    assert "root/train/<class>/*.JPEG" in str(err.value)

    _write_folder(tmp_path, "train", 2, [(9, 9)])
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "val"))):
        _build(_imagenet(tmp_path))

    (tmp_path / "val").mkdir()
    with pytest.raises(ValueError, match="no images found in " + re.escape(str(tmp_path / "val"))):
        _build(_imagenet(tmp_path))
    (tmp_path / "val" / "apple").mkdir()  # a class folder, still no images
    with pytest.raises(ValueError, match="no images found in " + re.escape(str(tmp_path / "val"))):
        _build(_imagenet(tmp_path))


def test_image_folder_class_mismatch(tmp_path: Path) -> None:
    _write_folder(tmp_path, "train", 2, [(9, 9)])
    (tmp_path / "val" / "zebra").mkdir(parents=True)
    Image.new("RGB", (9, 9)).save(tmp_path / "val" / "zebra" / "0.png")
    with pytest.raises(ValueError, match="class folders"):
        _build(_imagenet(tmp_path), batch_size=2)


# --------------------------------------------------------------------------- synthetic


def test_synthetic_flag_shapes_and_seeding() -> None:
    cfg = {
        "name": "synthetic",
        "num_samples": 50,
        "image_size": 6,
        "num_classes": 3,
        "in_channels": 2,
    }
    data = _build(cfg, world_size=2, batch_size=5, seed=1)
    assert data.synthetic is True
    assert (data.num_classes, data.in_channels, data.image_size, data.train_size) == (3, 2, 6, 50)
    assert len(data.train) == 5 and data.test.num_samples == 5  # half of 50 // 5
    x, y = next(iter(data.train))
    assert x.shape == (5, 2, 6, 6) and int(y.max()) < 3
    again = _build(cfg, world_size=2, batch_size=5, seed=1)
    assert _same_batches(list(data.train), list(again.train))
    other = _build(cfg, world_size=2, batch_size=5, seed=2)
    assert not torch.equal(next(iter(other.train))[0], x)


# --------------------------------------------------------------------------- config and errors


def test_dictconfig_is_accepted() -> None:
    data = _build(
        OmegaConf.create({"name": "digits", "partition": "iid", "alpha": 0.5, "augment": False})
    )
    assert data.train_size == 1437


def test_bad_arguments_raise_one_line_value_errors() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'mnist'") as err:
        _build({"name": "mnist"})
    assert all(name in str(err.value) for name in DATASETS)
    for bad in (0, -4):
        with pytest.raises(ValueError, match=f"batch_size must be a positive integer, got {bad}"):
            _build(_digits(), batch_size=bad)
    with pytest.raises(ValueError, match="batch_size=400 .* shard of 359 samples"):
        _build(_digits(), world_size=4, batch_size=400)
    with pytest.raises(ValueError, match="dataset.partition must be one of iid, dirichlet"):
        _build(_digits(partition="shards"))
    with pytest.raises(ValueError, match="dataset.alpha must be a positive number"):
        _build(_digits(partition="dirichlet", alpha=0))
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 1\], got 2"):
        _build(_digits(), rank=2, world_size=2)
    train = _build(_digits()).train
    with pytest.raises(ValueError, match=r"start must be an integer in \[0, 44\], got 45"):
        train.iterate(0, start=45)
    with pytest.raises(ValueError, match="epoch must be a non-negative integer"):
        train.iterate(-1)


@pytest.mark.gpu
def test_cuda_batches_match_cpu_batches() -> None:
    cfg = _digits(augment=True)
    cuda = build_data(cfg, rank=0, world_size=2, batch_size=32, seed=0, device=torch.device("cuda"))
    cpu = _build(cfg, rank=0, world_size=2, seed=0)
    for (xg, yg), (xc, yc) in zip(cuda.train.iterate(1, start=3), cpu.train.iterate(1, start=3)):
        assert xg.is_cuda and yg.is_cuda
        torch.testing.assert_close(xg.cpu(), xc)
        assert torch.equal(yg.cpu(), yc)
    for (xg, _), (xc, _) in zip(cuda.test, cpu.test):
        torch.testing.assert_close(xg.cpu(), xc)
