"""The optimizers this package adds: :class:`AccumAdam`, :class:`AccumAdamW`, :class:`LaggedVAdamW`
and :class:`QGMSGD`.

Public under :mod:`decent_dp.optim`, together with the hyper-parameter checks
that the optimizers and the ``optim_fn_*`` factories share.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = ["AccumAdam", "AccumAdamW", "LaggedVAdamW", "QGMSGD"]


# --------------------------------------------------------------------------- checks


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


# --------------------------------------------------------------------------- AccumAdam


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
        betas = _check_adam_args(lr, betas, eps, weight_decay)
        _check_accum_iter(accum_iter)
        if maximize:
            raise ValueError("maximize must be False for AccumAdam, got True")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "accum_iter": accum_iter,
            "decoupled": decoupled,
            "maximize": False,
        }
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


# --------------------------------------------------------------------------- LaggedVAdamW


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
        betas = _check_adam_args(lr, betas, eps, weight_decay)
        _check_clip(clip)
        _check_flag("lag_m", lag_m)
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "clip": float(clip),
            "lag_m": lag_m,
        }
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


# --------------------------------------------------------------------------- QGM


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
