"""Tests of experiments.models.schema: defaults by model, and every rule of check_model."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from experiments.models import MODELS, SmallCNN, VisionTransformer
from experiments.train.config import ConfigError, ModelName, check_model, model_section
from tests.support.launch import CONF, compose_config


def test_every_model_has_a_schema_and_a_builder() -> None:
    from experiments.models.schema import SCHEMAS

    assert list(SCHEMAS) == list(MODELS) == [m.value for m in ModelName]


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
def test_composed_options_and_bare_names_pass(option: str) -> None:
    composed = compose_config(f"model={option}").model
    check_model(composed, image_size=32)
    # a preset (gpt_tiny, gpt2_124m) is a size of a named model; the name alone passes too
    check_model({"name": str(composed.name)}, image_size=32)


def test_gpt_presets_are_the_module_constants() -> None:
    from experiments.models.gpt import GPT2_124M, GPT_TINY

    for option, preset in (("gpt", GPT_TINY), ("gpt_tiny", GPT_TINY), ("gpt2_124m", GPT2_124M)):
        section = model_section(compose_config(f"model={option}").model)
        assert section.name == "gpt"
        for key in ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias", "compile"):
            assert section[key] == getattr(preset, key), (option, key)
    big = compose_config("model=gpt2_124m").model
    assert (big.vocab_size, big.block_size, big.bias, big.dropout) == (50304, 1024, False, 0.0)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("model.compile=fast", "model.compile=fast is invalid; it must be one of off, per_block"),
        ("model.n_head=3", "model.n_embd=128 is invalid; it must be divisible by model.n_head=3"),
        ("model.dropout=1.0", "model.dropout=1.0 is invalid"),
    ],
)
def test_gpt_rules_reject_a_composed_section(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_model(compose_config("model=gpt", override).model)
    assert str(info.value).startswith(needle) and "\n" not in str(info.value)


def test_defaults_come_from_the_schema_of_the_name() -> None:
    assert model_section(None).name == "small_cnn" and model_section(None).norm == "group"
    vit = model_section({"name": "vit_small", "depth": None})
    assert (vit.patch_size, vit.dim, vit.depth, vit.heads, vit.mlp_ratio) == (4, 192, 6, 3, 4.0)
    assert model_section({"name": "resnet50"}).channels_last is False


VIT = {"name": "vit_small"}


@pytest.mark.parametrize(
    ("section", "key", "allowed"),
    [
        (
            {"name": "resnet9"},
            "model.name=resnet9",
            "one of small_cnn, resnet18_cifar, resnet50, vit_small, gpt",
        ),
        ({"norm": "layer"}, "model.norm=layer", "one of group, batch"),
        ({"channels_last": "yes please"}, "model.channels_last=yes please", "true or false"),
        ({**VIT, "patch_size": 0}, "model.patch_size=0", "an integer > 0"),
        ({**VIT, "dim": -8}, "model.dim=-8", "an integer > 0"),
        ({**VIT, "depth": 0}, "model.depth=0", "an integer > 0"),
        ({**VIT, "heads": 0}, "model.heads=0", "an integer > 0"),
        ({**VIT, "heads": 1.5}, "model.heads=1.5", "an integer"),
        ({**VIT, "mlp_ratio": 0}, "model.mlp_ratio=0.0", "a number > 0"),
        ({**VIT, "dim": 100}, "model.dim=100", "divisible by model.heads=3"),
        ({**VIT, "patch_size": 5}, "model.patch_size=5", "a divisor of image_size=32"),
    ],
)
def test_each_rule_rejects_with_one_line_naming_the_key(section, key, allowed) -> None:
    for given in (section, OmegaConf.create(section)):
        with pytest.raises(ConfigError) as info:
            check_model(given, image_size=32)
        assert str(info.value) == f"{key} is invalid; it must be {allowed}"


def test_an_unknown_key_names_the_keys_of_the_model() -> None:
    with pytest.raises(ConfigError) as info:
        check_model({"name": "resnet50", "norm": "batch"})
    message = str(info.value)
    assert (
        message
        == "model.norm is not a key of model=resnet50; it must be one of name, channels_last"
    )


def test_the_image_size_is_checked_only_when_known() -> None:
    check_model({"name": "vit_small", "patch_size": 5})
    check_model({"name": "vit_small", "patch_size": 5}, image_size=35)


def test_the_model_classes_apply_the_same_checks() -> None:
    with pytest.raises(ConfigError, match="^model.norm=layer is invalid"):
        SmallCNN(10, norm="layer")
    with pytest.raises(ConfigError, match="^model.patch_size=3 is invalid"):
        VisionTransformer(10, 3, 32, patch_size=3)
    vit = VisionTransformer(10, 3, 12, patch_size=3, dim=16, depth=1, heads=2)
    assert vit(torch.zeros(1, 3, 12, 12)).shape == (1, 10)
