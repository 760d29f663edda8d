"""Structured-config schemas for ``conf/``, registered in Hydra's ConfigStore.

Every option file of every config group starts its defaults list with one of
the schemas stored here (``- /schema/<group>/<schema>@_here_``), and
``config.yaml`` starts with ``base_config``. Hydra then checks each YAML
against its dataclass while composing, so a misspelt key or a value of the
wrong type fails at compose time, before any process group exists.

The ``dataset`` and ``model`` schemas live beside their builders, in
:mod:`experiments.data.schema` and :mod:`experiments.models.schema`; they are
registered and re-exported here. Every schema module builds on
:mod:`experiments.schema` (:class:`ConfigError`, :func:`require`,
:func:`require_number`, :func:`name_enum`, :func:`typed_section`). What a type
cannot express (a positive size, ``heads`` dividing ``dim``, a share in ``[0, 1)``)
each dataclass checks itself in ``__post_init__``, so a section is checked wherever it
becomes its dataclass: in :func:`config_object`, which the trainer's ``validate``
calls once before any collective, and in the builders, which read their section
through its group's typed section, so every path reports the same one line
``"<group>.<key>=<value> is invalid; it must be <allowed>"``. Only the rules that
span groups (or need the world size) are ``experiments.train.run.validate``'s.

The ``optim`` and ``scheduler`` schemas are in
:mod:`experiments.train.optim_schema`, also registered and re-exported here.
This module holds the schemas of the topology, network, compression and
logger groups and of the top level, their registration, :func:`config_object`,
and the resolver and error formatting that ``config.yaml`` and ``train.py``
need. It is past 500 lines because it is one table: short dataclasses, one per
group option, each with its own checks, and the code that registers them and
types a composed config by them.

Registered names (topologies, models, datasets, optimizers, schedulers,
network profiles) are enums: an unknown name in any YAML or override fails at
compose time with OmegaConf's message listing the allowed values. The enum
members are ``str`` subclasses that print as their plain value, so downstream
code can compare them with strings (``cfg.topology.name == "ring"``) and put
them in f-strings. Topologies are read from :class:`decent_dp.topo.TopologyReg`
when this module is imported, so a custom topology must be registered before
that import to be usable from a config.

``conf/config.yaml`` names its run and sweep directories with the
``${launch_time:FORMAT}`` resolver registered here instead of Hydra's
``${now:FORMAT}``: every rank of one torchrun launch, and every restart of it,
gets the same timestamp, so all ranks agree on the directory and a restarted
job finds its checkpoints. The resolver is cached, so a SLURM job launched by
submitit (and every requeue of it) keeps the directory printed at submission.

Example::

    import experiments.train.config  # registers the schemas
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir="/abs/path/conf", version_base="1.3"):
        cfg = compose("config", overrides=["topology=ring"])
"""

from __future__ import annotations

import datetime
import os
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from decent_dp.topo import TopologyReg
from experiments.data.schema import (
    CifarConfig,
    DatasetConfig,
    DatasetName,
    ImageNetConfig,
    PartitionName,
    SyntheticConfig,
    TokensConfig,
    check_dataset,
    dataset_section,
)
from experiments.models.schema import (
    GPTConfig,
    ModelConfig,
    ModelName,
    NormName,
    SmallCNNConfig,
    VitConfig,
    check_model,
    model_section,
)
from experiments.network.netem import profile_from_cfg
from experiments.schema import (
    ConfigError,
    NameEnum,
    is_int,
    name_enum,
    plain,
    require,
    require_number,
    schema_section,
    typed_section,
)
from experiments.train import optim_schema
from experiments.train.engine import EngineConfig, EngineName
from experiments.train.fault_tolerance import FaultToleranceConfig, FaultToleranceName
from experiments.train.optim_schema import *  # noqa: F403  (re-exported, see __all__)
from experiments.train.optim_schema import (
    AccumAdamConfig,
    AccumAdamWConfig,
    AdamConfig,
    AdamWConfig,
    ConstantConfig,
    CosineWarmupConfig,
    LaggedVAdamWConfig,
    OptimTargetConfig,
    QGMSGDConfig,
    SchedulerTargetConfig,
    SGDConfig,
    StepConfig,
)
from experiments.train.outer import OuterConfig, outer_section

