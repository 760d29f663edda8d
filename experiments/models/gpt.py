"""A decoder-only GPT language model, the ``model=gpt`` of language-model pretraining.

The model, from the tokens in to the loss out::

    idx (B, T) token ids, T <= block_size
      -> wte(idx) + wpe(0..T-1)          token and learned position embeddings, (B, T, C)
      -> dropout
      -> n_layer x Block                 pre-LayerNorm residual blocks:
             x = x + attn(ln_1(x))         causal multi-head self-attention
             x = x + mlp(ln_2(x))          Linear(C, 4C) -> GELU -> Linear(4C, C)
      -> ln_f                            a final LayerNorm
      -> head                            Linear(C, vocab_size), its weight IS wte's
    logits (B, T, vocab_size); with targets also the mean cross-entropy over all positions

``C`` is ``n_embd``. Attention runs through
``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``, so position
``t`` sees positions ``0..t`` only and PyTorch picks the fastest kernel (flash, memory
efficient or plain) for the device. The output head shares its weight with the token
embedding (weight tying): one ``(vocab_size, C)`` matrix both reads tokens in and scores
them out, which saves ``vocab_size * C`` parameters (38.6M of GPT-2's 124M).

Initialisation follows GPT-2: every Linear and Embedding weight is drawn from
``normal(0, 0.02)``, biases are zero, LayerNorms start as the identity (weight 1, bias 0),
and the two projections that write into the residual stream in each block (attention's
``proj`` and the MLP's ``proj``) are drawn from ``normal(0, 0.02 / sqrt(2 * n_layer))``:
the residual stream sums ``2 * n_layer`` of them, and the smaller scale keeps its variance
at the start independent of the depth.

Sizes. :data:`GPT_TINY` is the CPU default (0.8M parameters in the blocks) and
:data:`GPT2_124M` is the GPT-2 small recipe (12 layers, 12 heads, width 768, context 1024,
vocabulary 50304: GPT-2's 50257 rounded up to a multiple of 64 for faster matrix
multiplies). :meth:`GPT.num_parameters` counts the parameters; :meth:`GPT.flops_per_token`
is the numerator of the model-FLOPs-utilisation (MFU) estimate.

Compilation (``compile``). ``off`` runs eagerly. ``per_block`` compiles each block in place
(``block.compile()``): the parameters stay those of the uncompiled module and their
gradients still arrive block by block during backward, so the gradient hooks of
``decent_dp``'s wrapper fire as in eager mode and its gossip keeps overlapping the backward
pass. ``whole`` wraps the whole model in ``torch.compile``, which may fuse more but lets the
compiled backward deliver gradients in its own order.

The ``model=gpt`` section. :class:`GPTConfig` is its schema; :func:`check_gpt` checks the
values a type cannot express and :func:`build_gpt` builds the model from the section,
taking ``vocab_size`` from the dataset unless the section sets one.

Example::

    model = build_gpt({"name": "gpt", "n_layer": 2}, vocab_size=256)
    idx = torch.randint(256, (4, 64))
    logits = model(idx)  # (4, 64, 256)
    _, loss = model(idx[:, :-1], idx[:, 1:])  # next-token loss, as the paper's scripts use it
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from experiments.schema import is_int, require, typed_section

__all__ = [
    "COMPILE_MODES",
    "GPTConfig",
    "GPT_TINY",
    "GPT2_124M",
    "GPT",
    "check_gpt",
    "gpt_section",
    "apply_compile",
    "build_gpt",
]

COMPILE_MODES = ("off", "per_block", "whole")
"""The values of ``model.compile``, see :func:`apply_compile`."""
_ONE_OF_MODES = "one of " + ", ".join(COMPILE_MODES)


@dataclass
class GPTConfig:
    """``model=gpt``: the shape of a decoder-only Transformer language model.

    Attributes:
        name: The model's registered name.
        n_layer: Number of Transformer blocks.
        n_head: Attention heads per block; must divide ``n_embd``.
        n_embd: Width of the residual stream (the embedding size).
        block_size: Longest sequence (context length) the model accepts; the number of
            learned positions.
        vocab_size: Number of token ids; ``None`` takes the dataset's. A larger value (a
            multiple of 64, say) pads the embedding with ids that never occur.
        dropout: Dropout probability after the embeddings, on the attention weights and on
            each residual branch; ``0.0`` for pretraining.
        bias: Whether the Linear layers and LayerNorms have biases (GPT-2 had them).
        compile: ``off``, ``per_block`` or ``whole`` (see :func:`apply_compile`).
    """

    name: str = "gpt"
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    vocab_size: int | None = None
    dropout: float = 0.0
    bias: bool = False
    compile: str = "off"


GPT_TINY = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=128)
"""The CPU default: 4 blocks of width 128, context 128 (the defaults of :class:`GPTConfig`).

