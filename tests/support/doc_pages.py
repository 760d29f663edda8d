"""Copies of the repository's pages to edit in a test, for the docs check's drift tests."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copy_page(tmp_path: Path, page: str) -> Path:
    """A copy of one page of the repository under ``tmp_path`` (the data stays in ROOT)."""
    target = tmp_path / page
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / page, target)
    return target


def edit_once(page: Path, old: str, new: str) -> int:
    """Replace the one occurrence of ``old``; the line number it is on."""
    text = page.read_text()
    assert text.count(old) == 1, old
    page.write_text(text.replace(old, new))
    return text[: text.index(old)].count("\n") + 1


def edit_span(page: Path, figure: str, new: str) -> tuple[int, str]:
    """Write ``new`` in the one span of ``figure`` on ``page``; its line and what it held."""
    text = page.read_text()
    opening = f"<!-- v:{figure} -->"
    assert text.count(opening) == 1, figure
    start = text.index(opening) + len(opening)
    end = text.index("<!-- /v -->", start)
    page.write_text(text[:start] + new + text[end:])
    return text[:start].count("\n") + 1, text[start:end]
