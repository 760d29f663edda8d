"""Side by side with the package this one replaces: ``make bench-upstream``.

``python -m experiments.bench.upstream`` times one training step (forward plus
backward, which steps the optimizer inside both wrappers) of the same model,
data and optimizer under three implementations:

1. ``ours``: this repository's :class:`decent_dp.DecentralizedDataParallel`;
2. ``0.2.3``: ``decent-dp==0.2.3`` from PyPI, as a new user would call it;
3. ``torch-ddp``: ``torch.nn.parallel.DistributedDataParallel`` + the same optimizer.

Two models (``--models``): ``mlp``, about 9.5M parameters with SGD and the
wrappers' default bucket size; and ``gpt``, the paper's GPT-2 recipe
(:mod:`experiments.bench.gpt_workload`: a tied-embedding GPT whose
``model(x, y)`` returns ``(logits, loss)``, AccumAdamW on two param groups, a
warmup-cosine schedule, a GradScaler, clipping at 1.0 and 100 MB buckets).

Both packages are imported as ``decent_dp``, so 0.2.3 lives in its own virtual
environment, ``.bench/venv`` (git-ignored), built on first use by
:mod:`experiments.bench.upstream_env`. Every job is a separate ``torchrun``
launch of this file as a script, so the repository root is never on
``sys.path`` ahead of the installed package; each worker
(:mod:`experiments.bench.upstream_worker`) checks which ``decent_dp`` it
imported before it times anything. This module is the driver: it starts the
jobs, hands out the turns and writes the tables.

The implementations take turns. Each one is started once (one ``torchrun``
job per implementation) and then sleeps until the driver hands it the turn;
it then runs ``--turn-warmup`` untimed and ``--steps`` timed steps, finishes
its gossip, and hands the turn back. Every round gives each implementation one
turn, in an order rotated every round, so a slow spell of a shared machine
hits all of them. The medians over rounds, their ratios and the targets are
printed and written to ``--out`` (JSON and Markdown). Beside the wall-clock
step time, each row has the CPU time per step of a process (all its threads,
gloo's included): 4 processes on 2 cores share the CPU, so that work, not
overlap, sets the pace there.

``--profile`` adds one torch.profiler run per implementation that splits a
step into compute, gradient accumulation, mixing, optimizer, waiting, zeroing,
launching the gossip, and Python/other overhead. ``--candidate NAME=FILE``
times a modified wrapper (a file defining ``DecentralizedDataParallel`` with
this package's signature) as one more implementation; ``--candidate
NAME=REV`` times ``decent_dp`` as of a git revision (before/after a change).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

if not __package__:
    # a worker, started as a script with PYTHONSAFEPATH=1: the repository goes last on the
    # path, after the site-packages that hold the decent_dp being timed
    sys.path.append(str(Path(__file__).resolve().parents[2]))
from experiments.bench.step_time import add_common_arguments, median_row  # noqa: E402
from experiments.bench.upstream_env import (  # noqa: E402
    IMPLS,
    ROOT,
    UPSTREAM,
    VENV,
    ensure_upstream_env,
    export_revision,
    upstream_python,
)
from experiments.bench.upstream_worker import CATEGORIES, await_file, worker  # noqa: E402
from experiments.report.doc_data import md_table  # noqa: E402

MODELS = ("mlp", "gpt")

# (model, procs, topology, numerator, denominator, target): the ratios this benchmark checks
TARGETS = (
    ("mlp", 2, "ring", "ours", UPSTREAM, 1.0),
    ("mlp", 4, "one-peer-exp", "ours", UPSTREAM, 0.90),
    ("mlp", 4, "one-peer-exp", "ours", "torch-ddp", 0.65),
    ("gpt", 2, "ring", "ours", UPSTREAM, 0.85),
    ("gpt", 4, "one-peer-exp", "ours", UPSTREAM, 0.85),
)


def _batch(model: str, args: argparse.Namespace) -> int:
    return args.gpt_batch if model == "gpt" else args.batch


def _command(
    impl: str,
    impl_file: str,
    procs: int,
    topology: str,
    baton: Path,
    args: argparse.Namespace,
    model: str = "mlp",
) -> tuple[list[str], dict[str, str]]:
    python = upstream_python() if impl == UPSTREAM else Path(sys.executable)
    cmd = [
        str(python), "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
        str(Path(__file__).resolve()), "--worker", "--impl", impl, "--impl-file", impl_file,
        "--topology", topology, "--steps", str(args.steps), "--rounds", str(args.rounds),
        "--warmup", str(args.warmup), "--turn-warmup", str(args.turn_warmup),
        "--profile-steps", str(args.profile_steps), "--batch", str(_batch(model, args)),
        "--threads", str(args.threads), "--baton", str(baton), "--model", model,
    ]  # fmt: skip
    if args.bucket_mb is not None:
        cmd += ["--bucket-mb", str(args.bucket_mb)]
    # PYTHONSAFEPATH: neither the script's folder nor the working directory go first on the
    # workers' sys.path, ahead of the site-packages that hold the decent_dp being timed
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONSAFEPATH": "1"}
    env.pop("PYTHONPATH", None)
    return cmd, env


def _stop(jobs: list[subprocess.Popen[bytes]]) -> None:
    for job in jobs:
        if job.poll() is None:
            job.terminate()
    for job in jobs:
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            job.kill()


def _run_rounds(
    jobs: list[tuple[str, str]],
    procs: int,
    topology: str,
    args: argparse.Namespace,
    model: str = "mlp",
) -> dict[str, list[dict[str, Any]]]:
    """Start every implementation once, then hand them the turn, round after round.

    Only the implementation holding the turn runs; the others sleep on a file
    poll, so the machine is theirs alone in turn, without a restart per turn.
    """
    baton = Path(tempfile.mkdtemp(prefix="bench-upstream-"))
    running = []
    try:
        for name, path in jobs:
            cmd, env = _command(name, path, procs, topology, baton, args, model)
            running.append(subprocess.Popen(cmd, env=env, cwd=VENV.parent))
        for name, _ in jobs:  # nobody's turn starts while another is still importing torch
            await_file(baton / f"ready-{name}.json", running)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in jobs}
        for rnd in range(args.rounds):
            k = rnd % len(jobs)
            for name, _ in jobs[k:] + jobs[:k]:  # rotated: no implementation always goes first
                (baton / f"go-{name}-{rnd}").touch()
                done = baton / f"done-{name}-{rnd}.json"
                await_file(done, running)
                row = json.loads(done.read_text())
                runs[name].append(row)
                print(
                    f"  [round {rnd + 1}] {name:12s} {row['median_step_s'] * 1e3:8.1f} ms "
                    f"(CPU {row['cpu_step_s'] * 1e3:.1f} ms per rank)",
                    flush=True,
                )
        (baton / "release").touch()
        for job in running:
            if job.wait() != 0:
                raise RuntimeError(f"a benchmark job exited with {job.returncode}: {job.args}")
        return runs
    finally:
        _stop(running)
        shutil.rmtree(baton, ignore_errors=True)


def _run_profile(
    name: str, path: str, procs: int, topology: str, args: argparse.Namespace, model: str = "mlp"
) -> dict[str, float]:
    baton = Path(tempfile.mkdtemp(prefix="bench-upstream-"))
    try:
        cmd, env = _command(name, path, procs, topology, baton, args, model)
        subprocess.run([*cmd, "--profile"], check=True, env=env, cwd=VENV.parent)
        return json.loads((baton / f"profile-{name}.json").read_text())["profile_ms"]
    finally:
        shutil.rmtree(baton, ignore_errors=True)


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One implementation's row: the medians over its rounds, and every round's step time."""
    return {**median_row(rows), "rounds_ms": [round(r["median_step_s"] * 1e3, 2) for r in rows]}


