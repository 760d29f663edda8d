"""What the wrapper may assume about a bucket's optimizer, to save passes over the bucket.

One fact is read off well-known optimizer classes (exact types only, since a
subclass may do anything in ``step``): whether the update ``d`` reads the
parameter's value only through weight decay, and in which form (L2 added to
the gradient, or decoupled), so that the wrapper can step at the mixed point
and still compute ``d`` from ``x(t-1)`` exactly (see
``DecentralizedDataParallel._step_bucket``). The choice of torch's fused
kernels lives in :mod:`decent_dp.optim._kernels`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import optim
from torch.optim import Optimizer

from .accum_adam import AccumAdam, AccumAdamW

__all__ = ["DecayFold", "decay_plan"]


def _flag(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda group: "decoupled" if group.get(key, False) else "coupled"


def _coupled(group: dict[str, Any]) -> str:
    return "coupled"


# how each class applies weight decay; every other use of the parameter is the update itself
_DECAY_FORM: dict[type, Callable[[dict[str, Any]], str]] = {
    optim.SGD: _coupled,
    optim.Adamax: _coupled,
    optim.RMSprop: _coupled,
    optim.Adagrad: _coupled,
    optim.Adadelta: _coupled,
    optim.Rprop: _coupled,  # has no weight decay
    optim.Adam: _flag("decoupled_weight_decay"),
    optim.AdamW: _flag("decoupled_weight_decay"),
    optim.NAdam: _flag("decoupled_weight_decay"),
    optim.RAdam: _flag("decoupled_weight_decay"),
    AccumAdam: _flag("decoupled"),
    AccumAdamW: _flag("decoupled"),
}

# (params, form, coefficient): L2 adds sign * wd * x(t-1) to the gradient, decoupled decay
# adds -lr * wd * x(t-1) to the result
DecayFold = tuple[list[torch.Tensor], str, float]


def decay_plan(opt: Optimizer, all_have_grads: bool = False) -> list[DecayFold] | None:
    """How to apply this step's weight decay at ``x(t-1)`` by hand, or ``None`` if unknown.

    An empty list means the update does not read the parameters at all. The
    caller zeroes ``weight_decay`` in the groups listed while the optimizer steps.

    Args:
        opt: The bucket's optimizer.
        all_have_grads: The caller knows every parameter has a (dense) gradient:
            the groups' own lists are used as they are, built once instead of
            filtered each step.
    """
    form_of = _DECAY_FORM.get(type(opt))
    if form_of is None:
        return None
    plan: list[DecayFold] = []
    for group in opt.param_groups:
        wd = group.get("weight_decay", 0.0)
        if isinstance(wd, torch.Tensor):
            return None
        if not wd:
            continue
        if all_have_grads:
            params = group["params"]
        else:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                return None
        if not params:
            continue  # no gradient in this group: nothing decays
        if form_of(group) == "coupled":
            # the optimizer negates the gradient for maximize before adding the decay
            plan.append((params, "coupled", -wd if group.get("maximize", False) else wd))
        else:
            lr = group["lr"]
            if isinstance(lr, torch.Tensor):
                return None
            plan.append((params, "decoupled", -float(lr) * wd))
    return plan
