"""One ``torchrun`` job of ``make bench-upstream``: one implementation, timed in turns.

:func:`worker` runs on every rank of a job that the driver
(:mod:`experiments.bench.upstream`) starts by launching that file as a script. It
checks which ``decent_dp`` it imported, builds the model, data and optimizer that
every implementation shares, and then either takes turns (waits for the driver's
``go`` file, times ``--steps`` steps, writes ``done``) or, with ``--profile``,
splits a step's time into :data:`CATEGORIES` with torch.profiler. The files of that
exchange go through :func:`write_json` and :func:`await_file`.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from experiments.bench import step_time as bench
from experiments.bench.upstream_env import ROOT, UPSTREAM, VENV

__all__ = ["CATEGORIES", "plain_sgd", "worker", "write_json", "await_file"]

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

    def labelled_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("bench.optimizer"):
            return step(*args, **kwargs)

    def labelled_zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("bench.zero_grad"):
            return zero_grad(*args, **kwargs)

    # bound methods: an LR scheduler wraps ``opt.step`` through its ``__func__``
    opt.step = types.MethodType(labelled_step, opt)  # type: ignore[method-assign]
    opt.zero_grad = types.MethodType(labelled_zero_grad, opt)  # type: ignore[method-assign]
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
    """One rank of ``args.impl``'s job: time its turns, or with ``args.profile`` profile it."""
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    if args.profile:
        # 0.2.3 registers its bucket hooks in its second forward: label the whole run
        with _instrumented():
            step, wrapper, row = _setup(args)
            row["profile_ms"] = _profile(step, args)
        if dist.get_rank() == 0:
            write_json(Path(args.baton) / f"profile-{args.impl}.json", row)
    else:
        step, wrapper, row = _setup(args)
        _take_turns(step, wrapper, row, args)
    del step, wrapper
    gc.collect()  # free DDP's reducer before its process group goes away
    dist.destroy_process_group()


def _setup(args: argparse.Namespace) -> tuple[Callable[[int], None], Any, dict[str, Any]]:
    """The step function of one implementation, its wrapper (if any) and the row's fixed fields."""
    rank = dist.get_rank()
    if args.impl != "torch-ddp":
        _check_import(args.impl, args.impl_file)
    model_name = getattr(args, "model", "mlp")
    if model_name == "gpt":
        return _setup_gpt(args)
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
        kwargs = {} if args.bucket_mb is None else {"bucket_size_in_mb": args.bucket_mb}
        wrapper = net = cls(model, optim_fn, topology=args.topology, **kwargs)
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

    return step, wrapper, _row(args, "mlp", bench.n_params(model))


def _setup_gpt(args: argparse.Namespace) -> tuple[Callable[[int], None], Any, dict[str, Any]]:
    """The paper's GPT-2 workload (see :mod:`experiments.bench.gpt_workload`) under one wrapper.

    Both wrappers get the script's flags: AccumAdamW, the warmup-cosine schedule,
    a GradScaler (disabled: no fp16 on CPU, as the script with ``amp = false``),
    clipping at 1.0 and ``bucket_size_in_mb``. torch DDP gets the same optimizer,
    schedule and clipping, applied after backward.
    """
    from experiments.bench import gpt_workload as gw

    rank = dist.get_rank()
    model = gw.build()
    data = gw.token_batches(args.batch, seed=rank)
    optim_fn = gw.accum_adamw_fn()
    if args.profile:
        optim_fn = (lambda f: lambda pairs: _labelled_optimizer(f(pairs)))(optim_fn)
    bucket_mb = gw.BUCKET_MB if args.bucket_mb is None else args.bucket_mb
    opt: torch.optim.Optimizer | None = None
    sched: Any = None
    wrapper: Any = None
    if args.impl == "torch-ddp":
        net: nn.Module = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        opt = optim_fn(list(model.named_parameters()))
        sched = gw.cosine_fn(opt)
    else:
        cls = _wrapper_class(args.impl, args.impl_file)
        wrapper = net = cls(
            model,
            optim_fn,
            lr_scheduler_fn=gw.cosine_fn,
            topology=args.topology,
            scaler=torch.GradScaler("cpu", enabled=False),
            grad_clip_norm=gw.CLIP_NORM,
            bucket_size_in_mb=bucket_mb,
        )
    rf = torch.profiler.record_function if args.profile else _label_off

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        with rf("bench.step"):
            with rf("bench.forward"):
                _, loss = net(x, y)
            with rf("bench.backward"):
                loss.backward()
            if opt is not None:
                with rf("bench.optimizer"):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), gw.CLIP_NORM)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)

    return step, wrapper, _row(args, "gpt", gw.n_params(model), bucket_mb=bucket_mb)


def _row(args: argparse.Namespace, model: str, params: int, **extra: Any) -> dict[str, Any]:
    """A result row's fixed fields: what ran, on how many ranks, and the model's size."""
    return {
        "impl": args.impl,
        "model": model,
        "world_size": dist.get_world_size(),
        "topology": args.topology if args.impl != "torch-ddp" else "allreduce",
        "batch": args.batch,
        **extra,
        "params_m": params / 1e6,
    }


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
        write_json(baton / f"ready-{args.impl}.json", {})
    for rnd in range(args.rounds):
        await_file(baton / f"go-{args.impl}-{rnd}", None)
        # a cold cache after the idle wait: a few untimed steps first (0.2.3 needs 2 to build)
        warmup = args.warmup if rnd == 0 else args.turn_warmup
        result = dict(row, **bench.timed_steps(step, warmup, args.steps, pop))
        if pop is not None:
            for key, value in pop().items():
                result[key.replace("comm/", "") + "_per_step"] = value / args.steps
        _drain(wrapper)
        dist.barrier()
        if rank == 0:
            write_json(baton / f"done-{args.impl}-{rnd}.json", result)
    # exiting (freeing, tearing the group down) would load the machine during others' turns
    await_file(baton / "release", None)


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


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` as JSON, all at once for the side that polls for it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.rename(path)  # atomic: a reader never sees half a file


def await_file(path: Path, jobs: list[subprocess.Popen[bytes]] | None) -> None:
    """Poll for ``path``; a driver also gives up when one of its jobs has failed."""
    while not path.exists():
        for job in jobs or []:
            if job.poll() not in (None, 0):
                raise RuntimeError(f"a benchmark job exited with {job.returncode}: {job.args}")
        if jobs and all(job.poll() == 0 for job in jobs) and not path.exists():
            raise RuntimeError(f"every benchmark job has exited, and none wrote {path}")
        time.sleep(0.01)