def _model(cfg: dict[str, Any]) -> str:
    return str(cfg.get("model", "mlp"))  # results written before the gpt model timed the mlp


def _where(cfg: dict[str, Any]) -> list[str]:
    return [_model(cfg), str(cfg["procs"]), cfg["topology"]]


def _step_table(configs: list[dict[str, Any]]) -> str:
    """Each implementation's median step, its rounds, CPU time, page faults and phases."""
    header = ["model", "procs", "topology", "impl", "median step (ms)", "rounds (ms)"]
    header += ["CPU per step and rank (ms)", "page faults per step", "wait", "mix", "optim"]
    rows = []
    for cfg in configs:
        for r in cfg["rows"]:

            def ms(key: str, r: dict[str, Any] = r) -> str:
                return f"{r[key] * 1e3:.1f}" if key in r else ""

            rounds = " ".join(f"{x:.0f}" for x in r["rounds_ms"])
            faults = f"{r.get('faults_per_step', float('nan')):.0f}"
            timed = [ms("median_step_s"), rounds, ms("cpu_step_s"), faults]
            phases = [ms(f"{k}_s_per_step") for k in ("wait", "mix", "optim")]
            rows.append([*_where(cfg), r["impl"], *timed, *phases])
    return md_table(header, ["---", "---:", "---", "---", "---:", "---", *["---:"] * 5], rows)


