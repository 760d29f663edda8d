"""Packed workers: ``n`` decentralized workers of one model trained in one process.

Every trained parameter is stacked on a leading worker dimension, and so is
every buffer: ``x[i]`` is worker ``i``'s copy. One forward over stacked
inputs (``torch.func.vmap`` of ``functional_call``) and one backward give
every worker its own gradient, since worker ``i``'s loss depends on ``x[i]``
alone. :meth:`PackedWorkers.step` then takes the wrapper's step for every
worker at once::

    x_i(t) = sum_j W_ij(t) x_j(t-1) + d_i(t)

with ``d_i(t)`` worker ``i``'s optimizer update computed at ``x_i(t-1)`` and
``W(t)`` the mixing matrix of the topology's round ``(t-1) mod period``, as
:class:`decent_dp.DecentralizedDataParallel` computes it across processes.

Why it is exact:

* **The optimizer.** The user's ``optim_fn`` is called on the model's own
  ``(parameter, name)`` pairs, so its parameter groups (weight decay on
  weights, ``ndim >= 2``, only) are the ones a worker gets; the stacked
  tensors then take the places of the parameters. An optimizer whose update
  is elementwise is then exactly ``n`` optimizers, one per worker: SGD, Adam,
  AdamW, this package's AccumAdam(W), LaggedVAdamW and QGMSGD. Any other is
  refused, since a norm or a matrix step over a stacked tensor would mix the
  workers.
* **Gradient clipping** is per worker: each worker's own global norm.
* **Mixing** costs ``O(n P)`` whatever the round: each group's sum is an
  ``index_add`` over the worker dimension, and each worker takes ``W_ii``
  of its own value and ``W_ij`` of every other member's (a one-peer round
  is a gather, not a dense ``n x n`` product).
* **The outer optimizer** (DiLoCo, SlowMo) keeps one outer copy ``x_outer``;
  at every step ``t > 1`` with ``t % outer_every == 0`` it steps on
  ``x_outer - xbar(t-1)`` and every worker continues from ``x_outer + d_i(t)``,
  as the wrapper's outer rounds do (:mod:`decent_dp._engine.outer`).
* **``topology="allreduce"``** is the synchronous baseline: every worker
  steps on the workers' mean gradient (clipped as one), so the copies stay
  identical, as torch's DDP with an ordinary optimizer keeps them.

Example::

    packed = PackedWorkers(
        model, workers=8, optim_fn=partial(optim_fn_adamw, lr=1e-3),
        topology="one-peer-exp",
    )
    for xs, ys in loader:                 # xs: (8, batch, ...), one batch per worker
        losses = loss_fn(packed(xs), ys)  # (8,), one loss per worker
        losses.sum().backward()           # every worker's own gradient
        packed.step()
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.optim import Optimizer

from ._engine.bucket import aligned_offsets
from ._engine.outer import OuterOptimFn, check_outer_args, inner_lr, step_scaled
from .compression.codecs import parse_compression
from .compression.cost import exchange_bytes
from .optim._factories import check_scheduler, resolve_optim_fn
from .optim._kernels import prefer_fused
from .optim.accum_adam import AccumAdam, AccumAdamW
from .optim.lagged_adamw import LaggedVAdamW
from .optim.qgm import QGMSGD
from .topo import Edge, Topology, TopologyReg

__all__ = ["ALLREDUCE", "ELEMENTWISE_OPTIMIZERS", "PackedWorkers"]

ALLREDUCE = "allreduce"
"""The topology name of the synchronous baseline: one step on the workers' mean gradient."""

ELEMENTWISE_OPTIMIZERS: tuple[type[Optimizer], ...] = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    AccumAdam,
    AccumAdamW,
    LaggedVAdamW,
    QGMSGD,
)
"""Optimizer classes whose step over a stacked tensor is one independent step per worker."""


