"""Side by side with the package this one replaces: ``make bench-upstream``.

``python -m experiments.bench.upstream`` times one training step (forward plus
backward, which steps the optimizer inside both wrappers) of the same model,
data and optimizer under three implementations:

1. ``ours``: this repository's :class:`decent_dp.DecentralizedDataParallel`;
2. ``0.2.3``: ``decent-dp==0.2.3`` from PyPI, as a new user would call it;
3. ``torch-ddp``: ``torch.nn.parallel.DistributedDataParallel`` + ``SGD``.

Both packages are imported as ``decent_dp``, so 0.2.3 lives in its own virtual
environment, ``.bench/venv`` (git-ignored), built on first use. It holds only
``decent-dp`` and ``loguru``; torch comes from the main ``.venv`` through a
``.pth`` path entry, which does not run that environment's editable-install
hook, so ``import decent_dp`` there resolves to 0.2.3. Every job is a separate
``torchrun`` launch of this file as a script, so the repository root is never
on ``sys.path`` ahead of the installed package; each worker checks which
``decent_dp`` it imported before it times anything.

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
import gc
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
if not __package__:
    # a worker, started as a script with PYTHONSAFEPATH=1: the repository goes last on the
    # path, after the site-packages that hold the decent_dp being timed
    sys.path.append(str(ROOT))
from experiments.bench import step_time as bench  # noqa: E402

VENV = ROOT / ".bench" / "venv"
UPSTREAM = "0.2.3"
REQUIREMENTS = (f"decent-dp=={UPSTREAM}", "loguru==0.7.3")
IMPLS = ("ours", UPSTREAM, "torch-ddp")
# (procs, topology, numerator, denominator, target): the ratios the issue asks for
TARGETS = (
    (2, "ring", "ours", UPSTREAM, 1.0),
    (4, "one-peer-exp", "ours", UPSTREAM, 0.90),
    (4, "one-peer-exp", "ours", "torch-ddp", 0.65),
)
CATEGORIES = (
    "compute",
    "grad_accumulate",
    "mix",
    "optimizer",
    "wait",
    "zero",
    "launch",
    "python_other",
)


# ------------------------------------------------------------------ environment
def upstream_python() -> Path:
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


# ---------------------------------------------------------------------- worker
def plain_sgd(lr: float = 0.01, momentum: float = 0.9) -> Callable[[list[Any]], torch.optim.SGD]:
    """One optim_fn for every package: 0.2.3 passes (name, tensor) pairs, ours (tensor, name)."""

    def optim_fn(pairs: list[Any]) -> torch.optim.SGD:
        params = [a if isinstance(a, torch.Tensor) else b for a, b in pairs]
        return torch.optim.SGD(params, lr=lr, momentum=momentum)

    return optim_fn


def _check_import(impl: str, impl_file: str) -> None:
    """Refuse to time the wrong package: both are imported as ``decent_dp``."""
    import importlib.metadata

    import decent_dp

    where = Path(decent_dp.__file__).resolve()
    if impl == UPSTREAM:
        version = importlib.metadata.version("decent-dp")
        ok = version == UPSTREAM and VENV in where.parents
    else:
        ok = where.parent == ROOT / "decent_dp"
    if not ok:
        raise RuntimeError(f"implementation {impl!r} imported decent_dp from {where}")


def _wrapper_class(impl: str, impl_file: str) -> Any:
    if impl_file and Path(impl_file).is_dir():  # an exported git revision
        sys.path.append(str(Path(impl_file).parent))
        return importlib.import_module(f"{Path(impl_file).name}.ddp").DecentralizedDataParallel
    if impl_file:
        spec = importlib.util.spec_from_file_location(f"candidate_{impl}", impl_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.DecentralizedDataParallel
    if impl == UPSTREAM:
        from decent_dp.ddp import DecentralizedDataParallel as Upstream

        return Upstream
    from decent_dp import DecentralizedDataParallel as Ours

    return Ours


class _TimedWork:
    """Wraps a collective's work handle so that waiting on it shows up as ``bench.wait``."""

    def __init__(self, work: Any):
        self._work = work

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("bench.wait"):
            return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


