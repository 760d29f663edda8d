"""The README and docs/ name only make targets, modules and pages that exist.

Every fenced shell block (```bash, ```sh, ```shell, ```console, and untyped
blocks that start with a command) is read line by line. A line, after an
optional ``$ `` prompt, that starts with ``make `` must name targets of the
Makefile; one that starts with ``python -m `` (or ``.venv/bin/python -m ``)
must name a module that ``python -m`` can run. Modules are found without
importing them: this repository's packages by file path, anything else
through its top-level package's import spec. Relative links, and the anchors
they point to, must resolve too.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from collections.abc import Iterator
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "docs" / "results" / "README.md",
]
# every page of docs/, results included (runs/ holds only the runs' own files), for links
ALL_PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "runs" not in p.relative_to(ROOT).parts),
]
SHELL_INFO = {"bash", "sh", "shell", "console"}

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)")
_PROMPT = re.compile(r"^\$\s+")
_ASSIGNMENTS = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)+")
_MAKE = re.compile(r"^make(?:\s+(?P<rest>.*))?$")
_PYTHON_M = re.compile(r"^(?:\.venv/bin/)?python3?\s+-m\s+(?P<module>\S+)")
_TARGET = re.compile(r"^(?P<name>[^\s:#=$()]+)\s*:(?!=)")
_LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(?P<text>.+?)\s*#*\s*$")
# make options that take the next word as their value
_MAKE_OPTIONS_WITH_VALUE = {"-C", "-f", "-I", "-o", "-W", "--directory", "--file"}


def fenced_blocks(text: str) -> Iterator[tuple[str, list[tuple[int, str]]]]:
    """Yield ``(info, [(line number, line), ...])`` for every fenced code block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.group(1), opening.group(2).lower()
        body: list[tuple[int, str]] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1  # the closing fence
        yield info, body


def _command(line: str) -> str:
    """The line without its prompt and leading variable assignments (``OUT=x make y``)."""
    line = _PROMPT.sub("", line.strip())
    return _ASSIGNMENTS.sub("", line)


def _looks_like_commands(body: list[tuple[int, str]]) -> bool:
    first = next((line.strip() for _, line in body if line.strip()), "")
    return bool(_PROMPT.match(first) or _MAKE.match(first) or _PYTHON_M.match(first))


def command_lines(text: str) -> Iterator[tuple[int, str]]:
    """Every line of the shell blocks of a markdown text, prompt and assignments removed."""
    for info, body in fenced_blocks(text):
        if info in SHELL_INFO or (info == "" and _looks_like_commands(body)):
            for number, line in body:
                yield number, _command(line)


def make_targets_of(line: str) -> list[str] | None:
    """The targets a ``make ...`` line asks for (``[]`` for the default goal), else None."""
    match = _MAKE.match(line)
    if not match:
        return None
    rest = match.group("rest") or ""
    try:
        words = shlex.split(rest, comments=True)
    except ValueError:  # an open quote continued on the next line
        words = rest.split("#", 1)[0].split()
    targets: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in _MAKE_OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-") and "=" not in word and word != "\\":
            targets.append(word)
    return targets


def makefile_targets(makefile: Path = ROOT / "Makefile") -> set[str]:
    """The targets defined in a Makefile (``name:`` at the start of a line)."""
    found = set()
    for line in makefile.read_text().splitlines():
        match = _TARGET.match(line)
        if match:
            found.add(match.group("name"))
    return found


def _find(name: str, locations: list[str] | None) -> ModuleSpec | None:
    if locations is None:  # top level: this repository first, then the environment
        local = PathFinder.find_spec(name, [str(ROOT)])
        return local if local is not None else importlib.util.find_spec(name)
    return PathFinder.find_spec(name, locations)


def runnable_module(name: str) -> str | None:
    """Why ``python -m name`` would fail, or None when it would find the module.

    Nothing is imported: each dotted part is looked up in its parent's search
    locations, and a package needs a ``__main__`` module.
    """
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return f"'{name}' is not a module name"
    spec: ModuleSpec | None = None
    locations: list[str] | None = None
    for i in range(len(parts)):
        if spec is not None and locations is None:
            return f"'{'.'.join(parts[:i])}' is a module, not a package, so '{name}' cannot exist"
        spec = _find(".".join(parts[: i + 1]), locations)
        if spec is None:
            return f"no module '{'.'.join(parts[: i + 1])}'"
        search = spec.submodule_search_locations
        locations = list(search) if search is not None else None
    if locations is not None and _find(f"{name}.__main__", locations) is None:
        return f"'{name}' is a package without __main__"
    return None