__all__ = [
    "ALLREDUCE",
    "NameEnum",
    "name_enum",
    "TopologyName",
    "ModelName",
    "DatasetName",
    "PartitionName",
    "NetworkName",
    "LoggerName",
    "WandbMode",
    "AmpMode",
    "NanPolicy",
    "NormName",
    "ModelConfig",
    "SmallCNNConfig",
    "VitConfig",
    "GPTConfig",
    "DatasetConfig",
    "CifarConfig",
    "ImageNetConfig",
    "SyntheticConfig",
    "TokensConfig",
    *optim_schema.__all__,  # the optim and scheduler groups' names
    "TopologyConfig",
    "TopologyTargetConfig",
    "NetworkConfig",
    "CompressionName",
    "CompressionConfig",
    "compression_arg",
    "LoggerConfig",
    "TrainConfig",
    "LogConfig",
    "CheckpointConfig",
    "DistConfig",
    "MainConfig",
    "config_object",
    "register_configs",
    "plain",
    "launch_time",
    "compose_error_line",
    "ConfigError",
    "require",
    "require_number",
    "is_int",
    "typed_section",
    "check_dataset",
    "dataset_section",
    "check_model",
    "model_section",
]

ALLREDUCE = "allreduce"
"""Topology name of the baseline: torch DDP with an ordinary optimizer."""


TopologyName = name_enum("TopologyName", [*TopologyReg.names(), ALLREDUCE], __name__)
NetworkName = name_enum(
    "NetworkName", ["none", "ethernet_25g", "infiniband_100g", "custom"], __name__
)
LoggerName = name_enum("LoggerName", ["wandb", "none"], __name__)
CompressionName = name_enum("CompressionName", ["none", "bf16", "int8", "randk"], __name__)
WandbMode = name_enum("WandbMode", ["offline", "online", "disabled"], __name__)
AmpMode = name_enum("AmpMode", ["bf16", "fp16", "off"], __name__)
NanPolicy = name_enum("NanPolicy", ["error", "skip"], __name__)


# ---------------------------------------------------------------- topology, network, logger


@dataclass
class TopologyConfig:
    """``topology`` group: a registered topology, or ``allreduce`` for the torch DDP baseline.

    Attributes:
        name: Registered topology name, or ``allreduce``.
        local_world_size: Ranks per node; ``None`` reads ``LOCAL_WORLD_SIZE`` (set by torchrun).
        kwargs: Extra keyword arguments of the topology's constructor.
        bucket_size_in_mb: Gradient/parameter bucket size (also torch DDP's ``bucket_cap_mb``).
        sync_buffer_in_global_avg: Average the buffers (BatchNorm statistics) too
            when the globally averaged model is formed for evaluation.
    """

    name: TopologyName = MISSING  # type: ignore[valid-type]
    local_world_size: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    bucket_size_in_mb: float = 25.0
    sync_buffer_in_global_avg: bool = True

    def __post_init__(self) -> None:
        _check_topology(self)


def _check_topology(topo: TopologyConfig | TopologyTargetConfig) -> None:
    """What a type cannot say of a topology section, registered or ``_target_``."""
    lws = topo.local_world_size
    require_number("topology.local_world_size", lws, at_least=1, nullable=True)
    require_number("topology.bucket_size_in_mb", topo.bucket_size_in_mb, above=0)


@dataclass
class TopologyTargetConfig:
    """``topology`` as ``_target_: their_pkg.module.MyTopology``, a ``Topology`` subclass.

    The class is built as ``MyTopology(world_size, local_world_size, **kwargs)``, its
    arguments being every key of the section but these (:mod:`experiments.train.targets`).

    Attributes:
        _target_: The ``decent_dp.topo.Topology`` subclass, as a dotted import path.
        name: Set to the ``_target_`` path, for logs, summaries and checkpoints.
        local_world_size: Ranks per node; ``None`` reads ``LOCAL_WORLD_SIZE``.
        bucket_size_in_mb: As for a registered topology.
        sync_buffer_in_global_avg: As for a registered topology.
        kwargs: The class's own arguments.
    """

    _target_: str = MISSING
    name: str = MISSING
    local_world_size: int | None = None
    bucket_size_in_mb: float = 25.0
    sync_buffer_in_global_avg: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_topology(self)


