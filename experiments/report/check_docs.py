"""``make check-docs``: every measured figure in the docs against the committed file it comes from.

Three kinds of figure are checked, on ``README.md`` and every ``docs/**/*.md``:

- **Generated blocks.** A table that comes from data sits between marker comments::

      <!-- data: wire-rates file=docs/results/network/table.json shape=4x1 rates=5mbit arms=ring -->
      | ... the table ... |
      <!-- /data -->

  The view (``wire-rates``) is a function of :mod:`experiments.report.doc_views` that reads its
  files and returns the block's text. ``--write`` rewrites every block from its data; the check
  regenerates each one in memory and reports every cell that differs. The view ``figures``
  (``<!-- data: figures id=gap.batch -->``) is a table of :data:`~experiments.report.figures.TABLES`.
- **Spans.** A figure in prose is a span, ``<!-- v:gap.w32.gap.mean -->+0.194<!-- /v -->``, whose id
  names a :class:`~experiments.report.figures.Figure` of :data:`~experiments.report.figures.FIGURES`
  (its source and format). ``--write`` fills every span; the check regenerates and diffs them. An
  unknown id, a figure whose data is missing and a data file that does not parse each fail.
- **Pages written whole** by a command from committed data (a ``report.md`` of ``make report``,
  the wire study's ``table.md``, ...; :data:`experiments.report.whole_pages.PAGES`): each is
  written again in memory from its data and diffed line by line; ``--write`` rewrites it.

Each problem is one line: the page and line, the figure (its id for a span) as written, the value
from the data and the file it comes from. The exit status is 1 on any problem::

    python -m experiments.report.check_docs            # check (make check-docs)
    python -m experiments.report.check_docs --write    # regenerate the blocks and spans, then check
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.report.doc_data import DataError, Source
from experiments.report.doc_views import VIEWS
from experiments.report.figures import TABLES, figure, table
from experiments.report.whole_pages import check_page

ROOT = Path(__file__).resolve().parents[2]

_OPEN = re.compile(r"^<!-- data: (?P<view>[\w-]+)(?P<args>(?:\s+[\w-]+=\S*)*)\s*-->\s*$")
_CLOSE = "<!-- /data -->"
_SPAN = re.compile(r"<!-- v:(?P<id>[^ ]*) -->(?P<text>.*?)<!-- /v -->")
_CODE = re.compile(r"(`[^`]*`)")
_VIEWS = {**VIEWS, "figures": table}
_SLOT = re.compile(r"\{\{([\w.-]+)\}\}")


def pages(root: Path) -> list[Path]:
    """``README.md`` and every markdown page under ``docs/`` of ``root``."""
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    return found + sorted((root / "docs").rglob("*.md"))


def _args(text: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in text.split())


def render(view: str, args: dict[str, str], src: Source) -> str:
    """The text of a block of ``view`` with ``args``, read through ``src``."""
    if view not in _VIEWS:
        raise DataError("-", f"unknown view '{view}' (known: {', '.join(sorted(_VIEWS))})")
    try:
        return _VIEWS[view](src, **args)
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


def _slots(page: str, first: int, written: list[str], name: str, data_root: Path) -> list[str]:
    """One line per figure of table ``name`` that differs from its data, naming its own files."""
    template = TABLES[name].split("\n")
    if len(template) != len(written):
        return []
    header = _cells(template[0])
    problems = []
    for offset, (have, pattern) in enumerate(zip(written, template, strict=True)):
        parts = _SLOT.split(pattern)  # literal text and slot ids, in turn
        ids = parts[1::2]
        if not ids:
            continue
        shape = "".join(re.escape(p) if i % 2 == 0 else "(.*?)" for i, p in enumerate(parts))
        match = re.fullmatch(shape, have)
        if match is None:
            return []
        for slot, text in zip(ids, match.groups(), strict=True):
            src = Source(data_root)
            wanted = figure(src, slot)
            if text != wanted:
                start = pattern.index("{{" + slot + "}}")
                column = header[pattern[:start].count("|") - 1]
                problems.append(
                    f"{page}:{first + offset}: figure '{slot}' is '{text}' (row "
                    f"'{_cells(have)[0]}', column '{column}') but {', '.join(src.read)} gives "
                    f"'{wanted}'"
                )
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
            drift = _diff(rel, start + 2, written, wanted, files)
            if drift and opening["view"] == "figures":
                # a table of figures names each figure's own files, not the whole table's
                name = _args(opening["args"]).get("id", "")
                drift = _slots(rel, start + 2, written, name, data_root) or drift
            problems += drift
            out.extend(written)
        out.append(lines[end])
        i = end + 1
    if write:
        page.write_text("\n".join(out))
    return problems


def check_spans(page: Path, rel: str, data_root: Path, write: bool = False) -> list[str]:
    """Problems of the spans of ``page``; with ``write``, fill each from its data first."""
    lines = page.read_text().split("\n")
    problems: list[str] = []
    for number, line in enumerate(lines, start=1):

        def one(span: re.Match[str], number: int = number) -> str:
            src = Source(data_root)
            try:
                wanted = figure(src, span["id"])
            except DataError as err:
                problems.append(f"{rel}:{number}: figure '{span['id']}': {err}")
                return span[0]
            if span["text"] != wanted and not write:
                problems.append(
                    f"{rel}:{number}: figure '{span['id']}' is '{span['text']}' but "
                    f"{', '.join(src.read)} gives '{wanted}'"
                )
            return f"<!-- v:{span['id']} -->{wanted}<!-- /v -->"

        # a span shown as code (`<!-- v:ID -->`, in the guides) is text, not a figure
        parts = _CODE.split(line)
        parts[::2] = [_SPAN.sub(one, part) for part in parts[::2]]
        lines[number - 1] = "".join(parts)
        rest = "".join(_SPAN.sub("", part) for part in parts[::2])
        if "<!-- v:" in rest or "<!-- /v -->" in rest:
            problems.append(f"{rel}:{number}: a span without its closing '<!-- /v -->'")
    if write:
        page.write_text("\n".join(lines))
    return problems


def check(root: Path = ROOT, data_root: Path | None = None, write: bool = False) -> list[str]:
    """Every problem of the pages under ``root`` against the data under ``data_root``."""
    data_root = data_root or root
    problems: list[str] = []
    for page in pages(root):
        rel = page.relative_to(root).as_posix()
        problems += check_page(page, rel, data_root, write=write)
        problems += check_blocks(page, rel, data_root, write=write)
        problems += check_spans(page, rel, data_root, write=write)
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Check (or with ``--write`` regenerate, then check) the docs; 1 on any problem."""
    parser = argparse.ArgumentParser(prog="python -m experiments.report.check_docs")
    parser.add_argument("--write", action="store_true", help="regenerate every block and span")
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
    print(f"check-docs: {n} pages, every generated block, span and whole page matches its data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
