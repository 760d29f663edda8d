"""Packed workers against one process per worker: samples/s, peak memory and wall time.

``python -m experiments.bench.packed_throughput`` (part of ``make bench``, options in
``PACKED_ARGS``) trains the same job two ways and puts them side by side:

- ``packed``: ``python train.py engine=packed engine.workers=N ...``, the job's ``N``
  workers in one process (:class:`decent_dp.PackedWorkers`);
- ``processes``: ``torchrun --standalone --nproc_per_node=N train.py ...``, one process
  per worker (gloo on loopback).

Both get the same overrides (``topology=one-peer-exp``, ``logger=none log.progress=false``,
a fixed batch per worker). Two tasks: ``digits`` (the default ``small_cnn``, SGD) and
``gpt`` (``experiment=lm_quick``'s tiny GPT on the stdlib corpus, made first with
``experiments.data.prepare_tokens`` when ``--lm-data`` lacks it), at ``--workers`` (both
arms) and ``--packed-only`` (packed alone: 64 processes do not fit on a small machine).

Order. These machines are noisy, so the two arms of a cell run back to back, packed
first, ``--repeats`` times (ABAB); a row is the median over its repeats, and its ratio
packed / processes is the median of the ratios of the pairs measured back to back.
Rows are written to ``--out`` after every run, so a cut-off bench keeps what it measured.

Throughput. ``samples_per_s`` is the mean of the run's metrics windows (``metrics.jsonl``,
every ``log.every`` steps; the trainer times training steps only, not evaluation) without
the first window, which holds the warm-up; ``summary_samples_per_s`` (``summary.json``'s
mean over every window) is kept beside it. ``tokens_per_s`` likewise, for the GPT.

Memory. Each run is watched from outside, without touching the training code
(:mod:`experiments.bench.proc_watch`): every ``--poll-s`` seconds (0.05 by default) the
bench walks the launched process's tree and reads each process's ``/proc/<pid>/status``.
``peak_mb`` is the sum over the tree's processes of the last ``VmHWM`` seen of each (the
kernel's own high-water mark of resident memory, so sampling misses only growth in a
process's last ``poll_s`` before it exits): for packed the one process's peak, for
processes every worker's peak plus torchrun's agent (``agent_mb``). ``rss_peak_mb`` is the
largest sum of ``VmRSS`` seen at one poll, the peak the tree held at once. Both count the
pages of shared libraries (torch's, hundreds of MB) once per process, although the
processes share them; ``anon_peak_mb``, the largest sum of ``RssAnon`` seen at one poll
(anonymous memory: the heap, tensors, the interpreter's objects), leaves them out.
Wall time is from the launch to the exit of the command, start-up and evaluation included.

Threads: torchrun sets ``OMP_NUM_THREADS=1`` in each worker when unset; the packed process
keeps torch's default (one thread per core; ``--packed-threads`` sets its
``OMP_NUM_THREADS``). Both arms use every core of the machine. Intra-op threads wait for
each other in every operation, so a packed run slows down much more than the processes do
when something else takes a core: measure on a quiet machine (``load_avg`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from experiments.bench.proc_watch import watch
from experiments.report.doc_views_packed import rows_table
from experiments.train.metrics import host_tag

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path("docs/results/packed/bench.json")
ARMS = ("packed", "processes")
COMMON = ["topology=one-peer-exp", "logger=none", "log.progress=false", "log.consensus_every=0"]


def task_overrides(task: str, args: argparse.Namespace) -> list[str]:
    """The overrides of ``task`` (``digits`` or ``gpt``), the same for both arms."""
    if task == "digits":
        return [
            f"train.max_steps={args.digits_steps}",
            f"train.batch_size={args.digits_batch}",
            f"log.every={args.digits_log_every}",
        ]
    if task == "gpt":
        return [
            "experiment=lm_quick",
            f"dataset.root={args.lm_data}",
            f"dataset.block_size={args.gpt_block}",
            # one epoch longer than the run at every N: one evaluation, at the end
            "dataset.tokens_per_epoch=8388608",
            "dataset.eval_tokens=16384",
            f"train.max_steps={args.gpt_steps}",
            f"train.batch_size={args.gpt_batch}",
            f"log.every={args.gpt_log_every}",
        ]
    raise ValueError(f"unknown task '{task}' (known: digits, gpt)")


def _torchrun() -> list[str]:
    script = Path(sys.executable).parent / "torchrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def command(arm: str, workers: int, overrides: list[str], run_dir: Path) -> list[str]:
    """The command line of one run of ``arm`` with ``workers`` workers."""
    tail = ["train.py", *COMMON, *overrides, f"hydra.run.dir={run_dir}"]
    if arm == "packed":
        return [sys.executable, tail[0], "engine=packed", f"engine.workers={workers}", *tail[1:]]
    return [*_torchrun(), "--standalone", f"--nproc_per_node={workers}", *tail]


def shown(cmd: list[str]) -> str:
    """``cmd`` as a shell line, executables inside the repository relative to it."""
    words = [os.path.relpath(w, ROOT) if w.startswith(str(ROOT)) else w for w in cmd]
    return shlex.join(words)


# ---------------------------------------------------------------- one run
def throughput(run_dir: Path) -> dict[str, Any]:
    """Samples/s (and tokens/s) of a finished run: the mean of its windows after the first."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    windows = [x for x in lines if "perf/samples_per_s" in x]
    kept = windows[1:] or windows
    summary = json.loads((run_dir / "summary.json").read_text())
    out = {
        "samples_per_s": statistics.mean(x["perf/samples_per_s"] for x in kept),
        "windows": len(kept),
        "summary_samples_per_s": summary.get("perf/samples_per_s"),
        "world_size": summary.get("world_size"),
        "engine": summary.get("engine"),
    }
    if all("perf/tokens_per_s" in x for x in kept):
        out["tokens_per_s"] = statistics.mean(x["perf/tokens_per_s"] for x in kept)
        out["summary_tokens_per_s"] = summary.get("perf/tokens_per_s")
    return out