@dataclass
class NetworkConfig:
    """``network`` group: emulated interconnect (``none`` = no emulation).

    ``latency_ms`` and ``bandwidth_gbps`` are required for ``custom``; the
    named profiles carry their values for reference. ``efficiency`` (``custom``
    only) is the share of the line rate a collective's payload gets.
    ``procs_per_host`` emulates hosts of that many consecutive ranks: a gossip
    inside a host is not held back (its ranks talk over the real loopback), and
    one across hosts shares the host's link with the host's other ranks (1:
    every rank its own host with its own link). ``collective_ms`` (a fixed cost
    of each collective call) and ``stack_cpu_ms_per_mb`` (CPU milliseconds the
    host's network stack spends per MB a rank sends, burned beside training)
    are ``custom``'s calibration terms; the testbed's measured values are in
    ``docs/results/network/calibration.json``. The values are checked by building
    the profile (:func:`experiments.network.netem.profile_from_cfg`);
    ``procs_per_host`` must divide the world size (``validate``).
    """

    name: NetworkName = MISSING  # type: ignore[valid-type]
    latency_ms: float | None = None
    bandwidth_gbps: float | None = None
    efficiency: float | None = None
    collective_ms: float | None = None
    stack_cpu_ms_per_mb: float | None = None
    procs_per_host: int = 1

    def __post_init__(self) -> None:
        try:
            profile_from_cfg(self)
        except ValueError as exc:
            raise ConfigError(f"network={self.name}: {exc}") from None


@dataclass
class CompressionConfig:
    """``compression`` group: what gossip sends (``decent_dp``'s ``compression=``).

    Attributes:
        name: ``none`` (exact), ``bf16``, ``int8`` or ``randk``.
        ratio: The share of coordinates ``randk`` sends, in ``(0, 1]``; 1.0 for the others.
    """

    name: CompressionName = MISSING  # type: ignore[valid-type]
    ratio: float = 1.0

    def __post_init__(self) -> None:
        require_number("compression.ratio", self.ratio, above=0, at_most=1)


def compression_arg(section: Any) -> str | None:
    """The wrapper's ``compression=`` for a ``compression`` section (``None`` when absent)."""
    if section is None or str(section.name) == "none":
        return None
    name = str(section.name)
    return f"randk:{float(section.ratio)}" if name == "randk" else name


@dataclass
class LoggerConfig:
    """``logger`` group: ``wandb`` (offline by default, written into the run directory) or ``none``.

    Attributes:
        name: ``wandb`` or ``none``; metrics.jsonl is written either way.
        mode: wandb mode; ``offline`` needs no account (``wandb sync`` later).
        project: wandb project.
        entity: wandb entity (user or team); ``None`` = the account's default.
        group: wandb group; ``None`` = the sweep directory's name in a multirun.
        tags: wandb tags.
    """

    name: LoggerName = MISSING  # type: ignore[valid-type]
    mode: WandbMode = WandbMode["offline"]  # type: ignore[valid-type]
    project: str = "decent-dp"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- top level


