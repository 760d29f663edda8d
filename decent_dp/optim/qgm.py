"""QGMSGD: SGD with quasi-global momentum."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ._base import (
    _check_qgm_args,
    _ClosureStep,
)

__all__ = ["QGMSGD"]


class QGMSGD(_ClosureStep):
    r"""SGD with quasi-global momentum (Lin et al., ICML 2021), for heterogeneous data.

    Plain momentum on a worker whose data differ from its neighbours' keeps
    pushing towards the worker's own optimum. Quasi-global momentum builds the
    buffer from how the model actually moved across the whole step, gossip
    included, which approximates the global direction instead.

    With gradient ``g(t)`` at ``x(t-1)`` (plus ``wd * x(t-1)`` when
    ``weight_decay > 0``), momentum ``beta`` and ``mu`` (``beta`` by default),
    one step does::

        m(t) = g(t) + beta * mhat(t-1)                        # mhat(0) = 0
        d(t) = -lr * m(t)              (nesterov: -lr * (g(t) + beta * m(t)))
        x(t) = sum_j W_ij x_j(t-1) + d(t)                     # the wrapper's mixing
        mhat(t) = mu * mhat(t-1) + (1 - mu) * (x(t-1) - x(t)) / lr

    Mapping onto the paper's Algorithm 1 (QG-DSGDm): the paper takes the
    local step first and gossips the result, ``x(t+1) = W (x(t) - lr m(t))``;
    :class:`~decent_dp.ddp.DecentralizedDataParallel` gossips ``x(t-1)`` while
    the gradient is computed and adds the local update afterwards. The
    momentum rule, ``m = g + beta * mhat`` and ``mhat = mu * mhat + (1 - mu)
    (x_before - x_after) / lr`` over the full step, is the paper's, with the
    paper's choice ``mu = beta``; only the order of mixing and update differs,
    as it does for every optimizer under the wrapper.

    :meth:`step` computes ``d(t)`` while the parameters hold ``x(t-1)`` and
    saves ``x(t-1)``; :meth:`post_average_hook`, which the wrapper calls once
    the parameters hold ``x(t)``, folds the model difference into ``mhat``.
    Without the hook (a plain loop, torch DDP) the next :meth:`step` folds it
    from the parameters it finds, which is the same update; with no gossip
    it reduces to ``mhat = mu * mhat + (1 - mu) * m``. A step with ``lr = 0``
    moves nothing of its own and leaves ``mhat`` unchanged.

    Args:
        params: Parameters or param groups, as for any :class:`~torch.optim.Optimizer`.
        lr: Learning rate, ``>= 0``.
        momentum: ``beta``, in ``[0, 1)``.
        weight_decay: L2 coefficient added to the gradient, ``>= 0``.
        nesterov: Use the Nesterov form of the update (needs ``momentum > 0``).
        mu: Decay of the quasi-global buffer, in ``[0, 1)``; ``None`` uses ``momentum``.

    Raises:
        ValueError: If a hyper-parameter is outside its range.

    Example::

        model = DecentralizedDataParallel(
            net, optim_fn=partial(optim_fn_qgm_sgd, lr=0.1, momentum=0.9), topology="ring"
        )
    """

    _family = "QGMSGD"

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        mu: float | None = None,
    ) -> None:
        _check_qgm_args(lr, momentum, weight_decay, nesterov, mu)
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "mu": mu,
        }
        super().__init__(params, defaults)

    @staticmethod
    def _fold(p: torch.Tensor, state: dict[str, Any], mu: float) -> None:
        """mhat = mu * mhat + (1 - mu) * (x_prev - x) / lr_prev, with x the current parameters."""
        state["pending"] = False
        lr = state["prev_lr"]
        if lr == 0.0:
            return
        diff = state["prev"].sub_(p).div_(lr)  # the saved copy is not needed any more
        state["momentum_buffer"].mul_(mu).add_(diff, alpha=1.0 - mu)

    def _fold_pending(self) -> None:
        for group in self.param_groups:
            mu = group["momentum"] if group["mu"] is None else group["mu"]
            for p in group["params"]:
                state = self.state.get(p)
                if state and state.get("pending", False):
                    self._fold(p, state, mu)

    @torch.no_grad()
    def post_average_hook(self) -> None:
        """Fold the step's model change ``(x(t-1) - x(t)) / lr`` into the buffer.

        Called by the wrapper once the parameters hold ``x(t)``; calling it
        again, or without a step in between, does nothing.
        """
        self._fold_pending()

    def _update(self) -> None:
        """Take ``d(t) = -lr * m(t)`` from the parameters' current value and save that value."""
        self._fold_pending()  # no post_average_hook since the last step: fold from x(t-1) here
        for group in self.param_groups:
            lr = float(group["lr"])
            beta = group["momentum"]
            wd = group["weight_decay"]
            for p, g in self._with_grads(group):
                state = self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(
                        p, memory_format=torch.preserve_format
                    )
                    state["prev"] = torch.empty_like(p, memory_format=torch.preserve_format)
                    state["prev_lr"] = 0.0
                    state["pending"] = False
                if wd != 0.0:
                    g = g.add(p, alpha=wd)
                m = g.add(state["momentum_buffer"], alpha=beta)
                d = g.add(m, alpha=beta) if group["nesterov"] else m
                state["prev"].copy_(p)
                state["prev_lr"] = lr
                state["pending"] = True
                p.add_(d, alpha=-lr)