@contextmanager
def _instrumented() -> Iterator[None]:
    """Label the wrappers' hooks, collectives and waits for the profiler, without editing them.

    Both packages register their per-bucket work with
    ``register_post_accumulate_grad_hook`` and gossip with ``dist.all_reduce``,
    so patching those two entry points labels both the same way.
    """
    reg = torch.Tensor.register_post_accumulate_grad_hook
    all_reduce = dist.all_reduce

    def register(self: torch.Tensor, fn: Callable[[torch.Tensor], None]) -> Any:
        def labelled(p: torch.Tensor) -> None:
            with torch.profiler.record_function("bench.hook"):
                fn(p)

        return reg(self, labelled)

    def labelled_all_reduce(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("bench.launch"):
            work = all_reduce(*args, **kwargs)
        return _TimedWork(work) if work is not None else None

    torch.Tensor.register_post_accumulate_grad_hook = register  # type: ignore[method-assign]
    dist.all_reduce = labelled_all_reduce
    try:
        yield
    finally:
        torch.Tensor.register_post_accumulate_grad_hook = reg  # type: ignore[method-assign]
        dist.all_reduce = all_reduce


def _labelled_optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    step, zero_grad = opt.step, opt.zero_grad

    def labelled_step(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("bench.optimizer"):
            return step(*args, **kwargs)

    def labelled_zero_grad(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("bench.zero_grad"):
            return zero_grad(*args, **kwargs)

    opt.step = labelled_step  # type: ignore[method-assign]
    opt.zero_grad = labelled_zero_grad  # type: ignore[method-assign]
    return opt


_MIX_OPS = ("aten::add_", "aten::mul_", "aten::mul", "aten::copy_", "aten::sub_", "aten::add")
_ZERO_OPS = ("aten::zero_", "aten::fill_")


def _category(ev: Any) -> str:
    """Where an event's own time goes, from its nearest labelled ancestor (itself included)."""
    in_accumulate = False
    node = ev
    while node is not None:
        name = node.name
        if name == "bench.wait":
            return "wait"
        if name == "bench.optimizer":
            return "optimizer"
        if name == "bench.zero_grad":
            return "zero"
        if name == "bench.launch":
            return "launch"
        if name == "bench.hook":
            if ev is node or not ev.name.startswith("aten::"):
                return "python_other"
            if ev.name in _ZERO_OPS:
                return "zero"
            if ev.name.startswith(("aten::_fused_", "aten::_foreach_")):
                return "optimizer"  # an optimizer built by the wrapper itself, unlabelled
            return "mix" if ev.name in _MIX_OPS else "python_other"
        if "AccumulateGrad" in name:
            in_accumulate = True
        if name in ("bench.forward", "bench.backward"):
            if ev is node:
                return "python_other"
            if in_accumulate:
                return "grad_accumulate"
            if ev.name.startswith("c10d::") or "gloo" in ev.name:
                return "launch"
            return "compute"
        if name == "bench.step":
            return "python_other" if ev is node else "compute"
        node = node.cpu_parent
    return "python_other"


def _breakdown(prof: Any, steps: int) -> dict[str, float]:
    """Milliseconds per step in each category, from the main thread's events."""
    events = [e for e in prof.events() if e.name == "bench.step"]
    thread = events[0].thread if events else None
    out = dict.fromkeys(CATEGORIES, 0.0)
    for ev in prof.events():
        if ev.thread != thread:
            continue
        out[_category(ev)] += ev.self_cpu_time_total / 1e3
    total = sum(e.cpu_time_total for e in events) / 1e3
    out = {k: v / steps for k, v in out.items()}
    out["step_profiled"] = total / steps
    return out


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    if args.profile:
        # 0.2.3 registers its bucket hooks in its second forward: label the whole run
        with _instrumented():
            step, wrapper, row = _setup(args)
            row["profile_ms"] = _profile(step, args)
        if dist.get_rank() == 0:
            _write_json(Path(args.baton) / f"profile-{args.impl}.json", row)
    else:
        step, wrapper, row = _setup(args)
        _take_turns(step, wrapper, row, args)
    del step, wrapper
    gc.collect()  # free DDP's reducer before its process group goes away
    dist.destroy_process_group()


def _setup(args: argparse.Namespace) -> tuple[Callable[[int], None], Any, dict[str, Any]]:
    """The step function of one implementation, its wrapper (if any) and the row's fixed fields."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.impl != "torch-ddp":
        _check_import(args.impl, args.impl_file)
    model, shape, classes = bench.build("mlp")
    data = bench.synthetic_batches(args.batch, shape, classes, seed=rank)
    loss_fn = nn.CrossEntropyLoss()
    optim_fn = plain_sgd()
    if args.profile:
        optim_fn = (lambda f: lambda pairs: _labelled_optimizer(f(pairs)))(optim_fn)
    opt: torch.optim.Optimizer | None = None
    wrapper: Any = None
    if args.impl == "torch-ddp":
        net: nn.Module = nn.parallel.DistributedDataParallel(model)
        opt = optim_fn(list(model.named_parameters()))
    else:
        cls = _wrapper_class(args.impl, args.impl_file)
        wrapper = net = cls(model, optim_fn, topology=args.topology)
    rf = torch.profiler.record_function if args.profile else _label_off

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        with rf("bench.step"):
            with rf("bench.forward"):
                loss = loss_fn(net(x), y)
            with rf("bench.backward"):
                loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)

    row: dict[str, Any] = {
        "impl": args.impl,
        "world_size": world,
        "topology": args.topology if args.impl != "torch-ddp" else "allreduce",
        "batch": args.batch,
        "params_m": bench.n_params(model) / 1e6,
    }
    return step, wrapper, row


def _drain(wrapper: Any) -> None:
    """Finish the gossip in flight, so that it does not spill into the next implementation's turn."""
    if wrapper is None:
        return
    if hasattr(wrapper, "_drain"):  # ours
        wrapper._drain()
    for op in getattr(wrapper, "_comm_ops", []):  # 0.2.3 (a finished handle can wait again)
        if op is not None:
            op.wait()


def _take_turns(
    step: Callable[[int], None], wrapper: Any, row: dict[str, Any], args: argparse.Namespace
) -> None:
    """Time ``--steps`` steps each time the driver hands this implementation the turn."""
    baton, rank = Path(args.baton), dist.get_rank()
    pop = getattr(wrapper, "pop_timers", None)
    if rank == 0:
        _write_json(baton / f"ready-{args.impl}.json", {})
    for rnd in range(args.rounds):
        _await_file(baton / f"go-{args.impl}-{rnd}", None)
        # a cold cache after the idle wait: a few untimed steps first (0.2.3 needs 2 to build)
        warmup = args.warmup if rnd == 0 else args.turn_warmup
        result = dict(row, **bench.timed_steps(step, warmup, args.steps, pop))
        if pop is not None:
            for key, value in pop().items():
                result[key.replace("comm/", "") + "_per_step"] = value / args.steps
        _drain(wrapper)
        dist.barrier()
        if rank == 0:
            _write_json(baton / f"done-{args.impl}-{rnd}.json", result)
    # exiting (freeing, tearing the group down) would load the machine during others' turns
    _await_file(baton / "release", None)


def _profile(step: Callable[[int], None], args: argparse.Namespace) -> dict[str, float]:
    """The per-category breakdown of ``--profile-steps`` steps, the mean over ranks."""
    for i in range(args.warmup):
        step(i)
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0, cpu0, main0 = time.perf_counter(), time.process_time(), time.thread_time()
        for i in range(args.profile_steps):
            step(args.warmup + i)
        wall = (time.perf_counter() - t0) / args.profile_steps
        cpu = (time.process_time() - cpu0) / args.profile_steps
        main_cpu = (time.thread_time() - main0) / args.profile_steps
    parts = _breakdown(prof, args.profile_steps)
    parts["step_wall"] = wall * 1e3
    # CPU time is what 4 processes on 2 cores share; the other threads are gloo's
    parts["cpu_main_thread"] = main_cpu * 1e3
    parts["cpu_other_threads"] = (cpu - main_cpu) * 1e3
    vec = torch.tensor([parts[k] for k in sorted(parts)], dtype=torch.float64)
    dist.all_reduce(vec)
    return {k: float(v) / dist.get_world_size() for k, v in zip(sorted(parts), vec)}


@contextmanager
def _label_off(name: str) -> Iterator[None]:
    yield


# ---------------------------------------------------------------------- driver
def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.rename(path)  # atomic: a reader never sees half a file


def _await_file(path: Path, jobs: list[subprocess.Popen[bytes]] | None) -> None:
    """Poll for ``path``; a driver also gives up when one of its jobs has failed."""
    while not path.exists():
        for job in jobs or []:
            if job.poll() not in (None, 0):
                raise RuntimeError(f"a benchmark job exited with {job.returncode}: {job.args}")
        if jobs and all(job.poll() == 0 for job in jobs) and not path.exists():
            raise RuntimeError(f"every benchmark job has exited, and none wrote {path}")
        time.sleep(0.01)


def _command(
    impl: str, impl_file: str, procs: int, topology: str, baton: Path, args: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    python = upstream_python() if impl == UPSTREAM else Path(sys.executable)
    cmd = [
        str(python), "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
        str(Path(__file__).resolve()), "--worker", "--impl", impl, "--impl-file", impl_file,
        "--topology", topology, "--steps", str(args.steps), "--rounds", str(args.rounds),
        "--warmup", str(args.warmup), "--turn-warmup", str(args.turn_warmup),
        "--profile-steps", str(args.profile_steps), "--batch", str(args.batch),
        "--threads", str(args.threads), "--baton", str(baton),
    ]  # fmt: skip
    # PYTHONSAFEPATH: neither the script's folder (experiments/train/logger.py would shadow the
    # standard library) nor the working directory go first on the workers' sys.path
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
    jobs: list[tuple[str, str]], procs: int, topology: str, args: argparse.Namespace
) -> dict[str, list[dict[str, Any]]]:
    """Start every implementation once, then hand them the turn, round after round.

    Only the implementation holding the turn runs; the others sleep on a file
    poll, so the machine is theirs alone in turn, without a restart per turn.
    """
    baton = Path(tempfile.mkdtemp(prefix="bench-upstream-"))
    running = []
    try:
        for name, path in jobs:
            cmd, env = _command(name, path, procs, topology, baton, args)
            running.append(subprocess.Popen(cmd, env=env, cwd=VENV.parent))
        for name, _ in jobs:  # nobody's turn starts while another is still importing torch
            _await_file(baton / f"ready-{name}.json", running)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in jobs}
        for rnd in range(args.rounds):
            k = rnd % len(jobs)
            for name, _ in jobs[k:] + jobs[:k]:  # rotated: no implementation always goes first
                (baton / f"go-{name}-{rnd}").touch()
                done = baton / f"done-{name}-{rnd}.json"
                _await_file(done, running)
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
    name: str, path: str, procs: int, topology: str, args: argparse.Namespace
) -> dict[str, float]:
    baton = Path(tempfile.mkdtemp(prefix="bench-upstream-"))
    try:
        cmd, env = _command(name, path, procs, topology, baton, args)
        subprocess.run([*cmd, "--profile"], check=True, env=env, cwd=VENV.parent)
        return json.loads((baton / f"profile-{name}.json").read_text())["profile_ms"]
    finally:
        shutil.rmtree(baton, ignore_errors=True)


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in rows)
    out["rounds_ms"] = [round(r["median_step_s"] * 1e3, 2) for r in rows]
    return out