@dataclass
class TrainConfig:
    """``train``: the optimisation budget and numerics.

    Attributes:
        batch_size: Samples per worker per step (global batch = batch_size x world size);
            a sample is an image, or a sequence of ``block_size`` tokens.
        global_batch_size: Samples per step over all workers; when set, ``batch_size``
            becomes ``global_batch_size / world size``, which must divide exactly.
        epochs: Passes over the training set; ignored when ``max_steps`` is set.
        max_steps: Total optimizer steps; ``None`` = ``epochs`` x steps per epoch.
        seed: Seed of the model initialisation (same on every rank) and the data order.
        amp: Autocast dtype on CUDA (``bf16``, ``fp16`` with a GradScaler, ``off``);
            ignored on CPU with a warning.
        grad_clip_norm: Clip the gradient norm to this value; 0 = off.
        nan_policy: On a non-finite loss, ``error`` stops the run and ``skip``
            replaces that batch's gradient by zeros.
        label_smoothing: Cross-entropy label smoothing in ``[0, 1)``.
        cudnn_benchmark: ``torch.backends.cudnn.benchmark`` on CUDA (cuDNN times its
            convolution algorithms once per shape and keeps the fastest); no-op on CPU.
        tf32: TF32 matmuls and convolutions on CUDA (``torch.backends.cuda.matmul`` and
            ``torch.backends.cudnn`` ``allow_tf32``); no-op on CPU.
        shard_size: Ranks per replica: ``S > 1`` shards each replica's model over ``S``
            consecutive ranks with FSDP2 and gossips between the ``world / S`` replicas
            (:mod:`experiments.train.sharding`); 1 = every rank holds the whole model;
            it must divide the world size (``validate``).
    """

    batch_size: int = 32
    global_batch_size: int | None = None
    epochs: int = 20
    max_steps: int | None = None
    seed: int = 0
    amp: AmpMode = AmpMode["off"]  # type: ignore[valid-type]
    grad_clip_norm: float = 0.0
    nan_policy: NanPolicy = NanPolicy["error"]  # type: ignore[valid-type]
    label_smoothing: float = 0.0
    cudnn_benchmark: bool = True
    tf32: bool = True
    shard_size: int = 1

    def __post_init__(self) -> None:
        if self.max_steps is None:  # the budget in epochs
            require_number("train.epochs", self.epochs, above=0, kind="integer")
        else:
            require_number("train.max_steps", self.max_steps, above=0, kind="integer")
        require_number("train.batch_size", self.batch_size, above=0, kind="integer")
        clip = self.grad_clip_norm
        require_number("train.grad_clip_norm", clip, at_least=0, note="0 disables")
        require_number("train.label_smoothing", self.label_smoothing, at_least=0, below=1)
        require_number("train.seed", self.seed, at_least=0)


@dataclass
class LogConfig:
    """``log``: how often metrics are computed and written.

    Attributes:
        every: Write a metrics line every this many steps.
        consensus_every: Also compute the exact consensus distance every this many steps
            (it is always computed at every evaluation and at the end); 0 = only then.
        consensus_sketch: Size ``k`` of the count-sketch estimate of the consensus
            distance logged on every metrics line (``k`` numbers of communication);
            0 = no sketch.
        progress: Show a tqdm progress bar on rank 0.
        peak_flops: Peak FLOP/s of one device, the denominator of a language model's
            ``perf/mfu``; the default, 312e12, is an A100's dense bf16 peak, the GPU of
            the published GPT-2 runs. Set it to your device's (an H100 SXM: 989e12).
        update_norm: Also log ``train/update_norm``, this rank's ``||x(t) - x(t-1)||``
            over the logged step (the local update and the mix together), at the cost
            of one copy of the model before each logged step.
    """

    every: int = 10
    consensus_every: int = 50
    consensus_sketch: int = 1024
    progress: bool = True
    peak_flops: float = 312e12
    update_norm: bool = False

    def __post_init__(self) -> None:
        require_number("log.every", self.every, at_least=1)
        only = "0 = only at evaluations"
        require_number("log.consensus_every", self.consensus_every, at_least=0, note=only)
        sketch = self.consensus_sketch
        require_number(
            "log.consensus_sketch", sketch, at_least=0, kind="integer", note="0 = no sketch"
        )
        require_number("log.peak_flops", self.peak_flops, above=0)


@dataclass
class CheckpointConfig:
    """``checkpoint``: crash-safe per-rank checkpoints under ``<run dir>/checkpoints``.

    Attributes:
        every_steps: Save every this many steps (and at the end); 0 = off.
        keep: Complete checkpoints to keep.
        allow_reshard: Resume a checkpoint written with another world size or
            topology by starting every worker from the global average; the
            old checkpoints then move to ``checkpoints/before_reshard_*``.
        on_signal: On SIGTERM or the pre-emption signal (``SIGUSR2``), save every
            rank's checkpoint at an agreed step and exit to be requeued.
        signal_check_every: Agree on such a stop every this many steps (one
            all-reduce of two integers); at most this many steps run after the signal.
    """

    every_steps: int = 0
    keep: int = 3
    allow_reshard: bool = False
    on_signal: bool = True
    signal_check_every: int = 10

    def __post_init__(self) -> None:
        require_number("checkpoint.every_steps", self.every_steps, at_least=0, note="0 = off")
        require_number("checkpoint.keep", self.keep, at_least=1)
        require_number("checkpoint.signal_check_every", self.signal_check_every, at_least=1)


