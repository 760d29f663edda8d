"""Command lines that must refuse bad arguments: the cases, and the status and message they end with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def bad_command_lines(*cases: tuple[list[str], str]) -> pytest.MarkDecorator:
    """Parametrize a test over ``(argv, needle)``: bad arguments and what their error must name."""
    ids = [" ".join(argv) for argv, _ in cases]
    return pytest.mark.parametrize(("argv", "needle"), list(cases), ids=ids)


def refusal(
    main: Callable[[list[str]], Any],
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    status: int,
) -> str:
    """The stderr of ``main(argv)``, asserted to end with exit ``status`` (returned or raised).

    argparse's own errors raise ``SystemExit(2)``; a command's checks after parsing
    may return their status instead: either way nothing else may happen first.
    """
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == status, err
    return err
