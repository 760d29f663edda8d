"""decent-dp 0.2.3 in a virtual environment of its own, and ``decent_dp`` as of a git revision.

Both are imported as ``decent_dp``, so 0.2.3 lives in ``.bench/venv`` (git-ignored),
built on first use by :func:`ensure_upstream_env`. It holds only ``decent-dp`` and
``loguru``; torch comes from the main ``.venv`` through a ``.pth`` path entry, which
does not run that environment's editable-install hook, so ``import decent_dp`` there
resolves to 0.2.3. :func:`export_revision` unpacks ``decent_dp/`` of a git revision
under ``.bench/revs`` as a package with its own import name.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = [
    "ROOT",
    "VENV",
    "UPSTREAM",
    "REQUIREMENTS",
    "IMPLS",
    "upstream_python",
    "ensure_upstream_env",
    "export_revision",
]

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".bench" / "venv"
UPSTREAM = "0.2.3"
REQUIREMENTS = (f"decent-dp=={UPSTREAM}", "loguru==0.7.3")
IMPLS = ("ours", UPSTREAM, "torch-ddp")


def upstream_python() -> Path:
    """The interpreter of ``.bench/venv``, which imports decent-dp 0.2.3."""
    return VENV / "bin" / "python"


def _probe(python: Path) -> tuple[str, str]:
    """The ``decent_dp`` version and file that ``python`` imports (run outside the repository)."""
    code = (
        "import importlib.metadata as m, decent_dp; "
        "print(m.version('decent-dp')); print(decent_dp.__file__)"
    )
    out = subprocess.run(
        [str(python), "-c", code], cwd=VENV.parent, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    return out[0].strip(), out[1].strip()


def ensure_upstream_env() -> Path:
    """Build ``.bench/venv`` with decent-dp 0.2.3 once; later calls return at once."""
    python = upstream_python()
    marker = VENV / f"decent-dp-{UPSTREAM}.ok"
    if marker.exists() and python.exists():
        return python
    if VENV.exists():  # left half-built by an interrupted run
        shutil.rmtree(VENV)
    print(f"== building {VENV.relative_to(ROOT)} with decent-dp=={UPSTREAM}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    # install before torch becomes visible: pip must never see (or try to replace) the
    # editable decent_dp of the main environment
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
        + list(REQUIREMENTS),
        check=True,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    main_paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    # a plain path line: the main environment's own .pth files (its editable hook) do not run
    Path(site, "_bench_main_venv.pth").write_text("".join(f"{p}\n" for p in main_paths))
    version, where = _probe(python)
    if version != UPSTREAM or VENV not in Path(where).resolve().parents:
        raise RuntimeError(
            f"{python} imports decent_dp {version} from {where}; expected {UPSTREAM} under {VENV}"
        )
    marker.write_text(f"decent-dp {version} from {where}\n")
    return python


def export_revision(rev: str) -> Path | None:
    """``decent_dp`` as of git revision ``rev``, as a package of its own under ``.bench/revs``."""
    res = subprocess.run(
        ["git", "rev-parse", "--verify", "--short", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        return None
    sha = res.stdout.strip()
    # its own import name, so that it loads beside today's decent_dp (its imports are relative)
    pkg = VENV.parent / "revs" / sha / f"decent_dp_{sha}"
    if not (pkg / "ddp.py").exists():
        tmp = pkg.parent / "tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", sha, "decent_dp"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        (tmp / "decent_dp").rename(pkg)
        tmp.rmdir()
    return pkg
