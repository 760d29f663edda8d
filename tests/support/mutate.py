"""``make mutate``: a mutation run with cosmic-ray, each module against the fast tests that cover it.

The whole fast suite takes minutes, too long to run once per mutant, so every module
is mapped to the test files that exercise it (:data:`TESTS`); a mutant survives when
those tests still pass. The run works on a copy of the tracked tree in a temporary
folder, so an interrupted run never leaves a mutated file behind, and writes one
summary per module to ``docs/results/mutate/<module>.json``: the counts (killed,
survived, timeout, incompetent), the command, and each survivor's line and diff.

cosmic-ray's operators make every pairing of binary and comparison operators; the run
keeps one mutant per site, as mutmut does (:data:`EXCLUDED_OPERATORS` skips the rest), and
every other operator (numbers, ``not``, booleans, loops, exceptions, decorators) as it is.

Usage::

    python -m tests.support.mutate decent_dp/mixing.py decent_dp/compression/codecs.py
    python -m tests.support.mutate --list          # the modules with a test selection
    python -m tests.support.mutate --table         # the summaries, as docs/testing.md shows them
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "results" / "mutate"

# each module and the fast tests that cover it (the slow and GPU ones never run here)
TESTS: dict[str, list[str]] = {
    "decent_dp/mixing.py": [
        "tests/decent_dp/test_topo.py",
        "tests/decent_dp/test_topo_tables.py",
        "tests/experiments/network/test_choose.py",
    ],
    "decent_dp/compression/codecs.py": [
        "tests/decent_dp/test_compression.py",
        "tests/decent_dp/test_compression_replay.py",
    ],
    "decent_dp/compression/cost.py": [
        "tests/decent_dp/test_bytes_exact.py",
        "tests/decent_dp/test_hierarchical_bytes.py",
    ],
    "decent_dp/_engine/state_sync.py": [
        "tests/decent_dp/test_state_sync.py",
        "tests/decent_dp/test_bytes_exact.py",
    ],
    "decent_dp/optim/lagged_adamw.py": ["tests/decent_dp/test_lagged_v_adamw.py"],
    "decent_dp/_engine/clip.py": ["tests/decent_dp/test_clip.py"],
    "decent_dp/metrics.py": ["tests/decent_dp/test_metrics.py"],
    "decent_dp/topo/graph.py": [
        "tests/decent_dp/test_topo.py",
        "tests/decent_dp/test_topo_registry.py",
    ],
    "decent_dp/_engine/outer.py": [
        "tests/decent_dp/test_outer.py",
        "tests/decent_dp/test_outer_consistency.py",
    ],
    "decent_dp/_comm/hierarchical.py": [
        "tests/decent_dp/test_hierarchical_ddp.py",
        "tests/decent_dp/test_hierarchical_bytes.py",
        "tests/decent_dp/test_hierarchical_compression.py",
    ],
    "decent_dp/_comm/inflight.py": [
        "tests/decent_dp/test_lifecycle.py",
        "tests/decent_dp/test_ddp.py",
    ],
    "experiments/network/calibrate.py": [
        "tests/experiments/network/test_calibrate.py",
        "tests/experiments/network/test_wire_table.py",
    ],
    "experiments/network/netem.py": [
        "tests/experiments/network/test_netem.py",
        "tests/experiments/network/test_netem_calibration.py",
    ],
    "experiments/network/sim_links.py": [
        "tests/experiments/network/test_simulate.py",
        "tests/experiments/network/test_sim_hierarchical.py",
    ],
}

# one mutant per operator site, as mutmut makes them: each arithmetic operator becomes its
# inverse (``+`` and ``-``, ``*`` and ``/``), each comparison its boundary or its negation
# (``<`` and ``<=``, ``==`` and ``!=``), and a unary operator is dropped. cosmic-ray makes
# every pairing (``+`` into ``<<``, ``%``, ``**`` ...), ten times as many mutants, which the
# same tests kill; on two cores they would take hours.
_BINARY_KEPT = ["Add_Sub", "Sub_Add", "Mul_Div", "Div_Mul", "FloorDiv_Div", "Mod_Mul", "Pow_Mul",
                "BitOr_BitAnd", "BitAnd_BitOr", "BitXor_BitOr", "LShift_RShift", "RShift_LShift"]  # fmt: skip
_COMPARISON_KEPT = ["Lt_LtE", "LtE_Lt", "Gt_GtE", "GtE_Gt", "Eq_NotEq", "NotEq_Eq",
                    "Is_IsNot", "IsNot_Is", "In_NotIn", "NotIn_In"]  # fmt: skip
EXCLUDED_OPERATORS = [
    r"core/ReplaceBinaryOperator_(?!(" + "|".join(_BINARY_KEPT) + r")$)",
    r"core/ReplaceComparisonOperator_(?!(" + "|".join(_COMPARISON_KEPT) + r")$)",
    r"core/ReplaceUnaryOperator_(?!Delete_)",
]


def test_command(module: str) -> list[str]:
    """The pytest command that judges ``module``'s mutants (fast tests only, first failure ends it)."""
    if module not in TESTS:
        known = ", ".join(sorted(TESTS))
        raise SystemExit(f"mutate: {module!r} has no test selection; known modules: {known}")
    return [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
            "-m", "not slow and not gpu", *TESTS[module]]  # fmt: skip