@dataclass
class _Round:
    """One round of the topology as gather indices and per-worker weights."""

    group_of: torch.Tensor  # (n,) the index of each worker's group
    groups: int
    share: torch.Tensor  # (n,) W_ij, the weight of each other member of the worker's group
    size: torch.Tensor  # (n,) k, the size of the worker's group
    partner: torch.Tensor | None  # (n,) the other member where every group has at most two
    alone: bool  # every worker in a group of one: nothing to mix
    sizes: list[int]  # the group size of each worker

    @classmethod
    def of(cls, edges: Sequence[Edge], n: int, device: torch.device) -> _Round:
        group_of = torch.empty(n, dtype=torch.long)
        share = torch.empty(n, dtype=torch.float64)
        partner = torch.arange(n)
        sizes = [1] * n
        for g, edge in enumerate(edges):
            for rank in edge.ranks:
                group_of[rank] = g
                share[rank] = edge.peer_weight
                sizes[rank] = len(edge.ranks)
            if len(edge.ranks) == 2:
                a, b = edge.ranks
                partner[a], partner[b] = b, a
        pairs = max(sizes) <= 2
        return cls(
            group_of.to(device),
            len(edges),
            share.to(device),
            torch.tensor(sizes, dtype=torch.float64, device=device),
            partner.to(device) if pairs else None,
            max(sizes) == 1,
            sizes,
        )

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """``(W - I) x`` over the leading worker dimension of ``x``.

        A row of ``W`` keeps ``W_ii = 1 - (k-1) W_ij``, so ``((W - I) x)_i = W_ij (S - k
        x_i)`` with ``S`` the sum over the worker's group of ``k``: for a pair, ``W_ij
        (x_j - x_i)``, one gather.
        """
        shape = (-1,) + (1,) * (x.dim() - 1)
        share = self.share.to(x.dtype).view(shape)
        if self.partner is not None:
            return x.index_select(0, self.partner).sub_(x).mul_(share)
        sums = x.new_zeros((self.groups, *x.shape[1:])).index_add_(0, self.group_of, x)
        out = sums.index_select(0, self.group_of)
        return out.sub_(x * self.size.to(x.dtype).view(shape)).mul_(share)