Module constants are shared: ``dataclasses.replace(GPT_TINY, ...)`` makes a changed copy.
"""

GPT2_124M = GPTConfig(
    n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, dropout=0.0, bias=False
)
"""GPT-2 small: 124.4M parameters with the (tied) embeddings, 85.0M in the 12 blocks."""


def gpt_section(section: Mapping[str, Any] | DictConfig | None) -> DictConfig:
    """The ``model=gpt`` section with :class:`GPTConfig`'s defaults filled in, checked.

    Args:
        section: A dict, a ``DictConfig`` or ``None`` (all defaults). Keys left out, or
            null, take :class:`GPTConfig`'s defaults.

    Returns:
        A ``DictConfig`` of :class:`GPTConfig`.

    Raises:
        ValueError: A one-line ``"model.<key>=<value> is invalid; it must be <allowed>"``
            (a :class:`~experiments.train.config.ConfigError`) for an unknown key, a value
            of the wrong type, a size that is not positive, ``n_embd`` not divisible by
            ``n_head``, ``dropout`` outside ``[0, 1)`` or an unknown ``compile`` mode.
    """
    m = typed_section(section, "model", {"gpt": GPTConfig}, default="gpt")
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        require(f"model.{key}", m[key], m[key] > 0, "an integer > 0")
    if m.vocab_size is not None:
        require("model.vocab_size", m.vocab_size, m.vocab_size > 0, "an integer > 0 or null")
    divisible = f"divisible by model.n_head={m.n_head}"
    require("model.n_embd", m.n_embd, m.n_embd % m.n_head == 0, divisible)
    require("model.dropout", m.dropout, 0.0 <= m.dropout < 1.0, "a number in [0, 1)")
    require("model.compile", m.compile, m.compile in COMPILE_MODES, _ONE_OF_MODES)
    return m


def check_gpt(section: Mapping[str, Any] | DictConfig | None) -> None:
    """Check the ``model=gpt`` section's values beyond their types.

    Args:
        section: A dict or ``DictConfig``; left-out keys take :class:`GPTConfig`'s defaults.

    Raises:
        ValueError: One line naming the key, the bad value and what is allowed (see
            :func:`gpt_section`).
    """
    gpt_section(section)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position ``t`` attends to positions ``<= t``.

    One Linear computes the queries, keys and values of all heads at once; another (the
    residual projection, ``proj``) mixes the heads' outputs back into the residual stream.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(B, T, C)`` to ``(B, T, C)``."""
        batch, time, width = x.shape
        # (B, T, 3C) -> three (B, n_head, T, C / n_head), the layout SDPA expects
        q, k, v = (
            t.view(batch, time, self.n_head, width // self.n_head).transpose(1, 2)
            for t in self.qkv(x).split(width, dim=2)
        )
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(batch, time, width)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    """The position-wise feed-forward branch: ``Linear(C, 4C) -> GELU -> Linear(4C, C)``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(B, T, C)`` to ``(B, T, C)``."""
        return self.dropout(self.proj(self.gelu(self.fc(x))))


class Block(nn.Module):
    """A pre-LayerNorm Transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(B, T, C)`` to ``(B, T, C)``."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A decoder-only Transformer language model with tied input and output embeddings.

    See the module's docstring for the architecture and the initialisation.

    Args:
        config: The model's shape; ``config.vocab_size`` must be set.

    Raises:
        ValueError: One line naming the key, if ``config`` does not pass :func:`check_gpt`
            or its ``vocab_size`` is ``None``.

    Example::

        model = GPT(dataclasses.replace(GPT_TINY, vocab_size=256))
        x = torch.randint(256, (8, 129))
        logits, loss = model(x[:, :-1], x[:, 1:])  # (8, 128, 256), a scalar
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        check_gpt(vars(config))
        vocab = config.vocab_size
        require("model.vocab_size", vocab, vocab is not None, "an integer > 0 (the dataset's)")
        assert vocab is not None  # for mypy; require() raised otherwise
        self.config = config
        self.wte = nn.Embedding(vocab, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.head = nn.Linear(config.n_embd, vocab, bias=False)
        # One Parameter for both: the optimizer, the gossip and the checkpoint see it once.
        self.head.weight = self.wte.weight
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for module in self.modules():
            if isinstance(module, (CausalSelfAttention, MLP)):
                nn.init.normal_(module.proj.weight, mean=0.0, std=residual_std)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Score every next token of a batch of sequences.

        Args:
            idx: Token ids, ``(B, T)`` with ``T <= block_size``.
            targets: The ids to predict at every position, ``(B, T)`` (usually ``idx``
                shifted left by one); ``-1`` marks a position that does not count.

        Returns:
            The logits ``(B, T, vocab_size)`` when ``targets`` is ``None``; otherwise
            ``(logits, loss)``, the loss being the mean cross-entropy over all positions
            whose target is not ``-1``.

        Raises:
            ValueError: If ``T`` exceeds ``block_size``.
        """
        time = idx.shape[1]
        if time > self.config.block_size:
            raise ValueError(
                f"sequence length {time} exceeds model.block_size={self.config.block_size}"
            )
        pos = torch.arange(time, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1
        )
        return logits, loss

    def num_parameters(self, non_embedding: bool = True) -> int:
        """The number of parameters, each tensor counted once.

        The tied ``(vocab_size, n_embd)`` matrix is one parameter and is counted once, as
        the output head: unlike a lookup it is a matrix multiply at every position, so it
        belongs to the model's compute.

        Args:
            non_embedding: Leave out the position embedding (``block_size * n_embd``), a
                lookup that costs no multiply.

        Returns:
            The count; for :data:`GPT2_124M` 124.4M in all, 123.6M without the position
            embedding: 85.0M in the blocks and the final LayerNorm, 38.6M in the tied head.
        """
        total = sum(p.numel() for p in self.parameters())
        return total - self.wpe.weight.numel() if non_embedding else total

    def flops_per_token(self) -> int:
        """Floating-point operations of one training step per token: ``6 * N``.

        ``N`` is :meth:`num_parameters` (``non_embedding=True``). Each parameter costs one
        multiply and one add per token in the forward pass and twice that in the backward
        pass (gradients of the inputs and of the weights): 2 + 4 = 6 FLOPs. This is the
        numerator of the MFU estimate (``flops_per_token * tokens_per_s / peak_flops``).
        It leaves out the attention scores and their weighted sum (``12 * n_layer *
        n_embd * T`` per token), about 15% on top for GPT-2 at ``T = 1024``.

        Returns:
            ``6 * N``.
        """
        return 6 * self.num_parameters(non_embedding=True)


def apply_compile(model: GPT, mode: str) -> nn.Module:
    """Compile ``model`` as ``model.compile`` says.

    Args:
        model: The model (``per_block`` needs its ``blocks``).
        mode: ``off`` returns ``model`` unchanged; ``per_block`` compiles each block in place
            with ``block.compile()`` and returns ``model``, whose gradients still arrive
            block by block so the wrapper's gossip overlaps backward; ``whole`` returns
            ``torch.compile(model)``. Both compile for static shapes (``dynamic=False``):
            otherwise the kernels a step runs would depend on the shapes seen before it
            (an evaluation's batch makes the next compile dynamic), and a resumed run,
            which has not seen them, would not repeat the straight run bit for bit.

    Returns:
        The model to train.

    Raises:
        ValueError: If ``mode`` is not one of :data:`COMPILE_MODES`.
    """
    require("model.compile", mode, mode in COMPILE_MODES, _ONE_OF_MODES)
    if mode == "per_block":
        for block in model.blocks:
            block.compile(dynamic=False)
    elif mode == "whole":
        return torch.compile(model, dynamic=False)  # type: ignore[return-value]
    return model


def build_gpt(section: Mapping[str, Any] | DictConfig | None, *, vocab_size: int) -> nn.Module:
    """Build the ``model=gpt`` model on the CPU, compiled as the section says.

    Args:
        section: The ``model`` section (a dict or ``DictConfig``); left-out keys take
            :class:`GPTConfig`'s defaults.
        vocab_size: The dataset's vocabulary size, taken unless the section sets
            ``vocab_size``, which must then be at least as large.

    Returns:
        The freshly initialised model (after :func:`apply_compile`).

    Raises:
        ValueError: One line naming the key, if the section does not pass
            :func:`check_gpt`, ``vocab_size`` is not a positive integer or the section's
            ``vocab_size`` is smaller than the dataset's.
    """
    require("vocab_size", vocab_size, is_int(vocab_size) and vocab_size > 0, "an integer > 0")
    m = gpt_section(section)
    if m.vocab_size is None:
        m.vocab_size = int(vocab_size)
    at_least = f"at least the dataset's vocab_size={vocab_size}"
    require("model.vocab_size", m.vocab_size, m.vocab_size >= vocab_size, at_least)
    config = OmegaConf.to_object(m)
    assert isinstance(config, GPTConfig)
    with torch.device("cpu"):
        model = GPT(config)
    return apply_compile(model, config.compile)
