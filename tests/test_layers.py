"""The layers of docs/architecture.md, checked on the source: library, framework, entry points.

- ``decent_dp`` imports the standard library, torch and itself, nothing else.
- ``experiments`` may import ``decent_dp`` and third-party packages, never an entry
  point (``train.py``) or the tests.
- Nothing below the tests imports ``tests``.

Imports are read with :mod:`ast`, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY_ALLOWED = {"torch", "decent_dp"}


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every absolute import in a file (relative imports stay inside)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _forbidden_in_library(roots: set[str]) -> set[str]:
    return {r for r in roots if r not in LIBRARY_ALLOWED and r not in sys.stdlib_module_names}


@pytest.mark.parametrize("path", _sources("decent_dp"), ids=lambda p: p.name)
def test_the_library_imports_torch_and_the_standard_library_only(path: Path) -> None:
    assert _forbidden_in_library(imported_roots(path)) == set(), path


@pytest.mark.parametrize("path", _sources("experiments"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_framework_never_imports_upward(path: Path) -> None:
    assert imported_roots(path) & {"train", "tests"} == set(), path


def test_the_checks_catch_a_wrong_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os\nimport torch.nn\nfrom . import sibling\n"
        "def later():\n    import hydra\n    from experiments.train import run\n"
    )
    roots = imported_roots(bad)
    assert roots == {"os", "torch", "hydra", "experiments"}
    assert _forbidden_in_library(roots) == {"hydra", "experiments"}
