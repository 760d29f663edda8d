"""A tiny learnable token corpus in nanoGPT's layout, and the overrides of a tiny LM job."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

VOCAB = 32
# what every LM run reports, beside the keys of every run
LM_TRAIN_KEYS = {
    "tokens",
    "train/loss",
    "perf/tokens_per_s",
    "perf/mfu",
    "consensus/distance_sketch",
}
LM_EVAL_KEYS = {"tokens", "eval/loss", "eval/loss_local", "eval/ppl", "consensus/distance"}
LM_SUMMARY_KEYS = {
    "eval/loss",
    "eval/loss_local",
    "eval/ppl",
    "perf/tokens_per_s",
    "perf/mfu",
    "tokens",
    "unigram_entropy",
}


def write_corpus(
    root: Path,
    *,
    train_tokens: int = 6000,
    val_tokens: int = 1500,
    meta: bool = True,
    vocab_in_meta: bool = True,
) -> Path:
    """``train.bin``, ``val.bin`` and ``meta.json`` of a Markov chain a model can learn.

    Each next token is ``(5 * t + 1) % VOCAB`` nine times in ten, else uniform: close to
    uniform as unigrams (about ``log 32 = 3.47`` nats), far more predictable in context.
    """
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ids = np.empty(train_tokens + val_tokens, dtype=np.int64)
    ids[0] = 0
    for i in range(1, len(ids)):
        rule = rng.random() < 0.9
        ids[i] = (5 * ids[i - 1] + 1) % VOCAB if rule else rng.integers(VOCAB)
    train, val = ids[:train_tokens], ids[train_tokens:]
    train.astype("<u2").tofile(root / "train.bin")
    val.astype("<u2").tofile(root / "val.bin")
    if meta:
        counts = np.bincount(train, minlength=VOCAB) / len(train)
        entropy = -sum(p * math.log(p) for p in counts if p > 0)
        info = {"dtype": "uint16", "unigram_entropy": entropy}
        if vocab_in_meta:
            info["vocab_size"] = VOCAB
        (root / "meta.json").write_text(json.dumps(info))
    return root


def lm_overrides(root: Path) -> list[str]:
    """A tiny GPT on the corpus at ``root``: 1 block of width 32, windows of 16 tokens."""
    return [
        "model=gpt",
        "dataset=tokens",
        f"dataset.root={root}",
        "model.n_layer=1",
        "model.n_head=2",
        "model.n_embd=32",
        "model.block_size=16",
        "dataset.tokens_per_epoch=1024",  # 8 steps of 8 windows of 16 tokens on one rank
        "dataset.eval_tokens=512",
        "train.batch_size=8",
        "optim=adamw",
        "optim.lr=3e-3",
        "scheduler=constant",
    ]
