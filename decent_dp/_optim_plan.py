"""What the wrapper may assume about a bucket's optimizer, to save passes over the bucket.

Two facts are read off well-known optimizer classes (exact types only, since a
subclass may do anything in ``step``):

* whether the update ``d`` reads the parameter's value only through weight
  decay, and in which form (L2 added to the gradient, or decoupled), so that
  the wrapper can step at the mixed point and still compute ``d`` from
  ``x(t-1)`` exactly (see ``DecentralizedDataParallel._step_bucket``);
* whether torch has a fused kernel for it on the bucket's device, which the
  wrapper selects when the optimizer left the choice to torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import optim
from torch.optim import Optimizer

from decent_dp.optim import AccumAdam, AccumAdamW

__all__ = [
    "DecayFold",
    "decay_plan",
    "drop_fused",
    "kernel_flags",
    "prefer_fused",
    "restore_fused",
]


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


_FUSABLE = (optim.SGD, optim.Adam, optim.AdamW)


def prefer_fused(opt: Optimizer, device: torch.device) -> bool:
    """Switch ``opt`` to torch's fused kernel where it left the choice to torch; True if done.

    Only for exact :class:`~torch.optim.SGD`, :class:`~torch.optim.Adam` and
    :class:`~torch.optim.AdamW` whose ``foreach`` and ``fused`` are unset in
    every group, on a device with fused kernels. The update is the same; it
    reads and writes each tensor once instead of once per elementary operation.
    """
    if type(opt) not in _FUSABLE:
        return False
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    if device.type not in _get_fused_kernels_supported_devices():
        return False
    groups = opt.param_groups
    if any(
        g.get("foreach") is not None or g.get("fused") is not None or g.get("differentiable")
        for g in groups
    ):
        return False
    if not all(torch.is_floating_point(p) for g in groups for p in g["params"]):
        return False
    restore_fused(opt)
    return True


def restore_fused(opt: Optimizer) -> None:
    """Set the fused flag (again, e.g. after ``load_state_dict`` replaced the groups)."""
    for g in opt.param_groups:
        g["foreach"] = None
        g["fused"] = True
    opt.defaults["fused"] = True
    # the constructor sets this for fused=True; a GradScaler's step() reads it
    opt._step_supports_amp_scaling = True  # type: ignore[attr-defined]


def drop_fused(opt: Optimizer) -> None:
    """Back to torch's default implementation (e.g. for sparse gradients)."""
    for g in opt.param_groups:
        g["fused"] = None
    opt.defaults["fused"] = None
    opt._step_supports_amp_scaling = False  # type: ignore[attr-defined]


def kernel_flags(opt: Optimizer) -> dict[str, Any]:
    """Which kernels ``opt.step()`` will run: ``{"optimizer", "fused", "foreach"}``.

    ``fused`` is torch's single-kernel update; ``foreach`` its multi-tensor
    kernels (the default torch picks when both flags are unset, or, for
    :class:`AccumAdam`, its own choice per device). Both ``False`` is a loop
    over the parameters. A flag is ``True`` only if every param group uses it.
    """
    groups = [g for g in opt.param_groups if g["params"]]
    fused = bool(groups) and all(bool(g.get("fused")) for g in groups)
    if isinstance(opt, AccumAdam):
        foreach = bool(groups) and all(
            opt._use_foreach(p.device) for g in groups for p in g["params"]
        )
    elif fused or not all("foreach" in g for g in groups):
        foreach = False  # fused, or a class without multi-tensor kernels
    else:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        def group_foreach(g: dict[str, Any]) -> bool:
            if g["foreach"] is not None:
                return bool(g["foreach"])
            return _default_to_fused_or_foreach(g["params"], bool(g.get("differentiable")))[1]

        foreach = bool(groups) and all(group_foreach(g) for g in groups)
    return {"optimizer": type(opt).__name__, "fused": fused, "foreach": foreach}
