"""LaggedVAdamW: AdamW whose second moment is fed by the previous step's gradient."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from ._base import (
    _adam_defaults,
    _check_clip,
    _check_flag,
    _ClosureStep,
)

__all__ = ["LaggedVAdamW"]


class LaggedVAdamW(_ClosureStep):
    r"""AdamW whose second moment is fed by the previous step's gradient, kept as a state.

    Each parameter keeps ``m`` and ``v`` (zeros), the gradient of its last step
    ``grad_prev`` and the step count ``t``. A step with gradient ``g`` does::

        t += 1
        s = g if t == 1 else grad_prev
        m = b1*m + (1-b1)*(s if lag_m else g) ; v = b2*v + (1-b2)*s*s
        u = (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)
        p *= 1 - lr*wd
        p -= lr * clamp(u, -clip, clip)
        grad_prev = g

    Alone it is AdamW with ``v`` one step late. Its use is with the wrapper's
    ``state_sync={"grad_prev": 1}``: the gossip then mixes ``grad_prev`` with
    the neighbours' before each step, so ``v`` follows the square of the
    neighbourhood's mean gradient (with ``complete``, the square of the
    workers' mean gradient, as ``allreduce``'s AdamW has it) instead of the
    square of the worker's own, noisier, gradient. The step is then linear in
    the worker's own gradient for a given ``v``, and with ``complete`` the
    workers' ``v`` agree after the first steps, so averaging the workers'
    steps averages their gradients, as with SGD.

    Adam bounds each coordinate's step because ``v`` holds the current
    gradient's square; here it does not, so a coordinate whose gradient
    appears after its ``v`` was near zero would step by ``m / eps``. The
    normalised step ``u`` is therefore clipped to ``[-clip, clip]``; at steady
    state ``|u|`` stays near or below 1, where the clip does nothing.

    With ``lag_m=True`` the first moment is fed by ``grad_prev`` as well: from
    the second step on, this is AdamW applied one step late, each step taking
    the gradient computed at the iterate before the last. Without
    ``state_sync`` that measures what a one-step-stale gradient alone costs
    (a decentralized worker sees its neighbours' models one step late).

    Args:
        params: Parameters or param groups, as for any :class:`~torch.optim.Optimizer`.
        lr: Learning rate, ``>= 0``.
        betas: Moment decay rates, each in ``[0, 1)``.
        eps: Added to the denominator, ``> 0``.
        weight_decay: Decoupled decay coefficient, ``>= 0``.
        clip: Bound on each coordinate's normalised step, ``> 0``.
        lag_m: Feed the first moment with ``grad_prev`` too (AdamW one step late).

    Raises:
        ValueError: If a hyper-parameter is outside its range.

    Example::

        opt = LaggedVAdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    """

    _family = "LaggedVAdamW"

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        clip: float = 5.0,
        lag_m: bool = False,
    ) -> None:
        defaults = _adam_defaults(lr, betas, eps, weight_decay)
        _check_clip(clip)
        _check_flag("lag_m", lag_m)
        defaults.update(clip=float(clip), lag_m=lag_m)
        super().__init__(params, defaults)

    def _update(self) -> None:
        for group in self.param_groups:
            lr = float(group["lr"])
            b1, b2 = group["betas"]
            eps, wd, clip = group["eps"], group["weight_decay"], group["clip"]
            lag_m = bool(group.get("lag_m", False))  # absent from states saved before it
            for p, g in self._with_grads(group):
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["grad_prev"] = g.clone(memory_format=torch.preserve_format)
                t = state["step"] = int(state["step"]) + 1
                m, v, prev = state["exp_avg"], state["exp_avg_sq"], state["grad_prev"]
                m.mul_(b1).add_(prev if lag_m else g, alpha=1.0 - b1)
                v.mul_(b2).addcmul_(prev, prev, value=1.0 - b2)
                if wd != 0.0:
                    p.mul_(1.0 - lr * wd)
                denom = v.sqrt().div_(math.sqrt(1.0 - b2**t)).add_(eps)
                u = m.div(denom).div_(1.0 - b1**t).clamp_(-clip, clip)
                p.add_(u, alpha=-lr)
                prev.copy_(g)