@dataclass
class DistConfig:
    """``dist``: process-group options.

    Attributes:
        backend: ``nccl``, ``gloo``, or ``None`` (nccl when CUDA is usable, else gloo).
        timeout_s: Seconds a collective may wait before it fails.
    """

    backend: str | None = None
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        known = self.backend in (None, "nccl", "gloo")
        require("dist.backend", self.backend, known, "nccl, gloo or null (auto)")
        require_number("dist.timeout_s", self.timeout_s, above=0)


@dataclass
class MainConfig:
    """The primary config (``config.yaml``); group sections are typed by their own schemas."""

    model: Any = MISSING
    dataset: Any = MISSING
    optim: Any = MISSING
    scheduler: Any = MISSING
    topology: Any = MISSING
    network: Any = MISSING
    compression: Any = None
    logger: Any = MISSING
    outer: Any = None  # the outer group (experiments.train.outer); None reads as outer=none
    fault_tolerance: Any = None  # experiments.train.fault_tolerance; None reads as none
    engine: Any = None  # experiments.train.packed; None reads as distributed
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistConfig = field(default_factory=DistConfig)


_SCHEMAS: dict[str, dict[str, type]] = {
    "model": {
        "model": ModelConfig,
        "small_cnn": SmallCNNConfig,
        "vit": VitConfig,
        "gpt": GPTConfig,
    },
    "dataset": {
        "dataset": DatasetConfig,
        "cifar": CifarConfig,
        "imagenet": ImageNetConfig,
        "synthetic": SyntheticConfig,
        "tokens": TokensConfig,
    },
    "optim": {
        "sgd": SGDConfig,
        "qgm_sgd": QGMSGDConfig,
        "adam": AdamConfig,
        "adamw": AdamWConfig,
        "accum_adam": AccumAdamConfig,
        "accum_adamw": AccumAdamWConfig,
        "lagged_v_adamw": LaggedVAdamWConfig,
    },
    "scheduler": {
        "cosine_warmup": CosineWarmupConfig,
        "constant": ConstantConfig,
        "step": StepConfig,
    },
    "topology": {"topology": TopologyConfig},
    "network": {"network": NetworkConfig},
    "compression": {"compression": CompressionConfig},
    "logger": {"logger": LoggerConfig},
    "outer": {"outer": OuterConfig},
    "fault_tolerance": {"fault_tolerance": FaultToleranceConfig},
    "engine": {"engine": EngineConfig},
}


def _every(schema: type, names: Any) -> dict[str, type]:
    """``schema`` for each of a group's ``names`` (an enum)."""
    return {str(n): schema for n in names}


def _fixed(group: str, schema: type) -> Callable[[Any], DictConfig]:
    """A top-level section without a name (``train``, ...) typed by its schema."""
    return lambda values: schema_section(values or {}, group, schema, group)


def _named(
    group: str, schemas: Mapping[str, type], default: str, target: type | None = None
) -> Callable[[Any], DictConfig]:
    """A group's section typed by the schema of its ``name`` (or ``target``, by ``_target_``)."""
    return lambda values: typed_section(values, group, schemas, default, target)


# how each section of the top level is typed (and checked), whatever its source
_SECTIONS: dict[str, Callable[[Any], DictConfig]] = {
    "model": model_section,
    "dataset": dataset_section,
    "optim": _named("optim", _SCHEMAS["optim"], "sgd", OptimTargetConfig),
    "scheduler": _named("scheduler", _SCHEMAS["scheduler"], "cosine_warmup", SchedulerTargetConfig),
    "topology": _named(
        "topology", _every(TopologyConfig, TopologyName), "one-peer-exp", TopologyTargetConfig
    ),
    "network": _named("network", _every(NetworkConfig, NetworkName), "none"),
    "compression": _named("compression", _every(CompressionConfig, CompressionName), "none"),
    "logger": _named("logger", _every(LoggerConfig, LoggerName), "wandb"),
    "outer": outer_section,
    "fault_tolerance": _named(
        "fault_tolerance", _every(FaultToleranceConfig, FaultToleranceName), "none"
    ),
    "engine": _named("engine", _every(EngineConfig, EngineName), "distributed"),
    "train": _fixed("train", TrainConfig),
    "log": _fixed("log", LogConfig),
    "checkpoint": _fixed("checkpoint", CheckpointConfig),
    "dist": _fixed("dist", DistConfig),
}


