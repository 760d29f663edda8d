"""The outer optimizer sweep's ``summary.md``: each configuration's final metric and bytes sent.

``experiments/sweeps/outer.sh`` keeps each run's small files under
``docs/results/outer/runs/<task>/<configuration>/seed<k>/`` and writes the summary from them::

    python -m experiments.report.outer_summary docs/results/outer/runs \\
        --out docs/results/outer/summary.md [--vocab-size 1024]

One section per task (``digits``, ``noniid``, ``lm``) that has runs: per configuration the
seeds, the final metric's mean and sample standard deviation over them, the gap of the mean to
``allreduce``'s, and what one rank sends per step. The bytes are computed from the model's size
(the task's model built from ``conf/``; the tiny GPT needs the corpus's vocabulary size, which
``outer.sh`` gives ``prepare_tokens``) and the configuration's schedule: see :func:`per_step` and
the note under the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import experiments.train.config  # noqa: F401  (registers the schemas)
from decent_dp.topo import TopologyReg
from experiments.models import build_model
from experiments.report.doc_data import write_page

__all__ = ["TASKS", "markdown", "main", "parameters", "per_step"]

CONF = Path(__file__).resolve().parents[2] / "conf"
VOCAB_SIZE = 1024  # outer.sh's corpus: prepare_tokens --vocab-size 1024

# task folder: (section title, the final metric compared)
TASKS = {
    "digits": ("digits, IID", "eval/acc"),
    "noniid": ("digits, Dirichlet alpha=0.1", "eval/acc"),
    "lm": ("tiny GPT (lm_quick)", "eval/loss"),
}
_FIRST = {"allreduce": 0, "one-peer-exp": 1}  # then the others by name

NOTE = (
    "bytes/step/rank: what one rank sends per step in a bandwidth-optimal all-reduce of a\n"
    "group of k ranks, 2(k-1)/k x the model's float32 bytes, averaged over the schedule:\n"
    "allreduce 1.5x the model every step (k=4); one-peer-exp 1x (pairs, k=2);\n"
    "local-sgd and DiLoCo with period H one world all-reduce every H steps, 1.5/H x. DiLoCo's\n"
    "outer round is local-sgd's averaging round, so both send the same bytes; SlowMo over\n"
    "one-peer-exp replaces every 8th pair round by a world all-reduce, (7/8) 1x + (1/8) 1.5x."
)


def _compose(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def parameters(task: str, vocab_size: int = VOCAB_SIZE) -> int:
    """The trainable parameters of ``task``'s model: the tiny GPT or the digits CNN."""
    if task == "lm":
        model = build_model(_compose("experiment=lm_quick").model, vocab_size=vocab_size)
    else:
        model = build_model(_compose().model, num_classes=10, in_channels=1, image_size=8)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def share(k: int) -> float:
    """The model copies one rank sends in a bandwidth-optimal (ring) all-reduce of ``k`` ranks."""
    return 2 * (k - 1) / k if k > 1 else 0.0


def per_step(name: str, n: int) -> float:
    """The model copies a rank sends per step in configuration ``name`` of ``n`` ranks, averaged
    over the schedule (rank 0's groups)."""
    if name == "allreduce":
        return share(n)
    if name == "one-peer-exp":
        topo = TopologyReg.create("one-peer-exp", n)
        return statistics.mean(
            share(len(next(e for e in r if 0 in e.ranks).ranks)) for r in topo.rounds
        )
    h = int(name.rsplit("-H", 1)[1])
    if name.startswith("slowmo-one-peer-exp"):  # every H-th round becomes a world all-reduce
        return per_step("one-peer-exp", n) * (h - 1) / h + share(n) / h
    return share(n) / h  # local-sgd-H, diloco-H: one all-reduce every H steps


def _section(task: str, cells: list[Path], vocab_size: int) -> list[str]:
    """The heading and table of one task's configurations (the folders ``cells``)."""
    title, key = TASKS[task]
    size = parameters(task, vocab_size)
    acc = key == "eval/acc"  # in percent and points, else in nats
    lines = [
        f"### {title}: {size:,} parameters (float32), 4 workers",
        "",
        f"| configuration | seeds | final {key} (mean ± std) | vs allreduce | bytes/step/rank |",
        "|---|---:|---:|---:|---:|",
    ]
    rows, base = [], None
    for cell in cells:
        summaries = [json.loads(s.read_text()) for s in sorted(cell.glob("seed*/summary.json"))]
        if not summaries:
            continue
        values = [s[key] for s in summaries]
        mean = statistics.mean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        sent = per_step(cell.name, summaries[0]["world_size"]) * 4 * size
        rows.append((cell.name, len(values), mean, sd, sent))
        if cell.name == "allreduce":
            base = mean
    scale, digits = (100, 2) if acc else (1, 3)
    for name, seeds, mean, sd, sent in sorted(rows, key=lambda r: (_FIRST.get(r[0], 2), r[0])):
        gap = ""
        if base is not None:
            gap = f"{100 * (mean - base):+.2f} pts" if acc else f"{mean - base:+.3f} nats"
        lines.append(
            f"| {name} | {seeds} | {scale * mean:.{digits}f} ± {scale * sd:.{digits}f} | {gap} | "
            f"{sent / 1e3:,.1f} kB |"
        )
    return [*lines, ""]


def markdown(runs: Path, vocab_size: int = VOCAB_SIZE) -> str:
    """``summary.md`` from the runs under ``runs`` (``<task>/<configuration>/seed<k>/``)."""
    lines: list[str] = []
    for task in TASKS:
        cells = sorted(p for p in (runs / task).glob("*") if p.is_dir())
        if cells:
            lines += _section(task, cells, vocab_size)
    return "\n".join([*lines, NOTE]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``summary.md`` from the committed runs and print it."""
    parser = argparse.ArgumentParser(prog="python -m experiments.report.outer_summary")
    parser.add_argument("runs", type=Path, help="the runs: <task>/<configuration>/seed<k>/")
    parser.add_argument("--out", type=Path, required=True, help="the summary.md to write")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE,
                        help=f"the tiny GPT's vocabulary (default {VOCAB_SIZE})")  # fmt: skip
    args = parser.parse_args(argv)
    return write_page(args.out, markdown(args.runs, args.vocab_size))


if __name__ == "__main__":
    sys.exit(main())
