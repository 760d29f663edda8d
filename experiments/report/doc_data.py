"""The committed measurement files that the docs' figures come from, read for ``check_docs``.

A :class:`Source` reads files under the repository root and remembers which ones it read, so
that a figure that differs from its data can name the file it came from. Anything missing (a
file, a key, a row of a table) raises :class:`DataError` naming the file and what was missing.

The helpers read the formats the project commits:
- ``table.json`` of the wire study (a list of rows keyed by model, shape, rate and arm);
- a folder of seeded runs, one ``summary.json`` per seed (``tune.sh``'s ``final/``);
- any JSON file by a dotted key path (``rows.0.median_step_s``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


class DataError(Exception):
    """A figure's data is missing: ``file`` (relative to the root) and why."""

    def __init__(self, file: str, why: str) -> None:
        super().__init__(f"{file}: {why}")
        self.file = file
        self.why = why


def _parse(root: Path, path: Path) -> Any:
    """The JSON of ``path``; a file that does not parse is a :class:`DataError` naming it."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(str(path.relative_to(root)), f"not JSON ({err})") from err


class Source:
    """Reads committed data files under ``root`` and records which ones were read."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.read: list[str] = []
        self._cache: dict[str, Any] = {}

    def _note(self, rel: str) -> None:
        if rel not in self.read:
            self.read.append(rel)

    def json(self, rel: str) -> Any:
        """The parsed JSON file ``rel``."""
        self._note(rel)
        if rel not in self._cache:
            path = self.root / rel
            if not path.is_file():
                raise DataError(rel, "no such file")
            try:
                self._cache[rel] = json.loads(path.read_text())
            except json.JSONDecodeError as err:
                raise DataError(rel, f"not JSON ({err})") from err
        return self._cache[rel]

    def key(self, rel: str, path: str) -> Any:
        """The value at the dotted ``path`` of JSON file ``rel`` (list indices as numbers)."""
        value = self.json(rel)
        for part in path.split("."):
            if (
                isinstance(value, list)
                and part.lstrip("-").isdigit()
                and -len(value) <= int(part) < len(value)
            ):
                value = value[int(part)]
            elif isinstance(value, dict) and part in value:
                value = value[part]
            else:
                raise DataError(rel, f"no key '{path}' (stops at '{part}')")
        return value

    def row(self, rel: str, **match: Any) -> dict[str, Any]:
        """The one row of a list-of-rows JSON file whose fields equal ``match``."""
        rows = self.json(rel)
        if not isinstance(rows, list):
            raise DataError(rel, "not a list of rows")
        found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
        wanted = " ".join(f"{k}={v}" for k, v in match.items())
        if not found:
            raise DataError(rel, f"no row {wanted}")
        if len(found) > 1:
            raise DataError(rel, f"{len(found)} rows {wanted}")
        return found[0]

    def wire(
        self, rel: str, shape: str, rate: str, arm: str, field: str = "samples_per_s"
    ) -> float:
        """A field of the wire study's row for digits at ``shape`` (``"4x1"``), ``rate``, ``arm``."""
        hosts, _, procs = shape.partition("x")
        row = self.row(
            rel, model="digits", hosts=int(hosts), procs_per_host=int(procs), rate=rate, arm=arm
        )
        value = row.get(field)
        if value is None:
            raise DataError(rel, f"no '{field}' in the row {shape} {rate} {arm}")
        return float(value)

    def seeds(self, rel_dir: str, key: str = "eval/loss") -> list[float]:
        """``key`` of each seed's ``summary.json``, in the order of the folders' names.

        ``rel_dir`` is a folder of one folder per seed (``.../final``), or a glob of the seed
        folders themselves (``.../ring_int8_seed*``).
        """
        pattern = rel_dir + "/summary.json" if "*" in rel_dir else rel_dir + "/*/summary.json"
        files = sorted(self.root.glob(pattern))
        self._note(rel_dir)
        if not files:
            raise DataError(rel_dir, "no run (summary.json) there")
        values = []
        for file in files:
            summary = _parse(self.root, file)
            if summary.get(key) is None:
                raise DataError(str(file.relative_to(self.root)), f"no key '{key}'")
            values.append(float(summary[key]))
        return values

    def text(self, rel: str) -> str:
        """The text of file ``rel``."""
        self._note(rel)
        path = self.root / rel
        if not path.is_file():
            raise DataError(rel, "no such file")
        return path.read_text()

    def jsonl(self, rel: str) -> list[Any]:
        """The records of the JSON-lines file ``rel``."""
        try:
            return [json.loads(line) for line in self.text(rel).splitlines() if line.strip()]
        except json.JSONDecodeError as err:
            raise DataError(rel, f"not JSON lines ({err})") from err

    def md_rows(self, rel: str) -> list[dict[str, str]]:
        """The rows of the first markdown table of ``rel``, each a map of header to cell."""
        self._note(rel)
        path = self.root / rel
        if not path.is_file():
            raise DataError(rel, "no such file")
        lines = [line.strip() for line in path.read_text().splitlines()]
        start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
        if start is None:
            raise DataError(rel, "no table")
        header = [c.strip() for c in lines[start].strip("|").split("|")]
        rows = []
        for line in lines[start + 2 :]:
            if not line.startswith("|"):
                break
            rows.append(
                dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=False))
            )
        return rows

    def md_cell(self, rel: str, column: str, **match: str) -> str:
        """The ``column`` cell of the one row of ``rel``'s table whose cells equal ``match``."""
        found = [r for r in self.md_rows(rel) if all(r.get(k) == v for k, v in match.items())]
        wanted = " ".join(f"{k}={v}" for k, v in match.items())
        if len(found) != 1:
            raise DataError(rel, f"{len(found)} rows {wanted}")
        if column not in found[0]:
            raise DataError(rel, f"no column '{column}'")
        return found[0][column]

    def run(self, rel_dir: str, key: str = "eval/loss") -> float:
        """``key`` of one run's ``summary.json`` (``rel_dir`` is the run's folder)."""
        rel = f"{rel_dir}/summary.json"
        value = self.json(rel).get(key)
        if value is None:
            raise DataError(rel, f"no key '{key}'")
        return float(value)

    def at(self, rel_dir: str, key: str, value: float, metric: str = "eval/loss") -> float:
        """``metric`` of the one run in ``rel_dir``'s folders whose override ``key`` is ``value``."""
        found = []
        for path in sorted((self.root / rel_dir).glob("*/.hydra/overrides.yaml")):
            for line in path.read_text().splitlines():
                name, _, given = line.removeprefix("- ").partition("=")
                if name.strip() == key and float(given) == value:
                    found.append(path.parent.parent)
        self._note(rel_dir)
        if len(found) != 1:
            raise DataError(rel_dir, f"{len(found)} runs with {key}={value}")
        return self.run(str(found[0].relative_to(self.root)), metric)

    def override(self, rel_dir: str, key: str) -> str:
        """The value ``key`` was given in the first seed's ``.hydra/overrides.yaml``."""
        files = sorted((self.root / rel_dir).glob("*/.hydra/overrides.yaml"))
        if not files:
            raise DataError(rel_dir, "no */.hydra/overrides.yaml")
        rel = str(files[0].relative_to(self.root))
        self._note(rel)
        for line in files[0].read_text().splitlines():
            name, _, value = line.removeprefix("- ").partition("=")
            if name.strip() == key:
                return value.strip()
        raise DataError(rel, f"no override '{key}'")

    def mean(self, rel_dir: str, key: str = "eval/loss") -> float:
        """The mean of :meth:`seeds`."""
        return statistics.mean(self.seeds(rel_dir, key))

    def sd(self, rel_dir: str, key: str = "eval/loss") -> float:
        """The sample standard deviation of :meth:`seeds` (0 for one seed)."""
        values = self.seeds(rel_dir, key)
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def paired_gap(self, base: str, other: str, key: str = "eval/loss") -> list[float]:
        """``other - base`` seed by seed, over the seed folders both hold."""
        names = sorted(
            p.parent.name
            for p in (self.root / base).glob("*/summary.json")
            if (self.root / other / p.parent.name / "summary.json").is_file()
        )
        self._note(base)
        self._note(other)
        if not names:
            raise DataError(other, f"no seed folder shared with {base}")
        gaps = []
        for name in names:
            b = _parse(self.root, self.root / base / name / "summary.json")[key]
            o = _parse(self.root, self.root / other / name / "summary.json")[key]
            gaps.append(float(o) - float(b))
        return gaps