def config_object(cfg: Any) -> MainConfig:
    """The composed config as its schemas' dataclasses: each group's own checks, in one place.

    Every section is typed by the schema of its group and name (a ``_target_`` section by
    its group's target schema) and built as that dataclass, whose ``__post_init__``
    checks what a type cannot express; a plain ``DictConfig`` is typed the same way.
    ``experiments.train.run.validate`` calls this before any collective and then checks
    only the rules across groups.

    Args:
        cfg: The composed config (a ``DictConfig``; ``_target_`` sections typed or not).

    Returns:
        The :class:`MainConfig`; an absent optional group (``outer``, ...) stays ``None``.

    Raises:
        ConfigError: One line naming the key, the value and what is allowed.
    """
    objects: dict[str, Any] = {}
    for f in fields(MainConfig):
        section = cfg.get(f.name)
        optional = section is None and f.default is None
        objects[f.name] = None if optional else OmegaConf.to_object(_SECTIONS[f.name](section))
    return MainConfig(**objects)


def register_configs() -> None:
    """Store ``base_config`` and every ``schema/<group>/<name>`` in Hydra's ConfigStore.

    Called on import; calling it again re-stores the same nodes.
    """
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=MainConfig)
    for group, schemas in _SCHEMAS.items():
        for name, node in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=node)


_LAUNCH: datetime.datetime | None = None


def _agreed_timestamp(now: float) -> float:
    """The first timestamp any rank of this torchrun launch offered, via the agent's store."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env:
        return now
    try:
        import torch.distributed as dist

        store = dist.TCPStore(
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=30),
        )
        # the run id keeps separate launches apart; restarts of one launch share it
        key = f"decent_dp/launch_time/{env.get('TORCHELASTIC_RUN_ID', '')}"
        return float(store.compare_set(key, "", repr(now)).decode())
    except Exception as exc:  # no store: fall back to this process's clock
        warnings.warn(
            f"launch_time: could not agree on a timestamp ({exc}); using the local clock",
            stacklevel=2,
        )
        return now


def launch_time(fmt: str) -> str:
    """``datetime.now().strftime(fmt)``, the same on every rank and restart of one torchrun launch.

    Under torchrun the first rank to ask stores its clock in the elastic
    agent's key-value store and the others (and restarted workers) read it
    back. Without torchrun it is this process's start of the first call.
    The resolver is registered with ``use_cache=True``: a launcher such as
    submitit pickles the config it resolved when submitting, with its
    cache, so a SLURM job (and each requeue of it) writes into the sweep
    directory that was printed at submission instead of its own clock's.

    Args:
        fmt: A ``strftime`` format, e.g. ``%Y-%m-%d``.

    Returns:
        The formatted timestamp.
    """
    global _LAUNCH
    if _LAUNCH is None:
        _LAUNCH = datetime.datetime.fromtimestamp(_agreed_timestamp(time.time()))
    return _LAUNCH.strftime(fmt)


def compose_error_line(exc: BaseException) -> str:
    """Hydra's composition error on one line: message, OmegaConf cause and the options.

    Hydra reports an unknown group option or an invalid value over several
    lines (options one per line, then its config search path). This keeps
    what names the bad value and what is allowed, e.g. ``In 'config': Could
    not find 'topology/foo'; Available options in 'topology': allreduce, ...``.

    Args:
        exc: A ``hydra.errors.HydraException`` (or any exception).

    Returns:
        The message without newlines.
    """
    text = str(exc).split("Config search path:")[0]
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        text += "\n" + str(cause).strip().splitlines()[0]  # the rest is full_key/object_type
    segments: list[tuple[str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if raw[0].isspace() and segments:  # an indented option under the line before
            segments[-1][1].append(line)
        else:
            segments.append((line, []))
    return "; ".join(f"{head} {', '.join(items)}" if items else head for head, items in segments)


register_configs()
# cached, so that a pickled config keeps the timestamp it was resolved with (see launch_time)
OmegaConf.register_new_resolver("launch_time", launch_time, replace=True, use_cache=True)