def tables(results: dict[str, Any]) -> str:
    """Markdown: step times, ratios against the targets, and the profile breakdown."""
    lines = [
        "| procs | topology | impl | median step (ms) | rounds (ms) | CPU per step and rank (ms) "
        "| page faults per step | wait | mix | optim |",
        "|---:|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for cfg in results["configs"]:
        for r in cfg["rows"]:

            def ms(key: str, r: dict[str, Any] = r) -> str:
                return f"{r[key] * 1e3:.1f}" if key in r else ""

            lines.append(
                f"| {cfg['procs']} | {cfg['topology']} | {r['impl']} | {ms('median_step_s')} | "
                f"{' '.join(f'{x:.0f}' for x in r['rounds_ms'])} | {ms('cpu_step_s')} | "
                f"{r.get('faults_per_step', float('nan')):.0f} | {ms('wait_s_per_step')} | {ms('mix_s_per_step')} | {ms('optim_s_per_step')} |"
            )
    loads = ", ".join(
        f"{c['procs']} procs {c['load_avg'][0]:.1f} -> {c['load_avg'][1]:.1f}"
        for c in results["configs"]
        if "load_avg" in c
    )
    if loads:
        lines += ["", f"Load average of the machine before -> after the rounds: {loads}."]
    lines += [
        "",
        "| procs | topology | ratio of median steps | measured | target | met | ratio of CPU per step |",
        "|---:|---|---|---:|---:|---|---:|",
    ]
    for cfg in results["configs"]:
        rows = {r["impl"]: r for r in cfg["rows"]}
        targets = {
            (num, den): target
            for procs, topo, num, den, target in TARGETS
            if (procs, topo) == (cfg["procs"], cfg["topology"])
        }
        for num in rows:
            for den in (UPSTREAM, "torch-ddp"):
                if num == den or den not in rows or (num == "torch-ddp" and den == UPSTREAM):
                    continue
                ratio = rows[num]["median_step_s"] / rows[den]["median_step_s"]
                cpu = rows[num]["cpu_step_s"] / rows[den]["cpu_step_s"]
                target = targets.get((num, den))
                met = "" if target is None else ("yes" if ratio <= target else "no")
                goal = "" if target is None else f"<= {target:.2f}"
                lines.append(
                    f"| {cfg['procs']} | {cfg['topology']} | {num} / {den} | {ratio:.2f} | {goal} "
                    f"| {met} | {cpu:.2f} |"
                )
    if any(cfg.get("profile") for cfg in results["configs"]):
        head = " | ".join(CATEGORIES)
        lines += [
            "",
            "Profile (torch.profiler, ms per step, mean over ranks; the profiler's own "
            "overhead is in python_other):",
            "",
            f"| procs | topology | impl | step (profiled) | {head} | CPU main thread "
            "| CPU other threads |",
            "|---:|---|---|---:|" + "---:|" * (len(CATEGORIES) + 2),
        ]
        for cfg in results["configs"]:
            for impl, p in cfg.get("profile", {}).items():
                cells = " | ".join(f"{p[c]:.1f}" for c in CATEGORIES)
                lines.append(
                    f"| {cfg['procs']} | {cfg['topology']} | {impl} | {p['step_wall']:.1f} | {cells} "
                    f"| {p['cpu_main_thread']:.1f} | {p['cpu_other_threads']:.1f} |"
                )
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


def _export_revision(rev: str) -> Path | None:
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


def _candidate(text: str) -> tuple[str, str]:
    name, _, where = text.partition("=")
    if not name or name in IMPLS or not where:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=FILE or NAME=GIT_REVISION with a NAME other than {IMPLS}"
        )
    if Path(where).is_file():
        return name, str(Path(where).resolve())
    pkg = _export_revision(where)
    if pkg is None:
        raise argparse.ArgumentTypeError(
            f"{where!r} in {text!r} is neither a file nor a git revision of this repository"
        )
    return name, str(pkg)