_ALIGN = {"l": "---", "r": "---:", "c": ":---:"}


def md_table(
    header: Sequence[str | None],
    align: Sequence[str],
    rows: Iterable[Sequence[str | None]],
    *,
    padded: bool = False,
) -> str:
    """A markdown table: ``header``, the alignment cells (``---``, ``---:``) and ``rows``.

    Args:
        header: The column names.
        align: One alignment cell per column, written as given (``---``, ``---:``), or one
            letter per column: ``l`` (``---``), ``r`` (``---:``) or ``c`` (``:---:``); a
            string of letters (``"llr"``) names them all at once.
        rows: The rows' cells, as text. A cell that is ``None`` (of the header or a row) is
            left blank, ``| |``, as a table written by hand leaves one; an empty string is a
            cell of no text, ``|  |``.
        padded: Write the alignment row like the others, ``| --- | ---: |``, where it is
            ``|---|---:|`` by default.

    Returns:
        The table's lines, joined by newlines (no newline at the end).
    """
    cells = [_ALIGN.get(a, a) for a in align]
    lines = [_md_row(header)]
    lines.append("| " + " | ".join(cells) + " |" if padded else "|" + "|".join(cells) + "|")
    lines += [_md_row(row) for row in rows]
    return "\n".join(lines)


def _md_row(cells: Sequence[str | None]) -> str:
    if None in cells:
        return "|" + "|".join(" " if c is None else f" {c} " for c in cells) + "|"
    return "| " + " | ".join(c or "" for c in cells) + " |"


def write_page(path: Path, text: str) -> int:
    """Write a generated page (its folder too) and print it; the exit status of a command (0)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text, end="")
    return 0