def warnings_of(log: Path, limit: int = 200) -> list[str]:
    """The distinct lines of a run's output that name a warning, cut to ``limit`` characters."""
    seen: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if "Warning" in line and line[:limit] not in seen:
            seen.append(line[:limit])
    return seen


def run_one(task: str, workers: int, arm: str, repeat: int, args: argparse.Namespace) -> dict:
    """Run one job and return its row (see the module docstring for each key)."""
    run_dir = args.runs_dir / f"{task}-n{workers}-{arm}-r{repeat}"
    run_dir.mkdir(parents=True, exist_ok=True)
    if run_dir.is_relative_to(ROOT):  # the command runs from the root: show it short
        run_dir = run_dir.relative_to(ROOT)
    cmd = command(arm, workers, task_overrides(task, args), run_dir)
    log = ROOT / run_dir / "bench.log"
    load = os.getloadavg()[0]  # what else ran: the noise this run saw
    env = {}
    if arm == "packed" and args.packed_threads:
        env["OMP_NUM_THREADS"] = str(args.packed_threads)
    seen = watch(cmd, ROOT, log, args.poll_s, args.timeout_s, env)
    if seen.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"{shown(cmd)} exited with {seen.returncode}:\n{tail}")
    mb = 1024.0
    return {
        "task": task,
        "workers": workers,
        "arm": arm,
        "repeat": repeat,
        "command": shown(cmd),
        "wall_s": seen.wall_s,
        **throughput(ROOT / run_dir),
        "peak_mb": sum(seen.hwm_kb.values()) / mb,
        "agent_mb": seen.hwm_kb.get(seen.root, 0) / mb if arm == "processes" else 0.0,
        "rss_peak_mb": seen.rss_peak_kb / mb,
        "anon_peak_mb": seen.anon_peak_kb / mb,
        "processes": len(seen.hwm_kb),
        "load_avg_1m": load,
        "warnings": warnings_of(log),
    }


# ---------------------------------------------------------------- plan, rows, output
def plan(args: argparse.Namespace) -> Iterator[tuple[str, int, str, int]]:
    """``(task, workers, arm, repeat)`` in run order: N outermost, the arms' pairs back to back."""
    tasks = args.tasks.split(",")
    both = [int(n) for n in args.workers.split(",") if n]
    alone = [int(n) for n in args.packed_only.split(",") if n]
    for n in sorted({*both, *alone}):
        for task in tasks:
            for repeat in range(args.repeats):
                for arm in ARMS if n in both else ("packed",):
                    yield task, n, arm, repeat


def summarize(runs: list[dict]) -> list[dict]:
    """One row per task, worker count and arm: medians over repeats, paired ratios."""
    rows = []
    keys = sorted({(r["task"], r["workers"]) for r in runs}, key=lambda k: (k[0], k[1]))
    for task, n in keys:
        cell = [r for r in runs if r["task"] == task and r["workers"] == n]
        pairs = [
            (p, q)
            for p in cell
            for q in cell
            if p["arm"] == "packed" and q["arm"] == "processes" and p["repeat"] == q["repeat"]
        ]
        for arm in ARMS:
            mine = [r for r in cell if r["arm"] == arm]
            if not mine:
                continue
            row: dict[str, Any] = {"task": task, "workers": n, "arm": arm, "repeats": len(mine)}
            for key in ("samples_per_s", "tokens_per_s", "peak_mb", "anon_peak_mb", "wall_s"):
                if all(key in r for r in mine):
                    row[key] = statistics.median(r[key] for r in mine)
            if arm == "packed" and pairs:
                row["ratio"] = statistics.median(
                    p["samples_per_s"] / q["samples_per_s"] for p, q in pairs
                )
                row["memory_ratio"] = statistics.median(
                    p["peak_mb"] / q["peak_mb"] for p, q in pairs
                )
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a markdown table, as the docs' ``packed-bench`` view shows them."""
    return rows_table(rows)


