"""The plain options of the benches' command lines, declared by their defaults.

Most of a bench's options are a number or a name with a default and nothing to
explain (``--steps``, ``--hosts``, ``--timeout-s``, a model's sizes): each is
``--some-name`` of keyword ``some_name``, taking values of its default's type.
Options with help text, choices or a ``Path`` stay ``parser.add_argument`` calls.
"""

from __future__ import annotations

import argparse

__all__ = ["add_options"]


def add_options(parser: argparse.ArgumentParser, **defaults: int | float | str) -> None:
    """Add ``--some-name`` to ``parser`` for each keyword ``some_name``, in order.

    Args:
        parser: The parser (or a subcommand's).
        **defaults: Each option's default: an ``int`` makes an option of integers, a
            ``float`` one of floats, a ``str`` one of strings.

    Raises:
        TypeError: A default of another type (``bool`` included: use ``store_true``).

    Example::

        add_options(parser, hosts=4, steps=60, timeout_s=20.0)  # --hosts --steps --timeout-s
    """
    for name, default in defaults.items():
        if isinstance(default, bool) or not isinstance(default, (int, float, str)):
            raise TypeError(f"{name}={default!r}: a plain option's default is an int, float or str")
        kind = None if isinstance(default, str) else type(default)
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=default)
