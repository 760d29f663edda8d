"""The benches' plain options: one ``--name`` per keyword, typed by its default."""

from __future__ import annotations

import argparse

import pytest

from experiments.bench.options import add_options


def test_each_keyword_is_an_option_of_its_defaults_type() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, hosts=4, timeout_s=20.0, topology="ring")
    assert vars(parser.parse_args([])) == {"hosts": 4, "timeout_s": 20.0, "topology": "ring"}
    args = parser.parse_args(["--hosts", "8", "--timeout-s", "5", "--topology", "complete"])
    assert (args.hosts, args.timeout_s, args.topology) == (8, 5.0, "complete")
    assert isinstance(args.timeout_s, float)
    with pytest.raises(SystemExit):
        parser.parse_args(["--hosts", "four"])


@pytest.mark.parametrize("default", [True, None, [1, 2]])
def test_a_default_of_another_type_is_refused(default: object) -> None:
    with pytest.raises(TypeError, match="a plain option's default is an int, float or str"):
        add_options(argparse.ArgumentParser(), flag=default)  # type: ignore[arg-type]
