"""AccumAdam and AccumAdamW: Adam(W) whose moments are refreshed every ``accum_iter`` steps."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ._base import (
    _adam_defaults,
    _check_accum_iter,
    _ClosureStep,
    _foreach_device,
)

__all__ = ["AccumAdam", "AccumAdamW"]


class AccumAdam(_ClosureStep):
    r"""Adam whose moments are refreshed only every ``accum_iter`` steps.

    Each parameter keeps stored moments ``m`` and ``v`` (zeros), a gradient
    accumulator ``acc`` (zeros), the number of refreshes ``k`` (0) and the
    step count ``t`` (0). A step with gradient ``g`` (after L2 decay,
    ``g += wd * p``, in the non-decoupled variant) does::

        acc += g ; t += 1
        m_hat = (b1*m + (1-b1)*g) / (1 - b1**(k+1))
        v_hat = (b2*v + (1-b2)*g*g) / (1 - b2**(k+1))
        (decoupled: p *= 1 - lr*wd)
        p -= lr * m_hat / (sqrt(v_hat) + eps)
        if t % accum_iter == 0:
            gbar = acc / accum_iter
            m = b1*m + (1-b1)*gbar ; v = b2*v + (1-b2)*gbar*gbar ; k += 1 ; acc = 0

    Every step thus blends the current gradient into the stored moments, with
    bias correction by the number of refreshes, while the moments themselves
    move only with the mean of the last ``accum_iter`` gradients. With
    ``accum_iter=1`` this is :class:`torch.optim.Adam` (``decoupled=False``)
    or :class:`torch.optim.AdamW` (``decoupled=True``).

    On CUDA a step updates each param group with torch's multi-tensor
    (``_foreach``) kernels, about a dozen per group and dtype instead of about
    ten per parameter; on the CPU it goes one parameter at a time, which
    measured faster there for large tensors (see ``foreach``).

    The state holds tensors and Python numbers only, so its
    :meth:`state_dict` loads with ``torch.load(..., weights_only=True)``.
    Parameters whose ``grad`` is ``None`` are skipped.

    Args:
        params: Parameters or param groups, as for any :class:`~torch.optim.Optimizer`.
        lr: Learning rate, ``>= 0``.
        betas: Moment decay rates, each in ``[0, 1)``.
        eps: Added to the denominator, ``> 0``.
        weight_decay: Decay coefficient, ``>= 0``.
        accum_iter: Steps between moment refreshes, an integer ``>= 1``.
        decoupled: ``True`` for AdamW-style decay ``p *= 1 - lr * wd``;
            ``False`` for L2 decay added to the gradient.
        maximize: Must be ``False``; kept so the signature matches torch's.
        foreach: ``True`` for multi-tensor kernels, ``False`` for one tensor
            at a time; ``None`` (default) chooses multi-tensor kernels on
            devices that have them (CUDA), as torch's optimizers do. The
            result is the same either way.

    Raises:
        ValueError: If a hyper-parameter is outside its range or ``maximize`` is set.

    Example::

        opt = AccumAdam(model.parameters(), lr=1e-3, accum_iter=4, decoupled=True)
        for x, y in loader:
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    """

    _family = "AccumAdam"

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        accum_iter: int = 4,
        decoupled: bool = False,
        maximize: bool = False,
        *,
        foreach: bool | None = None,
    ) -> None:
        defaults = _adam_defaults(lr, betas, eps, weight_decay)
        _check_accum_iter(accum_iter)
        if maximize:
            raise ValueError("maximize must be False for AccumAdam, got True")
        defaults.update(accum_iter=accum_iter, decoupled=decoupled, maximize=False)
        super().__init__(params, defaults)
        # not a group key, so that state dicts keep the format of earlier versions
        self.foreach = foreach

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "foreach": self.foreach}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("foreach", None)
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("decoupled", False)
            group.setdefault("maximize", False)

    def _update(self) -> None:
        for group in self.param_groups:
            if group.get("maximize", False):
                raise ValueError("maximize must be False for AccumAdam, got True")
            for params, grads, k, refresh in self._batches(group):
                if self._use_foreach(params[0].device):
                    self._step_batch(group, params, grads, k, refresh)
                else:
                    for p, g in zip(params, grads):
                        self._step_one(group, p, g, k, refresh)

    def _use_foreach(self, device: torch.device) -> bool:
        return _foreach_device(device) if self.foreach is None else self.foreach

    def _batches(
        self, group: dict[str, Any]
    ) -> Iterator[tuple[list[torch.Tensor], list[torch.Tensor], int, bool]]:
        """The group's parameters with a gradient, in lists that one multi-tensor call can take.

        A list shares device, dtype, the number of refreshes (which sets the bias
        correction) and whether this step refreshes; in a plain loop every
        parameter agrees on the last two, so there is one list per device and dtype.
        Creates the state of parameters stepped for the first time.
        """
        accum_iter = group["accum_iter"]
        lists: dict[tuple[torch.device, torch.dtype, int, bool], tuple[list, list]] = {}
        for p, g in list(self._with_grads(group)):  # refuse sparse gradients before any change
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["refreshes"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["grad_accum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            key = (p.device, p.dtype, state["refreshes"], state["step"] % accum_iter == 0)
            params, grads = lists.setdefault(key, ([], []))
            params.append(p)
            grads.append(g)
        for (_, _, k, refresh), (params, grads) in lists.items():
            yield params, grads, k, refresh

    def _step_batch(
        self,
        group: dict[str, Any],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        k: int,
        refresh: bool,
    ) -> None:
        """One step of parameters that share ``k`` and ``refresh``, with ``_foreach`` kernels.

        The same elementary operations, in the same order, as the per-parameter
        formulas in the class docstring, so the trajectory does not depend on
        how the parameters were batched.
        """
        lr = float(group["lr"])
        b1, b2 = group["betas"]
        eps = group["eps"]
        wd = group["weight_decay"]
        decoupled = group["decoupled"]
        states = [self.state[p] for p in params]
        m = [s["exp_avg"] for s in states]
        v = [s["exp_avg_sq"] for s in states]
        acc = [s["grad_accum"] for s in states]

        if wd != 0.0 and not decoupled:
            grads = list(torch._foreach_add(grads, params, alpha=wd))
        torch._foreach_add_(acc, grads)

        m_step = torch._foreach_mul(m, b1)
        torch._foreach_add_(m_step, grads, alpha=1.0 - b1)
        v_step = torch._foreach_mul(v, b2)
        torch._foreach_addcmul_(v_step, grads, grads, value=1.0 - b2)
        bias1 = 1.0 - b1 ** (k + 1)
        bias2 = 1.0 - b2 ** (k + 1)
        if wd != 0.0 and decoupled:
            torch._foreach_mul_(params, 1.0 - lr * wd)
        # sqrt(v_step / bias2) computed as sqrt(v_step) / sqrt(bias2), as torch's Adam does
        torch._foreach_sqrt_(v_step)
        torch._foreach_div_(v_step, math.sqrt(bias2))
        torch._foreach_add_(v_step, eps)
        torch._foreach_addcdiv_(params, m_step, v_step, value=-lr / bias1)

        if refresh:
            torch._foreach_div_(acc, group["accum_iter"])
            torch._foreach_mul_(m, b1)
            torch._foreach_add_(m, acc, alpha=1.0 - b1)
            torch._foreach_mul_(v, b2)
            torch._foreach_addcmul_(v, acc, acc, value=1.0 - b2)
            for s in states:
                s["refreshes"] = k + 1
            torch._foreach_zero_(acc)

    def _step_one(
        self, group: dict[str, Any], p: torch.Tensor, g: torch.Tensor, k: int, refresh: bool
    ) -> None:
        """:meth:`_step_batch` for one parameter, with per-tensor kernels: the same operations."""
        lr = float(group["lr"])
        b1, b2 = group["betas"]
        eps = group["eps"]
        wd = group["weight_decay"]
        state = self.state[p]
        m, v, acc = state["exp_avg"], state["exp_avg_sq"], state["grad_accum"]

        if wd != 0.0 and not group["decoupled"]:
            g = g.add(p, alpha=wd)
        acc.add_(g)

        m_step = m.mul(b1).add_(g, alpha=1.0 - b1)
        v_step = v.mul(b2).addcmul_(g, g, value=1.0 - b2)
        bias1 = 1.0 - b1 ** (k + 1)
        bias2 = 1.0 - b2 ** (k + 1)
        if wd != 0.0 and group["decoupled"]:
            p.mul_(1.0 - lr * wd)
        denom = v_step.sqrt_().div_(math.sqrt(bias2)).add_(eps)
        p.addcdiv_(m_step, denom, value=-lr / bias1)

        if refresh:
            gbar = acc.div_(group["accum_iter"])
            m.mul_(b1).add_(gbar, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(gbar, gbar, value=1.0 - b2)
            state["refreshes"] = k + 1
            acc.zero_()


class AccumAdamW(AccumAdam):
    """:class:`AccumAdam` with decoupled (AdamW-style) weight decay, ``p *= 1 - lr * wd``.

    The name and keywords of decent-dp 0.2.x, so that its scripts keep working
    (``from decent_dp.optim import AccumAdamW``). The update rule is the one
    documented on :class:`AccumAdam`.

    It takes :class:`AccumAdam`'s arguments, with ``decoupled=True``.

    Raises:
        ValueError: If a hyper-parameter is outside its range.

    Example::

        opt = AccumAdamW(model.parameters(), lr=1e-3, weight_decay=0.1, accum_iter=4)
    """

    __init__ = functools.partialmethod(AccumAdam.__init__, decoupled=True)
