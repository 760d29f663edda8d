"""``dataset=tokens``: language-model windows read from flat token files on disk.

Layout (nanoGPT's): ``root/train.bin`` and ``root/val.bin`` hold token ids as flat
little-endian ``uint16``, read through ``numpy.memmap`` and never loaded whole;
``root/meta.json`` may give ``{"vocab_size": N, "dtype": "uint16", "tokenizer": ...}``.
``python -m experiments.data.prepare_tokens`` writes all three from text. Without a
``meta.json``, nanoGPT's own ``root/meta.pkl`` (``vocab_size``, ``stoi``, ``itos``, from its
character-level ``prepare.py``) is read instead, by :mod:`experiments.data.meta_pickle`,
which runs nothing the file holds. nanoGPT's OpenWebText files come with neither; their
vocabulary (GPT-2's BPE, 50257 ids) is then ``dataset.vocab_size``.

Training. Every rank draws its own random windows of ``block_size + 1`` tokens of
``train.bin``: ``x`` is the first ``block_size`` tokens of a window and ``y`` the same
shifted by one. The starts of batch ``b`` of epoch ``e`` on rank ``r`` come from a
generator seeded with :func:`~experiments.data.partition.derive_seed` of
``(TAG_WINDOWS, seed, e, r, b)``, so a batch depends on nothing else: a run resumed at
batch ``k`` of epoch ``e`` (``train.iterate(e, start=k)``, or ``load_state_dict`` of the
saved ``state_dict()``) sees exactly the batches an uninterrupted run would have seen. An
epoch is ``tokens_per_epoch`` training tokens summed over all ranks.

Evaluation. Fixed windows spread evenly over ``val.bin``, about ``eval_tokens`` predicted
tokens in all, cut into contiguous disjoint runs of windows, one per rank, and copied to
the device once. Sum the loss times ``test.num_tokens`` and the token counts over ranks for
the global mean.

Batches are ``int64`` ``(batch_size, block_size)`` on the device, copied from pinned memory
with ``non_blocking=True`` on CUDA; producing one reads no value back from the device.

A little past 500 lines as one unit: the file layout, the training windows and the
evaluation windows read the same files with the same dtype and vocabulary checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from experiments.data.loaders import EvalLoader, Placement
from experiments.data.meta_pickle import META_PICKLE, read_meta_pickle
from experiments.data.partition import eval_range, generator
from experiments.data.schema import TokensConfig, tokens_section
from experiments.schema import ConfigError, is_int, require

__all__ = [
    "TAG_WINDOWS",
    "TRAIN_FILE",
    "VAL_FILE",
    "META_FILE",
    "META_PICKLE",
    "TOKEN_DTYPE",
    "TokensConfig",
    "TokenLoader",
    "TokenEvalLoader",
    "TokenData",
    "tokens_section",
    "read_meta",
    "meta_path",
    "open_split",
    "eval_starts",
    "token_sizes",
    "build_tokens",
]

TAG_WINDOWS = 5
"""Stream tag of the training windows' starts, apart from the tags of ``partition``."""

TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"
META_FILE = "meta.json"
TOKEN_DTYPE = np.dtype("<u2")
"""Token files hold little-endian ``uint16`` ids."""

_VOCAB_SAMPLE = 1 << 16
# ids checked against vocab_size at the head of each file: a cheap check, not a proof


def meta_path(root: Path) -> Path | None:
    """The metadata file of a token directory: ``meta.json``, else ``meta.pkl``, else ``None``."""
    for name in (META_FILE, META_PICKLE):
        if (root / name).is_file():
            return root / name
    return None


def read_meta(root: Path) -> dict[str, Any]:
    """The metadata of a token directory as a dict, empty if it has none.

    ``root/meta.json`` is read if present (its ``dtype`` checked), else nanoGPT's
    ``root/meta.pkl`` (:func:`~experiments.data.meta_pickle.read_meta_pickle`: only plain
    containers, strings and numbers; its ``stoi`` and ``itos`` are kept for decoding).

    Args:
        root: The token directory.

    Returns:
        The metadata.

    Raises:
        ValueError: One line naming the file, if ``meta.json`` is not a JSON object, says a
            ``dtype`` other than ``uint16``, or gives a ``vocab_size`` that is not a
            positive integer; or if ``meta.pkl`` is refused or malformed.
    """
    path = root / META_FILE
    if not path.is_file():
        pickled = root / META_PICKLE
        return read_meta_pickle(pickled) if pickled.is_file() else {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}".replace("\n", " ")) from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(meta).__name__}")
    dtype = meta.get("dtype", "uint16")
    if dtype != "uint16":
        raise ValueError(
            f"{path} says dtype={dtype!r}; token files must be flat little-endian uint16 "
            "(remake them with python -m experiments.data.prepare_tokens)"
        )
    vocab = meta.get("vocab_size")
    if vocab is not None and not (is_int(vocab) and vocab > 0):
        raise ValueError(f"{path} gives vocab_size={vocab!r}; it must be an integer > 0")
    return meta


