"""Tests of experiments.data.schema: defaults by dataset, and every rule of check_dataset."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from experiments.data import DATASETS
from experiments.train.config import (
    ConfigError,
    DatasetName,
    check_dataset,
    dataset_section,
)
from tests.support.launch import CONF, compose_config


def test_every_dataset_has_a_schema_and_a_builder() -> None:
    from experiments.data.schema import SCHEMAS

    assert list(SCHEMAS) == list(DATASETS) == [d.value for d in DatasetName]


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "dataset").glob("*.yaml")))
def test_composed_options_and_bare_names_pass(option: str) -> None:
    check_dataset(compose_config(f"dataset={option}").dataset)
    check_dataset({"name": option})


def test_none_is_digits_with_its_defaults() -> None:
    section = dataset_section(None)
    assert section.name == "digits" and section.partition == "iid" and section.augment is False


def test_defaults_come_from_the_schema_of_the_name() -> None:
    assert dataset_section({"name": "cifar10"}).augment is True
    assert dataset_section({"name": "cifar100", "augment": None}).augment is True
    imagenet = dataset_section({"name": "imagenet"})
    assert (imagenet.augment, imagenet.num_workers, imagenet.image_size) == (True, 4, 224)
    synthetic = dataset_section({"name": "synthetic"})
    assert (synthetic.num_samples, synthetic.num_test_samples, synthetic.image_size) == (
        4096,
        None,
        32,
    )
    # a composed section keeps what its YAML says
    composed = dataset_section(compose_config("dataset=imagenet").dataset)
    assert composed.num_workers == 8


@pytest.mark.parametrize(
    ("section", "line"),
    [
        ({"name": "mnist"}, "dataset.name=mnist is invalid; it must be one of digits, cifar10"),
        ({"num_workers": -1}, "dataset.num_workers=-1 is invalid; it must be >= 0"),
        ({"partition": "shards"}, "dataset.partition=shards is invalid; it must be one of iid,"),
        (
            {"partition": "dirichlet", "alpha": 0},
            "dataset.alpha=0.0 is invalid; it must be > 0 (and finite) for the dirichlet",
        ),
        (
            {"partition": "dirichlet", "alpha": float("inf")},
            "dataset.alpha=inf is invalid; it must be > 0",
        ),
        ({"alpha": "much"}, "dataset.alpha=much is invalid; it must be a number"),
        ({"augment": "maybe"}, "dataset.augment=maybe is invalid; it must be true or false"),
        ({"image_size": 8}, "dataset.image_size is not a key of dataset=digits; it must be one"),
        (
            {"name": "imagenet", "image_size": 0},
            "dataset.image_size=0 is invalid; it must be an integer > 0",
        ),
        (
            {"name": "synthetic", "num_samples": 0},
            "dataset.num_samples=0 is invalid; it must be an integer > 0",
        ),
        (
            {"name": "synthetic", "num_test_samples": -2},
            "dataset.num_test_samples=-2 is invalid; it must be an integer > 0",
        ),
        (
            {"name": "synthetic", "num_test_samples": "few"},
            "dataset.num_test_samples=few is invalid; it must be an integer or null",
        ),
        (
            {"name": "synthetic", "num_classes": 0},
            "dataset.num_classes=0 is invalid; it must be an integer > 0",
        ),
        (
            {"name": "synthetic", "in_channels": 2.5},
            "dataset.in_channels=2.5 is invalid; it must be an integer",
        ),
    ],
)
def test_each_rule_rejects_with_one_line_naming_the_key(section: dict, line: str) -> None:
    for given in (section, OmegaConf.create(section)):
        with pytest.raises(ConfigError) as info:
            check_dataset(given)
        message = str(info.value)
        assert message.startswith(line) and "\n" not in message
    assert issubclass(ConfigError, ValueError)


def test_alpha_matters_only_for_the_dirichlet_partition() -> None:
    check_dataset({"partition": "iid", "alpha": 0})
    check_dataset({"partition": "dirichlet", "alpha": 1e-3})