def machine() -> dict[str, Any]:
    """The cores, CPU, torch and Python this bench ran on, and the load when it started."""
    return {
        "cores": os.cpu_count(),
        "cpu": host_tag(torch.device("cpu"))["cpu"],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_avg": list(os.getloadavg()),
    }


def plot(data: dict[str, Any], png: Path) -> None:
    """Samples/s per arm and worker count, a panel per task, bars (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        ns = sorted({r["workers"] for r in rows if r["task"] == task})
        values = []
        for i, arm in enumerate(ARMS):
            xs, ys = [], []
            for j, n in enumerate(ns):
                key = (task, n, arm)
                row = next((r for r in rows if (r["task"], r["workers"], r["arm"]) == key), None)
                if row is not None:
                    xs.append(j + (i - 0.5) * 0.38)
                    ys.append(row["samples_per_s"])
            bars = ax.bar(xs, ys, width=0.36, label=arm)
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
            values += ys
        ax.set_xticks(range(len(ns)), [f"N={n}" for n in ns])
        ax.set_yscale("log")
        # room above the bars for the legend, and bars that start well below the smallest
        ax.set_ylim(min(values) / 3, max(values) * 8)
        ax.set_ylabel("samples/s (all workers)")
        ax.set_title(task)
        ax.legend(fontsize=8, ncol=2, loc="upper center")
    fig.suptitle(f"{data['machine']['cores']} cores, torch {data['machine']['torch']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _ensure_corpus(args: argparse.Namespace) -> None:
    if "gpt" not in args.tasks.split(",") or (ROOT / args.lm_data / "train.bin").exists():
        return
    subprocess.run(
        [sys.executable, "-m", "experiments.data.prepare_tokens", "--stdlib", "--out"]
        + [str(args.lm_data), "--max-bytes", "2000000", "--vocab-size", "1024"],
        cwd=ROOT,
        check=True,
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line (``--help`` lists it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="digits,gpt", help="comma-separated: digits, gpt")
    p.add_argument("--workers", default="4,8", help="worker counts of both arms")
    p.add_argument("--packed-only", default="64", help="worker counts of packed alone")
    p.add_argument("--repeats", type=int, default=2, help="pairs per cell (ABAB)")
    p.add_argument("--digits-steps", type=int, default=60)
    p.add_argument("--digits-batch", type=int, default=16, help="per worker (64 x 16 < 1,437)")
    p.add_argument("--digits-log-every", type=int, default=10)
    p.add_argument("--gpt-steps", type=int, default=20)
    p.add_argument("--gpt-batch", type=int, default=4, help="windows per worker")
    p.add_argument("--gpt-block", type=int, default=64)
    p.add_argument("--gpt-log-every", type=int, default=5)
    p.add_argument("--lm-data", type=Path, default=Path("data/stdlib-bpe"))
    p.add_argument(
        "--packed-threads", type=int, default=0, help="OMP_NUM_THREADS of packed (0: as is)"
    )
    p.add_argument("--poll-s", type=float, default=0.05, help="seconds between memory polls")
    p.add_argument("--timeout-s", type=float, default=1200.0, help="per run")
    p.add_argument("--runs-dir", type=Path, default=None, help="run directories (outputs/...)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--plot", type=Path, default=None, help="PNG (default: --out's, .png)")
    p.add_argument("--from-json", action="store_true", help="only draw --out's plot and table")
    args = p.parse_args(argv)
    if args.runs_dir is None:
        args.runs_dir = ROOT / "outputs" / "packed_bench" / time.strftime("%Y-%m-%d_%H-%M-%S")
    args.runs_dir = args.runs_dir.resolve()
    args.plot = args.plot or args.out.with_suffix(".png")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the bench (or, with ``--from-json``, redraw its plot); print the table."""
    from tqdm import tqdm

    args = parse(argv)
    # SIGTERM ends the bench through its finally blocks, so the running job is killed too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.from_json:
        data = json.loads(args.out.read_text())
        plot(data, args.plot)
        print(table(data["rows"]))
        return 0
    _ensure_corpus(args)
    keep = ("out", "plot", "runs_dir", "from_json")
    data: dict[str, Any] = {
        "machine": machine(),
        "args": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in keep
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": [],
        "rows": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    todo = list(plan(args))
    bar = tqdm(todo, desc="packed bench", unit="run", file=sys.stderr)
    for task, n, arm, repeat in bar:
        bar.set_postfix_str(f"{task} N={n} {arm} r{repeat}")
        row = run_one(task, n, arm, repeat, args)
        data["runs"].append(row)
        data["rows"] = summarize(data["runs"])
        data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        tokens = f", {row['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in row else ""
        bar.write(
            f"{task} N={n} {arm} r{repeat}: {row['samples_per_s']:,.1f} samples/s{tokens}, "
            f"{row['peak_mb']:,.0f} MB, {row['wall_s']:.1f} s"
        )
    plot(data, args.plot)
    print(table(data["rows"]))
    print(f"wrote {args.out} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
