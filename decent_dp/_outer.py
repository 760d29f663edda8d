"""The outer optimizer: every ``H`` steps, one optimizer step on an outer copy of the model.

Every rank keeps an outer copy ``x_outer`` of each bucket, identical on all
ranks, starting from the parameters when the buckets are built (``x(0)``
after the wrapper's broadcast). At every step ``t`` with ``t % H == 0`` the
gossip that step ``t`` mixes in (launched right after step ``t-1``) is one
all-reduce of the whole world with weight ``1/n``, so it delivers the exact
average ``xbar(t-1)``. When the bucket steps, :meth:`OuterOptimizer.step`
turns that average, in the gossip buffer itself, into ``Delta = x_outer -
xbar(t-1)``, hands it to the outer optimizer as the gradient of
``x_outer``, steps, and writes the new ``x_outer`` back into the buffer. The
rest of the bucket step is unchanged: the buffer is mixed in as the average
would have been (with the default mixing step size 1 the mixed value is
``x_outer`` exactly) and the local update ``d(t)``, computed at ``x(t-1)``,
is added on top.

With ``local-sgd`` and ``period=H`` that all-reduce is the topology's own
averaging round (DiLoCo); on a gossip topology it replaces that step's
round (SlowMo over gossip). The wrapper's :mod:`decent_dp._gossip` asks
:meth:`OuterOptimizer.due` which launches are outer rounds and recognises
their results by :attr:`OuterOptimizer.edge`.

Fragments (streaming outer rounds, ``F = fragments``, ``H % F == 0``). The
buckets are dealt to ``F`` fragments in bucket order, bucket ``b`` to
fragment ``b % F`` (strided over the layers, so that every fragment holds
about ``1/F`` of the model). Fragment ``f`` runs the whole schedule shifted
by ``s_f = f H / F`` steps: its outer rounds are the steps ``t >= 1`` with
``(t - s_f) % H == 0`` (``t = s_f, s_f + H, ...``; fragment 0 keeps
``t = H, 2H, ...``), and at every other step it takes the topology's round
``(t - s_f - 1) mod period`` where the unshifted schedule takes ``(t - 1)
mod period``. The modulo (never negative) defines the steps before a
fragment's first outer round, ``t < s_f``, as the tail of a period before
step 0: under ``local-sgd`` with ``period=H`` those are local steps, so a
fragment communicates only at its own outer rounds (streaming DiLoCo); on a
gossip topology it gossips from step 1 (streaming SlowMo). The first outer
round of fragment ``f > 0`` comes after ``s_f - 1`` local steps, as the
first one of fragment 0 comes after ``H - 1``. With ``F = 1`` this is the
schedule above. Each step then all-reduces about ``1/F`` of the model
instead of every ``H``-th step all of it: the mean bytes per step are the
same, the peak is ``1/F`` of it. A fragment without a bucket (``F`` larger
than the number of buckets) never communicates; the wrapper warns when the
buckets are built.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from ._bucket import Bucket
from ._compression import CompressionSpec, exchange_bytes
from .topo import Edge

__all__ = ["OuterOptimFn", "OuterOptimizer", "check_outer_args", "schedule_bytes"]

OuterOptimFn = Callable[[list[torch.Tensor]], Optimizer]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_outer_args(
    outer_optim_fn: Any, outer_every: Any, like: torch.Tensor, fragments: Any = 1
) -> None:
    """Raise a one-line error unless both are given (``outer_every`` an int >= 1) or neither.

    ``fragments`` must be an int >= 1 that divides ``outer_every``, and other
    than 1 only with an outer optimizer. A trial optimizer is built over one
    element shaped like ``like``, so a factory that fails or returns something
    else fails here, on every rank, before any collective.

    Raises:
        ValueError: Only one of the two is given, ``outer_every`` is not an int >= 1,
            or ``fragments`` is not an int >= 1 dividing it (or given without them).
        TypeError: ``outer_optim_fn`` is not callable or does not return an optimizer.
    """
    if outer_optim_fn is None and outer_every is None:
        if not (_is_int(fragments) and fragments == 1):
            raise ValueError(
                f"outer_fragments={fragments!r} is given without an outer optimizer; it needs "
                "outer_optim_fn and outer_every (leave it at 1 otherwise)"
            )
        return
    if outer_optim_fn is None or outer_every is None:
        raise ValueError(
            f"outer_optim_fn={outer_optim_fn!r} and outer_every={outer_every!r}: give both "
            "(an optimizer factory and an int >= 1) or neither"
        )
    if isinstance(outer_every, bool) or not isinstance(outer_every, int) or outer_every < 1:
        raise ValueError(
            f"outer_every={outer_every!r} is invalid; it must be an integer >= 1 "
            "(the steps between outer steps)"
        )
    if not _is_int(fragments) or fragments < 1:
        raise ValueError(
            f"outer_fragments={fragments!r} is invalid; it must be an integer >= 1 "
            "(the number of fragments whose outer rounds are staggered)"
        )
    if outer_every % fragments != 0:
        raise ValueError(
            f"outer_fragments={fragments} does not divide outer_every={outer_every}; "
            f"it must be a divisor of outer_every (e.g. 1 or {outer_every})"
        )
    if not callable(outer_optim_fn):
        raise TypeError(
            f"outer_optim_fn must be callable (list of tensors -> torch.optim.Optimizer), "
            f"got {type(outer_optim_fn).__name__}"
        )
    trial = outer_optim_fn([torch.zeros(1, dtype=like.dtype, device=like.device)])
    if not isinstance(trial, Optimizer):
        raise TypeError(
            f"outer_optim_fn must return a torch.optim.Optimizer, got {type(trial).__name__}"
        )


class OuterOptimizer:
    """The outer copies of the buckets, their optimizers, and the outer rounds' schedule.

    Args:
        optim_fn: Builds a torch optimizer over a list of tensors (one bucket's outer copy).
        every: ``H``, the steps between outer steps; step ``t`` is one when ``t % H == 0``.
        world_size: Number of ranks; the outer round averages all of them.
        fragments: ``F``, a divisor of ``H``: bucket ``b`` belongs to fragment ``b % F``,
            whose schedule is shifted by ``(b % F) H / F`` steps (see the module docstring).

    Attributes:
        edge: The outer round's group (every rank, weight ``1/n``).
        group: Its process group (the default group).
    """

    def __init__(self, optim_fn: OuterOptimFn, every: int, world_size: int, fragments: int = 1):
        self.optim_fn = optim_fn
        self.every = int(every)
        self.fragments = int(fragments)
        self.stride = self.every // self.fragments  # H / F: the shift between fragments
        self.edge = Edge(range(world_size), 1.0 / world_size)
        self.group: Any = dist.group.WORLD
        self.copies: list[list[torch.Tensor]] = []
        self.optimizers: list[Optimizer] = []
        # ||Delta||^2 per bucket at its latest outer step, summed on the device until read
        self._delta_sq: list[torch.Tensor | None] = []

    def shift(self, bucket_index: int) -> int:
        """``s_f``: the steps by which the schedule of the bucket's fragment is shifted."""
        return (bucket_index % self.fragments) * self.stride

    def due(self, for_step: int, bucket_index: int = 0) -> bool:
        """Whether the bucket's gossip mixed in at step ``for_step`` (1-based) is an outer round."""
        return (for_step - self.shift(bucket_index)) % self.every == 0

    def check_buckets(self, count: int) -> None:
        """Warn (once the buckets exist) when some fragments hold no bucket."""
        if count < self.fragments:
            warnings.warn(
                f"outer_fragments={self.fragments} but the model has {count} bucket(s): "
                f"fragments {count}..{self.fragments - 1} are empty and never communicate; "
                "lower bucket_size_in_mb or outer_fragments",
                stacklevel=2,
            )

    @torch.no_grad()
    def add_bucket(self, bucket: Bucket) -> None:
        """Start the bucket's outer copy from its current values, and build its optimizer."""
        copies = [v.detach().clone() for v in bucket.values()]
        opt = self.optim_fn(copies)
        if not isinstance(opt, Optimizer):
            raise TypeError(
                f"outer_optim_fn must return a torch.optim.Optimizer, got {type(opt).__name__}"
            )
        self.copies.append(copies)
        self.optimizers.append(opt)
        self._delta_sq.append(None)

    @torch.no_grad()
    def step(self, bucket: Bucket) -> None:
        """Turn ``xbar(t-1)`` in the bucket's gossip buffer into the stepped ``x_outer``.

        The buffer holds ``W x(t-1)`` with ``W`` the uniform average (the
        outer round's result); it first becomes ``Delta = x_outer - xbar``,
        which is the outer optimizer's gradient, and then the new ``x_outer``.
        """
        i = bucket.index
        copies, opt = self.copies[i], self.optimizers[i]
        sq = torch.zeros((), dtype=torch.float64, device=bucket.device)
        for x, c in zip(copies, bucket.comm_views):
            torch.sub(x, c, out=c)
            x.grad = c
            sq += torch.linalg.vector_norm(c, dtype=torch.float64).square()
        self._delta_sq[i] = sq
        opt.step()
        for x, c in zip(copies, bucket.comm_views):
            x.grad = None
            c.copy_(x)

    def delta_norm(self) -> float | None:
        """``||Delta||`` over all buckets at the latest outer step (identical on every rank).

        ``None`` before the first outer step. Reads the device: call it at log time.
        """
        parts = [s for s in self._delta_sq if s is not None]
        if not parts:
            return None
        return float(torch.stack(parts).sum().sqrt().item())

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The outer copies (cloned) and the outer optimizers' states."""
        return {
            "every": self.every,
            "fragments": self.fragments,
            "copies": [[x.detach().clone() for x in xs] for xs in self.copies],
            "optimizers": [opt.state_dict() for opt in self.optimizers],
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into buckets already built with the same layout.

        Raises:
            ValueError: The state has another ``every``, another number of fragments
                (a state without the key has one), or another number of buckets or tensors.
        """
        if int(state.get("every", -1)) != self.every:
            raise ValueError(
                f"the outer state was saved with outer_every={state.get('every')}; "
                f"this wrapper has outer_every={self.every}"
            )
        if int(state.get("fragments", 1)) != self.fragments:
            raise ValueError(
                f"the outer state was saved with outer_fragments={state.get('fragments', 1)}; "
                f"this wrapper has outer_fragments={self.fragments}"
            )
        saved: Sequence[Sequence[torch.Tensor]] = state["copies"]
        if [len(xs) for xs in saved] != [len(xs) for xs in self.copies]:
            raise ValueError("the saved outer copies do not match this wrapper's bucket layout")
        for xs, ys in zip(self.copies, saved):
            for x, y in zip(xs, ys):
                x.copy_(y)
        for opt, opt_state in zip(self.optimizers, state["optimizers"]):
            opt.load_state_dict(opt_state)
        self._delta_sq = [None] * len(self.copies)


def schedule_bytes(
    outer: OuterOptimizer,
    edges: list[Edge],
    numels: list[int],
    element_size: int,
    gossip: CompressionSpec,
) -> list[float]:
    """Bytes this rank sends at each step ``t = 1 .. lcm(period, H)``, outer rounds included.

    Each bucket's step is its fragment's: the exact all-reduce of the world at
    its outer rounds, else its shifted topology round, compressed by ``gossip``
    (the cost model of :func:`decent_dp._compression.exchange_bytes`).

    Args:
        outer: The outer optimizer (its schedule and fragments).
        edges: This rank's edge in each round of the topology's period.
        numels: The element count of each bucket, in bucket order.
        element_size: Bytes per element of the buckets.
        gossip: The gossip's compressor.
    """
    period = len(edges)
    span = math.lcm(period, outer.every)
    exact = CompressionSpec()
    k_outer = len(outer.edge.ranks)
    steps = []
    for t in range(1, span + 1):
        sent = 0.0
        for b, n in enumerate(numels):
            if outer.due(t, b):
                sent += exchange_bytes(exact, n, element_size, k_outer)
            else:
                edge = edges[(t - outer.shift(b) - 1) % period]
                sent += exchange_bytes(gossip, n, element_size, len(edge.ranks))
        steps.append(sent)
    return steps
