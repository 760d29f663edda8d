"""Tests of experiments.data.tokens: the token layout, training and evaluation windows, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from experiments.data import partition
from experiments.data.loaders import Placement
from experiments.data.tokens import (
    TAG_WINDOWS,
    TokenData,
    build_tokens,
    eval_starts,
    token_sizes,
    tokens_section,
)
from experiments.train.config import ConfigError
from tests.experiments.data.common import CPU, same_batches

TRAIN_LEN, VAL_LEN, VOCAB = 5000, 1200, 5000


def write_tokens(
    root: Path,
    train: Any = None,
    val: Any = None,
    meta: dict | None = None,
) -> Path:
    """Write ``train.bin``, ``val.bin`` (uint16) and ``meta.json`` under ``root``.

    By default token ``i`` of a file is ``i``, so a window's content tells its start.
    """
    root.mkdir(parents=True, exist_ok=True)
    for name, ids, n in (("train.bin", train, TRAIN_LEN), ("val.bin", val, VAL_LEN)):
        np.asarray(np.arange(n) if ids is None else ids, dtype="<u2").tofile(root / name)
    meta = {"vocab_size": VOCAB, "dtype": "uint16"} if meta is None else meta
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def place(rank: int = 0, world_size: int = 1, batch_size: int = 4, seed: int = 0) -> Placement:
    return Placement(rank, world_size, batch_size, seed, CPU)


def build(root: Path, rank: int = 0, world_size: int = 1, seed: int = 0, **cfg: Any) -> TokenData:
    section = {"root": str(root), "tokens_per_epoch": 4 * 16 * world_size * 5, **cfg}
    return build_tokens(section, placement=place(rank, world_size, seed=seed), block_size=16)


def draw(loader: Any, count: int) -> list:
    """``count`` batches from iterating the loader itself, epoch after epoch."""
    out: list = []
    while len(out) < count:
        for batch in loader:
            out.append(batch)
            if len(out) == count:
                break
    return out


def test_layout_is_read_through_memmaps_with_meta(tmp_path: Path) -> None:
    root = write_tokens(tmp_path, meta={"vocab_size": VOCAB, "unigram_entropy": 3.5})
    data = build_tokens(
        {"root": str(root), "tokens_per_epoch": 10_000},
        placement=place(world_size=2, batch_size=3),
        block_size=32,
    )
    assert isinstance(data.train.tokens, np.memmap) and data.train.tokens.dtype == np.dtype("<u2")
    assert (data.vocab_size, data.block_size, data.train_tokens) == (VOCAB, 32, TRAIN_LEN)
    assert data.tokens_per_step == 3 * 32 * 2
    assert len(data.train) == 10_000 // (3 * 32 * 2)
    assert data.unigram_entropy == 3.5
    # the section's sizes win over meta.json and the model
    data = build(root, vocab_size=VOCAB + 7, block_size=8, tokens_per_epoch=1)
    assert (data.vocab_size, data.block_size, len(data.train)) == (VOCAB + 7, 8, 1)


def test_windows_are_block_plus_one_tokens_with_y_shifted(tmp_path: Path) -> None:
    data = build(write_tokens(tmp_path))
    for b, (x, y) in enumerate(data.train.iterate(2)):
        assert x.shape == y.shape == (4, 16)
        assert x.dtype == y.dtype == torch.int64 and x.is_contiguous() and y.is_contiguous()
        starts = data.train.window_starts(2, b)
        assert int(starts.min()) >= 0 and int(starts.max()) <= TRAIN_LEN - 17
        expected = starts[:, None] + torch.arange(16)
        assert torch.equal(x, expected) and torch.equal(y, expected + 1)


def test_ranks_draw_their_own_windows_reproducibly(tmp_path: Path) -> None:
    root = write_tokens(tmp_path)
    state = torch.get_rng_state()
    r0, r1 = build(root, rank=0, world_size=2), build(root, rank=1, world_size=2)
    assert not torch.equal(r0.train.window_starts(0, 0), r1.train.window_starts(0, 0))
    assert same_batches(list(r1.train.iterate(0)), list(build(root, 1, 2).train.iterate(0)))
    # new windows for another batch, epoch or seed
    first = r0.train.window_starts(0, 0)
    assert not torch.equal(first, r0.train.window_starts(0, 1))
    assert not torch.equal(first, r0.train.window_starts(1, 0))
    assert not torch.equal(first, build(root, 0, 2, seed=1).train.window_starts(0, 0))
    # the data pipeline never draws from the global RNG
    assert torch.equal(torch.get_rng_state(), state)


def test_windows_have_their_own_stream_tag() -> None:
    tags = {v for k, v in vars(partition).items() if k.startswith("TAG_")}
    assert TAG_WINDOWS not in tags


def test_resumed_loader_draws_the_same_windows(tmp_path: Path) -> None:
    root = write_tokens(tmp_path)
    assert len(build(root).train) == 5  # the seven batches below cross into epoch 1
    full = draw(build(root).train, 7)
    first = build(root).train
    head = draw(first, 3)
    saved = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    assert saved == {"epoch": 0, "batch": 3}
    resumed = build(root).train
    resumed.load_state_dict(saved)
    assert same_batches(full, head + draw(resumed, 4))
    assert resumed.state_dict() == {"epoch": 1, "batch": 2}
    resumed.load_state_dict({"epoch": 0, "batch": 5})
    assert resumed.state_dict() == {"epoch": 1, "batch": 0}
    assert same_batches(full[5:], draw(resumed, 2))
    # the same batches by position alone
    by_position = list(build(root).train.iterate(0)) + list(build(root).train.iterate(1))[:2]
    assert same_batches(full, by_position)
    assert same_batches(full[3:5], list(build(root).train.iterate(0, start=3)))
    assert list(build(root).train.iterate(0, start=5)) == []


@pytest.mark.parametrize(
    "state",
    [{"epoch": 0}, {"epoch": -1, "batch": 0}, {"epoch": 0, "batch": 6}, {"epoch": 0.5, "batch": 0}],
)
def test_bad_loader_state_is_refused(tmp_path: Path, state: dict) -> None:
    loader = build(write_tokens(tmp_path)).train
    with pytest.raises(ValueError, match="state lacks|epoch must|start must"):
        loader.load_state_dict(state)
    with pytest.raises(ValueError):
        loader.iterate(0, start=6)


@pytest.mark.parametrize("world", [1, 3, 4])
def test_eval_windows_are_fixed_disjoint_and_split_across_ranks(tmp_path: Path, world: int) -> None:
    root = write_tokens(tmp_path)
    starts = eval_starts(VAL_LEN, 16, 640)
    assert len(starts) == 640 // 16
    assert all(b - a >= 16 for a, b in zip(starts, starts[1:]))
    assert starts[-1] + 17 <= VAL_LEN and starts[-1] > VAL_LEN // 2  # spread over the file
    seen, sizes = [], []
    for rank in range(world):
        test = build(root, rank, world, eval_tokens=640).test
        batches = list(test)
        assert len(batches) == len(test) and all(x.shape[0] <= 4 for x, _ in batches)
        assert same_batches(batches, list(build(root, rank, world, eval_tokens=640).test))
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        assert torch.equal(y, x + 1) and torch.equal(x[:, 0], torch.tensor(test.starts))
        assert test.num_tokens == test.num_samples * 16 == x.numel()
        seen += test.starts
        sizes.append(test.num_samples)
    assert seen == starts and max(sizes) - min(sizes) <= 1


def test_eval_windows_cap_at_the_validation_file() -> None:
    assert eval_starts(100, 16, 10**6) == [k * ((100 - 17) // 5) for k in range(6)]
    assert eval_starts(17, 16, 10**6) == [0]
    assert eval_starts(1000, 16, 1) == [0]


def _one_line(exc: pytest.ExceptionInfo, name: str) -> str:
    text = str(exc.value)
    assert "\n" not in text and name in text, text
    return text


@pytest.mark.parametrize("split", ["train.bin", "val.bin"])
def test_missing_split_says_how_to_make_it(tmp_path: Path, split: str) -> None:
    root = write_tokens(tmp_path)
    (root / split).unlink()
    with pytest.raises(FileNotFoundError) as exc:
        build(root)
    assert "python -m experiments.data.prepare_tokens" in _one_line(exc, str(root / split))


def test_odd_size_is_not_uint16(tmp_path: Path) -> None:
    root = write_tokens(tmp_path)
    with open(root / "val.bin", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ValueError) as exc:
        build(root)
    assert "odd" in _one_line(exc, str(root / "val.bin"))


def test_meta_with_another_dtype_is_refused(tmp_path: Path) -> None:
    root = write_tokens(tmp_path, meta={"vocab_size": VOCAB, "dtype": "uint32"})
    with pytest.raises(ValueError) as exc:
        build(root)
    assert "uint32" in _one_line(exc, str(root / "meta.json"))


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"vocab_size": -3}'])
def test_malformed_meta_is_refused(tmp_path: Path, content: str) -> None:
    root = write_tokens(tmp_path)
    (root / "meta.json").write_text(content)
    with pytest.raises(ValueError) as exc:
        build(root)
    _one_line(exc, str(root / "meta.json"))


@pytest.mark.parametrize("split", ["train.bin", "val.bin"])
def test_file_shorter_than_one_window(tmp_path: Path, split: str) -> None:
    root = write_tokens(tmp_path, **{split[:-4]: np.arange(16)})
    with pytest.raises(ValueError) as exc:
        build(root)
    assert "block_size + 1 = 17" in _one_line(exc, str(root / split))
    write_tokens(tmp_path, **{split[:-4]: np.arange(17)})
    assert build(root).block_size == 16  # one window is enough


def test_token_id_beyond_the_vocabulary(tmp_path: Path) -> None:
    root = write_tokens(
        tmp_path, train=np.zeros(100), val=np.r_[np.zeros(40), 9], meta={"vocab_size": 9}
    )
    with pytest.raises(ValueError) as exc:
        build(root, eval_tokens=16)
    text = _one_line(exc, str(root / "val.bin"))
    assert "token id 9 at position 40" in text and "vocab_size=9" in text
    write_tokens(tmp_path, train=np.zeros(100), val=np.r_[np.zeros(40), 9], meta={})
    assert build(root, vocab_size=10).vocab_size == 10


def test_vocab_size_from_nowhere(tmp_path: Path) -> None:
    root = write_tokens(tmp_path, meta={"dtype": "uint16"})
    with pytest.raises(ValueError) as exc:
        build(root)
    assert "dataset.vocab_size" in _one_line(exc, str(root / "meta.json"))
    (root / "meta.json").unlink()
    with pytest.raises(ValueError, match="vocab_size unknown"):
        build(root)
    assert build(root, vocab_size=VOCAB).vocab_size == VOCAB


def test_token_sizes_are_known_before_the_files_are_opened(tmp_path: Path) -> None:
    root = write_tokens(tmp_path / "ok")
    assert token_sizes({"root": str(root)}, 16) == (16, VOCAB)  # the model's block size
    assert token_sizes({"root": str(root), "block_size": 8}, 16) == (8, VOCAB)
    assert token_sizes({"root": str(root), "vocab_size": 9000}, 16) == (16, 9000)
    with pytest.raises(ConfigError, match="^dataset.block_size=32 is invalid; it must be <= "):
        token_sizes({"root": str(root), "block_size": 32}, 16)
    (root / "meta.json").unlink()
    with pytest.raises(ConfigError, match="^vocab_size unknown: "):
        token_sizes({"root": str(root)}, 16)
    (root / "val.bin").unlink()
    with pytest.raises(ConfigError) as exc:
        token_sizes({"root": str(root), "vocab_size": VOCAB}, 16)
    message = str(exc.value)
    assert "holds no val.bin" in message and "prepare_tokens" in message and "\n" not in message


def test_section_is_checked_like_a_config(tmp_path: Path) -> None:
    section = tokens_section(None)
    assert (section.name, section.root, section.tokens_per_epoch) == (
        "tokens",
        "data/tokens",
        10**6,
    )
    assert (section.vocab_size, section.block_size, section.eval_tokens) == (None, None, 65_536)
    with pytest.raises(ConfigError, match="dataset.shards is not a key"):
        tokens_section({"shards": 3})
    with pytest.raises(ConfigError, match="dataset.eval_tokens=0 is invalid"):
        tokens_section({"eval_tokens": 0})
    root = write_tokens(tmp_path)
    with pytest.raises(ConfigError, match="dataset.block_size=None"):
        build_tokens({"root": str(root)}, placement=place())
    with pytest.raises(ConfigError, match="model's block size 16"):
        build(root, block_size=32)


@pytest.mark.gpu
def test_cuda_batches_match_the_cpu_ones(tmp_path: Path) -> None:
    root = write_tokens(tmp_path)
    cpu = build(root, rank=1, world_size=2)
    cuda_place = Placement(1, 2, 4, 0, torch.device("cuda"))
    section = {"root": str(root), "tokens_per_epoch": 4 * 16 * 2 * 5}
    gpu = build_tokens(section, placement=cuda_place, block_size=16)
    for (xc, yc), (xg, yg) in zip(cpu.train.iterate(1), gpu.train.iterate(1)):
        assert xg.is_cuda and torch.equal(xg.cpu(), xc) and torch.equal(yg.cpu(), yc)
    assert same_batches(list(cpu.test), [(x.cpu(), y.cpu()) for x, y in gpu.test])
