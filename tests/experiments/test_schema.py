"""The pieces every schema builds on: require_number's words, and a section checked by its dataclass."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from experiments.schema import ConfigError, require_number, schema_section


@pytest.mark.parametrize(
    ("value", "bounds", "allowed"),
    [
        (0, {"above": 0, "kind": "integer"}, "an integer > 0"),
        (2.5, {"above": 0, "kind": "integer"}, "an integer > 0"),
        (-1, {"at_least": 0}, ">= 0"),
        (1.0, {"at_least": 0, "below": 1}, "in [0, 1)"),
        (0.0, {"above": 0, "at_most": 1}, "in (0, 1]"),
        (float("inf"), {"above": 0, "kind": "number"}, "a number > 0"),
        (float("nan"), {"at_least": 0}, ">= 0"),
        (0, {"at_least": 1, "nullable": True}, ">= 1 or null"),
        (-2, {"at_least": 0, "note": "0 = off"}, ">= 0 (0 = off)"),
        (True, {"at_least": 0}, ">= 0"),
        ("3", {"at_least": 0}, ">= 0"),
        (None, {"at_least": 0}, ">= 0"),
        (5, {"at_most": 4}, "<= 4"),
    ],
)
def test_require_number_refuses_in_one_line(value, bounds, allowed) -> None:
    with pytest.raises(ConfigError) as info:
        require_number("group.key", value, **bounds)
    assert str(info.value) == f"group.key={value} is invalid; it must be {allowed}"


def test_require_number_accepts_what_it_names() -> None:
    require_number("k", 3, above=0, kind="integer")
    require_number("k", 3.0, above=0, kind="integer")  # a whole number
    require_number("k", None, at_least=1, nullable=True)
    require_number("k", 0.5, above=0, at_most=1)
    require_number("k", float("inf"), above=0)  # only kind="number" asks for finite


@dataclass
class _Pair:
    low: int = 0
    high: int = 1

    def __post_init__(self) -> None:
        require_number("pair.low", self.low, at_least=0)
        if self.high <= self.low:
            raise ConfigError(f"pair.high={self.high} is invalid; it must be > pair.low")


def test_a_section_is_checked_by_its_dataclass_where_it_is_typed() -> None:
    assert schema_section({"high": 5}, "pair", _Pair, "pair").high == 5
    with pytest.raises(ConfigError, match=r"^pair.low=-1 is invalid; it must be >= 0$"):
        schema_section({"low": -1}, "pair", _Pair, "pair")
    with pytest.raises(ConfigError, match=r"^pair.high=0 is invalid; it must be > pair.low$"):
        schema_section({"low": 2, "high": 0}, "pair", _Pair, "pair")
    with pytest.raises(ConfigError, match=r"^pair.width is not a key of pair; it must be one"):
        schema_section({"width": 1}, "pair", _Pair, "pair")
    with pytest.raises(ConfigError, match=r"^pair.low=x is invalid; it must be an integer$"):
        schema_section({"low": "x"}, "pair", _Pair, "pair")
