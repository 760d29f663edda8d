"""Every key of the ``train``, ``log`` and ``checkpoint`` groups, on every path.

A key either changes the run (something in its metrics lines, its summary, its
files or its log differs from the run without it) or is refused in one line that
names the key, its value and the path. :func:`schema_keys` reads the keys from the
schema dataclasses, so a key added later has no probe here and fails the walk
until it gets one.

A path is a way through the one Trainer: ``fault_tolerance`` (none, or torchft on a
lighthouse of the test's own), ``train.shard_size`` (1 or 2) and an outer optimizer
(none or DiLoCo). Its runs are real: two ranks (or two elastic hosts) forked once,
each running every job of the path in turn through ``run(cfg)``, 4 steps of
digits each.

To keep the walk cheap, probes whose observables are disjoint share one variant
run (their ``group``): each one's observable depends on its own key only (the
summary's batch size, the steps of lines holding a name, the checkpoint
directories, the log), so a key ignored there still shows as no change.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from experiments.schema import ConfigError
from experiments.train.config import CheckpointConfig, LogConfig, TrainConfig
from tests.support.launch import compose_config

SECTIONS = {"train": TrainConfig, "log": LogConfig, "checkpoint": CheckpointConfig}

# every job of every path, before its own overrides
BASE = (
    "logger=none",
    "topology=ring",
    "train.max_steps=4",
    "train.batch_size=16",
    "log.every=2",
    "log.consensus_every=0",
    "log.consensus_sketch=0",
    "log.progress=false",
    "checkpoint.every_steps=2",
    "checkpoint.signal_check_every=2",
)
# the elastic hosts: two, a quorum every 3 steps
ELASTIC = (
    "fault_tolerance=torchft",
    "fault_tolerance.min_replicas=2",
    "fault_tolerance.timeout_s=20",
    "fault_tolerance.quorum_every=3",
    "fault_tolerance.host=127.0.0.1",
)
DILOCO = ("outer=diloco", "outer.every=3")
SHARDED = ("train.shard_size=2",)


@dataclass(frozen=True)
class Route:
    """A path through the Trainer: its name, its overrides, whether its hosts are elastic."""

    name: str
    overrides: tuple[str, ...]
    elastic: bool = False

    def markers(self) -> tuple[str, ...]:
        """What a refusal on this path names as the path."""
        names = ["fault_tolerance=torchft"] if self.elastic else []
        if any(o.startswith("train.shard_size") for o in self.overrides):
            names.append("shard_size")
        if any(o.startswith("outer=") for o in self.overrides):
            names.append("outer")
        return tuple(names)


ROUTES = {
    r.name: r
    for r in (
        Route("none", ()),
        Route("none+diloco", DILOCO),
        Route("shard2", SHARDED),
        # its replicas cannot be checkpointed: no checkpoints, and so no stop that saves one
        Route(
            "shard2+diloco",
            (*SHARDED, *DILOCO, "checkpoint.every_steps=0", "checkpoint.on_signal=false"),
        ),
        Route("torchft", ELASTIC, elastic=True),
        Route("torchft+diloco", ELASTIC + DILOCO, elastic=True),
        Route("torchft+shard2", ELASTIC + SHARDED, elastic=True),
    )
}


@dataclass
class Outcome:
    """What one job left: its summary or error, metrics lines, checkpoint steps and log."""

    summary: dict[str, Any] | None
    error: str | None
    lines: list[dict[str, Any]]
    checkpoints: list[str]
    log: str

    def steps_with(self, name: str) -> list[int]:
        """The steps of the lines that hold ``name``."""
        return [x["step"] for x in self.lines if name in x]

    def last(self, name: str) -> Any:
        """The newest value of ``name`` in the lines."""
        values = [x[name] for x in self.lines if name in x]
        return values[-1] if values else None

    def get(self, name: str) -> Any:
        """A summary value (``None`` after an error)."""
        return (self.summary or {}).get(name)


Observe = Callable[[Outcome], Any]


@dataclass(frozen=True)
class Probe:
    """How a key is seen: a variant of a base, and what of the outcome it changes.

    Attributes:
        variant: The overrides that set the key (over ``base``).
        observe: The part of an outcome the key changes.
        base: The probe's own base (over the path's); empty: the path's shared run.
        group: Probes of one group share their variant run (disjoint observables).
        first: A job run before, in the same directory (a checkpoint to resume).
        signal_at: Raise the pre-emption signal after this step, in base and variant.
        lm: A language model's job (the tiny GPT on a token corpus of the test's).
        other: The variant on a path that sets ``variant`` itself (the path's own key).
    """

    variant: tuple[str, ...]
    observe: Observe
    base: tuple[str, ...] = ()
    group: str | None = None
    first: tuple[str, ...] | None = None
    signal_at: int | None = None
    lm: bool = False
    other: tuple[str, ...] = ()

    def on(self, route: Route) -> tuple[str, ...]:
        """The variant's overrides on ``route``."""
        return self.other if set(self.variant) <= set(route.overrides) else self.variant


def _train_loss(o: Outcome) -> Any:
    return o.last("train/loss"), o.error


def _steps(o: Outcome) -> Any:
    return o.get("train/steps"), o.error


SAVED = ("checkpoint.every_steps=2",)  # as in BASE, unless the path cannot save
SIGNALLED = (*SAVED, "checkpoint.on_signal=true")
NAN = ("optim.lr=1e12", "log.every=1")
EPOCHS = ("train.max_steps=null", "train.batch_size=512")
RESHARD = ("topology=complete",)

PROBES: dict[str, Probe] = {
    # train
    "train.batch_size": Probe(("train.batch_size=8",), lambda o: o.get("batch_size"), group="a"),
    "train.global_batch_size": Probe(
        ("train.global_batch_size=16",), lambda o: o.get("global_batch_size"), group="b"
    ),
    "train.epochs": Probe(("train.epochs=2",), _steps, base=(*EPOCHS, "train.epochs=1")),
    "train.max_steps": Probe(("train.max_steps=3",), _steps, group="b"),
    "train.seed": Probe(("train.seed=1",), _train_loss, group="c"),
    "train.amp": Probe(
        ("train.amp=bf16",), lambda o: "train.amp=bf16 is ignored on cpu" in o.log, group="a"
    ),
    "train.grad_clip_norm": Probe(("train.grad_clip_norm=0.001",), _train_loss, group="d"),
    "train.nan_policy": Probe(
        ("train.nan_policy=skip",),
        lambda o: (o.error is None, o.get("train/skipped_steps")),
        base=NAN,
    ),
    "train.label_smoothing": Probe(("train.label_smoothing=0.5",), _train_loss, group="e"),
    # CUDA's flags: what a run on this path sets for them (none on a CPU)
    "train.cudnn_benchmark": Probe(
        ("train.cudnn_benchmark=false",), lambda o: o.get("backend_flags"), group="a"
    ),
    "train.tf32": Probe(("train.tf32=false",), lambda o: o.get("backend_flags"), group="a"),
    "train.shard_size": Probe(
        ("train.shard_size=2",),
        lambda o: o.get("comm/bytes_per_step"),
        group="d",
        other=("train.shard_size=1",),
    ),
    # log
    "log.every": Probe(("log.every=1",), lambda o: o.steps_with("train/loss"), group="a"),
    "log.consensus_every": Probe(
        ("log.consensus_every=3",), lambda o: o.steps_with("consensus/distance"), group="b"
    ),
    "log.consensus_sketch": Probe(
        ("log.consensus_sketch=8",), lambda o: o.steps_with("consensus/distance_sketch"), group="a"
    ),
    "log.progress": Probe(("log.progress=true",), lambda o: "it/s" in o.log, group="a"),
    "log.peak_flops": Probe(("log.peak_flops=1e9",), lambda o: o.last("perf/mfu"), lm=True),
    "log.update_norm": Probe(
        ("log.update_norm=true",), lambda o: o.steps_with("train/update_norm"), group="a"
    ),
    # checkpoint
    "checkpoint.every_steps": Probe(
        ("checkpoint.every_steps=1",), lambda o: o.checkpoints, group="a"
    ),
    "checkpoint.keep": Probe(
        ("checkpoint.keep=1",), lambda o: len(o.checkpoints), base=SAVED, group="c"
    ),
    "checkpoint.allow_reshard": Probe(
        ("checkpoint.allow_reshard=true",),
        lambda o: (o.error is None, o.get("resumed_from_step")),
        base=(*SAVED, *RESHARD),
        first=SAVED,
    ),
    "checkpoint.on_signal": Probe(
        ("checkpoint.on_signal=false",), _steps, base=SIGNALLED, signal_at=1
    ),
    # the stop's step: its checkpoint
    "checkpoint.signal_check_every": Probe(
        ("checkpoint.signal_check_every=3",), lambda o: o.checkpoints, base=SIGNALLED, signal_at=1
    ),
}


def schema_keys() -> list[str]:
    """Every key of the walked groups, from their schema dataclasses."""
    return [f"{name}.{f.name}" for name, schema in SECTIONS.items() for f in fields(schema)]


# ------------------------------------------------------------------ the jobs of a path


@dataclass(frozen=True)
class Job:
    """One run of a path: its directory name, its overrides, a job before it, a signal."""

    name: str
    overrides: tuple[str, ...]
    first: tuple[str, ...] | None = None
    signal_at: int | None = None


@dataclass
class Plan:
    """A path's jobs and, for each probed key, its base job and its variant job."""

    jobs: dict[str, Job] = field(default_factory=dict)
    pairs: dict[str, tuple[str, str]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def add(self, job: Job) -> str:
        self.jobs.setdefault(job.name, job)
        return job.name


def refusal(route: Route, overrides: tuple[str, ...], world: int) -> str | None:
    """The one-line ``ConfigError`` a config of the path raises in validation, or ``None``."""
    from experiments.train.run import validate

    cfg = compose_config(*BASE, *route.overrides, *overrides)
    saved = dict(os.environ)
    os.environ.update(LOCAL_WORLD_SIZE="1" if route.elastic else str(world))
    try:
        with warnings.catch_warnings():  # the default replica id's: the walk names its hosts
            warnings.simplefilter("ignore")
            validate(cfg, 1 if route.elastic else world)
    except ConfigError as exc:
        return str(exc)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return None


def plan(route: Route, keys: list[str], lm: tuple[str, ...], world: int = 2) -> Plan:
    """The jobs that probe ``keys`` on ``route``: refusals found first, probes grouped."""
    out = Plan()
    base = out.add(Job("base", route.overrides))
    groups: dict[str, list[str]] = {}
    for key in keys:
        probe = PROBES[key]
        extra = lm if probe.lm else ()
        reason = refusal(route, (*extra, *probe.base, *probe.on(route)), world)
        if reason is None:
            reason = refusal(route, (*extra, *probe.base), world)
        if reason is not None:
            out.refused[key] = reason
            continue
        # what the probe's base sets beyond the path's own jobs
        own = tuple(o for o in (*extra, *probe.base) if o not in BASE + route.overrides)
        if probe.group is not None and not own:
            groups.setdefault(probe.group, []).append(key)
            continue
        tag = key.split(".", 1)[1]
        start = base
        if probe.signal_at is not None:  # the signalled probes share their base
            start = out.add(Job("signal-base", route.overrides + own, None, probe.signal_at))
        elif own or probe.first is not None:
            start = out.add(Job(f"{tag}-base", route.overrides + own, probe.first))
        variant = out.add(
            Job(f"{tag}-variant", route.overrides + own + probe.on(route), probe.first,
                probe.signal_at)
        )  # fmt: skip
        out.pairs[key] = (start, variant)
    for group, members in groups.items():
        variant = tuple(o for key in members for o in PROBES[key].on(route))
        name = out.add(Job(f"group-{group}", route.overrides + variant))
        for key in members:
            out.pairs[key] = (base, name)
    return out


# ------------------------------------------------------------------ running them


class _Capture(logging.Handler):
    def __init__(self, sink: io.StringIO) -> None:
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.write(record.getMessage() + "\n")


@contextlib.contextmanager
def _captured(sink: io.StringIO) -> Iterator[None]:
    """The job's log records and stderr (tqdm's bar) into ``sink``."""
    handler = _Capture(sink)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with contextlib.redirect_stderr(sink):
            yield
    finally:
        root.removeHandler(handler)


@contextlib.contextmanager
def _signal_after(step: int | None) -> Iterator[None]:
    """Raise the pre-emption signal (SIGUSR2) once the Trainer has taken ``step``.

    A handler that only records it is installed first, as a launcher's would be:
    with ``checkpoint.on_signal=false`` the run goes on, and a stop hands over to it.
    """
    from experiments.train import trainer

    if step is None:
        yield
        return
    original = trainer.Trainer._after_step

    def after(self: Any, bar: Any) -> None:
        if self.step == step:
            signal.raise_signal(signal.SIGUSR2)
        original(self, bar)

    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    trainer.Trainer._after_step = after  # type: ignore[method-assign]
    try:
        yield
    finally:
        trainer.Trainer._after_step = original  # type: ignore[method-assign]
        signal.signal(signal.SIGUSR2, previous)


def _run_one(cfg: Any, run_dir: Path, signal_at: int | None) -> tuple[Any, str | None, str]:
    from experiments.train.run import run

    sink = io.StringIO()
    summary, error = None, None
    with _captured(sink), _signal_after(signal_at):
        try:
            summary = run(cfg, run_dir=run_dir)
        except SystemExit as exc:
            error = f"SystemExit({exc.code})"
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return summary, error, sink.getvalue()


def run_jobs(
    rank: int, jobs: list[Job], root: str, route: Route, extra: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """Every job of a path on this rank (or elastic host), in turn; rank 0's outcomes.

    Args:
        rank: This process's rank, or the elastic host's index.
        jobs: The path's jobs.
        root: The directory of the path's runs (one per job).
        route: The path.
        extra: Overrides of every job (the lighthouse's address).
    """
    out: dict[str, dict[str, Any]] = {}
    for job in jobs:
        run_dir = Path(root) / job.name
        host = ()
        if route.elastic:
            host = (f"fault_tolerance.replica_id=h{rank}",)
        if job.first is not None:
            cfg = compose_config(*BASE, *extra, *host, *route.overrides, *job.first)
            _run_one(cfg, run_dir, None)
        cfg = compose_config(*BASE, *extra, *host, *job.overrides)
        summary, error, text = _run_one(cfg, run_dir, job.signal_at)
        mine = run_dir / f"h{rank}" if route.elastic else run_dir
        metrics = mine / "metrics.jsonl"
        lines = (
            [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        )
        ckpts = mine / "checkpoints"
        names = sorted(p.name for p in ckpts.glob("step_*")) if ckpts.exists() else []
        out[job.name] = {
            "summary": summary,
            "error": error,
            "lines": lines,
            "checkpoints": names,
            "log": text,
        }
    return out if rank == 0 else {}


def _elastic_host(rank: int, world: int, *args: Any) -> dict[str, dict[str, Any]]:
    # each host is its own torchrun --nproc_per_node=1: a world of one, no process group
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    return run_jobs(rank, *args)


def _rank(rank: int, world: int, *args: Any) -> dict[str, dict[str, Any]]:
    return run_jobs(rank, *args)


def walk(route: Route, keys: list[str], root: Path, lm: tuple[str, ...]) -> dict[str, Any]:
    """Run ``route``'s plan; return, per key, ``("refused", line)`` or ``(base, variant)`` seen."""
    from tests.support import elastic_cases as ec
    from tests.support.dist_harness import run_distributed

    paths = plan(route, keys, lm)
    jobs = list(paths.jobs.values())
    results: list[tuple[str, Any]]
    if route.elastic:
        import multiprocessing as mp

        server = ec._LighthouseProcess(mp.get_context("spawn"))
        try:
            extra = (f"fault_tolerance.lighthouse={server.url}",)
            results = run_distributed(
                _elastic_host, 2, jobs, str(root), route, extra, init=False, timeout=600
            )
        finally:
            server.shutdown()
    else:
        results = run_distributed(_rank, 2, jobs, str(root), route, (), timeout=600)
    status, value = results[0]
    assert status == "ok", f"{route.name}: {status}: {value}"
    outcomes = {name: Outcome(**o) for name, o in value.items()}
    seen: dict[str, Any] = {k: ("refused", line) for k, line in paths.refused.items()}
    for key, (base, variant) in paths.pairs.items():
        observe = PROBES[key].observe
        seen[key] = (observe(outcomes[base]), observe(outcomes[variant]), outcomes[variant].error)
    shutil.rmtree(root, ignore_errors=True)
    return seen