def main(argv: list[str] | None = None) -> None:
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
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--profile", action="store_true", help="also profile each implementation")
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--out", default="outputs/bench/upstream.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--impl-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--topology", default="ring", help=argparse.SUPPRESS)
    parser.add_argument("--baton", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.rounds < 0 or (args.rounds == 0 and not args.profile):
        parser.error(f"--rounds {args.rounds} is invalid; it must be >= 1 (or 0 with --profile)")
    if args.turn_warmup < 0:
        parser.error(f"--turn-warmup {args.turn_warmup} is invalid; it must be >= 0")
    for name in ("steps", "batch", "threads", "profile_steps"):
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
                "threads",
                "profile_steps",
            )
        },
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "ours": _ours_state(),
        "configs": [],
    }
    for procs, topo in args.configs:
        print(
            f"== {procs} processes, {topo} (CPU, gloo, {args.threads} thread(s) each)", flush=True
        )
        load_before = os.getloadavg()[0]
        runs = _run_rounds(jobs, procs, topo, args) if args.rounds else {}
        cfg: dict[str, Any] = {
            "procs": procs,
            "topology": topo,
            # other users' load (1-minute average) around the timed rounds: noise to judge by
            "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "rows": [_median(runs[name]) for name, _ in jobs if runs.get(name)],
        }
        if args.profile:
            cfg["profile"] = {
                name: _run_profile(name, path, procs, topo, args) for name, path in jobs
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
