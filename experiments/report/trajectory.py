"""The first steps of runs side by side: loss, consensus distance and update size against the step.

For looking at what happens early in training, e.g. one seed that stalls while another learns.
Each run is a run folder with ``metrics.jsonl`` (as ``train.py`` writes it); a run logged with
``log.every=2 log.update_norm=true`` gives ``train/update_norm`` on every second step.

Usage::

    python -m experiments.report.trajectory RUN [RUN ...] --out DIR [--max-step N]
        [--mark-every H] [--at S1,S2,...]

It writes ``DIR/trajectory.png`` (one panel per key, one line per run, dotted lines every
``H`` steps) and ``DIR/trajectory.md`` (each key at the steps ``--at``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.report.doc_data import md_table
from experiments.report.plots import _pyplot

KEYS = ("train/loss", "consensus/distance_sketch", "train/update_norm", "train/lr")


def series(run: Path, key: str, max_step: int) -> list[tuple[int, float]]:
    """``(step, value)`` of ``key`` on the run's training lines up to ``max_step``."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if key in rec and rec["step"] <= max_step and rec[key] is not None:
            out.append((int(rec["step"]), float(rec[key])))
    return out


def table(runs: Sequence[Path], at: Sequence[int], max_step: int) -> str:
    """Markdown: for each key, one row per run with its value at each step of ``at``."""
    lines = []
    for key in KEYS:
        rows = []
        for run in runs:
            values = dict(series(run, key, max_step))
            if values:
                rows.append([run.name, *(f"{values[s]:.4g}" if s in values else "–" for s in at)])
        if rows:
            head = ["run", *(f"step {s}" for s in at)]
            lines += [f"**{key}**", "", md_table(head, "l" + "r" * len(at), rows), ""]
    return "\n".join(lines)


def plot(runs: Sequence[Path], path: Path, max_step: int, mark_every: int) -> None:
    """One panel per key with data, one line per run; averaging rounds dotted."""
    plt = _pyplot()
    keys = [k for k in KEYS if any(series(r, k, max_step) for r in runs)]
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.3 * len(keys)), sharex=True)
    axes = [axes] if len(keys) == 1 else list(axes)
    for ax, key in zip(axes, keys):
        for run in runs:
            pts = series(run, key, max_step)
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], label=run.name, lw=1.2)
        if mark_every > 0:
            for s in range(mark_every, max_step + 1, mark_every):
                ax.axvline(s, color="0.8", ls=":", lw=0.8)
        if key.startswith("consensus"):
            ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_ylabel(key.split("/")[-1])
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-step", type=int, default=128)
    p.add_argument("--mark-every", type=int, default=0, help="dotted lines every H steps")
    p.add_argument("--at", default="16,32,48,64,96,128", help="steps for the table")
    args = p.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "metrics.jsonl").is_file()]
    if missing:
        print(f"trajectory: no metrics.jsonl in {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        at = [int(s) for s in args.at.split(",")]
    except ValueError:
        print(f"trajectory: --at {args.at!r} must be comma-separated steps", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    plot(args.runs, args.out / "trajectory.png", args.max_step, args.mark_every)
    (args.out / "trajectory.md").write_text(table(args.runs, at, args.max_step))
    print(f"wrote {args.out / 'trajectory.png'} and trajectory.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
