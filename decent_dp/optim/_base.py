"""What this package's optimizers share: the hyper-parameter checks and the closure step.

The ``optim_fn_*`` factories of :mod:`decent_dp.optim` run the same checks
before they build an optimizer, so a bad value reads the same from either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim import Optimizer


def _check_lr(lr: float) -> None:
    if not lr >= 0.0:
        raise ValueError(f"lr must be >= 0, got {lr}")


def _check_eps(eps: float) -> None:
    if not eps > 0.0:
        raise ValueError(f"eps must be > 0, got {eps}")


def _check_weight_decay(weight_decay: float) -> None:
    if not weight_decay >= 0.0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")


def _check_betas(betas: tuple[float, float]) -> tuple[float, float]:
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}") from None
    for i, b in enumerate((b1, b2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"betas[{i}] must be in [0, 1), got {b}")
    return float(b1), float(b2)


def _check_clip(clip: float) -> None:
    if not clip > 0.0:
        raise ValueError(f"clip must be > 0, got {clip}")


def _check_flag(name: str, value: bool) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def _check_accum_iter(accum_iter: int) -> None:
    if isinstance(accum_iter, bool) or not isinstance(accum_iter, int) or accum_iter < 1:
        raise ValueError(f"accum_iter must be an integer >= 1, got {accum_iter!r}")


def _check_adam_args(
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> tuple[float, float]:
    """The checks every Adam-style factory shares; returns the checked betas."""
    _check_lr(lr)
    checked = _check_betas(betas)
    _check_eps(eps)
    _check_weight_decay(weight_decay)
    return checked


def _adam_defaults(
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> dict[str, Any]:
    """The param-group defaults every Adam-style optimizer of the package starts from, checked."""
    betas = _check_adam_args(lr, betas, eps, weight_decay)
    return {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}


def _check_qgm_args(
    lr: float, momentum: float, weight_decay: float, nesterov: bool, mu: float | None
) -> None:
    _check_lr(lr)
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    if mu is not None and not 0.0 <= mu < 1.0:
        raise ValueError(f"mu must be in [0, 1) or None (= momentum), got {mu}")
    if nesterov and momentum == 0.0:
        raise ValueError("nesterov=True needs momentum > 0, got momentum=0")
    _check_weight_decay(weight_decay)


def _foreach_device(device: torch.device) -> bool:
    """Whether torch has multi-tensor kernels on ``device`` (as for torch's own foreach default)."""
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    return device.type in _get_foreach_kernels_supported_devices()


class _ClosureStep(Optimizer):
    """An optimizer whose :meth:`step` evaluates the closure, then updates without autograd."""

    _family = ""  # the name in error messages

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Perform one optimization step.

        Args:
            closure: Optional callable that re-evaluates the model and returns the loss.

        Returns:
            The loss returned by ``closure``, or ``None``.

        Raises:
            RuntimeError: If a gradient is sparse.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._update()
        return loss

    def _update(self) -> None:
        raise NotImplementedError

    def _with_grads(self, group: dict[str, Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The group's parameters that have a gradient, each with it; sparse ones are refused."""
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{self._family} does not support sparse gradients")
            yield p, p.grad