def _ratio_table(configs: list[dict[str, Any]]) -> str:
    """The ratios of median steps (against 0.2.3 and torch DDP) and the targets they meet."""
    header = ["model", "procs", "topology", "ratio of median steps", "measured", "target", "met"]
    header.append("ratio of CPU per step")
    rows = []
    for cfg in configs:
        by_impl = {r["impl"]: r for r in cfg["rows"]}
        targets = {
            (num, den): target
            for model, procs, topo, num, den, target in TARGETS
            if (model, procs, topo) == (_model(cfg), cfg["procs"], cfg["topology"])
        }
        for num in by_impl:
            for den in (UPSTREAM, "torch-ddp"):
                if num == den or den not in by_impl or (num == "torch-ddp" and den == UPSTREAM):
                    continue
                ratio = by_impl[num]["median_step_s"] / by_impl[den]["median_step_s"]
                cpu = by_impl[num]["cpu_step_s"] / by_impl[den]["cpu_step_s"]
                target = targets.get((num, den))
                met = "" if target is None else ("yes" if ratio <= target else "no")
                goal = "" if target is None else f"<= {target:.2f}"
                rows.append(
                    [*_where(cfg), f"{num} / {den}", f"{ratio:.2f}", goal, met, f"{cpu:.2f}"]
                )
    return md_table(header, ["---", "---:", "---", "---", "---:", "---:", "---", "---:"], rows)


def _profile_table(configs: list[dict[str, Any]]) -> str:
    """The profiler's split of a step, per implementation."""
    header = ["model", "procs", "topology", "impl", "step (profiled)", *CATEGORIES]
    header += ["CPU main thread", "CPU other threads"]
    keys = ("step_wall", *CATEGORIES, "cpu_main_thread", "cpu_other_threads")
    rows = [
        [*_where(cfg), impl, *(f"{p[k]:.1f}" for k in keys)]
        for cfg in configs
        for impl, p in cfg.get("profile", {}).items()
    ]
    return md_table(header, ["---", "---:", "---", "---", *["---:"] * len(keys)], rows)


def tables(results: dict[str, Any]) -> str:
    """Markdown: step times, ratios against the targets, and the profile breakdown."""
    configs = results["configs"]
    lines = [_step_table(configs)]
    loads = ", ".join(
        f"{_model(c)} {c['procs']} procs {c['load_avg'][0]:.1f} -> {c['load_avg'][1]:.1f}"
        for c in configs
        if "load_avg" in c
    )
    if loads:
        lines += ["", f"Load average of the machine before -> after the rounds: {loads}."]
    lines += ["", _ratio_table(configs)]
    if any(cfg.get("profile") for cfg in configs):
        lines += [
            "",
            "Profile (torch.profiler, ms per step, mean over ranks; the profiler's own "
            "overhead is in python_other):",
            "",
            _profile_table(configs),
        ]
    return "\n".join(lines)


def _ours_state() -> str:
    """The commit, and the hash of decent_dp/ddp.py when it differs from the commit."""

    def git(*cmd: str) -> str:
        res = subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True)
        return res.stdout.strip() if res.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "decent_dp")
    if not dirty:
        return head
    ddp = hashlib.sha1((ROOT / "decent_dp" / "ddp.py").read_bytes()).hexdigest()[:10]
    return f"{head} + uncommitted decent_dp changes (ddp.py sha1 {ddp})"


def _config(text: str) -> tuple[int, str]:
    procs, _, topo = text.partition(":")
    if not procs.isdigit() or int(procs) < 1 or not topo:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not PROCS:TOPOLOGY (e.g. 2:ring or 4:one-peer-exp)"
        )
    return int(procs), topo