class _Apply(nn.Module):
    """Holds the model as ``inner`` so that ``functional_call`` can run any function of it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.inner, *args, **kwargs)


def _worker_count(workers: Any) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} is invalid; it must be an integer >= 1")
    return workers


def _check_elementwise(opt: Optimizer) -> None:
    if type(opt) not in ELEMENTWISE_OPTIMIZERS:
        allowed = ", ".join(k.__name__ for k in ELEMENTWISE_OPTIMIZERS)
        raise ValueError(
            f"optim_fn built {type(opt).__name__}, which packed workers cannot step exactly; "
            f"allowed: {allowed} (an update that is elementwise over a stacked tensor)"
        )


class PackedWorkers:
    """``workers`` decentralized workers of one model, stacked and trained in one process.

    The workers start from ``model``'s parameters (as the wrapper's workers
    start from rank 0's). ``model`` itself stays untouched and serves as the
    template of the forward pass; keep it on the device the workers train on.

    Args:
        model: The module every worker trains a copy of.
        workers: ``n``, the number of workers.
        optim_fn: As for :class:`decent_dp.DecentralizedDataParallel`: builds an
            optimizer from ``(parameter, name)`` pairs. It must be one of
            :data:`ELEMENTWISE_OPTIMIZERS`.
        lr_scheduler_fn: Builds an LR scheduler from that optimizer; stepped once
            per step. ``None`` keeps the learning rate constant.
        topology: A registered name, a :class:`~decent_dp.topo.Topology` instance
            for ``workers`` workers, or ``"allreduce"`` (:data:`ALLREDUCE`).
        grad_clip_norm: Clip each worker's global gradient norm to this value
            (the mean gradient's under ``allreduce``); 0 disables.
        local_world_size: Workers per node for topologies that read it
            (``alternating-exp-ring``, ``hierarchical``); 1 by default (every
            worker a node of its own), as :func:`decent_dp.topo.mixing_matrices` has it.
        topology_kwargs: Extra keyword arguments for a topology given by name.
        outer_optim_fn: The outer optimizer (DiLoCo, SlowMo) over ``x_outer`` (a
            list of tensors), as for the wrapper.
        outer_every: ``H``: step ``t > 1`` with ``t % H == 0`` is an outer round.
        outer_scale_by_inner_lr: SlowMo's update: the outer gradient divided by the
            inner learning rate of that step, the outer learning rate times it.

    Raises:
        ValueError: A bad ``workers``, an unknown topology or one built for another
            worker count, a negative ``grad_clip_norm``, an optimizer that is not
            elementwise, outer arguments the wrapper refuses too, or an outer
            optimizer with ``allreduce``.
        TypeError: A factory returns the wrong type.

    Example::

        packed = PackedWorkers(model, 8, partial(optim_fn_sgd, lr=0.1), topology="ring")
        out = packed(x.expand(8, *x.shape))   # every worker's output on the same batch
    """

    def __init__(
        self,
        model: nn.Module,
        workers: int,
        optim_fn: Callable[[list[tuple[torch.Tensor, str]]], Optimizer],
        lr_scheduler_fn: Callable[[Optimizer], Any] | None = None,
        topology: str | Topology = "complete",
        *,
        grad_clip_norm: float = 0.0,
        local_world_size: int | None = None,
        topology_kwargs: dict[str, Any] | None = None,
        outer_optim_fn: OuterOptimFn | None = None,
        outer_every: int | None = None,
        outer_scale_by_inner_lr: bool = False,
    ):
        n = _worker_count(workers)
        clip = float(grad_clip_norm)
        if not (math.isfinite(clip) and clip >= 0):
            raise ValueError(f"grad_clip_norm={grad_clip_norm!r} is invalid; it must be >= 0")
        named: list[tuple[str, torch.Tensor]] = [
            (name, p) for name, p in model.named_parameters() if p.requires_grad
        ]
        if not named:
            raise ValueError("model has no parameter with requires_grad=True to train")
        self.module = model
        self.workers = n
        self.grad_clip_norm = clip
        self.allreduce = isinstance(topology, str) and topology == ALLREDUCE
        if self.allreduce:
            self.topology: Topology | None = None
        else:
            self.topology = TopologyReg.create(
                topology, n, local_world_size or 1, **(topology_kwargs or {})
            )
            if self.topology.world_size != n:
                raise ValueError(
                    f"topology {self.topology!r} is built for world_size="
                    f"{self.topology.world_size}, but there are workers={n}"
                )
        check_outer_args(
            outer_optim_fn, outer_every, named[0][1], scale_by_inner_lr=outer_scale_by_inner_lr
        )
        if self.allreduce and outer_optim_fn is not None:
            raise ValueError(
                "an outer optimizer does not combine with topology='allreduce' "
                "(the workers' copies are identical already)"
            )

        self.names = [name for name, _ in named]
        self.params = [self._stack(p).requires_grad_() for _, p in named]
        self.frozen = {
            name: p.detach() for name, p in model.named_parameters() if not p.requires_grad
        }
        self.buffers = {name: self._stack(b) for name, b in model.named_buffers()}
        # the same tensors under the names they have inside map()'s holder module
        self._names = [f"inner.{n}" for n in self.names]
        self._frozen = {f"inner.{n}": t for n, t in self.frozen.items()}
        self._buffers = {f"inner.{n}": t for n, t in self.buffers.items()}
        # every state-dict key -> the first name of its tensor: a tied weight (a GPT's
        # embedding and head) is one stacked tensor, written under each of its names
        first: dict[int, str] = {}
        self._alias = {
            key: first.setdefault(id(t), key) for key, t in model.state_dict(keep_vars=True).items()
        }

        build, trial = resolve_optim_fn(optim_fn, named)
        _check_elementwise(trial)
        if trial.state:
            raise ValueError(
                f"optim_fn built {type(trial).__name__} with state already in it; "
                "packed workers need a fresh optimizer"
            )
        stacked = {id(p): s for (_, p), s in zip(named, self.params)}
        for group in trial.param_groups:  # the model's groups, each parameter stacked
            group["params"] = [stacked[id(p)] for p in group["params"]]
        # torch's fused kernel where the choice was left to torch, as the wrapper's buckets have it
        prefer_fused(trial, self.params[0].device)
        self.optimizer = trial
        # checked on a throwaway optimizer, since a scheduler edits the one it is given
        check_scheduler(lr_scheduler_fn, build(list(named)))
        self.scheduler = lr_scheduler_fn(self.optimizer) if lr_scheduler_fn else None

        self.outer_every = outer_every if outer_optim_fn is not None else None
        self.outer_scale_by_inner_lr = bool(outer_scale_by_inner_lr)
        self.x_outer: list[torch.Tensor] = []
        self.outer_optimizer: Optimizer | None = None
        if outer_optim_fn is not None:
            self.x_outer = [p.detach()[0].clone() for p in self.params]
            self.outer_optimizer = outer_optim_fn(self.x_outer)

        self._apply = _Apply(model)
        self._delta_sq: torch.Tensor | None = None  # ||Delta||^2 of the latest outer round
        device = self.params[0].device
        self._rounds = (
            [] if self.topology is None else [_Round.of(r, n, device) for r in self.topology.rounds]
        )
        self.step_count = 0

    def _stack(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().unsqueeze(0).repeat(self.workers, *([1] * t.dim())).contiguous()

    # ---------------------------------------------------------------- forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Every worker's forward pass: tensor arguments carry a leading worker dimension.

        Non-tensor arguments and ``kwargs`` go to every worker unchanged. The
        output has the worker dimension first.
        """
        return self.map(lambda module, *xs: module(*xs, **kwargs), *args)

    def map(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(module, *args)`` for every worker at once, ``module`` holding that worker's model.

        Tensor arguments carry a leading worker dimension (worker ``i`` gets row
        ``i``); other arguments go to every worker unchanged. ``fn`` must return
        tensors (or tuples of them), which come back with the worker dimension
        first. A training forward with its loss is one call::

            losses = packed.map(lambda m, x, y: F.cross_entropy(m(x), y), xs, ys)  # (n,)
        """
        names = self._names

        def one(params: list[torch.Tensor], buffers: dict[str, torch.Tensor], *xs: Any) -> Any:
            own = dict(zip(names, params))
            return functional_call(self._apply, (own, self._frozen, buffers), (fn, *xs))

        in_dims = (0, 0, *(0 if isinstance(a, torch.Tensor) else None for a in args))
        # torch's fused attention kernels have no batching rule: under vmap each falls back to
        # a loop over the workers whose backward fills the whole stacked gradient once per
        # worker (quadratic in n); the math kernel is matmuls and a softmax, which batch
        with sdpa_kernel(SDPBackend.MATH):
            return vmap(one, in_dims=in_dims, randomness="different")(
                self.params, self._buffers, *args
            )

    def call(self, worker: int, *args: Any, **kwargs: Any) -> Any:
        """Worker ``worker``'s forward on unstacked inputs (no worker dimension), e.g. to evaluate it."""
        self._check_worker(worker)
        own = {n: p[worker] for n, p in zip(self.names, self.params)}
        buffers = {n: b[worker] for n, b in self.buffers.items()}
        return functional_call(self.module, (own, self.frozen, buffers), args, kwargs)

    def _check_worker(self, worker: int, what: str = "worker") -> None:
        if not 0 <= worker < self.workers:
            raise ValueError(
                f"{what}={worker} is out of range; it must be in 0..{self.workers - 1}"
            )

    # ---------------------------------------------------------------- the step

    def _clip(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads or self.grad_clip_norm <= 0:
            return
        norms = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in grads]
        total = torch.linalg.vector_norm(torch.stack(norms), dim=0)  # each worker's global norm
        coef = torch.clamp(self.grad_clip_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype).view((-1,) + (1,) * (g.dim() - 1)))

    def _mean_gradient(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.copy_(p.grad.mean(0, keepdim=True).expand_as(p.grad))

    def _outer_due(self, t: int) -> bool:
        # no gossip precedes step 1, so an outer round due there does not happen (as in the wrapper)
        return self.outer_every is not None and t > 1 and t % self.outer_every == 0

    def _outer_step(self) -> None:
        """Step ``x_outer`` on ``x_outer - xbar(t-1)`` (SlowMo's scaling if asked)."""
        opt = self.outer_optimizer
        assert opt is not None
        gamma = inner_lr(self.optimizer) if self.outer_scale_by_inner_lr else 1.0
        sq = torch.zeros((), dtype=torch.float64, device=self.x_outer[0].device)
        for x, p in zip(self.x_outer, self.params):
            delta = x - p.detach().mean(0)
            sq += delta.double().square().sum()
            x.grad = delta / gamma
        self._delta_sq = sq
        step_scaled(opt, gamma)
        for x in self.x_outer:
            x.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Every worker's step ``t``: its optimizer update at ``x_i(t-1)`` plus the round's mix.

        Call it after the backward of every worker's loss. Parameters without a
        gradient take no optimizer step, as in the wrapper; they are still mixed.
        """
        t = self.step_count + 1
        if self.allreduce:
            self._mean_gradient()
        self._clip()
        rnd = self._rounds[(t - 1) % len(self._rounds)] if self._rounds else None
        # what the round adds to x(t-1), taken before the optimizer moves the parameters
        if self._outer_due(t):
            self._outer_step()
            delta = [x.unsqueeze(0) - p.detach() for x, p in zip(self.x_outer, self.params)]
        elif rnd is not None and not rnd.alone:
            delta = [rnd.delta(p.detach()) for p in self.params]
        else:
            delta = []
        self.optimizer.step()  # x(t-1) + d(t)
        if self.scheduler is not None:
            self.scheduler.step()
        self.zero_grad()
        for p, dp in zip(self.params, delta):
            p.add_(dp)
        self.step_count = t

    def zero_grad(self) -> None:
        """Drop every worker's gradients (:meth:`step` does it too)."""
        for p in self.params:
            p.grad = None

    # ---------------------------------------------------------------- metrics

    @torch.no_grad()
    def consensus_distance(self) -> torch.Tensor:
        """``(1/n) sum_i ||x_i - xbar||^2`` over every trained parameter, as a float64 tensor."""
        total = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        for p in self.params:
            total += (p - p.mean(0, keepdim=True)).double().square().sum()
        return total / self.workers

    def outer_delta_norm(self) -> float | None:
        """``||x_outer - xbar||`` at the latest outer round (reads the device); ``None`` before one."""
        return None if self._delta_sq is None else float(self._delta_sq.sqrt())

    def param_count(self) -> int:
        """Trained elements of one worker's model."""
        return sum(p[0].numel() for p in self.params)

    def comm_bytes_per_step(self) -> float:
        """Bytes one worker would send per step, averaged over workers and over the schedule.

        Exact gossip's cost model (:func:`decent_dp.compression.cost.exchange_bytes`) over
        the wrapper's blocks, every parameter aligned to 256 bytes: a group of ``k``
        all-reduces, ``2 (k-1) / k`` of the model per member. ``allreduce`` all-reduces the gradients every step; an
        outer round all-reduces the model over every worker in place of its round.
        """
        steps = self._schedule_bytes()
        return sum(steps) / len(steps)

    def comm_peak_bytes_per_step(self) -> float:
        """The most bytes one worker would send in one step of the schedule (mean over workers)."""
        return max(self._schedule_bytes())

    def _schedule_bytes(self) -> list[float]:
        """Bytes per worker of each step of one whole schedule (rounds and outer rounds)."""
        spec = parse_compression(None)
        size = self.params[0].element_size()
        n = self.workers
        if self.allreduce:  # torch's DDP all-reduces the gradients unpadded
            return [exchange_bytes(spec, self.param_count(), size, n)]
        # the wrapper's blocks align every parameter to 256 bytes, and send the padding too
        numel = aligned_offsets([p[0] for p in self.params], size)[1]
        period = len(self._rounds)
        steps = period
        if self.outer_every is not None:
            steps = period * self.outer_every // math.gcd(period, self.outer_every)
        out = []
        for t in range(1, steps + 1):
            if self.outer_every is not None and t % self.outer_every == 0:
                out.append(exchange_bytes(spec, numel, size, n))
            else:
                sizes = self._rounds[(t - 1) % period].sizes
                out.append(sum(exchange_bytes(spec, numel, size, k) for k in sizes) / n)
        return out

    # ---------------------------------------------------------------- models

    @torch.no_grad()
    def worker_state_dict(self, worker: int) -> dict[str, torch.Tensor]:
        """Worker ``worker``'s model as ``model.state_dict()`` keys (copies)."""
        self._check_worker(worker)
        return self._state(lambda s: s[worker].clone())

    @torch.no_grad()
    def averaged_state_dict(self, buffers_of: int | None = None) -> dict[str, torch.Tensor]:
        """The workers' average model as ``model.state_dict()`` keys.

        Args:
            buffers_of: Take the buffers (BatchNorm statistics) of this worker instead of
                averaging them, as an evaluation on that worker's data would see them.

        Floating-point buffers are averaged unless ``buffers_of`` is given; other buffers
        (counters) are worker 0's.
        """

        def mean(s: torch.Tensor) -> torch.Tensor:
            return s.mean(0) if s.is_floating_point() else s[0].clone()

        if buffers_of is None:
            return self._state(mean)
        self._check_worker(buffers_of, "buffers_of")
        return self._state(mean, lambda b: b[buffers_of].clone())

    def _state(
        self,
        pick: Callable[[torch.Tensor], torch.Tensor],
        pick_buffer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        own = {name: pick(p.detach()) for name, p in zip(self.names, self.params)}
        own.update({name: (pick_buffer or pick)(b) for name, b in self.buffers.items()})
        state = {}
        for key, value in self.module.state_dict().items():
            name = self._alias.get(key, key)
            state[key] = own[name] if name in own else value.detach().clone()
        return state

    def averaged_module(self) -> nn.Module:
        """A copy of the model holding the workers' average (for evaluation)."""
        model = copy.deepcopy(self.module)
        model.load_state_dict(self.averaged_state_dict())
        return model

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs: the stacked models, optimizer, scheduler, outer state, step."""
        state: dict[str, Any] = {
            "step": self.step_count,
            "workers": self.workers,
            "params": {n: p.detach().clone() for n, p in zip(self.names, self.params)},
            "buffers": {n: b.clone() for n, b in self.buffers.items()},
            "optimizer": self.optimizer.state_dict(),
        }
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.outer_optimizer is not None:
            state["x_outer"] = [x.clone() for x in self.x_outer]
            state["outer_optimizer"] = self.outer_optimizer.state_dict()
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load :meth:`state_dict`'s output in place; the next step continues exactly.

        Raises:
            ValueError: The state is of another worker count or another model.
        """
        if state.get("workers") != self.workers:
            raise ValueError(
                f"the state holds workers={state.get('workers')!r}; these are workers={self.workers}"
            )
        if sorted(state["params"]) != sorted(self.names):
            raise ValueError("the state's parameter names differ from this model's")
        for name, p in zip(self.names, self.params):
            p.copy_(state["params"][name])
        for name, b in self.buffers.items():
            b.copy_(state["buffers"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.outer_optimizer is not None:
            for x, saved in zip(self.x_outer, state["x_outer"]):
                x.copy_(saved)
            self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.step_count = int(state["step"])
