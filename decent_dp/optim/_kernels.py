"""Which optimizer kernels a bucket steps with: torch's fused, its multi-tensor, or a loop.

The wrapper switches each bucket's optimizer to torch's fused kernel where the
optimizer left the choice to torch (:func:`prefer_fused`), and the public
:func:`decent_dp.optim.prefer_fused_kernels` and
:func:`decent_dp.optim.optimizer_kernels` make and report the same choice for
any optimizer. This module depends on torch and :mod:`decent_dp.optim.accum_adam`
only, so both the factories (``optim.py``) and the wrapper may import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import optim
from torch.optim import Optimizer

from .accum_adam import AccumAdam

__all__ = [
    "drop_fused",
    "kernel_flags",
    "prefer_fused",
    "restore_fused",
    "summed_kernel_flags",
]

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


def summed_kernel_flags(optimizers: Sequence[Optimizer]) -> dict[str, Any]:
    """:func:`kernel_flags` over several optimizers (the wrapper's buckets), all ``None`` if none.

    ``optimizer`` joins the distinct class names, sorted, with commas; a flag
    is ``True`` only if it is for every optimizer.
    """
    flags = [kernel_flags(opt) for opt in optimizers]
    if not flags:
        return {"optimizer": None, "fused": None, "foreach": None}
    return {
        "optimizer": ",".join(sorted({f["optimizer"] for f in flags})),
        "fused": all(f["fused"] for f in flags),
        "foreach": all(f["foreach"] for f in flags),
    }
