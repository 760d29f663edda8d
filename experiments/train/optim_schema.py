"""The schemas of the ``optim`` and ``scheduler`` groups, which :mod:`experiments.train.optim` builds.

Each option file of ``conf/optim/`` and ``conf/scheduler/`` starts its
defaults list with one of these (``- /schema/optim/<name>@_here_``), so a
misspelt key or a value of the wrong type fails while Hydra composes; a scheduler's
schema checks its values when it is built (``__post_init__``). The optimizers'
hyper-parameters are checked by their factories (``decent_dp.optim``), which
``experiments.train.run.validate`` calls once with a probe parameter.
:mod:`experiments.train.config` registers them with the other groups'.
A section with ``_target_`` instead of ``name`` names any optimizer or
scheduler class (or a function of the optimizer): :class:`OptimTargetConfig`
and :class:`SchedulerTargetConfig` type what the framework reads of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, OmegaConf

from experiments.schema import name_enum, plain, require_number

__all__ = [
    "OptimName",
    "SchedulerName",
    "StateSyncConfig",
    "state_sync_arg",
    "SGDConfig",
    "QGMSGDConfig",
    "AdamConfig",
    "AdamWConfig",
    "AccumAdamConfig",
    "AccumAdamWConfig",
    "LaggedVAdamWConfig",
    "CosineWarmupConfig",
    "ConstantConfig",
    "StepConfig",
    "OptimTargetConfig",
    "SchedulerTargetConfig",
]

OptimName = name_enum(
    "OptimName",
    ["sgd", "adam", "adamw", "accum_adam", "accum_adamw", "lagged_v_adamw", "qgm_sgd"],
    __name__,
)
SchedulerName = name_enum("SchedulerName", ["cosine_warmup", "constant", "step"], __name__)


# ---------------------------------------------------------------- optim


@dataclass
class StateSyncConfig:
    """``optim.state_sync``: optimizer states averaged with the gossip, each every K steps.

    Each field is a state tensor's name and its period K (0: not averaged), the
    wrapper's ``state_sync={name: K}``: every K-th step the state travels with
    the parameters to the round's neighbours (every worker with
    ``topology=complete``), and the optimizer steps from the mix, e.g.
    ``optim.state_sync.exp_avg_sq=1``. Adam and AdamW keep ``exp_avg`` and
    ``exp_avg_sq``, AccumAdam(W) also ``grad_accum``, LaggedVAdamW also
    ``grad_prev`` (the gradient its second moment is fed by), SGD
    ``momentum_buffer``.
    """

    exp_avg_sq: int = 0
    exp_avg: int = 0
    grad_accum: int = 0
    grad_prev: int = 0
    momentum_buffer: int = 0


def state_sync_arg(section: Any) -> dict[str, int]:
    """The wrapper's ``state_sync`` from ``optim.state_sync``: the names with a period > 0."""
    if section is None:
        return {}
    return {str(k): v for k, v in plain(OmegaConf.to_container(section)).items() if v != 0}


@dataclass
class SGDConfig:
    """``optim=sgd``: maps to ``decent_dp.optim.optim_fn_sgd``.

    ``state_sync`` (every optimizer, :class:`StateSyncConfig`): named optimizer
    states averaged with the neighbours every K steps, e.g.
    ``optim.state_sync.momentum_buffer=4``; none by default.
    """

    name: OptimName = MISSING  # type: ignore[valid-type]
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False
    state_sync: StateSyncConfig = field(default_factory=StateSyncConfig)


@dataclass
class QGMSGDConfig(SGDConfig):
    """``optim=qgm_sgd``: maps to ``decent_dp.optim.optim_fn_qgm_sgd`` (quasi-global momentum).

    ``mu`` is the decay of the quasi-global buffer; ``None`` uses ``momentum``.
    """

    mu: float | None = None


@dataclass
class AdamConfig:
    """``optim=adam``: maps to ``decent_dp.optim.optim_fn_adam`` (L2 weight decay).

    ``state_sync`` (:class:`StateSyncConfig`): named states averaged with the
    neighbours every K steps, e.g. ``optim.state_sync.exp_avg_sq=1``: Adam's
    second moment shared, with ``topology=complete`` over every worker.
    """

    name: OptimName = MISSING  # type: ignore[valid-type]
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.0
    state_sync: StateSyncConfig = field(default_factory=StateSyncConfig)


