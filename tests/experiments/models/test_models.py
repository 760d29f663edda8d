"""Tests of experiments.models: every model trains a step, options, errors, digits accuracy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from experiments.data import build_data
from experiments.models import MODELS, build_model
from experiments.models.schema import LANGUAGE_MODELS
from experiments.models.vision import VISION_MODELS

# (config, in_channels, image_size, batch): small shapes keep the big models fast on CPU.
CASES = {
    "small_cnn": ({"name": "small_cnn"}, 1, 8, 4),
    "resnet18_cifar": ({"name": "resnet18_cifar"}, 3, 16, 2),
    "resnet50": ({"name": "resnet50"}, 3, 32, 2),
    "vit_small": ({"name": "vit_small", "depth": 2}, 3, 16, 2),
}


def _with_slow(names: dict, slow: str) -> list:
    """The names, ``slow`` marked for the slow suite."""
    return [pytest.param(n, marks=pytest.mark.slow) if n == slow else n for n in names]


def _forward_backward(model: nn.Module, x: torch.Tensor, num_classes: int) -> torch.Tensor:
    model.train()
    logits = model(x)
    assert logits.shape == (x.shape[0], num_classes)
    assert torch.isfinite(logits).all()
    F.cross_entropy(logits, torch.arange(x.shape[0]) % num_classes).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(param.grad).all()
    return logits


def test_every_model_has_a_case() -> None:
    assert set(CASES) == set(VISION_MODELS)
    assert set(MODELS) == set(VISION_MODELS) | LANGUAGE_MODELS


def test_gpt_through_build_model_takes_the_data_vocabulary() -> None:
    torch.manual_seed(0)
    model = build_model({"name": "gpt", "n_layer": 1, "block_size": 16}, vocab_size=50)
    idx = torch.randint(50, (2, 16))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 16, 50) and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="^vocab_size=None is invalid; it must be an integer > 0$"):
        build_model({"name": "gpt"})
    with pytest.raises(ValueError, match="^model.n_embd=100 is invalid; it must be divisible"):
        build_model({"name": "gpt", "n_embd": 100, "n_head": 3}, vocab_size=50)


# ResNet-50 (25M parameters) builds and trains a step with a 1-channel stem in
# test_other_channel_counts_and_sizes; with its own stem it runs in the slow suite
@pytest.mark.parametrize("name", _with_slow(CASES, "resnet50"))
def test_forward_backward_shapes(name: str) -> None:
    cfg, channels, size, batch = CASES[name]
    torch.manual_seed(0)
    model = build_model(cfg, num_classes=7, in_channels=channels, image_size=size)
    _forward_backward(model, torch.randn(batch, channels, size, size), 7)


@pytest.mark.parametrize("name", ["small_cnn", "resnet18_cifar", "resnet50"])
def test_other_channel_counts_and_sizes(name: str) -> None:
    model = build_model({"name": name}, num_classes=3, in_channels=1, image_size=12)
    _forward_backward(model, torch.randn(2, 1, 12, 12), 3)


def test_small_cnn_size_and_norm_options() -> None:
    model = build_model({"name": "small_cnn"}, num_classes=10, in_channels=1, image_size=8)
    assert 50_000 <= sum(p.numel() for p in model.parameters()) <= 100_000
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    assert not list(model.buffers())  # nothing outside the parameters to keep in sync
    bn = build_model(
        {"name": "small_cnn", "norm": "batch"}, num_classes=10, in_channels=1, image_size=8
    )
    assert any(isinstance(m, nn.BatchNorm2d) for m in bn.modules())
    with pytest.raises(
        ValueError, match="^model.norm=layer is invalid; it must be one of group, batch$"
    ):
        build_model(
            {"name": "small_cnn", "norm": "layer"}, num_classes=10, in_channels=1, image_size=8
        )


def test_resnet18_cifar_keeps_full_resolution_in_the_stem() -> None:
    model = build_model({"name": "resnet18_cifar"}, num_classes=10, in_channels=3, image_size=32)
    stem = model.conv1
    assert (stem.kernel_size, stem.stride) == ((3, 3), (1, 1))
    assert isinstance(model.maxpool, nn.Identity)
    features = {}
    model.layer1.register_forward_hook(lambda m, i, o: features.setdefault("layer1", o))
    model(torch.randn(1, 3, 32, 32))
    assert features["layer1"].shape[-2:] == (32, 32)


def test_vit_structure_and_defaults() -> None:
    vit = build_model({"name": "vit_small"}, num_classes=10, in_channels=3, image_size=32)
    blocks = [m for m in vit.modules() if isinstance(m, nn.MultiheadAttention)]
    assert len(blocks) == 6
    assert all(b.batch_first and b.embed_dim == 192 and b.num_heads == 3 for b in blocks)
    assert vit.pos_embed.shape == (1, (32 // 4) ** 2 + 1, 192)
    assert vit.blocks[0].mlp[0].out_features == 4 * 192
    custom = build_model(
        OmegaConf.create(
            {
                "name": "vit_small",
                "patch_size": 8,
                "dim": 64,
                "depth": 1,
                "heads": 4,
                "mlp_ratio": 2,
            }
        ),
        num_classes=5,
        in_channels=2,
        image_size=16,
    )
    assert custom.pos_embed.shape == (1, 5, 64)
    _forward_backward(custom, torch.randn(3, 2, 16, 16), 5)


def test_vit_depends_on_every_patch() -> None:
    vit = build_model(
        {"name": "vit_small", "dim": 32, "depth": 1, "heads": 2},
        num_classes=4,
        in_channels=3,
        image_size=8,
    )
    nn.init.normal_(vit.head.weight)  # the zero-initialised head would hide the dependence
    x = torch.randn(1, 3, 8, 8, requires_grad=True)
    vit(x).sum().backward()
    per_patch = x.grad.abs().reshape(3, 2, 4, 2, 4).sum(dim=(0, 2, 4))
    assert (per_patch > 0).all()


# build_model converts every model the same way: ResNet-18's blocks cover ResNet-50's
@pytest.mark.parametrize("name", _with_slow(CASES, "resnet50"))
def test_channels_last(name: str) -> None:
    cfg, channels, size, batch = CASES[name]
    model = build_model(
        {**cfg, "channels_last": True}, num_classes=4, in_channels=channels, image_size=size
    )
    convs = [m.weight for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    x = torch.randn(batch, channels, size, size).contiguous(memory_format=torch.channels_last)
    _forward_backward(model, x, 4)


def test_bad_configs_raise_value_errors() -> None:
    with pytest.raises(
        ValueError, match="^model.patch_size=5 is invalid; it must be a divisor of image_size=32$"
    ):
        build_model(
            {"name": "vit_small", "patch_size": 5}, num_classes=10, in_channels=3, image_size=32
        )
    with pytest.raises(
        ValueError, match="^model.dim=100 is invalid; it must be divisible by model.heads=3$"
    ):
        build_model({"name": "vit_small", "dim": 100}, num_classes=10, in_channels=3, image_size=32)
    with pytest.raises(
        ValueError, match="^model.name=resnet9 is invalid; it must be one of small_cnn,"
    ) as err:
        build_model({"name": "resnet9"}, num_classes=10, in_channels=3, image_size=32)
    assert all(name in str(err.value) for name in MODELS)
    with pytest.raises(ValueError, match="^num_classes=0 is invalid; it must be an integer > 0$"):
        build_model({"name": "small_cnn"}, num_classes=0, in_channels=1, image_size=8)


@pytest.mark.slow
def test_small_cnn_learns_digits() -> None:
    """SGD(lr 0.1, momentum 0.9), batch 32, 20 epochs: at least 95 % test accuracy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny kernels: extra threads only add overhead
    try:
        torch.manual_seed(0)
        data = build_data(
            {"name": "digits"},
            rank=0,
            world_size=1,
            batch_size=32,
            seed=0,
            device=torch.device("cpu"),
        )
        model = build_model(
            {"name": "small_cnn"},
            num_classes=data.num_classes,
            in_channels=data.in_channels,
            image_size=data.image_size,
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model.train()
        for epoch in range(20):
            for x, y in data.train.iterate(epoch):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                opt.step()
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in data.test)
        accuracy = correct / data.test.num_samples
    finally:
        torch.set_num_threads(threads)
    assert data.test.num_samples == 360
    assert accuracy >= 0.95, f"test accuracy {accuracy:.3f}"
