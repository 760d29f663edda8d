"""The ``gpt`` workload of ``make bench-upstream``: the paper's GPT-2 recipe, shrunk to a CPU.

The paper's GPT-2 script wraps a tied-embedding GPT whose ``model(x, y)`` returns
``(logits, loss)``, and steps it with ``AccumAdamW`` on two param groups (weight
decay on the parameters with ``dim() >= 2`` only), ``accum_iter=8``, betas
``(0.9, 0.98)``, a linear warmup into a cosine schedule, a ``GradScaler`` and
global-norm clipping at 1.0, with ``bucket_size_in_mb=100``. This module builds
that workload for every implementation alike: the model is
:class:`experiments.models.gpt.GPT` (which imports no ``decent_dp``, so the 0.2.3
worker can use it too), sized so that a step takes tens of milliseconds on one
CPU core, and :func:`accum_adamw_fn` takes ``AccumAdamW`` from whichever
``decent_dp`` the worker imported, as the script does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from experiments.models.gpt import GPT, GPTConfig

__all__ = [
    "ACCUM_ITER",
    "BUCKET_MB",
    "CLIP_NORM",
    "GPT_BENCH",
    "accum_adamw_fn",
    "build",
    "cosine_fn",
    "param_groups",
    "token_batches",
]

GPT_BENCH = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=2048)
"""4 blocks of width 128, context 64, a 2048-token vocabulary: 1.05M parameters."""

ACCUM_ITER = 8
CLIP_NORM = 1.0
BUCKET_MB = 100  # as the paper's script passes it; the wrapper's default is 25
LR, BETAS, EPS, WEIGHT_DECAY = 6e-4, (0.9, 0.98), 1e-8, 0.1
WARMUP, TOTAL = 100, 100_000  # scheduler lengths; the benchmark stays inside the warmup


def build(config: GPTConfig = GPT_BENCH) -> GPT:
    """The benchmark's GPT, the same initial weights on every rank and in every job."""
    torch.manual_seed(0)
    return GPT(dataclasses.replace(config))


def token_batches(
    batch: int, config: GPTConfig = GPT_BENCH, seed: int = 0, n: int = 4
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` random ``(x, y)`` windows, ``y`` being ``x`` shifted by one token."""
    assert config.vocab_size is not None
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seq = torch.randint(0, config.vocab_size, (batch, config.block_size + 1), generator=gen)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def _tensors(pairs: list[Any]) -> list[torch.Tensor]:
    # 0.2.3 passes (name, tensor) pairs; a parameter list passes tensors
    return [a if isinstance(a, torch.Tensor) else b for a, b in pairs]


def param_groups(params: list[torch.Tensor], weight_decay: float) -> list[dict[str, Any]]:
    """The script's two groups: decay on matrices and embeddings, none on gains and biases."""
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def accum_adamw_fn(accum_iter: int = ACCUM_ITER) -> Callable[[list[Any]], torch.optim.Optimizer]:
    """An ``optim_fn`` building the script's ``AccumAdamW`` from the imported ``decent_dp``."""
    from decent_dp.optim import AccumAdamW  # this package's or 0.2.3's: the one being timed

    def optim_fn(pairs: list[Any]) -> torch.optim.Optimizer:
        groups = param_groups(_tensors(pairs), WEIGHT_DECAY)
        return AccumAdamW(
            groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, accum_iter=accum_iter
        )

    return optim_fn


def cosine_fn(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """The script's schedule: a linear warmup, then cosine annealing to a tenth of the rate."""
    warmup = torch.optim.lr_scheduler.LinearLR(opt, 1.0 / WARMUP, total_iters=WARMUP)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, TOTAL - WARMUP, eta_min=LR / 10)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[WARMUP])


def n_params(model: nn.Module) -> int:
    """Parameters counted once each (the tied embedding is one)."""
    return sum(p.numel() for p in model.parameters())
