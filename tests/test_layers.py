"""The layers of docs/architecture.md, checked on the source: library, framework, entry points.

- ``decent_dp`` imports the standard library, torch and itself, nothing else; only
  the elastic membership (``elastic/_quorum.py``) imports torchft, and only inside a
  function, when an elastic job asks for it (the ``ft`` extra).
- ``experiments`` may import ``decent_dp`` and third-party packages, never an entry
  point (``train.py``) or the tests.
- Nothing below the tests imports ``tests``.
- ``examples`` are users' packages: torch, ``decent_dp`` and the standard library, never the
  framework (``train.py`` reaches them through ``_target_``).
- The framework (``experiments/``, ``train.py``) and the examples import only public
  library modules: no path segment starting with ``_`` (``decent_dp._comm``,
  ``from decent_dp.elastic import _quorum``).
- Inside ``decent_dp`` imports point down the layers (:data:`LIBRARY_LAYERS`), from
  the bottom up:

  1. ``mixing``, ``metrics``, ``utils``: leaves, importing no other library module;
  2. ``topo/``, ``compression/``, ``optim/``: pure data and the optimizers (``topo/``
     and ``compression/`` create and use no process group);
  3. ``_comm/``: process groups, exchanges in flight, compressed and three-phase gossip;
  4. ``_engine/``: the per-iteration engine and the wrapper's mixins;
  5. ``sharded/``, ``packed``: the sharded wrapper's parts, the packed workers;
  6. ``ddp``: the public wrapper;
  7. ``elastic/``: the elastic wrapper, over ``ddp``;
  8. ``decent_dp/__init__.py``: the public API, imported lazily.

  A module may import its own package (a unit above) and the units of lower layers,
  never one of its own layer or above.
- ``decent_dp``'s modules import each other without a cycle.

Imports are read with :mod:`ast`, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
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


# optional packages a library module may import lazily (inside a function), by path in decent_dp/
LIBRARY_LAZY = {"elastic/_quorum.py": {"torchft"}}


def _module_level_roots(path: Path) -> set[str]:
    """Top-level names imported at module level (not inside a function or class)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", _sources("decent_dp"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_library_imports_torch_and_the_standard_library_only(path: Path) -> None:
    lazy = LIBRARY_LAZY.get(path.relative_to(ROOT / "decent_dp").as_posix(), set())
    assert _forbidden_in_library(imported_roots(path)) - lazy == set(), path
    assert _module_level_roots(path) & lazy == set(), f"{path}: import {lazy} inside a function"