def _copy_tree(dst: Path) -> None:
    """The tracked files of this checkout, as they are on disk (edits included)."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for raw in files:
        if not raw:
            continue
        rel = Path(os.fsdecode(raw))
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def _config(module: str, timeout_s: float) -> str:
    cmd = " ".join(shlex.quote(c) for c in test_command(module))
    excluded = ", ".join(json.dumps(e) for e in EXCLUDED_OPERATORS)
    return (
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {timeout_s:.0f}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(cmd)}\n\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n\n'
        "[cosmic-ray.filters.operators-filter]\n"
        f"exclude-operators = [{excluded}]\n"
    )


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def _results(session: Path) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    out = subprocess.run(
        [_tool("cosmic-ray"), "dump", str(session)], capture_output=True, text=True, check=True
    ).stdout
    return [tuple(json.loads(line)) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def summarize(
    module: str, rows: list[tuple[dict[str, Any], dict[str, Any] | None]]
) -> dict[str, Any]:
    """The counts and the survivors of one module's run, from ``cosmic-ray dump``'s rows."""
    counts = {"killed": 0, "survived": 0, "timeout": 0, "incompetent": 0, "skipped": 0}
    survivors = []
    for item, result in rows:
        mutation = item["mutations"][0]
        if result is None:
            continue
        if result["worker_outcome"] == "skipped":
            counts["skipped"] += 1
            continue
        outcome = result.get("test_outcome")
        if outcome == "killed" and result.get("output") == "timeout":
            counts["timeout"] += 1
        elif outcome in counts:
            counts[outcome] += 1
        else:
            counts["incompetent"] += 1
        if outcome == "survived":
            survivors.append(
                {
                    "line": mutation["start_pos"][0],
                    "operator": mutation["operator_name"],
                    "occurrence": mutation["occurrence"],
                    "diff": (result.get("diff") or "").strip(),
                }
            )
    survivors.sort(key=lambda s: (s["line"], s["operator"], s["occurrence"]))
    return {"module": module, "counts": counts, "survivors": survivors}


def run_module(module: str, out: Path, timeout_factor: float) -> dict[str, Any]:
    """Mutate ``module`` in a copy of the tree; write and return its summary."""
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        env = {**os.environ, "PYTHONPATH": str(work), "OMP_NUM_THREADS": "1"}
        start = time.monotonic()
        base = subprocess.run(
            test_command(module), cwd=work, env=env, capture_output=True, text=True
        )
        baseline_s = time.monotonic() - start
        if base.returncode != 0:
            raise SystemExit(f"mutate: {module}'s tests fail unmutated:\n{base.stdout[-2000:]}")
        timeout_s = max(60.0, timeout_factor * baseline_s)
        (work / "mutate.toml").write_text(_config(module, timeout_s))
        session = work / "session.sqlite"
        for cmd in (
            [_tool("cosmic-ray"), "init", "mutate.toml", str(session)],
            [_tool("cr-filter-operators"), str(session), "mutate.toml"],
            [_tool("cosmic-ray"), "exec", "mutate.toml", str(session)],
        ):
            subprocess.run(cmd, cwd=work, env=env, check=True, capture_output=True)
        summary = summarize(module, _results(session))
        with sqlite3.connect(session) as db:  # how many mutants the operators made at all
            (made,) = db.execute("select count(*) from work_items").fetchone()
    summary.update(
        mutants=made,
        tests=TESTS[module],
        command=f"make mutate ARGS={module}",
        baseline_s=round(baseline_s, 1),
        timeout_s=round(timeout_s),
        excluded_operators=EXCLUDED_OPERATORS,
        tool="cosmic-ray " + _version(),
    )
    out.mkdir(parents=True, exist_ok=True)
    name = module.removesuffix(".py").replace("/", ".")
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _version() -> str:
    from importlib.metadata import version

    return version("cosmic-ray")


def table(out: Path = OUT) -> str:
    """The summaries under ``out`` as a markdown table (the view docs/testing.md is checked by)."""
    from experiments.report.doc_data import Source
    from experiments.report.doc_views import mutate

    out = Path(out).resolve()
    return mutate(Source(out.parent), out.name) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.mutate", description=__doc__)
    parser.add_argument("modules", nargs="*", help="module paths, e.g. decent_dp/mixing.py")
    parser.add_argument("--list", action="store_true", help="print the modules and their tests")
    parser.add_argument("--table", action="store_true", help="print the summaries as markdown")
    parser.add_argument("--out", default=str(OUT), help="where the summaries go")
    parser.add_argument(
        "--timeout-factor", type=float, default=4.0, help="a mutant's limit, x the unmutated run"
    )
    ns = parser.parse_args(argv)
    if ns.table:
        print(table(Path(ns.out)), end="")
        return 0
    if ns.list or not ns.modules:
        for module, tests in TESTS.items():
            print(f"{module}: {' '.join(tests)}")
        return 0
    for module in ns.modules:
        test_command(module)  # every name checked before the first long run
    for module in ns.modules:
        s = run_module(module, Path(ns.out), ns.timeout_factor)
        c = s["counts"]
        print(
            f"{module}: {s['mutants']} mutants, {c['killed']} killed, {c['survived']} survived, "
            f"{c['timeout']} timeout, {c['incompetent']} incompetent, {c['skipped']} skipped",
            flush=True,
        )
        for v in s["survivors"]:
            print(f"  survived: line {v['line']} {v['operator']} #{v['occurrence']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
