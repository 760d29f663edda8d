"""Tests of experiments.data.loaders and build_data: resumable orders, evaluation batches, errors."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from experiments.data import DATASETS, build_data
from tests.experiments.data.common import build, digits, same_batches


def test_iid_shards_equal_length_disjoint_and_covering() -> None:
    world, bs = 4, 32
    ranks = [build(digits(), rank=r, world_size=world, batch_size=bs, seed=7) for r in range(4)]
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
    cfg = digits(augment=augment)
    state = torch.get_rng_state()
    full = list(build(cfg, rank=1, world_size=2, seed=5).train.iterate(3))
    # A resumed run builds its loaders afresh.
    resumed = list(build(cfg, rank=1, world_size=2, seed=5).train.iterate(3, start=7))
    assert len(full) == (1437 // 2) // 32
    assert same_batches(full[7:], resumed)
    # The data pipeline never draws from the global RNG.
    assert torch.equal(torch.get_rng_state(), state)


def test_iteration_changes_with_epoch_and_seed_and_iter_is_epoch_zero() -> None:
    data = build(digits(), world_size=2)
    e0, e1 = list(data.train.iterate(0)), list(data.train.iterate(1))
    assert same_batches(list(data.train), e0)
    assert not torch.equal(data.train.epoch_order(0), data.train.epoch_order(1))
    # Both epochs draw from the same shard.
    assert torch.isin(data.train.epoch_order(1), data.train.epoch_order(0)).float().mean() > 0.9
    assert torch.isin(data.train.epoch_order(1), data.train.indices).all()
    assert not torch.equal(e0[0][0], e1[0][0])
    other = build(digits(), world_size=2, seed=1)
    assert not torch.equal(data.train.indices, other.train.indices)
    assert list(data.train.iterate(0, start=len(data.train))) == []


@pytest.mark.parametrize("world", [3, 4, 7])
def test_eval_shards_cover_test_set_once(world: int) -> None:
    full = list(build(digits(), batch_size=32).test)
    fx, fy = torch.cat([b[0] for b in full]), torch.cat([b[1] for b in full])
    xs, ys, sizes = [], [], []
    for r in range(world):
        test = build(digits(), rank=r, world_size=world, batch_size=32).test
        batches = list(test)
        assert len(batches) == len(test)
        assert batches[0][0].shape[0] == min(256, test.num_samples)
        xs += [b[0] for b in batches]
        ys += [b[1] for b in batches]
        sizes.append(test.num_samples)
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 360
    assert torch.equal(torch.cat(xs), fx) and torch.equal(torch.cat(ys), fy)


def test_eval_batch_size_is_at_least_256_else_batch_size() -> None:
    assert build(digits(), batch_size=32).test.batch_size == 256
    assert build(digits(), batch_size=300).test.batch_size == 300


def test_dictconfig_is_accepted() -> None:
    data = build(
        OmegaConf.create({"name": "digits", "partition": "iid", "alpha": 0.5, "augment": False})
    )
    assert data.train_size == 1437


def test_bad_arguments_raise_one_line_value_errors() -> None:
    with pytest.raises(
        ValueError, match="^dataset.name=mnist is invalid; it must be one of"
    ) as err:
        build({"name": "mnist"})
    assert all(name in str(err.value) for name in DATASETS)
    for bad in (0, -4):
        with pytest.raises(
            ValueError, match=f"^batch_size={bad} is invalid; it must be an integer > 0"
        ):
            build(digits(), batch_size=bad)
    with pytest.raises(ValueError, match="batch_size=400 .* shard of 359 samples"):
        build(digits(), world_size=4, batch_size=400)
    with pytest.raises(
        ValueError, match="^dataset.partition=shards is invalid; it must be one of iid, dirichlet"
    ):
        build(digits(partition="shards"))
    with pytest.raises(ValueError, match="^dataset.alpha=0.0 is invalid; it must be > 0"):
        build(digits(partition="dirichlet", alpha=0))
    with pytest.raises(ValueError, match=r"^rank=2 is invalid; it must be an integer in \[0, 1\]"):
        build(digits(), rank=2, world_size=2)
    with pytest.raises(
        ValueError,
        match="^dataset.shuffle is not a key of dataset=digits; it must be one of name, root",
    ):
        build(digits(shuffle=True))
    train = build(digits()).train
    with pytest.raises(ValueError, match=r"start must be an integer in \[0, 44\], got 45"):
        train.iterate(0, start=45)
    with pytest.raises(ValueError, match="epoch must be a non-negative integer"):
        train.iterate(-1)


def test_left_out_and_null_keys_take_the_schema_defaults() -> None:
    # null is the schema's default as well, so a DictConfig with nulls reads like a plain dict
    a = build(
        OmegaConf.create({"name": "digits", "partition": None, "augment": None}), world_size=2
    )
    b = build(None, world_size=2)
    assert torch.equal(a.train.indices, b.train.indices)
    assert same_batches(list(a.train.iterate(1)), list(b.train.iterate(1)))


@pytest.mark.gpu
def test_cuda_batches_match_cpu_batches() -> None:
    cfg = digits(augment=True)
    cuda = build_data(cfg, rank=0, world_size=2, batch_size=32, seed=0, device=torch.device("cuda"))
    cpu = build(cfg, rank=0, world_size=2, seed=0)
    for (xg, yg), (xc, yc) in zip(cuda.train.iterate(1, start=3), cpu.train.iterate(1, start=3)):
        assert xg.is_cuda and yg.is_cuda
        torch.testing.assert_close(xg.cpu(), xc)
        assert torch.equal(yg.cpu(), yc)
    for (xg, _), (xc, _) in zip(cuda.test, cpu.test):
        torch.testing.assert_close(xg.cpu(), xc)
