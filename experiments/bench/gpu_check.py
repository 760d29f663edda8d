"""``make gpu-check``: the GPU tests, the step-time benchmark and a short bf16 training run.

Three parts, each a subprocess with its own timeout, in under 8 minutes on one
GPU:

1. ``tests``: ``pytest -m gpu`` (what ``make test-gpu`` runs);
2. ``bench``: :mod:`experiments.bench.step_time` with ``--device cuda``: at 1
   process the wrapper beside local training, and gloo with CUDA tensors at 2
   and 4 processes, all on the one GPU;
3. ``train``: ``train.py`` under ``torchrun`` on CUDA with ``train.amp=bf16``,
   2 ranks on the one GPU through gloo (digits and the small CNN, built in, no
   download).

The parts fail soft: a failure or a timeout is recorded and the next part
still runs. The report, ``docs/results/gpu.md`` by default, names the device
and holds each part's outcome: the test summary, the benchmark table and the
training run's final metrics. Without CUDA it runs nothing and exits with
status 2 after one line saying so.

Example::

    make gpu-check                        # or: python -m experiments.bench.gpu_check
    python -m experiments.bench.gpu_check --out /tmp/gpu.md --only tests
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PARTS = ("tests", "bench", "train")
# seconds per part: 460 in all, under the 8 minutes of the whole check
TIMEOUTS = {"tests": 230, "bench": 120, "train": 110}
# the metrics of the training run's summary.json that the report shows
TRAIN_KEYS = (
    "train/steps",
    "train/loss",
    "eval/acc",
    "eval/acc_local",
    "consensus/distance",
    "perf/samples_per_s",
    "wall_time_s",
    "world_size",
    "topology",
)


@dataclass
class PartResult:
    """What one part left: its outcome, how long it ran, and what the report shows of it."""

    name: str
    status: str  # "ok", "failed (exit N)", "timed out after N s", "error: ..."
    seconds: float
    body: str = ""  # markdown: the test summary, the bench table, the metrics table
    tail: str = ""  # the end of its output, shown when it did not succeed
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_command(name: str, cmd: Sequence[str], timeout_s: float) -> tuple[PartResult, str]:
    """Run ``cmd``; a non-zero exit or a timeout becomes the part's status, never an exception."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False
        )
        output = proc.stdout + proc.stderr
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired as exc:
        output = _text(exc.stdout) + _text(exc.stderr)
        status = f"timed out after {timeout_s:.0f} s"
    except OSError as exc:
        output, status = "", f"error: {exc}"
    result = PartResult(name, status, time.perf_counter() - t0)
    if not result.ok:
        result.tail = "\n".join(output.strip().splitlines()[-40:])
    return result, output


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def pytest_summary(output: str) -> str:
    """The failures and the final summary line of a ``pytest -q`` run."""
    lines = output.strip().splitlines()
    picked = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    final = [ln for ln in lines if " in " in ln and ("passed" in ln or "failed" in ln)]
    if final:
        picked.append(final[-1].strip("= "))
    return "\n".join(picked) if picked else "(no pytest summary line in the output)"


def run_tests(timeout_s: float) -> PartResult:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    result, output = run_command("tests", cmd, timeout_s)
    result.body = "```\n" + pytest_summary(output) + "\n```"
    return result


def run_bench(timeout_s: float, work: Path) -> PartResult:
    from experiments.bench.step_time import table

    out = work / "bench.json"
    cmd = [
        sys.executable, "-m", "experiments.bench.step_time", "--device", "cuda",
        "--procs", "1", "2", "4", "--models", "mlp", "--steps", "20", "--warmup", "3",
        "--repeats", "1", "--out", str(out),
    ]  # fmt: skip
    result, _ = run_command("bench", cmd, timeout_s)
    if result.ok:
        rows = json.loads(out.read_text())
        result.data["rows"] = rows
        result.body = table(rows)
    return result


def run_train(timeout_s: float, work: Path, procs: int = 2) -> PartResult:
    run_dir = work / "train"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun), "--standalone", f"--nproc_per_node={procs}", "train.py",
        # gloo: both ranks share the one GPU, which NCCL refuses, whatever CUDA_VISIBLE_DEVICES says
        "train.amp=bf16", "dist.backend=gloo", "logger=none", "log.progress=false",
        f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    result, _ = run_command("train", cmd, timeout_s)
    summary_file = run_dir / "summary.json"
    if summary_file.exists():
        summary = json.loads(summary_file.read_text())
        result.data["summary"] = summary
        result.body = metrics_table(summary, " ".join(cmd[3:]))
    elif result.ok:
        result.status = "failed (no summary.json)"
    return result


def metrics_table(summary: dict[str, Any], command: str) -> str:
    """The training run's final metrics as a markdown table."""
    lines = [f"`torchrun ... {command}`", "", "| metric | value |", "|---|---|"]
    for key in TRAIN_KEYS:
        if key in summary:
            value = summary[key]
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            lines.append(f"| {key} | {shown} |")
    return "\n".join(lines)


def render(device: str, results: list[PartResult], when: str, torch_version: str) -> str:
    """The report: the device, then each part's outcome and what it produced."""
    lines = [
        "# GPU check",
        "",
        f"Device: **{device}**; torch {torch_version}; {when}.",
        "Written by `make gpu-check` (`python -m experiments.bench.gpu_check`).",
        "",
        "| part | outcome | seconds |",
        "|---|---|---:|",
    ]
    for r in results:
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} |")
    titles = {
        "tests": "Tests (`pytest -m gpu`)",
        "bench": "Step time (`experiments.bench.step_time --device cuda`, gloo, one GPU)",
        "train": "Training run (`train.py`, CUDA, bf16)",
    }
    for r in results:
        lines += ["", f"## {titles.get(r.name, r.name)}", "", f"Outcome: {r.status}."]
        if r.body:
            lines += ["", r.body]
        if r.tail:
            lines += ["", "End of its output:", "", "```", r.tail, "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/results/gpu.md")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing ran")
        return 2
    device = torch.cuda.get_device_name(0)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results: list[PartResult] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        for part in args.only:
            print(f"gpu-check: {part} (at most {TIMEOUTS[part]} s)", flush=True)
            try:
                if part == "tests":
                    r = run_tests(TIMEOUTS[part])
                elif part == "bench":
                    r = run_bench(TIMEOUTS[part], work)
                else:
                    r = run_train(TIMEOUTS[part], work)
            except Exception as exc:  # a part's failure is recorded; the next part runs
                r = PartResult(part, f"error: {type(exc).__name__}: {exc}", 0.0)
            print(f"gpu-check: {part}: {r.status} ({r.seconds:.0f} s)", flush=True)
            results.append(r)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(device, results, when, torch.__version__))
    print(f"gpu-check: report written to {out}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
