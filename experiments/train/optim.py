"""The ``optim`` and ``scheduler`` config groups become ``decent_dp.optim`` factories.

The wrapper builds one optimizer and one scheduler per bucket from an
``optim_fn(named_params)`` and an ``lr_scheduler_fn(optimizer)``; the
``allreduce`` baseline calls the same two functions once, on the whole model.
So both paths train with the same hyper-parameters and the same schedule.

A section with ``_target_`` names any optimizer class (``torch.optim.SGD``) or
scheduler class or function of the optimizer
(``torch.optim.lr_scheduler.CosineAnnealingLR``), with its arguments as the
other keys. The optimizer is built over the same two parameter groups as the
built-in factories' (weight decay, the section's or the class's default, on
weights only) and the scheduler steps once per optimizer step, inside the
backward, as the built-ins do.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from omegaconf import OmegaConf

from decent_dp import optim as dopt
from decent_dp.optim import decay_groups  # the built-in factories' split by shape
from experiments.instantiate import Target
from experiments.schema import is_target, target_section
from experiments.train.config import plain
from experiments.train.optim_schema import OptimTargetConfig, SchedulerTargetConfig

__all__ = [
    "OPTIM_FNS",
    "SCHEDULER_FNS",
    "optim_hyper",
    "build_optim_fn",
    "build_scheduler_fn",
    "target_optimizer",
    "target_scheduler",
]

OPTIM_FNS: dict[str, Callable[..., Any]] = {
    "sgd": dopt.optim_fn_sgd,
    "qgm_sgd": dopt.optim_fn_qgm_sgd,
    "adam": dopt.optim_fn_adam,
    "adamw": dopt.optim_fn_adamw,
    "accum_adam": dopt.optim_fn_accum_adam,
    "accum_adamw": dopt.optim_fn_accum_adamw,
    "lagged_v_adamw": dopt.optim_fn_lagged_v_adamw,
}
"""``optim.name`` -> optimizer factory of :mod:`decent_dp.optim`."""

SCHEDULER_FNS: dict[str, Callable[..., Any]] = {
    "cosine_warmup": dopt.lr_scheduler_fn_cosine_with_warmup,
    "constant": dopt.lr_scheduler_fn_constant,
    "step": dopt.lr_scheduler_fn_step,
}
"""``scheduler.name`` -> scheduler factory of :mod:`decent_dp.optim`."""


def optim_hyper(optim_cfg: Any) -> dict[str, Any]:
    """The keyword arguments of the optimizer factory: the ``optim`` section less its name and ``state_sync``.

    Args:
        optim_cfg: The ``optim`` config section.

    Returns:
        Plain values; ``betas`` as a tuple, as torch expects.
    """
    container = plain(OmegaConf.to_container(optim_cfg, resolve=True))
    hyper = {k: v for k, v in container.items() if k not in ("name", "state_sync")}
    if "betas" in hyper:
        hyper["betas"] = tuple(hyper["betas"])
    return hyper


def build_optim_fn(optim_cfg: Any) -> Callable[..., Any]:
    """The ``optim_fn(named_params) -> Optimizer`` that the ``optim`` section names.

    Args:
        optim_cfg: The ``optim`` config section (``name`` plus hyper-parameters).

    Returns:
        The registered factory with the section's hyper-parameters bound.

    Example::

        optimizer = build_optim_fn(cfg.optim)(list(model.named_parameters()))
    """
    if is_target(optim_cfg):
        target = Target.of("optim", target_section(optim_cfg, "optim", OptimTargetConfig))
        target.check(positional=1)
        return partial(target_optimizer, target)
    return partial(OPTIM_FNS[str(optim_cfg.name)], **optim_hyper(optim_cfg))


def build_scheduler_fn(
    scheduler_cfg: Any, steps_per_epoch: int, total_steps: int
) -> Callable[..., Any]:
    """The ``lr_scheduler_fn(optimizer) -> LRScheduler`` that the ``scheduler`` section names.

    Epoch counts in the config become step counts here: the scheduler steps once
    per training step. ``scheduler.warmup_steps``, when set, is the warm-up in steps
    and overrides ``warmup_epochs``.

    Args:
        scheduler_cfg: The ``scheduler`` config section.
        steps_per_epoch: Training steps in one epoch.
        total_steps: Training steps of the whole run.

    Returns:
        The registered factory with its step counts bound.

    Example::

        scheduler = build_scheduler_fn(cfg.scheduler, 22, 100)(optimizer)
    """
    if is_target(scheduler_cfg):
        section = target_section(scheduler_cfg, "scheduler", SchedulerTargetConfig)
        target = Target.of("scheduler", section)
        target.check(positional=1)
        return partial(target_scheduler, target)
    s, name = scheduler_cfg, str(scheduler_cfg.name)
    if name == "cosine_warmup":
        steps = s.get("warmup_steps")
        epochs = float(s.warmup_epochs) * steps_per_epoch
        warmup = min(total_steps, round(epochs) if steps is None else int(steps))
        return partial(
            SCHEDULER_FNS[name],
            t_max=total_steps,
            t_warmup=warmup,
            eta_min=float(s.eta_min),
            warmup_decay=float(s.warmup_decay),
        )
    if name == "step":
        step_size = max(1, round(float(s.step_size_epochs) * steps_per_epoch))
        return partial(SCHEDULER_FNS[name], step_size=step_size, gamma=float(s.gamma))
    return SCHEDULER_FNS[name]


def target_optimizer(target: Target, params: Any) -> torch.optim.Optimizer:
    """The ``optim`` target over ``params`` split as the built-in factories split them.

    Weights (``ndim >= 2``) get the section's ``weight_decay``, else the class's default;
    biases and norms get 0. A class without ``weight_decay`` gets one group of each kind
    with no decay key.

    Args:
        target: The ``optim`` section's target.
        params: ``(tensor, name)`` or ``(name, tensor)`` pairs, as every ``optim_fn`` gets.

    Returns:
        The optimizer.

    Raises:
        ConfigError: One line, if the call raised or returned no optimizer.
    """
    decay = target.kwargs.get("weight_decay", target.default("weight_decay"))
    takes_decay = target.takes("weight_decay")
    groups = decay_groups(params, 0.0 if decay is inspect.Parameter.empty else float(decay))
    if not takes_decay:
        for group in groups:
            del group["weight_decay"]
    optimizer = target.call(groups)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise target.returned(optimizer, "a torch.optim.Optimizer")
    return optimizer


def target_scheduler(target: Target, optimizer: torch.optim.Optimizer) -> Any:
    """The ``scheduler`` target of ``optimizer``: ``target(optimizer, **kwargs)``.

    Raises:
        ConfigError: One line, if the call raised or returned no scheduler (no ``step``
            and ``state_dict``).
    """
    scheduler = target.call(optimizer)
    if not (callable(getattr(scheduler, "step", None)) and hasattr(scheduler, "state_dict")):
        raise target.returned(scheduler, "an LR scheduler (with step() and state_dict())")
    return scheduler
