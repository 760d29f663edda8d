"""Tests of experiments.models.gpt: shapes, tied weights, causality, loss, init, counts, checks."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from experiments.models.gpt import (
    GPT,
    GPT2_124M,
    GPT_TINY,
    GPTConfig,
    apply_compile,
    build_gpt,
    check_gpt,
)

VOCAB = 23
SMALL = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=12, vocab_size=VOCAB)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Run on one thread: models this small gain nothing from more, and on a busy machine
    OpenMP threads waiting for each other make every tiny kernel take milliseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _small(**changes: object) -> GPT:
    torch.manual_seed(0)
    return GPT(dataclasses.replace(SMALL, **changes))  # type: ignore[arg-type]


def _tokens(batch: int, time: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, time), generator=torch.Generator().manual_seed(seed))


def test_shapes_with_and_without_targets() -> None:
    model = _small()
    idx = _tokens(3, 12)
    logits = model(idx)
    assert logits.shape == (3, 12, VOCAB)
    logits2, loss = model(idx, _tokens(3, 12, seed=2))
    assert logits2.shape == (3, 12, VOCAB)
    assert loss.shape == ()
    torch.testing.assert_close(logits2, logits, rtol=0, atol=0)
    assert model(idx[:, :5]).shape == (3, 5, VOCAB)


def test_longer_than_block_size_is_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"^sequence length 13 exceeds model.block_size=12$"):
        _small()(_tokens(1, 13))


def test_head_and_token_embedding_are_one_parameter() -> None:
    model = _small()
    assert model.head.weight is model.wte.weight
    # wte, wpe, six weights per block (two LayerNorms, qkv, proj, fc, proj), ln_f
    assert len(list(model.parameters())) == 2 + 6 * SMALL.n_layer + 1
    assert "head.weight" not in dict(model.named_parameters())


def test_tied_gradient_sums_embedding_and_head_and_a_step_moves_both() -> None:
    model = _small()
    untied = copy.deepcopy(model)
    untied.head.weight = nn.Parameter(untied.wte.weight.detach().clone())
    assert untied.head.weight is not untied.wte.weight
    idx, targets = _tokens(2, 12), _tokens(2, 12, seed=3)
    model(idx, targets)[1].backward()
    untied(idx, targets)[1].backward()
    assert untied.head.weight.grad is not None and untied.wte.weight.grad is not None
    expected = untied.head.weight.grad + untied.wte.weight.grad
    torch.testing.assert_close(model.wte.weight.grad, expected)
    # rows of tokens absent from idx only get the head's gradient: both uses reach the matrix
    absent = sorted(set(range(VOCAB)) - set(idx.flatten().tolist()))
    assert absent and model.wte.weight.grad[absent].abs().sum() > 0

    before = model.wte.weight.detach().clone()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(model.wte.weight, before)
    assert torch.equal(model.head.weight, model.wte.weight)
    x = model.ln_f(torch.randn(1, SMALL.n_embd))
    torch.testing.assert_close(model.head(x), x @ model.wte.weight.T)


@pytest.mark.parametrize("t", [0, 4, 10])
def test_changing_a_later_token_leaves_earlier_logits_unchanged(t: int) -> None:
    model = _small().eval()
    idx = _tokens(2, 12)
    changed = idx.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(idx), model(changed)
    assert torch.equal(before[:, : t + 1], after[:, : t + 1])
    assert not torch.equal(before[:, t + 1], after[:, t + 1])


def test_loss_is_cross_entropy_over_all_positions() -> None:
    model = _small()
    idx, targets = _tokens(3, 12), _tokens(3, 12, seed=4)
    logits, loss = model(idx, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1)))


def test_targets_of_minus_one_do_not_count() -> None:
    model = _small()
    idx, targets = _tokens(3, 12), _tokens(3, 12, seed=5)
    masked = targets.clone()
    masked[:, :7] = -1
    logits, loss = model(idx, masked)
    kept = F.cross_entropy(logits[:, 7:].reshape(-1, VOCAB), targets[:, 7:].reshape(-1))
    torch.testing.assert_close(loss, kept)
    assert not torch.allclose(loss, model(idx, targets)[1])


def test_gpt2_style_init_statistics() -> None:
    n_layer = 8
    model = _small(n_layer=n_layer, n_head=4, n_embd=256, bias=True)
    residual = 0.02 / math.sqrt(2 * n_layer)
    block = model.blocks[3]
    for weight, std in [
        (block.attn.proj.weight, residual),
        (block.mlp.proj.weight, residual),
        (block.attn.qkv.weight, 0.02),
        (block.mlp.fc.weight, 0.02),
        (model.wpe.weight, 0.02),
    ]:
        assert weight.mean().abs() < 0.1 * std
        assert weight.std().item() == pytest.approx(std, rel=0.03)
    for name, param in model.named_parameters():
        if name.endswith(".bias"):
            assert torch.count_nonzero(param) == 0, name
        elif "ln" in name:
            assert torch.equal(param, torch.ones_like(param)), name


@pytest.mark.parametrize("bias", [False, True])
def test_num_parameters_against_a_hand_count(bias: bool) -> None:
    vocab, width, layers, block_size = 11, 8, 3, 5  # those of config below
    config = GPTConfig(n_layer=3, n_head=2, n_embd=8, block_size=5, vocab_size=11, bias=bias)
    model = GPT(config)
    ln = width * (2 if bias else 1)
    # qkv (C x 3C), attention proj (C x C), fc (C x 4C), mlp proj (4C x C), two LayerNorms
    per_block = 12 * width * width + 2 * ln
    if bias:
        per_block += 3 * width + width + 4 * width + width
    embeddings = vocab * width + block_size * width
    total = embeddings + layers * per_block + ln
    assert model.num_parameters(non_embedding=False) == total
    assert model.num_parameters() == total - block_size * width
    assert model.flops_per_token() == 6 * (total - block_size * width)


def test_gpt2_124m_parameter_count_on_the_meta_device() -> None:
    with torch.device("meta"):
        model = GPT(GPT2_124M)
    assert model.wte.weight.is_meta
    width, vocab = 768, 50304
    total = model.num_parameters(non_embedding=False)
    assert total == 124_373_760
    assert model.num_parameters() == total - 1024 * width
    blocks = model.num_parameters() - vocab * width  # the tied head left out too
    assert blocks == 12 * (12 * width * width + 2 * width) + width
    assert 84e6 < blocks < 86e6
    assert model.flops_per_token() == 6 * model.num_parameters()


@pytest.mark.parametrize(
    ("key", "value", "extra"),
    [
        ("n_layer", 0, {}),
        ("n_head", -1, {}),
        ("n_embd", 0, {}),
        ("block_size", 0, {}),
        ("vocab_size", 0, {}),
        ("n_embd", 130, {"n_head": 4}),
        ("dropout", 1.0, {}),
        ("dropout", -0.1, {}),
        ("compile", "fast", {}),
        ("n_layer", "four", {}),
    ],
)
def test_check_gpt_rejects_each_bad_value_in_one_line(key: str, value: object, extra: dict) -> None:
    with pytest.raises(ValueError) as info:
        check_gpt({"name": "gpt", key: value, **extra})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"model.{key}={value} is invalid; it must be ")


def test_check_gpt_accepts_defaults_and_names_an_unknown_key() -> None:
    check_gpt(None)
    check_gpt(OmegaConf.structured(GPT2_124M))
    check_gpt({"dropout": 0.5, "compile": "whole", "vocab_size": None})
    with pytest.raises(ValueError, match=r"^model\.n_layers is not a key of model=gpt"):
        check_gpt({"n_layers": 2})


def test_build_gpt_takes_the_dataset_vocab_unless_the_section_sets_a_larger_one() -> None:
    model = build_gpt({"n_layer": 1}, vocab_size=50)
    assert isinstance(model, GPT)
    assert model.config.vocab_size == 50 and model.config.n_layer == 1
    assert model.config.n_embd == GPT_TINY.n_embd and model.config.block_size == 128
    padded = build_gpt(
        OmegaConf.create({"name": "gpt", "n_layer": 1, "vocab_size": 64}), vocab_size=50
    )
    assert padded.wte.weight.shape == (64, GPT_TINY.n_embd)
    with pytest.raises(ValueError, match=r"^model\.vocab_size=40 is invalid; it must be at least"):
        build_gpt({"vocab_size": 40}, vocab_size=50)
    with pytest.raises(ValueError, match=r"^vocab_size=0 is invalid"):
        build_gpt({}, vocab_size=0)


def test_build_gpt_builds_on_the_cpu() -> None:
    with torch.device("meta"):
        model = build_gpt({"n_layer": 1, "n_embd": 16, "n_head": 2}, vocab_size=10)
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_gpt_needs_a_vocab_size() -> None:
    with pytest.raises(ValueError, match=r"^model\.vocab_size=None is invalid"):
        GPT(GPT_TINY)


def test_tiny_model_overfits_one_batch() -> None:
    model = _small(n_embd=32)
    idx = _tokens(4, 13, seed=6)
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = model(x, y)[1].item()
    for _ in range(40):
        opt.zero_grad()
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
    assert first > 2.5  # about ln(23) at the start
    assert model(x, y)[1].item() < 0.2


def test_apply_compile_off_and_whole_and_a_bad_mode() -> None:
    model = _small()
    assert apply_compile(model, "off") is model
    whole = apply_compile(model, "whole")
    assert whole is not model and getattr(whole, "_orig_mod", None) is model
    with pytest.raises(ValueError, match=r"^model\.compile=eager is invalid"):
        apply_compile(model, "eager")


@pytest.mark.slow
def test_per_block_compile_matches_eager_on_cpu() -> None:
    eager = _small()
    compiled = copy.deepcopy(eager)
    assert apply_compile(compiled, "per_block") is compiled
    idx, targets = _tokens(2, 12), _tokens(2, 12, seed=7)
    logits, loss = eager(idx, targets)
    logits_c, loss_c = compiled(idx, targets)
    torch.testing.assert_close(logits_c, logits)
    torch.testing.assert_close(loss_c, loss)
    loss.backward()
    loss_c.backward()
    for (name, p), p_c in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(p_c.grad, p.grad, msg=name)