def open_split(path: Path, block_size: int, vocab_size: int) -> np.memmap:
    """Map one token file read-only, after checking its size and the ids at its head.

    Args:
        path: ``train.bin`` or ``val.bin``.
        block_size: Tokens per window; the file must hold at least one window plus one.
        vocab_size: Ids must be below it (checked on the first 65,536 tokens).

    Returns:
        The ``uint16`` memory map.

    Raises:
        FileNotFoundError: If the file is missing (the message says how to make it).
        ValueError: One line naming the file, if its size is odd, it is shorter than
            ``block_size + 1`` tokens, or an id at its head is ``>= vocab_size``.
    """
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found; make the token files with `python -m "
            f"experiments.data.prepare_tokens --stdlib --out {path.parent}` "
            "(or --input PATH ... for your own text)"
        )
    size = path.stat().st_size
    if size % TOKEN_DTYPE.itemsize:
        raise ValueError(f"{path} is not a flat uint16 token file: its size, {size} bytes, is odd")
    num_tokens = size // TOKEN_DTYPE.itemsize
    if num_tokens < block_size + 1:
        raise ValueError(
            f"{path} holds {num_tokens} tokens, fewer than one window of block_size + 1 = "
            f"{block_size + 1}; use more text or a smaller dataset.block_size"
        )
    tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r")
    head = np.asarray(tokens[:_VOCAB_SAMPLE])
    if int(head.max()) >= vocab_size:
        at = int(np.argmax(head >= vocab_size))
        raise ValueError(
            f"{path} holds token id {int(head[at])} at position {at}, not below "
            f"vocab_size={vocab_size}; set dataset.vocab_size to the tokenizer's vocabulary "
            "or remake the files"
        )
    return tokens