@dataclass
class AdamWConfig(AdamConfig):
    """``optim=adamw``: maps to ``decent_dp.optim.optim_fn_adamw`` (decoupled weight decay)."""

    weight_decay: float = 0.01


@dataclass
class AccumAdamConfig(AdamConfig):
    """``optim=accum_adam``: Adam that applies an update every ``accum_iter`` steps."""

    accum_iter: int = 4


@dataclass
class AccumAdamWConfig(AdamWConfig):
    """``optim=accum_adamw``: AdamW that applies an update every ``accum_iter`` steps."""

    accum_iter: int = 4


@dataclass
class LaggedVAdamWConfig(AdamWConfig):
    """``optim=lagged_v_adamw``: AdamW whose ``v`` is fed by the previous step's gradient.

    With ``optim.state_sync.grad_prev=1`` that gradient is mixed with the
    neighbours' before each step (``decent_dp.optim.LaggedVAdamW``). ``clip``
    bounds each coordinate's normalised step; ``lag_m`` feeds ``m`` with the
    previous gradient too, which makes it AdamW one step late.
    """

    clip: float = 5.0
    lag_m: bool = False


# ---------------------------------------------------------------- scheduler


@dataclass
class CosineWarmupConfig:
    """``scheduler=cosine_warmup``: linear warm-up then cosine decay to ``eta_min``.

    The warm-up is given in epochs and converted to optimizer steps with the
    run's steps per epoch, or directly in steps with ``warmup_steps``, which
    overrides ``warmup_epochs`` when set (recipes counted in steps, such as
    language-model pretraining); ``t_max`` is the run's total number of steps.
    """

    name: SchedulerName = MISSING  # type: ignore[valid-type]
    warmup_epochs: float = 1.0
    warmup_steps: int | None = None
    eta_min: float = 0.0
    warmup_decay: float = 0.01

    def __post_init__(self) -> None:
        require_number("scheduler.warmup_epochs", self.warmup_epochs, at_least=0)
        require_number("scheduler.warmup_steps", self.warmup_steps, at_least=0, nullable=True)
        require_number("scheduler.eta_min", self.eta_min, at_least=0)
        require_number("scheduler.warmup_decay", self.warmup_decay, above=0, at_most=1)


@dataclass
class ConstantConfig:
    """``scheduler=constant``: the optimizer's learning rate throughout."""

    name: SchedulerName = MISSING  # type: ignore[valid-type]


@dataclass
class StepConfig:
    """``scheduler=step``: multiply the learning rate by ``gamma`` every ``step_size_epochs``."""

    name: SchedulerName = MISSING  # type: ignore[valid-type]
    step_size_epochs: float = 30.0
    gamma: float = 0.1

    def __post_init__(self) -> None:
        require_number("scheduler.step_size_epochs", self.step_size_epochs, above=0)
        require_number("scheduler.gamma", self.gamma, above=0)


# ---------------------------------------------------------------- _target_


@dataclass
class OptimTargetConfig:
    """``optim`` as ``_target_: torch.optim.SGD`` (any optimizer class) with its arguments.

    The target is called as ``target(param_groups, **kwargs)`` for every bucket, the
    parameters split by shape as the built-in factories split them: ``weight_decay`` (the
    section's, else the class's default) on weights, 0 on biases and norms.

    Attributes:
        _target_: The optimizer class, as a dotted import path.
        name: Set to the ``_target_`` path, for logs and summaries.
        state_sync: Named optimizer states averaged with the gossip (:class:`StateSyncConfig`).
        kwargs: The optimizer's own arguments (every other key of the section).
    """

    _target_: str = MISSING
    name: str = MISSING
    state_sync: StateSyncConfig = field(default_factory=StateSyncConfig)
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class SchedulerTargetConfig:
    """``scheduler`` as ``_target_: torch.optim.lr_scheduler.CosineAnnealingLR`` with its arguments.

    The target, a scheduler class or a function of the optimizer, is called as
    ``target(optimizer, **kwargs)`` for every bucket and stepped once per optimizer step.

    Attributes:
        _target_: The scheduler class or function, as a dotted import path.
        name: Set to the ``_target_`` path, for logs and summaries.
        kwargs: Its own arguments (every key of the section but ``_target_``).
    """

    _target_: str = MISSING
    name: str = MISSING
    kwargs: dict[str, Any] = field(default_factory=dict)
