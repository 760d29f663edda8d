"""Optimizer and learning-rate scheduler factories.

:class:`~decent_dp.ddp.DecentralizedDataParallel` builds one optimizer and one
scheduler per bucket, so it takes *factories* rather than instances:

- an ``optim_fn`` maps a list of ``(parameter, name)`` pairs to an optimizer;
- a ``lr_scheduler_fn`` maps an optimizer to a scheduler, stepped once per
  optimizer step.

Bind hyper-parameters with :func:`functools.partial`::

    from functools import partial
    optim_fn = partial(optim_fn_adamw, lr=3e-4, weight_decay=0.05)
    sched_fn = partial(lr_scheduler_fn_cosine_with_warmup, t_max=10_000, t_warmup=500)

The pairs may come in either order, ``(tensor, name)`` or ``(name, tensor)``
(the order of :meth:`torch.nn.Module.named_parameters`); each pair is checked
on its own. Weight decay applies to weights only: parameters with
``ndim <= 1`` (biases, normalization scales and shifts, scalars) go to a
second param group with ``weight_decay=0``. Each group keeps its parameter
names under the ``"names"`` key for debugging.

The optimizers this package adds, :class:`AccumAdam`, :class:`AccumAdamW`,
:class:`LaggedVAdamW` and :class:`QGMSGD`, are public here; they live in
:mod:`decent_dp.optim.accum_adam`, :mod:`decent_dp.optim.lagged_adamw` and
:mod:`decent_dp.optim.qgm`. :func:`check_state_sync` checks the wrapper's
``state_sync=`` option (:mod:`decent_dp.optim.state_sync`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from torch.optim import SGD, Adam, AdamW, Optimizer
from torch.optim.lr_scheduler import LambdaLR, StepLR

from ._base import (
    _check_accum_iter,
    _check_adam_args,
    _check_clip,
    _check_flag,
    _check_lr,
    _check_qgm_args,
    _check_weight_decay,
)
from ._kernels import kernel_flags, prefer_fused, summed_kernel_flags
from .accum_adam import AccumAdam, AccumAdamW
from .lagged_adamw import LaggedVAdamW
from .qgm import QGMSGD
from .state_sync import check_state_sync

__all__ = [
    "AccumAdam",
    "AccumAdamW",
    "LaggedVAdamW",
    "QGMSGD",
    "NamedParams",
    "optim_fn_sgd",
    "optim_fn_qgm_sgd",
    "optim_fn_adam",
    "optim_fn_adamw",
    "optim_fn_accum_adam",
    "optim_fn_accum_adamw",
    "optim_fn_lagged_v_adamw",
    "lr_scheduler_fn_cosine_with_warmup",
    "lr_scheduler_fn_constant",
    "lr_scheduler_fn_step",
    "check_state_sync",
    "decay_groups",
]

NamedParams = Iterable[tuple[torch.Tensor, str] | tuple[str, torch.Tensor]]
"""Parameters with their names, as ``(tensor, name)`` or ``(name, tensor)`` pairs."""


# --------------------------------------------------------------------------- param groups


def _split_pairs(params: NamedParams) -> tuple[list[torch.Tensor], list[str]]:
    """Return the tensors and names of ``params``, accepting either pair order."""
    tensors: list[torch.Tensor] = []
    names: list[str] = []
    for i, pair in enumerate(params):
        if isinstance(pair, tuple | list) and len(pair) == 2:
            a, b = pair
            if isinstance(a, torch.Tensor) and isinstance(b, str):
                tensors.append(a)
                names.append(b)
                continue
            if isinstance(a, str) and isinstance(b, torch.Tensor):
                tensors.append(b)
                names.append(a)
                continue
        raise TypeError(
            f"params[{i}] must be a (Tensor, str) or (str, Tensor) pair, got {type(pair).__name__}"
        )
    if not tensors:
        raise ValueError("params must hold at least one (parameter, name) pair, got none")
    return tensors, names


def decay_groups(params: NamedParams, weight_decay: float) -> list[dict[str, Any]]:
    """Split ``params`` into a decayed group (``ndim >= 2``) and an undecayed one.

    The built-in factories build their optimizers on these groups; a user's own
    optimizer factory can use them the same way.

    Decided by shape, never by name: a name like ``"bn"`` or ``"bias"`` says
    nothing reliable about what a tensor is. Empty groups are left out.

    Args:
        params: The bucket's parameters with their names.
        weight_decay: The decayed group's ``weight_decay``; the other group gets 0.

    Returns:
        Parameter groups (``params``, ``names``, ``weight_decay``) for a
        ``torch.optim.Optimizer``.
    """
    tensors, names = _split_pairs(params)
    decay: dict[str, Any] = {"params": [], "names": [], "weight_decay": weight_decay}
    no_decay: dict[str, Any] = {"params": [], "names": [], "weight_decay": 0.0}
    for p, n in zip(tensors, names):
        group = decay if p.ndim >= 2 else no_decay
        group["params"].append(p)
        group["names"].append(n)
    return [g for g in (decay, no_decay) if g["params"]]


# --------------------------------------------------------------------------- optimizer factories

_O = TypeVar("_O", bound=Optimizer)

# what each hyper-parameter means, shared by the factories that take it
_ARG_DOCS = {
    "params": "``(tensor, name)`` or ``(name, tensor)`` pairs.",
    "lr": "Learning rate, ``>= 0``.",
    "betas": "Moment decay rates, each in ``[0, 1)``.",
    "eps": "Added to the denominator, ``> 0``.",
    "l2": "L2 coefficient for weights, ``>= 0``.",
    "decoupled": "Decoupled decay coefficient for weights, ``>= 0``.",
    "accum_iter": "Steps between moment refreshes, an integer ``>= 1``.",
    "clip": "Bound on each coordinate's normalised step, ``> 0``.",
    "lag_m": "Feed the first moment with the previous gradient too (AdamW one step late).",
    "momentum": "Momentum factor, ``>= 0``; must be ``> 0`` with ``nesterov``.",
    "nesterov": "Use Nesterov momentum.",
    "beta": "``beta``, in ``[0, 1)``.",
    "nesterov_form": "Use the Nesterov form (needs ``momentum > 0``).",
    "mu": "Decay of the quasi-global buffer, in ``[0, 1)``; ``None`` uses ``momentum``.",
}
_RAISES = (
    "ValueError: If a hyper-parameter is outside its range or ``params`` is empty.",
    "TypeError: If an element of ``params`` is not a (tensor, name) pair.",
)


def _optim_factory(
    name: str,
    optimizer: type[_O],
    summary: str,
    hyper: list[tuple[str, Any, str, str]],
    check: Callable[[dict[str, Any]], None],
    returns: str,
    **fixed: Any,
) -> Callable[..., _O]:
    """An ``optim_fn``: check the hyper-parameters, split the decay groups, build ``optimizer``.

    Args:
        name: The function's public name, used in its signature and errors.
        optimizer: The optimizer class to build.
        summary: The first line of the docstring.
        hyper: ``(name, default, annotation, doc)`` of each hyper-parameter,
            in signature order; a doc that is a key of ``_ARG_DOCS`` stands
            for that text.
        check: Validates the bound hyper-parameters, raising ``ValueError``;
            may normalize them in place (``betas`` become floats).
        returns: The docstring's ``Returns:`` text.
        **fixed: Constructor arguments that are not hyper-parameters.
    """
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature(
        [inspect.Parameter("params", kind, annotation="NamedParams")]
        + [inspect.Parameter(n, kind, default=d, annotation=a) for n, d, a, _ in hyper],
        return_annotation=optimizer.__name__,
    )
    args = [("params", _ARG_DOCS["params"])] + [
        (n, _ARG_DOCS.get(doc, doc)) for n, _, _, doc in hyper
    ]
    doc = "\n".join(
        [summary, "", "Args:"]
        + [f"    {n}: {text}" for n, text in args]
        + ["", "Returns:", f"    {returns}", "", "Raises:"]
        + [f"    {line}" for line in _RAISES]
    )

    def factory(*args: Any, **kwargs: Any) -> _O:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}() {exc}") from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        params = values.pop("params")
        check(values)
        return optimizer(decay_groups(params, values["weight_decay"]), **values, **fixed)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = doc
    factory.__module__ = __name__
    factory.__signature__ = signature  # type: ignore[attr-defined]
    factory.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    factory.__annotations__["return"] = optimizer.__name__
    return factory


_PLAIN_RETURNS = "A :class:`{}` with one or two param groups."


def _check_sgd(hp: dict[str, Any]) -> None:
    _check_lr(hp["lr"])
    if not hp["momentum"] >= 0.0:
        raise ValueError(f"momentum must be >= 0, got {hp['momentum']}")
    if hp["nesterov"] and hp["momentum"] == 0.0:
        raise ValueError("nesterov=True needs momentum > 0, got momentum=0")
    _check_weight_decay(hp["weight_decay"])


def _check_qgm(hp: dict[str, Any]) -> None:
    _check_qgm_args(hp["lr"], hp["momentum"], hp["weight_decay"], hp["nesterov"], hp["mu"])


def _check_adam(hp: dict[str, Any]) -> None:
    hp["betas"] = _check_adam_args(hp["lr"], hp["betas"], hp["eps"], hp["weight_decay"])


def _check_lagged_v(hp: dict[str, Any]) -> None:
    _check_adam(hp)
    _check_clip(hp["clip"])
    _check_flag("lag_m", hp["lag_m"])


def _check_accum_adam(hp: dict[str, Any]) -> None:
    _check_adam(hp)
    _check_accum_iter(hp["accum_iter"])


_SUMMARIES = {
    "optim_fn_sgd": "Build SGD with weight decay on weights (``ndim >= 2``) only.",
    "optim_fn_qgm_sgd": "Build :class:`QGMSGD` (quasi-global momentum) with weight decay on weights only.",
    "optim_fn_adam": "Build Adam (L2 decay added to the gradient) with decay on weights only.",
    "optim_fn_adamw": "Build AdamW (decoupled decay) with decay on weights only.",
    "optim_fn_accum_adam": "Build :class:`AccumAdam` with L2 decay (added to the gradient) on weights only.",
    "optim_fn_accum_adamw": "Build :class:`AccumAdamW` (decoupled, AdamW-style decay) with decay on weights only.",
    "optim_fn_lagged_v_adamw": "Build :class:`LaggedVAdamW` (decoupled decay) with decay on weights only.",
}


def _sgd_factory(
    name: str, optimizer: type[_O], check: Callable[[dict[str, Any]], None], *extra: Any
) -> Callable[..., _O]:
    """An SGD-family ``optim_fn``: ``extra`` hyper-parameters follow the four of SGD."""
    qgm = optimizer is QGMSGD
    hyper = [
        ("lr", 0.1, "float", "lr"),
        ("momentum", 0.9, "float", "beta" if qgm else "momentum"),
        ("weight_decay", 5e-4, "float", "l2"),
        ("nesterov", False, "bool", "nesterov_form" if qgm else "nesterov"),
        *extra,
    ]
    returns = _PLAIN_RETURNS.format(optimizer.__name__ if qgm else "torch.optim.SGD")
    return _optim_factory(name, optimizer, _SUMMARIES[name], hyper, check, returns)


optim_fn_sgd = _sgd_factory("optim_fn_sgd", SGD, _check_sgd)
optim_fn_qgm_sgd = _sgd_factory(
    "optim_fn_qgm_sgd", QGMSGD, _check_qgm, ("mu", None, "float | None", "mu")
)


def _adam_factory(
    name: str, optimizer: type[_O], decoupled: bool, returns: str
) -> Callable[..., _O]:
    """An Adam-family ``optim_fn``: ``accum_iter`` for AccumAdam(W), decay 0.01 when decoupled."""
    hyper = [
        ("lr", 1e-3, "float", "lr"),
        ("betas", (0.9, 0.999), "tuple[float, float]", "betas"),
        ("eps", 1e-8, "float", "eps"),
        ("weight_decay", 0.01 if decoupled else 0.0, "float", "decoupled" if decoupled else "l2"),
    ]
    check = _check_adam
    if optimizer is LaggedVAdamW:
        hyper += [("clip", 5.0, "float", "clip"), ("lag_m", False, "bool", "lag_m")]
        check = _check_lagged_v
    if issubclass(optimizer, AccumAdam):
        hyper.append(("accum_iter", 4, "int", "accum_iter"))
        check = _check_accum_adam
    # AccumAdamW is decoupled by its class; AccumAdam takes the flag
    fixed = {"decoupled": False} if optimizer is AccumAdam else {}
    return _optim_factory(name, optimizer, _SUMMARIES[name], hyper, check, returns, **fixed)


optim_fn_adam = _adam_factory(
    "optim_fn_adam", Adam, False, _PLAIN_RETURNS.format("torch.optim.Adam")
)
optim_fn_adamw = _adam_factory(
    "optim_fn_adamw", AdamW, True, _PLAIN_RETURNS.format("torch.optim.AdamW")
)
optim_fn_accum_adam = _adam_factory(
    "optim_fn_accum_adam", AccumAdam, False, "An :class:`AccumAdam` with ``decoupled=False``."
)
optim_fn_accum_adamw = _adam_factory(
    "optim_fn_accum_adamw",
    AccumAdamW,
    True,
    "An :class:`AccumAdamW` (an :class:`AccumAdam` with ``decoupled=True``).",
)
optim_fn_lagged_v_adamw = _adam_factory(
    "optim_fn_lagged_v_adamw",
    LaggedVAdamW,
    True,
    "A :class:`LaggedVAdamW`: use it with ``state_sync={'grad_prev': 1}``.",
)


# --------------------------------------------------------------------------- schedulers


class _CosineWithWarmup:
    """LR factor of one param group: linear warm-up, cosine decay, then constant.

    A callable object rather than a closure so that :class:`LambdaLR` saves its
    fields in ``state_dict()`` (plain numbers, safe for ``weights_only`` loads).
    """

    def __init__(self, t_max: int, t_warmup: int, warmup_decay: float, min_factor: float) -> None:
        self.t_max = t_max
        self.t_warmup = t_warmup
        self.warmup_decay = warmup_decay
        self.min_factor = min_factor

    def __call__(self, step: int) -> float:
        if step >= self.t_max:
            return self.min_factor
        if step < self.t_warmup:
            return self.warmup_decay + (1.0 - self.warmup_decay) * step / self.t_warmup
        progress = (step - self.t_warmup) / (self.t_max - self.t_warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_factor + (1.0 - self.min_factor) * cosine


def lr_scheduler_fn_cosine_with_warmup(
    optimizer: Optimizer,
    t_max: int,
    t_warmup: int,
    eta_min: float = 0.0,
    warmup_decay: float = 0.01,
) -> LambdaLR:
    """Linear warm-up, then cosine decay to ``eta_min``, then constant.

    With base learning rate ``lr0`` of a param group, the rate after ``s``
    scheduler steps is:

    - ``s < t_warmup``: ``lr0 * (warmup_decay + (1 - warmup_decay) * s / t_warmup)``,
      rising linearly from ``lr0 * warmup_decay`` at ``s = 0`` to ``lr0`` at ``s = t_warmup``;
    - ``t_warmup <= s < t_max``:
      ``eta_min + (lr0 - eta_min) * (1 + cos(pi * (s - t_warmup) / (t_max - t_warmup))) / 2``;
    - ``s >= t_max``: ``eta_min``.

    When ``t_warmup == t_max`` the end of the schedule wins: ``eta_min`` from
    ``s = t_max`` on. ``eta_min`` is absolute; a param group whose base rate is
    0 stays at 0.

    Args:
        optimizer: The optimizer whose param groups are scheduled.
        t_max: Step at which the rate reaches ``eta_min``, ``> 0``.
        t_warmup: Length of the warm-up, in ``[0, t_max]``.
        eta_min: Final learning rate, ``>= 0``.
        warmup_decay: Starting factor of the warm-up, in ``(0, 1]``.

    Returns:
        A :class:`torch.optim.lr_scheduler.LambdaLR`, to be stepped once per optimizer step.

    Raises:
        ValueError: If an argument is outside its range.
    """
    if not t_max > 0:
        raise ValueError(f"t_max must be > 0, got {t_max}")
    if not t_warmup >= 0:
        raise ValueError(f"t_warmup must be >= 0, got {t_warmup}")
    if t_warmup > t_max:
        raise ValueError(f"t_warmup must be <= t_max ({t_max}), got {t_warmup}")
    if not 0.0 < warmup_decay <= 1.0:
        raise ValueError(f"warmup_decay must be in (0, 1], got {warmup_decay}")
    if not eta_min >= 0.0:
        raise ValueError(f"eta_min must be >= 0, got {eta_min}")
    factors: list[Callable[[int], float]] = []
    for group in optimizer.param_groups:
        base_lr = float(group.get("initial_lr", group["lr"]))
        min_factor = eta_min / base_lr if base_lr > 0.0 else 0.0
        factors.append(_CosineWithWarmup(t_max, t_warmup, warmup_decay, min_factor))
    return LambdaLR(optimizer, lr_lambda=factors)


def _constant_factor(step: int) -> float:
    return 1.0


def lr_scheduler_fn_constant(optimizer: Optimizer) -> LambdaLR:
    """Keep every param group at its base learning rate.

    Args:
        optimizer: The optimizer whose param groups are scheduled.

    Returns:
        A :class:`torch.optim.lr_scheduler.LambdaLR` with factor 1.
    """
    return LambdaLR(optimizer, lr_lambda=_constant_factor)


def lr_scheduler_fn_step(optimizer: Optimizer, step_size: int, gamma: float = 0.1) -> StepLR:
    """Multiply the learning rate by ``gamma`` every ``step_size`` steps.

    Args:
        optimizer: The optimizer whose param groups are scheduled.
        step_size: Steps between decays, an integer ``>= 1``.
        gamma: Multiplicative factor, ``> 0``.

    Returns:
        A :class:`torch.optim.lr_scheduler.StepLR`.

    Raises:
        ValueError: If ``step_size`` or ``gamma`` is outside its range.
    """
    if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size < 1:
        raise ValueError(f"step_size must be an integer >= 1, got {step_size!r}")
    if not gamma > 0.0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    return StepLR(optimizer, step_size=step_size, gamma=gamma)


# --------------------------------------------------------------------------- kernels


def prefer_fused_kernels(optimizer: Optimizer, device: torch.device | str) -> bool:
    """Switch ``optimizer`` to torch's fused kernel, as the wrapper does for each bucket.

    For exact :class:`~torch.optim.SGD`, :class:`~torch.optim.Adam` and
    :class:`~torch.optim.AdamW` whose ``foreach`` and ``fused`` are unset in
    every group, on a device with fused kernels (CPU and CUDA); any other
    optimizer is left alone. Call it again after ``load_state_dict``, which
    replaces the groups and their flags. A baseline that calls it steps with
    the same kernels as :class:`~decent_dp.ddp.DecentralizedDataParallel`.

    Args:
        optimizer: The optimizer, built but not yet stepped.
        device: The device of its parameters.

    Returns:
        ``True`` if the optimizer now uses the fused kernel.

    Example::

        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        prefer_fused_kernels(opt, "cuda")
    """
    return prefer_fused(optimizer, torch.device(device))


_NO_BUCKETS = object()  # what getattr returns for an object that is not the wrapper


def optimizer_kernels(optimizer: Any) -> dict[str, Any]:
    """Which kernels ``optimizer.step()`` runs, for a report.

    Args:
        optimizer: Any optimizer, or a
            :class:`~decent_dp.ddp.DecentralizedDataParallel`, whose per-bucket
            optimizers are then summed up.

    Returns:
        ``{"optimizer": class name, "fused": bool, "foreach": bool}``: torch's
        fused single-kernel update, its multi-tensor (``_foreach``) kernels
        (what torch picks when both flags are unset; :class:`AccumAdam`'s own
        choice per device), or neither (a loop over the parameters). A flag is
        ``True`` only if every param group (every bucket) uses it. For a
        wrapper before its first backward, when no bucket exists yet, the
        three values are ``None``.
    """
    # the wrapper is told by its buckets, not its class: this module sits below the
    # wrapper's, and importing ddp.py here would close an import cycle (tests/test_layers.py)
    buckets: Any = getattr(optimizer, "_buckets", _NO_BUCKETS)
    if buckets is _NO_BUCKETS:
        return kernel_flags(optimizer)
    return summed_kernel_flags([b.optimizer for b in buckets or [] if b.optimizer])


__all__ += ["prefer_fused_kernels", "optimizer_kernels"]
