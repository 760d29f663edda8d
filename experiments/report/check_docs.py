"""``make check-docs``: every measured figure in the docs against the committed file it comes from.

Two kinds of figure are checked, on ``README.md`` and every ``docs/**/*.md``:

- **Generated blocks.** A table that comes from data sits between marker comments::

      <!-- data: wire-rates file=docs/results/network/table.json shape=4x1 rates=5mbit arms=ring -->
      | ... the table ... |
      <!-- /data -->

  The view (``wire-rates``) is a function of :mod:`experiments.report.doc_views` that reads its
  files and returns the block's text. ``--write`` rewrites every block from its data; the check
  regenerates each one in memory and reports every cell that differs.
- **Claims.** A figure in prose is tied to its data by a declared claim
  (:mod:`experiments.report.claims`): the page, a pattern whose groups capture the numbers as
  written, and for each group the value from its file with its rounding. A claim whose pattern no
  longer matches its page fails too, so that editing a sentence cannot silently drop its check.

Each problem is one line: the page and line, the figure as written, the value from the data and
the file it comes from. The exit status is 1 on any problem::

    python -m experiments.report.check_docs            # check (make check-docs)
    python -m experiments.report.check_docs --write    # regenerate the blocks, then check
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.report.claims import CLAIMS, Claim
from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views import VIEWS

ROOT = Path(__file__).resolve().parents[2]

_OPEN = re.compile(r"^<!-- data: (?P<view>[\w-]+)(?P<args>(?:\s+[\w-]+=\S*)*)\s*-->\s*$")
_CLOSE = "<!-- /data -->"


def pages(root: Path) -> list[Path]:
    """``README.md`` and every markdown page under ``docs/`` of ``root``."""
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    return found + sorted((root / "docs").rglob("*.md"))


def _args(text: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in text.split())


def render(view: str, args: dict[str, str], src: Source) -> str:
    """The text of a block of ``view`` with ``args``, read through ``src``."""
    if view not in VIEWS:
        raise DataError("-", f"unknown view '{view}' (known: {', '.join(sorted(VIEWS))})")
    try:
        return VIEWS[view](src, **args)
    except TypeError as err:
        raise DataError("-", f"view '{view}': {err}") from err


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _diff(page: str, first: int, written: list[str], wanted: list[str], files: str) -> list[str]:
    """One line per cell (or line) of a generated block that differs from the data."""
    if len(written) != len(wanted):
        return [
            f"{page}:{first}: the block has {len(written)} lines where {files} gives "
            f"{len(wanted)} (rerun with --write)"
        ]
    header: list[str] = []
    problems = []
    for offset, (have, want) in enumerate(zip(written, wanted, strict=True)):
        if want.startswith("|") and not header:
            header = _cells(want)
        if have == want:
            continue
        where = f"{page}:{first + offset}"
        a, b = _cells(have), _cells(want)
        if have.startswith("|") and len(a) == len(b):
            for col, (x, y) in enumerate(zip(a, b, strict=True)):
                if x != y:
                    column = header[col] if col < len(header) else str(col)
                    problems.append(
                        f"{where}: '{x}' (row '{b[0]}', column '{column}') but {files} gives '{y}'"
                    )
        else:
            problems.append(f"{where}: '{have}' but {files} gives '{want}'")
    return problems


def check_blocks(page: Path, rel: str, data_root: Path, write: bool = False) -> list[str]:
    """Problems of the generated blocks of ``page``; with ``write``, rewrite them first."""
    lines = page.read_text().split("\n")
    out: list[str] = []
    problems: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        opening = _OPEN.match(lines[i])
        if not opening:
            i += 1
            continue
        start = i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == _CLOSE), None)
        if end is None:
            problems.append(f"{rel}:{start + 1}: data block without its closing '{_CLOSE}'")
            i += 1
            continue
        written = lines[start + 1 : end]
        src = Source(data_root)
        try:
            wanted = render(opening["view"], _args(opening["args"]), src).split("\n")
        except DataError as err:
            problems.append(f"{rel}:{start + 1}: data block '{opening['view']}': {err}")
            out.extend(written)
        else:
            if write:
                written = wanted
            files = ", ".join(src.read)
            problems += _diff(rel, start + 2, written, wanted, files)
            out.extend(written)
        out.append(lines[end])
        i = end + 1
    if write:
        page.write_text("\n".join(out))
    return problems


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def check_claim(claim: Claim, text: str, data_root: Path) -> list[str]:
    """Problems of one claim on its page's ``text``."""
    matches = list(re.finditer(claim.pattern, text, flags=re.MULTILINE))
    if not matches:
        return [
            f"{claim.page}: the phrase /{claim.pattern}/ is not on the page "
            "(update its claim in experiments/report/claims/)"
        ]
    problems = []
    for match in matches:
        for group, value in enumerate(claim.values, start=1):
            src = Source(data_root)
            where = f"{claim.page}:{_line_of(text, match.start(group))}"
            try:
                wanted = value.fmt.format(value.fn(src))
            except DataError as err:
                problems.append(f"{where}: '{match[group]}': {err}")
                continue
            written = match[group].replace("\u2212", "-").replace(",", "")
            if written != wanted.replace(",", ""):
                problems.append(
                    f"{where}: '{match[group]}' in \"{match[0].strip()}\" but "
                    f"{', '.join(src.read)} gives '{wanted}'"
                )
    return problems


def check(
    root: Path = ROOT,
    data_root: Path | None = None,
    write: bool = False,
    claims: Sequence[Claim] = CLAIMS,
) -> list[str]:
    """Every problem of the pages under ``root`` against the data under ``data_root``.

    Claims of pages that ``root`` does not hold are skipped, so that a copy of one page can be
    checked alone.
    """
    data_root = data_root or root
    problems: list[str] = []
    texts: dict[str, str] = {}
    for page in pages(root):
        rel = page.relative_to(root).as_posix()
        problems += check_blocks(page, rel, data_root, write=write)
        texts[rel] = page.read_text()
    for claim in claims:
        if claim.page in texts:
            problems += check_claim(claim, texts[claim.page], data_root)
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Check (or with ``--write`` regenerate, then check) the docs; 1 on any problem."""
    parser = argparse.ArgumentParser(prog="python -m experiments.report.check_docs")
    parser.add_argument("--write", action="store_true", help="regenerate every data block")
    parser.add_argument("--root", type=Path, default=ROOT, help="where the pages are")
    parser.add_argument("--data-root", type=Path, default=None, help="where the data is")
    args = parser.parse_args(argv)
    problems = check(args.root, args.data_root, write=args.write)
    for problem in problems:
        print(problem, file=sys.stderr)
    n = len(pages(args.root))
    if problems:
        print(f"check-docs: {len(problems)} figure(s) differ from their data", file=sys.stderr)
        return 1
    print(f"check-docs: {n} pages, every generated block and claimed figure matches its data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
