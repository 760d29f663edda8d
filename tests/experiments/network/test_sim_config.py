"""The simulator's numbers are read and checked as the training configs' are."""

from __future__ import annotations

import pytest

from experiments.network.sim_config import load_config, profiles, read_number
from experiments.schema import ConfigError


@pytest.mark.parametrize(
    ("cfg", "key", "bounds", "line"),
    [
        ({"n": 0}, "n", {"low": 1, "integer": True}, "n=0 is invalid; it must be an integer >= 1"),
        ({"n": 2.5}, "n", {"low": 1, "integer": True}, "n=2.5 is invalid; it must be an integer >= 1"),
        ({"r": 1.5}, "r", {"low": 0, "high": 1}, "r=1.5 is invalid; it must be a number in [0, 1]"),
        ({"r": float("inf")}, "r", {"low": 0}, "r=inf is invalid; it must be a number >= 0"),
        ({}, "r", {"low": 0}, "r=None is invalid; it must be a number >= 0"),
    ],
)  # fmt: skip
def test_read_number_refuses_with_the_schemas_line(cfg, key, bounds, line) -> None:
    with pytest.raises(ConfigError) as info:
        read_number(cfg, key, **bounds)
    assert str(info.value) == line


def test_read_number_returns_the_kind_asked_for() -> None:
    assert read_number({"n": 4.0}, "n", 1, integer=True) == 4
    assert type(read_number({"n": 4.0}, "n", 1, integer=True)) is int
    assert read_number({"r": 1}, "r", 0, 1) == 1.0


def test_compute_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"^compute_s=0 is invalid; it must be a number > 0$"):
        profiles(load_config(overrides=["compute_s=0"]))