@pytest.mark.parametrize("path", _sources("experiments"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_framework_never_imports_upward(path: Path) -> None:
    assert imported_roots(path) & {"train", "tests", "examples", "own_model"} == set(), path


@pytest.mark.parametrize("path", _sources("examples"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_import_torch_and_the_library_only(path: Path) -> None:
    own = {p.name for p in (ROOT / "examples").iterdir() if p.is_dir()}
    assert _forbidden_in_library(imported_roots(path)) - own == set(), path


def test_the_checks_catch_a_wrong_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os\nimport torch.nn\nfrom . import sibling\n"
        "def later():\n    import hydra\n    from experiments.train import run\n"
    )
    roots = imported_roots(bad)
    assert roots == {"os", "torch", "hydra", "experiments"}
    assert _forbidden_in_library(roots) == {"hydra", "experiments"}


# ----------------------------------------------------------------------- cycles

ImportGraph = dict[str, dict[str, int]]  # module -> {imported module: line of the first import}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package_dir: Path) -> ImportGraph:
    """Which of a package's modules each of its modules imports, anywhere in the file.

    Function-local imports count, and so do those under ``if TYPE_CHECKING:``:
    a cycle there is still two modules that each need the other (only the
    annotations are lazy), and it comes back as a real one the day someone
    needs the name at run time. Relative imports are resolved; ``from a import
    b`` is an edge to the module ``a.b`` where there is one, else to ``a``. A
    submodule's implicit import of its parent package is no edge, since that
    package's ``__init__`` runs first whoever imports what.
    """
    root = package_dir.parent
    files = {_module_name(p, root): p for p in sorted(package_dir.rglob("*.py"))}
    graph: ImportGraph = {}
    for name, path in files.items():
        # the package a relative import of level 1 starts from
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                targets = [
                    f"{module}.{a.name}" if f"{module}.{a.name}" in files else module
                    for a in node.names
                ]
            for target in targets:
                known = _known_prefix(target, files)
                if known and known != name:  # the first line, whatever order ast.walk takes
                    edges[known] = min(edges.get(known, node.lineno), node.lineno)
        graph[name] = edges
    return graph


def _known_prefix(target: str, modules: Iterable[str]) -> str:
    """The module itself, or for ``import a.b.c`` of something else its longest prefix that is one."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target


def import_cycles(graph: ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def _describe(graph: ImportGraph, cycles: Iterable[list[str]]) -> str:
    lines = []
    for modules in cycles:
        lines.append("cycle of " + ", ".join(modules) + ":")
        members = set(modules)
        for m in modules:
            for target, line in sorted(graph[m].items()):
                if target in members:
                    lines.append(f"    {m} -> {target} (line {line})")
    return "\n".join(lines)


def test_the_library_has_no_import_cycle() -> None:
    """No two of ``decent_dp``'s modules import each other, even through others.

    Every import in a file counts: at the top, inside a function, and under
    ``if TYPE_CHECKING:`` (see :func:`import_graph` for why). A failure names
    the modules of each cycle and the import lines that close it.
    """
    graph = import_graph(ROOT / "decent_dp")
    assert "decent_dp.ddp" in graph and "decent_dp" in graph  # the files were read
    cycles = import_cycles(graph)
    assert not cycles, "import cycles in decent_dp:\n" + _describe(graph, cycles)


def test_the_cycle_check_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .. import low\n")
    (pkg / "low.py").write_text("import os\n")
    (pkg / "a.py").write_text("from .sub import deep\nimport pkg.low.attr\n")
    (pkg / "sub" / "deep.py").write_text("def later():\n    from ..b import name\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.deep": 1, "pkg.low": 2}
    assert graph["pkg.sub"] == {"pkg.low": 1}
    assert graph["pkg.sub.deep"] == {"pkg.b": 2}
    assert graph["pkg.b"] == {"pkg.a": 3}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.deep"]]
    (pkg / "b.py").write_text("")
    assert import_cycles(import_graph(pkg)) == []


# ------------------------------------------------------------- private modules


def private_library_imports(path: Path) -> list[str]:
    """Every import of a private ``decent_dp`` module or name in a file: ``line: module``.

    A module is private when a segment of its dotted path starts with ``_``; a
    name imported from a library module is private when it starts with one
    (``from decent_dp.elastic import _quorum``, a module, and ``from decent_dp.optim
    import _split_pairs``, a function, alike). Dunder names (``__version__``) are public.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            modules += [
                f"{node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
        for module in modules:
            parts = module.split(".")
            if parts[0] == "decent_dp" and any(p.startswith("_") for p in parts[1:]):
                found.append(f"{node.lineno}: {module}")
    return found


_FRAMEWORK = [*_sources("experiments"), ROOT / "train.py", *_sources("examples")]


@pytest.mark.parametrize("path", _FRAMEWORK, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_framework_imports_public_library_modules_only(path: Path) -> None:
    private = private_library_imports(path)
    assert not private, f"{path.relative_to(ROOT)} imports private library modules: {private}"


def test_the_private_module_check_sees_every_form(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import decent_dp._comm.groups\n"
        "from decent_dp._engine import engine\n"
        "from decent_dp.elastic import _quorum, ElasticDataParallel\n"
        "def later():\n    from decent_dp.optim import _split_pairs, decay_groups\n"
        "import decent_dp.topo, os._private\n"
        "from decent_dp import __version__\n"
    )
    assert private_library_imports(bad) == [
        "1: decent_dp._comm.groups",
        "2: decent_dp._engine",
        "3: decent_dp.elastic._quorum",
        "5: decent_dp.optim._split_pairs",
    ]


# ------------------------------------------------------------------ the layers

# bottom to top: each unit (a module or a package of decent_dp) and its layer
LIBRARY_LAYERS: tuple[tuple[str, ...], ...] = (
    ("decent_dp.mixing", "decent_dp.metrics", "decent_dp.utils"),
    ("decent_dp.topo", "decent_dp.compression", "decent_dp.optim"),
    ("decent_dp._comm",),
    ("decent_dp._engine",),
    ("decent_dp.sharded", "decent_dp.packed"),
    ("decent_dp.ddp",),
    ("decent_dp.elastic",),
    ("decent_dp",),
)
_LAYER = {unit: i for i, units in enumerate(LIBRARY_LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """The unit of :data:`LIBRARY_LAYERS` a module belongs to: the longest one that prefixes it."""
    candidates = [u for u in _LAYER if module == u or module.startswith(u + ".")]
    if not candidates:
        raise KeyError(f"{module} is in no layer of LIBRARY_LAYERS; give it one")
    return max(candidates, key=len)


def upward_imports(graph: ImportGraph) -> list[str]:
    """Every import of a unit of the importer's own layer or above (its own unit aside)."""
    bad = []
    for module, edges in sorted(graph.items()):
        mine = unit_of(module)
        for target, line in sorted(edges.items()):
            theirs = unit_of(target)
            if theirs != mine and _LAYER[theirs] >= _LAYER[mine]:
                bad.append(f"{module} (line {line}) imports {target}: {theirs} is not below {mine}")
    return bad


def test_every_library_module_has_a_layer() -> None:
    graph = import_graph(ROOT / "decent_dp")
    assert {unit_of(m) for m in graph} == set(_LAYER)  # and no unit is left without a module


def test_the_library_imports_point_down_the_layers() -> None:
    """Inside ``decent_dp``, every import (lazy, or under ``TYPE_CHECKING``) points down."""
    bad = upward_imports(import_graph(ROOT / "decent_dp"))
    assert not bad, "imports against the layers of tests/test_layers.py:\n" + "\n".join(bad)


def test_the_layer_check_catches_an_upward_import() -> None:
    graph = import_graph(ROOT / "decent_dp")
    graph["decent_dp.topo.graph"] = {**graph["decent_dp.topo.graph"], "decent_dp._comm.groups": 9}
    graph["decent_dp._comm.survivors"] = {"decent_dp._engine.bucket": 3}
    graph["decent_dp.topo.hosts"] = {"decent_dp.optim": 4}  # same layer, another unit
    assert upward_imports(graph) == [
        "decent_dp._comm.survivors (line 3) imports decent_dp._engine.bucket: "
        "decent_dp._engine is not below decent_dp._comm",
        "decent_dp.topo.graph (line 9) imports decent_dp._comm.groups: "
        "decent_dp._comm is not below decent_dp.topo",
        "decent_dp.topo.hosts (line 4) imports decent_dp.optim: "
        "decent_dp.optim is not below decent_dp.topo",
    ]


# the pure-data packages create and use no process group; a topology built without a
# world size reads the default group's (decent-dp 0.2.x's Topology()), and that is all
PURE_DATA = ("topo", "compression", "mixing.py")
PURE_DIST_READS = {"is_available", "is_initialized", "get_world_size"}


def dist_uses(path: Path) -> set[str]:
    """What a file uses of ``torch.distributed``: the attributes read and the names imported."""
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch.distributed" or a.name.startswith("torch.distributed."):
                    aliases.add(a.asname or "torch.distributed")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "torch":
                aliases.update(a.asname or a.name for a in node.names if a.name == "distributed")
            elif node.module == "torch.distributed" or node.module.startswith("torch.distributed."):
                used.update(f"{node.module}.{a.name}" for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in aliases:
            used.add(node.attr)
    return used


@pytest.mark.parametrize(
    "path",
    [p for name in PURE_DATA for p in sorted((ROOT / "decent_dp").glob(f"{name}/**/*.py"))]
    + [ROOT / "decent_dp" / n for n in PURE_DATA if n.endswith(".py")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_pure_data_packages_use_no_process_group(path: Path) -> None:
    assert dist_uses(path) <= PURE_DIST_READS, f"{path.relative_to(ROOT)}: {dist_uses(path)}"


def test_the_process_group_check_sees_every_form(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch.distributed as dist\nfrom torch import distributed as d2\n"
        "from torch.distributed import new_group\n"
        "def f():\n    dist.get_world_size(); d2.all_reduce(x); import torch.distributed\n"
        "    torch.distributed.barrier()\n"
    )
    assert dist_uses(bad) == {
        "get_world_size",
        "all_reduce",
        "barrier",
        "torch.distributed.new_group",
    }