def _read_windows(
    tokens: np.ndarray, starts: list[int], block_size: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """The ``(x, y)`` windows at ``starts`` on ``device``, in one copy from the host."""
    pin = device.type == "cuda"
    host = torch.empty((2, len(starts), block_size), dtype=torch.int64, pin_memory=pin)
    buf = host.numpy()
    for i, start in enumerate(starts):
        window = tokens[start : start + block_size + 1]
        buf[0, i] = window[:-1]
        buf[1, i] = window[1:]
    both = host.to(device, non_blocking=pin)
    return both[0], both[1]


class TokenLoader:
    """This rank's random training windows, ``len(loader)`` batches per epoch.

    Batch ``b`` of epoch ``e`` depends only on ``(seed, rank, e, b)`` (see
    :meth:`window_starts`), so resuming needs only the position. The loader also keeps the
    position of the last batch it yielded: iterating it directly continues from there, one
    epoch at a time, and :meth:`state_dict` / :meth:`load_state_dict` save and restore it.

    Args:
        tokens: The training tokens (a ``uint16`` memory map of ``train.bin``).
        place: This rank's placement (``batch_size`` windows per batch, the seed, the device).
        block_size: Tokens per sample.
        num_batches: Batches per epoch.

    Example::

        data = build_tokens({"root": "data/tokens"}, placement=place, block_size=256)
        for epoch in range(2):
            for x, y in data.train.iterate(epoch):  # (B, 256) int64 each
                ...
        # resume at batch 5 of epoch 1: iterate(1, start=5), or
        data.train.load_state_dict({"epoch": 1, "batch": 5})
        x, y = next(iter(data.train))
    """

    def __init__(
        self, tokens: np.ndarray, place: Placement, *, block_size: int, num_batches: int
    ) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = place.batch_size
        self.num_batches = num_batches
        self.seed = place.seed
        self.rank = place.rank
        self.device = place.device
        self._epoch = 0
        self._batch = 0

    def __len__(self) -> int:
        return self.num_batches

    @property
    def num_tokens(self) -> int:
        """Tokens in the training file."""
        return int(self.tokens.shape[0])

    def window_starts(self, epoch: int, batch: int) -> Tensor:
        """The first token of each window of batch ``batch`` of ``epoch`` on this rank.

        Args:
            epoch: Epoch number.
            batch: Batch number within the epoch.

        Returns:
            ``batch_size`` int64 positions in ``[0, num_tokens - block_size - 1]`` (CPU).
        """
        gen = generator(TAG_WINDOWS, self.seed, epoch, self.rank, batch)
        high = self.num_tokens - self.block_size
        return torch.randint(0, high, (self.batch_size,), generator=gen)

    def batch(self, epoch: int, batch: int) -> tuple[Tensor, Tensor]:
        """Batch ``batch`` of ``epoch``: ``x`` and ``y = x`` shifted by one, on the device."""
        starts = self.window_starts(epoch, batch).tolist()
        return _read_windows(self.tokens, starts, self.block_size, self.device)

    def iterate(self, epoch: int, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield the batches ``start .. len(self) - 1`` of ``epoch``.

        Args:
            epoch: Epoch number (non-negative).
            start: First batch to yield; ``len(self)`` yields nothing.

        Returns:
            An iterator over ``(x, y)`` pairs, each ``(batch_size, block_size)`` int64.

        Raises:
            ValueError: If ``epoch`` is negative or ``start`` is outside ``[0, len(self)]``.
        """
        epoch, start = self._checked(epoch, start)
        return self._batches(epoch, start)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        """The rest of the current epoch, from the position of :meth:`state_dict`."""
        return self._batches(self._epoch, self._batch)

    def state_dict(self) -> dict[str, int]:
        """The position after the last batch yielded: ``{"epoch": e, "batch": b}``.

        Since batches derive from ``(seed, rank, epoch, batch)``, nothing else is needed.
        """
        return {"epoch": self._epoch, "batch": self._batch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved :meth:`state_dict`: the next batch is ``state["batch"]``.

        Args:
            state: ``{"epoch": e, "batch": b}``.

        Raises:
            ValueError: If a key is missing or a value is out of range.
        """
        missing = {"epoch", "batch"} - set(state)
        if missing:
            raise ValueError(f"token loader state lacks {sorted(missing)}; got {dict(state)}")
        epoch, batch = self._checked(state["epoch"], state["batch"])
        # the end of an epoch is the start of the next
        self._epoch, self._batch = (epoch + 1, 0) if batch == len(self) else (epoch, batch)

    def _checked(self, epoch: Any, start: Any) -> tuple[int, int]:
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        if not is_int(start) or not 0 <= start <= len(self):
            raise ValueError(f"start must be an integer in [0, {len(self)}], got {start!r}")
        return int(epoch), int(start)

    def _batches(self, epoch: int, start: int) -> Iterator[tuple[Tensor, Tensor]]:
        for b in range(start, self.num_batches):
            x, y = self.batch(epoch, b)
            done = b + 1 == self.num_batches
            self._epoch, self._batch = (epoch + 1, 0) if done else (epoch, b + 1)
            yield x, y


def eval_starts(num_tokens: int, block_size: int, eval_tokens: int) -> list[int]:
    """The starts of the evaluation windows of a validation file, the same on every rank.

    ``min(eval_tokens // block_size, (num_tokens - 1) // block_size)`` windows (at least
    one) are spread evenly over the file; their inputs never overlap.

    Args:
        num_tokens: Tokens in the file, at least ``block_size + 1``.
        block_size: Tokens per window.
        eval_tokens: Predicted tokens wanted in all.

    Returns:
        Increasing start positions.
    """
    count = min(max(eval_tokens // block_size, 1), (num_tokens - 1) // block_size)
    if count == 1:
        return [0]
    stride = (num_tokens - 1 - block_size) // (count - 1)
    return [k * stride for k in range(count)]


class TokenEvalLoader(EvalLoader):
    """This rank's fixed evaluation windows, held on the device, in batches.

    ``num_samples`` is the number of windows of this rank (possibly zero) and
    ``num_tokens`` the tokens they predict.

    Args:
        tokens: The validation tokens (a memory map of ``val.bin``).
        starts: This rank's window starts.
        block_size: Tokens per window.
        batch_size: Windows per batch.
        device: Where the windows are held.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        starts: list[int],
        *,
        block_size: int,
        batch_size: int,
        device: torch.device,
    ) -> None:
        self._x, self._y = _read_windows(tokens, starts, block_size, device)
        self.starts = list(starts)
        self.block_size = block_size
        self.batch_size = batch_size
        self.num_samples = len(starts)
        self.num_tokens = len(starts) * block_size

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for lo in range(0, self.num_samples, self.batch_size):
            hi = lo + self.batch_size
            yield self._x[lo:hi], self._y[lo:hi]


@dataclass
class TokenData:
    """Everything the training loop needs to know about the token data of one rank.

    Attributes:
        train: This rank's training windows.
        test: This rank's evaluation windows (sum losses and counts over ranks).
        vocab_size: Token ids are below this.
        block_size: Tokens per window.
        train_tokens: Tokens in ``train.bin``.
        tokens_per_step: Training tokens per step over all ranks
            (``batch_size * block_size * world_size``).
        unigram_entropy: The training tokens' unigram entropy in nats per token, from
            ``meta.json`` (a loss to beat), or ``None``.

    Example::

        data = build_tokens({"root": "data/tokens"}, placement=place, block_size=256)
        x, y = next(iter(data.train))  # (B, 256) int64 each, y[:, :-1] == x[:, 1:]
    """

    train: TokenLoader
    test: TokenEvalLoader
    vocab_size: int
    block_size: int
    train_tokens: int
    tokens_per_step: int
    unigram_entropy: float | None = None


def _sizes(d: DictConfig, meta: dict[str, Any], model_block: int | None) -> tuple[int, int]:
    """``(block_size, vocab_size)`` from the section, the model and the metadata file.

    The dataset's block size wins over the model's, and may not exceed it.
    """
    block: Any = d.block_size if d.block_size is not None else model_block
    valid = is_int(block) and block > 0
    require("dataset.block_size", block, valid, "an integer > 0 (null takes the model's)")
    if model_block is not None:
        fits = block <= model_block
        require("dataset.block_size", block, fits, f"<= the model's block size {model_block}")
    vocab = d.vocab_size if d.vocab_size is not None else meta.get("vocab_size")
    if vocab is None:
        root = Path(d.root)
        found = meta_path(root)
        if found is None:  # nanoGPT's OpenWebText layout: GPT-2's BPE, no metadata file
            raise ConfigError(
                f"vocab_size unknown: {root} holds no {META_FILE} or {META_PICKLE}; set "
                "dataset.vocab_size (50257 for GPT-2's BPE, as in nanoGPT's OpenWebText "
                "files, or 50304, that padded to a multiple of 64) or remake the files with "
                "experiments.data.prepare_tokens"
            )
        raise ConfigError(
            f"vocab_size unknown: {found} does not give it; "
            "set dataset.vocab_size or remake the files with experiments.data.prepare_tokens"
        )
    return int(block), int(vocab)


def token_sizes(section: Any, model_block: int | None) -> tuple[int, int]:
    """``(block_size, vocab_size)`` of a run, checked without opening the token files.

    Reads only the metadata file (``meta.json`` or ``meta.pkl``), so the trainer can call
    it on every rank before any collective.

    Args:
        section: The ``dataset`` section.
        model_block: The model's block size (the default, and the upper bound, of the
            dataset's), or ``None``.

    Returns:
        The block size the windows use and the vocabulary size.

    Raises:
        ConfigError: One line, for a bad section value, a dataset block size above the
            model's, no vocabulary size in the section or the metadata file, or a missing
            ``train.bin`` / ``val.bin`` (the message says how to make them).
        ValueError: One line naming the file, for a bad ``meta.json`` or ``meta.pkl``.
    """
    d = tokens_section(section)
    root = Path(d.root)
    for name in (TRAIN_FILE, VAL_FILE):
        if not (root / name).is_file():
            raise ConfigError(
                f"dataset.root={d.root} holds no {name}; make the token files with `python -m "
                f"experiments.data.prepare_tokens --stdlib --out {d.root}` "
                "(or --input PATH ... for your own text)"
            )
    return _sizes(d, read_meta(root), model_block)


def build_tokens(section: Any, *, placement: Placement, block_size: int | None = None) -> TokenData:
    """This rank's :class:`TokenData` of the token files the section names.

    Args:
        section: The ``dataset`` section (a dict, a ``DictConfig`` or ``None``): the keys of
            :class:`TokensConfig`.
        placement: This rank's placement (``batch_size`` is windows per batch).
        block_size: The model's block size, used when the section gives none.

    Returns:
        The :class:`TokenData` of this rank.

    Raises:
        ConfigError: For a bad section value, or no block size from either side.
        FileNotFoundError: If ``train.bin`` or ``val.bin`` is missing under ``root``.
        ValueError: One line naming the file, for a bad ``meta.json`` or ``meta.pkl``, a
            file of odd size or shorter than one window, an id ``>= vocab_size``, or no
            vocab size known.
    """
    d = tokens_section(section)
    root = Path(d.root)
    meta = read_meta(root)
    block, vocab = _sizes(d, meta, block_size)
    train_tokens = open_split(root / TRAIN_FILE, block, vocab)
    val_tokens = open_split(root / VAL_FILE, block, vocab)
    place = placement
    per_step = place.batch_size * block * place.world_size
    steps = max(1, int(d.tokens_per_epoch) // per_step)
    train = TokenLoader(train_tokens, place, block_size=block, num_batches=steps)
    starts = eval_starts(int(val_tokens.shape[0]), block, int(d.eval_tokens))
    lo, hi = eval_range(len(starts), place.rank, place.world_size)
    test = TokenEvalLoader(
        val_tokens,
        starts[lo:hi],
        block_size=block,
        batch_size=place.batch_size,
        device=place.device,
    )
    entropy = meta.get("unigram_entropy")
    return TokenData(
        train=train,
        test=test,
        vocab_size=vocab,
        block_size=block,
        train_tokens=int(train_tokens.shape[0]),
        tokens_per_step=per_step,
        unigram_entropy=None if entropy is None else float(entropy),
    )
