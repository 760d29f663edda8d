"""The ``optim`` and ``scheduler`` config groups become ``decent_dp.optim`` factories.

The wrapper builds one optimizer and one scheduler per bucket from an
``optim_fn(named_params)`` and an ``lr_scheduler_fn(optimizer)``; the
``allreduce`` baseline calls the same two functions once, on the whole model.
So both paths train with the same hyper-parameters and the same schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from omegaconf import OmegaConf

from decent_dp import optim as dopt
from experiments.train.config import plain

__all__ = ["OPTIM_FNS", "SCHEDULER_FNS", "optim_hyper", "build_optim_fn", "build_scheduler_fn"]

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
