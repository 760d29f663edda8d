"""A user's dataset by ``_target_``: sharded, batched and resumed exactly as the built-ins."""

from __future__ import annotations

import pytest
import torch

from experiments.data import build_data
from experiments.data.target import load_splits
from experiments.schema import ConfigError

CPU = torch.device("cpu")
OWN = "tests.support.own_targets"
DIGITS = {"_target_": f"{OWN}.Digits"}


def _build(section: dict, rank: int = 0, world_size: int = 2, batch_size: int = 32, seed: int = 3):
    return build_data(
        section, rank=rank, world_size=world_size, batch_size=batch_size, seed=seed, device=CPU
    )


def _same_batches(a, b) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        torch.testing.assert_close(xa, xb, rtol=0, atol=0)
        assert torch.equal(ya, yb)


@pytest.mark.parametrize(
    ("split", "labelled"), [("iid", True), ("dirichlet", True), ("dirichlet", False)]
)
def test_shards_batches_and_test_slices_are_the_builtin_digits(split: str, labelled: bool) -> None:
    # the same split and normalisation as dataset=digits, as a map-style dataset
    keys = {"partition": split, "alpha": 0.5}
    for rank in range(2):
        own = _build({**DIGITS, "labelled": labelled, **keys}, rank=rank)
        builtin = _build({"name": "digits", **keys}, rank=rank)
        assert torch.equal(own.train.indices, builtin.train.indices)
        assert len(own.train) == len(builtin.train) and own.train_size == builtin.train_size
        assert own.class_histogram == builtin.class_histogram
        assert (own.num_classes, own.in_channels, own.image_size) == (10, 1, 8)
        _same_batches(list(own.train.iterate(1)), list(builtin.train.iterate(1)))
        ours = [(x, y) for x, y in own.test]
        theirs = torch.cat([x for x, _ in builtin.test]), torch.cat([y for _, y in builtin.test])
        torch.testing.assert_close(torch.cat([x for x, _ in ours]), theirs[0], rtol=0, atol=0)
        assert torch.equal(torch.cat([y for _, y in ours]), theirs[1])


def test_random_reads_are_seeded_per_sample_so_a_resume_repeats_them() -> None:
    section = {**DIGITS, "jitter": 0.5}
    first = _build(section, rank=1)
    epoch = list(first.train.iterate(2))
    state = torch.get_rng_state()
    again = list(_build(section, rank=1).train.iterate(2, start=4))
    assert torch.equal(torch.get_rng_state(), state)  # the training process's draws untouched
    _same_batches(again, epoch[4:])
    other_epoch = list(first.train.iterate(3))
    assert not torch.equal(epoch[0][0], other_epoch[0][0])


def test_a_set_drawn_when_built_is_the_same_on_every_rank() -> None:
    section = {"_target_": f"{OWN}.Drawn", "partition": "dirichlet", "alpha": 1.0}
    torch.manual_seed(1)
    a = _build(section, rank=0, batch_size=4)
    torch.manual_seed(2)  # another rank's global state
    b = _build(section, rank=0, batch_size=4)
    _same_batches(list(a.train.iterate(0)), list(b.train.iterate(0)))
    assert torch.equal(a.train.indices, b.train.indices)


def test_the_check_hands_its_splits_to_the_build() -> None:
    kept = load_splits(DIGITS, 3, keep=True)
    data = _build(DIGITS)
    assert data.train._reader._dataset.dataset is kept.train  # built once
    assert _build(DIGITS).train._reader._dataset.dataset is not kept.train  # handed over once


def test_a_language_model_set() -> None:
    data = _build({"_target_": f"{OWN}.Tokens", "task": "language_model"}, batch_size=4)
    assert (data.vocab_size, data.block_size, data.num_classes) == (16, 8, None)
    x, y = next(iter(data.train))
    assert x.shape == y.shape == (4, 8) and torch.equal(y[:, :-1], x[:, 1:])


@pytest.mark.parametrize(
    ("section", "needles"),
    [
        (
            {"_target_": f"{OWN}.Unpaired"},
            (
                "Unpaired returned a dataset whose sample 0 of split=train is of type Tensor",
                "(input, target) pairs",
            ),
        ),
        ({"_target_": f"{OWN}.Stream"}, ("Stream returned an IterableDataset", "map-style")),
        (
            {"_target_": f"{OWN}.a_list"},
            ("a_list returned a dataset whose sample 0 of split=train is of type int", "pairs"),
        ),
        (
            {"_target_": f"{OWN}.FloatTargets", "num_classes": 2},
            ("returned a target of type float in sample 0", "integer class id"),
        ),
        (
            {"_target_": f"{OWN}.NoSplit"},
            ("dataset._target_=tests.support.own_targets.NoSplit takes no split",),
        ),
        (
            {"_target_": f"{OWN}.broken"},
            ("broken raised RuntimeError: cannot read the train files",),
        ),
        (
            {"_target_": f"{OWN}.Tokens"},
            ("dataset.num_classes=null is invalid", "has none", "set dataset.num_classes"),
        ),
        ({**DIGITS, "num_classes": 5}, ("dataset.num_classes=5",)),
        (
            {**DIGITS, "labeled": True},
            (
                "dataset.labeled=True is not an argument of tests.support.own_targets.Digits",
                "labelled",
            ),
        ),
        (
            {**DIGITS, "split": "test"},
            ("dataset.split=test is invalid", "split=train and split=val"),
        ),
        (
            {"_target_": f"{OWN}.Tokens", "task": "language_model", "vocab_size": 4},
            ("token id", "dataset.vocab_size=4"),
        ),
        (
            {"_target_": f"{OWN}.Nope"},
            ("dataset._target_=tests.support.own_targets.Nope does not import",),
        ),
    ],
)
def test_a_bad_dataset_is_one_line_naming_the_key(section: dict, needles: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        _build(section)
    text = str(info.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, text
