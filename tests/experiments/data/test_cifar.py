"""Tests of experiments.data.cifar: the Python batches on disk, augmentation, missing files."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.experiments.data.common import build, multiset


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
    data = build(cfg, batch_size=n_train)
    assert data.train_size == n_train
    assert data.num_classes == (10 if name == "cifar10" else 100)
    assert (data.in_channels, data.image_size, data.synthetic) == (3, 32, False)
    stats = _cifar_stats(ref["train_x"])
    [(x, y)] = list(data.train)
    assert x.shape == (n_train, 3, 32, 32)
    expected = torch.tensor(ref["train_x"].reshape(-1, 3, 32, 32))
    assert multiset(_cifar_to_bytes(x, stats), y) == multiset(
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
    plain = list(build({**cfg, "augment": False}, batch_size=10).train.iterate(1))
    aug = list(build(cfg, batch_size=10).train.iterate(1))  # augment defaults to true
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
            build({"name": name, "root": str(root), "download": False})
        message = str(err.value)
        assert str(root) in message and "dataset.download=true" in message and folder in message
        assert "\n" not in message


def test_cifar_missing_batch_file_is_named(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        build({"name": "cifar10", "root": str(tmp_path)})


class _Runs:
    """Unpickles as a call of os.system: what plain pickle.load would run."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        import os

        return (os.system, (self.command,))


@pytest.mark.parametrize("protocol", [2, 5])
def test_a_batch_that_names_a_command_is_refused_before_it_runs(
    tmp_path: Path, protocol: int
) -> None:
    from experiments.data.cifar import CIFAR, read_cifar

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    marker = tmp_path / "ran"
    good = {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}
    with (folder / "data_batch_1").open("wb") as fh:
        pickle.dump({**good, "x": _Runs(f"touch {marker}")}, fh, protocol=protocol)
    with pytest.raises(ValueError) as caught:
        read_cifar(folder, ["data_batch_1"], CIFAR["cifar10"], "hint")
    message = str(caught.value)
    assert "\n" not in message and "data_batch_1" in message and "system" in message
    assert not marker.exists()
    # the same batch without the command loads, in either protocol
    with (folder / "data_batch_1").open("wb") as fh:
        pickle.dump(good, fh, protocol=protocol)
    images, labels = read_cifar(folder, ["data_batch_1"], CIFAR["cifar10"], "hint")
    assert images.shape == (2, 3, 32, 32) and labels.tolist() == [0, 1]
