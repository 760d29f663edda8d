"""A user's model by ``_target_``: the data's sizes filled in, checked on the meta device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from experiments.models import SmallCNN, build_model
from experiments.models.target import check_target_model
from experiments.schema import ConfigError

OWN = "tests.support.own_targets"
CNN = {"_target_": "experiments.models.vision.SmallCNN"}
DATA = {"num_classes": 10, "in_channels": 1, "image_size": 8}


def test_the_data_sizes_go_to_the_parameters_that_name_them() -> None:
    torch.manual_seed(0)
    model = build_model(CNN, **DATA)
    torch.manual_seed(0)
    reference = SmallCNN(num_classes=10, in_channels=1)
    # the same constructor with the same arguments draws the same weights
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_the_config_wins_over_the_data_and_channels_last_applies() -> None:
    model = build_model({**CNN, "num_classes": 3, "channels_last": True}, **DATA)
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 3)
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_a_language_model_gets_the_vocabulary_and_the_window() -> None:
    model = build_model({"_target_": f"{OWN}.TokenModel"}, vocab_size=16, block_size=8)
    assert model.block_size == 8 and model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 16)


def test_the_check_builds_on_the_meta_device_and_falls_back_to_the_cpu() -> None:
    check_target_model(CNN, DATA)
    check_target_model({"_target_": f"{OWN}.NeedsRealTensors"}, DATA)  # .item() needs real data
    with pytest.raises(ConfigError) as info:
        check_target_model({**CNN, "norm": "layer"}, DATA)
    assert "model._target_=experiments.models.vision.SmallCNN raised ConfigError" in str(info.value)
    assert "model.norm=layer is invalid" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("section", "values", "needles"),
    [
        ({**CNN, "norme": "group"}, DATA, ("model.norme=group is not an argument", "norm")),
        (
            CNN,
            {"image_size": 8},
            (
                "needs the argument num_classes, which the data does not give",
                "set model.num_classes",
            ),
        ),
        (
            {"_target_": f"{OWN}.NotAModule"},
            DATA,
            ("returned an object of type NotAModule", "torch.nn.Module"),
        ),
        ({"_target_": "experiments.models.vision.SmallCNNN"}, DATA, ("does not import",)),
    ],
)
def test_a_bad_model_is_one_line(section: dict, values: dict, needles: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        check_target_model(section, values)
    text = str(info.value)
    assert "\n" not in text and all(n in text for n in needles), text