def _candidate(text: str) -> tuple[str, str]:
    name, _, where = text.partition("=")
    if not name or name in IMPLS or not where:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=FILE or NAME=GIT_REVISION with a NAME other than {IMPLS}"
        )
    if Path(where).is_file():
        return name, str(Path(where).resolve())
    pkg = export_revision(where)
    if pkg is None:
        raise argparse.ArgumentTypeError(
            f"{where!r} in {text!r} is neither a file nor a git revision of this repository"
        )
    return name, str(pkg)


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring; ``--worker`` runs one rank of a job instead."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--configs",
        type=_config,
        nargs="+",
        default=[(2, "ring"), (4, "one-peer-exp")],
        help="PROCS:TOPOLOGY pairs",
    )
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(MODELS),
        choices=MODELS,
        help="mlp: 9.5M parameters, SGD; gpt: the paper's GPT-2 recipe on a 1M-parameter GPT",
    )
    parser.add_argument("--gpt-batch", type=int, default=8, help="sequences per rank (gpt)")
    parser.add_argument(
        "--bucket-mb",
        type=float,
        default=None,
        help="bucket size of both wrappers (default: the wrapper's 25 for mlp, the script's 100 "
        "for gpt)",
    )
    parser.add_argument(
        "--candidate",
        type=_candidate,
        action="append",
        default=[],
        metavar="NAME=FILE|NAME=REV",
        help="also time a wrapper from FILE (defines DecentralizedDataParallel) or from a git "
        "revision's decent_dp",
    )
    parser.add_argument("--rounds", type=int, default=10, help="turns of each implementation")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per turn")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before round 1")
    parser.add_argument(
        "--turn-warmup", type=int, default=2, help="untimed steps at the start of later turns"
    )
    add_common_arguments(parser, batch=32, out="outputs/bench/upstream.json")
    parser.add_argument("--profile", action="store_true", help="also profile each implementation")
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--impl", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--impl-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--topology", default="ring", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mlp", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--baton", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.rounds < 0 or (args.rounds == 0 and not args.profile):
        parser.error(f"--rounds {args.rounds} is invalid; it must be >= 1 (or 0 with --profile)")
    if args.turn_warmup < 0:
        parser.error(f"--turn-warmup {args.turn_warmup} is invalid; it must be >= 0")
    if args.bucket_mb is not None and not args.bucket_mb > 0:
        parser.error(f"--bucket-mb {args.bucket_mb} is invalid; it must be > 0")
    for name in ("steps", "batch", "gpt_batch", "threads", "profile_steps"):
        if getattr(args, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} {getattr(args, name)} is invalid; it must be >= 1"
            )
    if args.warmup < 2:
        parser.error(
            f"--warmup {args.warmup} is invalid; 0.2.3 builds its buckets in step 2, so >= 2"
        )
    if UPSTREAM in args.impls:
        ensure_upstream_env()
    jobs = [(impl, "") for impl in args.impls] + list(args.candidate)
    out = (ROOT / args.out) if not Path(args.out).is_absolute() else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    args.out = str(out)
    results: dict[str, Any] = {
        "settings": {
            k: getattr(args, k)
            for k in (
                "rounds",
                "steps",
                "warmup",
                "turn_warmup",
                "batch",
                "gpt_batch",
                "bucket_mb",
                "threads",
                "profile_steps",
            )
        },
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "ours": _ours_state(),
        "configs": [],
    }
    for model, (procs, topo) in [(m, c) for m in args.models for c in args.configs]:
        print(
            f"== {model}, {procs} processes, {topo} (CPU, gloo, {args.threads} thread(s) each)",
            flush=True,
        )
        load_before = os.getloadavg()[0]
        runs = _run_rounds(jobs, procs, topo, args, model) if args.rounds else {}
        cfg: dict[str, Any] = {
            "model": model,
            "procs": procs,
            "topology": topo,
            # other users' load (1-minute average) around the timed rounds: noise to judge by
            "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "rows": [_median(runs[name]) for name, _ in jobs if runs.get(name)],
        }
        if args.profile:
            cfg["profile"] = {
                name: _run_profile(name, path, procs, topo, args, model) for name, path in jobs
            }
        results["configs"].append(cfg)
    text = (
        f"decent_dp (ours): {results['ours']}; torch {results['torch']}; "
        f"settings {results['settings']}\n\n" + tables(results)
    )
    out.write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text(text + "\n")
    print()
    print(text)
    print(f"\nwritten to {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
