"""``make gpu-check``: the GPU tests, the step-time benchmark and a short bf16 training run.

Three parts, each a subprocess with its own timeout, in the order of what a
first GPU run most needs to know, within ``--budget`` seconds (540 by default):

1. ``train``: ``train.py`` under ``torchrun`` on CUDA with ``train.amp=bf16``,
   2 ranks on the one GPU through gloo (digits and the small CNN, built in, no
   download): whether the whole stack runs at all, in about a minute;
2. ``tests``: ``pytest -m gpu`` (what ``make test-gpu`` runs). Its timeout is
   budgeted from a measurement: the seconds one cold process takes to import
   torch and initialise CUDA (each test spawns its ranks, which pay it in
   parallel) times the number of GPU tests collected, plus the tests' work;
3. ``bench``: :mod:`experiments.bench.step_time` with ``--device cuda``: at 1
   process the wrapper beside local training, and gloo with CUDA tensors at 2
   and 4 processes, all on the one GPU, in the time left.

Each part runs in a process group of its own: a timeout kills the whole
group, so no spawned rank is left holding GPU memory while the next part
runs. The parts fail soft: a failure or a timeout is recorded and the next
part still runs, and the report is rewritten after every part, so a check cut
short keeps what it measured. The report, ``docs/results/gpu.md`` by default,
names the device and holds each part's outcome: the test summary, the
benchmark table and the training run's final metrics. Without CUDA it runs
nothing and exits with status 2 after one line saying so.

Example::

    make gpu-check                        # or: python -m experiments.bench.gpu_check
    python -m experiments.bench.gpu_check --out /tmp/gpu.md --only tests
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from experiments.report.doc_data import md_table

PARTS = ("train", "tests", "bench")
BUDGET_S = 540.0  # the whole check, under the 10 minutes a device command may run
TRAIN_S = 110.0
BENCH_MIN_S, BENCH_MAX_S = 60.0, 150.0
TEST_WORK_S = 6.0  # a GPU test's own work besides its ranks' start, measured on an H100-class GPU
TESTS_MIN_S = 120.0
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
    """Run ``cmd``; a non-zero exit or a timeout becomes the part's status, never an exception.

    The command leads a new session: on a timeout its whole process group is
    killed (spawned ranks and daemon children included), not only its leader.
    """
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        return PartResult(name, f"error: {exc}", time.perf_counter() - t0), ""
    try:
        out, err = proc.communicate(timeout=timeout_s)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        status = f"timed out after {timeout_s:.0f} s"
    finally:
        kill_group(proc.pid)  # what the leader left running after it exited
    output = _text(out) + _text(err)
    result = PartResult(name, status, time.perf_counter() - t0)
    if not result.ok:
        result.tail = "\n".join(output.strip().splitlines()[-40:])
    return result, output


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in the group ``pgid`` (none left is fine)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def spawn_seconds(timeout_s: float = 120.0) -> float:
    """Seconds a cold process takes to import torch and initialise CUDA (as each rank does)."""
    code = "import torch; torch.zeros(1, device='cuda').sum().item()"
    t0 = time.perf_counter()
    result, _ = run_command("spawn", [sys.executable, "-c", code], timeout_s)
    return time.perf_counter() - t0 if result.ok else timeout_s


def count_gpu_tests() -> int:
    """How many tests ``pytest -m gpu`` would run."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    _, output = run_command("collect", cmd, 120.0)
    return sum(1 for line in output.splitlines() if "::" in line)


def tests_budget(n_tests: int, spawn_s: float, left_s: float) -> float:
    """The tests' timeout: each pays one rank start and its work, within what is left."""
    wanted = 30.0 + n_tests * (spawn_s + TEST_WORK_S)
    return max(TESTS_MIN_S, min(wanted * 1.25, left_s - BENCH_MIN_S))


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
    rows = []
    for key in TRAIN_KEYS:
        if key in summary:
            value = summary[key]
            rows.append([key, f"{value:.4g}" if isinstance(value, float) else str(value)])
    return f"`torchrun ... {command}`\n\n" + md_table(["metric", "value"], ["---", "---"], rows)


def render(device: str, results: list[PartResult], when: str, torch_version: str) -> str:
    """The report: the device, then each part's outcome and what it produced."""
    lines = [
        "# GPU check",
        "",
        f"Device: **{device}**; torch {torch_version}; {when}.",
        "Written by `make gpu-check` (`python -m experiments.bench.gpu_check`).",
        "",
        md_table(
            ["part", "outcome", "seconds"],
            ["---", "---", "---:"],
            [[r.name, r.status, f"{r.seconds:.0f}"] for r in results],
        ),
    ]
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
    parser.add_argument(
        "--budget", type=float, default=BUDGET_S, help="seconds for the whole check"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing ran")
        return 2
    device = torch.cuda.get_device_name(0)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: list[PartResult] = []
    deadline = time.perf_counter() + args.budget
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        for part in [p for p in PARTS if p in args.only]:
            left = deadline - time.perf_counter()
            try:
                if part == "train":
                    timeout = min(TRAIN_S, left)
                    print(f"gpu-check: train (at most {timeout:.0f} s)", flush=True)
                    r = run_train(timeout, work)
                elif part == "tests":
                    spawn, n = spawn_seconds(), count_gpu_tests()
                    timeout = tests_budget(n, spawn, deadline - time.perf_counter())
                    print(
                        f"gpu-check: tests: {n} tests, {spawn:.1f} s per cold start "
                        f"-> at most {timeout:.0f} s",
                        flush=True,
                    )
                    r = run_tests(timeout)
                    r.body += f"\n\n{n} GPU tests; a cold CUDA process started in {spawn:.1f} s."
                else:
                    timeout = max(BENCH_MIN_S, min(BENCH_MAX_S, left))
                    print(f"gpu-check: bench (at most {timeout:.0f} s)", flush=True)
                    r = run_bench(timeout, work)
            except Exception as exc:  # a part's failure is recorded; the next part runs
                r = PartResult(part, f"error: {type(exc).__name__}: {exc}", 0.0)
            print(f"gpu-check: {part}: {r.status} ({r.seconds:.0f} s)", flush=True)
            results.append(r)
            out.write_text(render(device, results, when, torch.__version__))  # kept if cut short
    print(f"gpu-check: report written to {out}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
