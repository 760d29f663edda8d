"""Calling the user's optimizer and scheduler factories, in either pair order."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = ["OptimBuilder", "resolve_optim_fn", "check_scheduler"]

log = logging.getLogger("decent_dp")

OptimBuilder = Callable[[list[tuple[str, torch.Tensor]]], Optimizer]

_ORDERS = ("(tensor, name)", "(name, tensor)")


def _arrange(order: int, named: Sequence[tuple[str, torch.Tensor]]) -> list[Any]:
    return [(p, n) for n, p in named] if order == 0 else list(named)


def _held(opt: Optimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def _mismatch(opt: Optimizer, named: Sequence[tuple[str, torch.Tensor]]) -> str | None:
    """Why ``opt`` does not hold exactly the given parameters, or None when it does."""
    held = {id(p) for p in _held(opt)}
    given = {id(p) for _, p in named}
    missing = [n for n, p in named if id(p) not in held]
    extra = len(held - given)
    if not missing and not extra:
        return None
    parts = []
    if missing:
        parts.append(f"misses {len(missing)} of them (e.g. {missing[:3]})")
    if extra:
        parts.append(f"adds {extra} parameter(s) that were not given")
    return "its optimizer " + " and ".join(parts)


def resolve_optim_fn(
    optim_fn: Callable[[Any], Any], named: Sequence[tuple[str, torch.Tensor]]
) -> tuple[OptimBuilder, Optimizer]:
    """Find the pair order that ``optim_fn`` was written for.

    This project documents ``(tensor, name)`` pairs; decent-dp 0.2.x passed
    ``(name, tensor)``. The function is called with the first order; if that
    raises, or returns an optimizer that does not hold exactly the given
    parameters, it is called with the other one.

    Args:
        optim_fn: The user's optimizer factory.
        named: ``(name, parameter)`` pairs to build a trial optimizer from.

    Returns:
        A builder that takes ``(name, parameter)`` pairs and calls ``optim_fn``
        in the order that works, and the trial optimizer.

    Raises:
        TypeError: ``optim_fn`` returns something other than an Optimizer.
        ValueError: Neither order gives an optimizer over exactly the given
            parameters; the message names both orders and what each did.
    """
    failures: list[str] = []
    for order in (0, 1):
        try:
            opt = optim_fn(_arrange(order, named))
        except Exception as exc:  # noqa: BLE001 - a wrong order shows as any error
            failures.append(f"with {_ORDERS[order]} pairs it raised {type(exc).__name__}: {exc}")
            continue
        if not isinstance(opt, Optimizer):
            raise TypeError(
                f"optim_fn returned {type(opt).__name__}; it must return a torch.optim.Optimizer"
            )
        why = _mismatch(opt, named)
        if why is None:
            log.debug("optim_fn takes %s pairs", _ORDERS[order])

            def build(pairs: list[tuple[str, torch.Tensor]], _o: int = order) -> Optimizer:
                return optim_fn(_arrange(_o, pairs))

            return build, opt
        failures.append(f"with {_ORDERS[order]} pairs {why}")
    raise ValueError(
        "optim_fn must build an optimizer over exactly the parameters it is given, as "
        "(tensor, name) or (name, tensor) pairs: " + "; ".join(failures)
    )


def check_scheduler(lr_scheduler_fn: Callable[[Optimizer], Any] | None, opt: Optimizer) -> None:
    """Reject a scheduler factory that does not return an LR scheduler."""
    if lr_scheduler_fn is None:
        return
    sched = lr_scheduler_fn(opt)
    if not callable(getattr(sched, "step", None)) or not hasattr(sched, "state_dict"):
        raise TypeError(
            f"lr_scheduler_fn returned {type(sched).__name__}; it must return an LR scheduler "
            "with step() and state_dict()"
        )