def command_problems(text: str, source: str, targets: set[str]) -> list[str]:
    """One line per make target or ``python -m`` module of ``text`` that does not exist."""
    problems = []
    for number, line in command_lines(text):
        wanted = make_targets_of(line)
        for target in wanted or []:
            if target not in targets:
                problems.append(f"{source}:{number}: make target '{target}' is not in the Makefile")
        module = _PYTHON_M.match(line)
        if module:
            why = runnable_module(module.group("module"))
            if why:
                problems.append(f"{source}:{number}: python -m {module.group('module')}: {why}")
    return problems


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a markdown text's headings (code blocks excluded)."""
    inside = {n for _, body in fenced_blocks(text) for n, _ in body}
    seen: dict[str, int] = {}
    found = set()
    for number, line in enumerate(text.splitlines(), start=1):
        match = _HEADING.match(line)
        if match and number not in inside:
            slug = _slug(match.group("text"))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def link_problems(page: Path, root: Path = ROOT) -> list[str]:
    """One line per relative link of ``page`` whose file or heading does not exist."""
    text = page.read_text()
    inside = {n for _, body in fenced_blocks(text) for n, _ in body}
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        if number in inside:
            continue
        for match in _LINK.finditer(line):
            target = match.group("target")
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}:{number}: link {target}"
            if not file.exists():
                problems.append(f"{where}: no file {path}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                problems.append(f"{where}: no heading #{anchor} in {path or page.name}")
    return problems


def test_every_command_in_the_docs_exists() -> None:
    targets = makefile_targets()
    problems = []
    for page in ALL_PAGES:
        problems += command_problems(page.read_text(), str(page.relative_to(ROOT)), targets)
    assert not problems, "\n".join(problems)


def test_the_readme_shows_the_quick_start_commands() -> None:
    readme = [line for _, line in command_lines((ROOT / "README.md").read_text())]
    asked = {t for line in readme for t in make_targets_of(line) or []}
    assert {"install", "train", "sweep", "report"} <= asked


def test_the_readme_links_every_page_of_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = {m.group("target").partition("#")[0] for m in _LINK.finditer(readme)}
    missing = [
        str(p.relative_to(ROOT)) for p in PAGES[1:] if str(p.relative_to(ROOT)) not in linked
    ]
    assert not missing, f"README.md does not link {missing}"


def test_every_relative_link_resolves() -> None:
    problems = [problem for page in ALL_PAGES for problem in link_problems(page)]
    assert not problems, "\n".join(problems)


def test_wrong_targets_and_modules_are_reported() -> None:
    text = "\n".join(
        [
            "```bash",
            "make train ARGS=topology=ring     # a real target with a variable",
            "make no-such-target",
            "$ make -C . help bench",
            "NPROC=2 make sweepp",
            "python -m experiments.report --out x",
            ".venv/bin/python -m experiments.bench.no_such_bench",
            "python -m decent_dp.topo --world-size 64",
            "python -m decent_dp.nope",
            "python -m experiments",
            "python -m decent_dp.mixing.sub",
            "python -m pytest -q",
            "python -m no_such_top_level_module",
            "```",
            "```python",
            "make python-blocks-are-not-read",
            "```",
            "```",
            "$ make untyped-blocks-are-read-when-they-start-with-a-command",
            "output: make is not a command here",
            "```",
        ]
    )
    problems = command_problems(text, "doc.md", {"train", "help", "bench", "sweep"})
    assert [p.split(": ", 1)[0] for p in problems] == [
        "doc.md:3",
        "doc.md:5",
        "doc.md:7",
        "doc.md:9",
        "doc.md:10",
        "doc.md:11",
        "doc.md:13",
        "doc.md:19",
    ]
    assert "make target 'no-such-target'" in problems[0]
    assert "make target 'sweepp'" in problems[1]
    assert "no module 'experiments.bench.no_such_bench'" in problems[2]
    assert "no module 'decent_dp.nope'" in problems[3]
    assert "package without __main__" in problems[4]
    assert "is a module, not a package" in problems[5]
    assert "no module 'no_such_top_level_module'" in problems[6]
    assert "untyped-blocks-are-read" in problems[7]


def test_makefile_targets_are_parsed_from_rule_lines(tmp_path: Path) -> None:
    makefile = tmp_path / "Makefile"
    makefile.write_text(
        "PY := python\n.DEFAULT_GOAL := help\nhelp: ## Show help\n\t@echo\nbench-upstream:\n"
    )
    assert makefile_targets(makefile) == {"help", "bench-upstream"}


def test_broken_links_and_anchors_are_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n## `torch.compile` and overlap\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#torchcompile-and-overlap) [ok](#a-heading)\n"
        "# A heading\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [web](https://example.org/x)\n"
        "```\n[inside a code block](missing.md)\n```\n"
    )
    problems = link_problems(page, root=tmp_path)
    assert len(problems) == 2
    assert "page.md:3: link missing.md: no file missing.md" in problems[0]
    assert "no heading #nope in other.md" in problems[1]


def test_the_readme_opens_in_one_screen_with_its_limits_first() -> None:
    text = (ROOT / "README.md").read_text()
    opening = text[: text.index("\n## Documentation")]
    assert len(opening.splitlines()) <= 60
    # the limits come before the results and the links
    assert opening.index("No GPU has run this code") < opening.index("## Results at a glance")
    assert "network namespaces" in opening and "share its 2 cores" in opening
    assert "<!-- data: glance -->" in opening
    asked = {t for _, line in command_lines(opening) for t in make_targets_of(line) or []}
    assert {"install", "test", "train"} <= asked
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    # the version is a generated span, filled from pyproject.toml by check_docs --write
    assert f"This is decent-dp <!-- v:readme.version -->{version.group(1)}<!-- /v -->." in opening
    assert "pip install -e ." in opening
