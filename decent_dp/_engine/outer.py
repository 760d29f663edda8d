"""The outer optimizer: every ``H`` steps, one optimizer step on an outer copy of the model.

Every rank keeps an outer copy ``x_outer`` of each bucket, identical on all
ranks, starting from rank 0's parameters when the buckets are built, which
every rank receives then (``x(0)`` when nothing has changed the parameters
since the wrapper's own broadcast; a script that changes them per rank in
between would otherwise start one outer loop per rank, never reconciled). A
checkpoint's outer copies, loaded after, replace them. At every step ``t`` with ``t % H == 0`` the
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
round (SlowMo over gossip). The wrapper's :mod:`decent_dp._engine.gossip` asks
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
buckets are built. No gossip precedes step 1, so an outer round due there
(``H / F = 1``) does not happen; the models are ``x(0) = x_outer`` anyway.

Compressed outer rounds (``compression`` ``bf16`` or ``int8``). What crosses
the wire is each rank's outer gradient ``Delta_i = x_outer - x_i(t-1)``
(small once training is under way, unlike the model), compressed with the
encoders of :mod:`decent_dp.compression.codecs`; the exchange is the one of
compressed gossip: a pair all-gathers its two payloads and sums them decoded
in rank order, a larger world exchanges in two phases (rank ``c`` sums every
rank's decoded chunk ``c`` in rank order and sends that sum compressed to
all). Every rank thus decodes the same sum ``S`` of the same payloads, in the
same order, and takes ``Delta = S / n`` as the outer gradient: the same bits
on every rank, so the outer optimizer (its state in the buckets' dtype) keeps
``x_outer`` identical everywhere, and the workers continue from
``x_i(t) = x_outer + d_i(t)`` exactly as after an exact round. Only the
outer gradient is approximate: ``Delta`` differs from the exact mean by the
compressor's rounding of each ``Delta_i`` and of the chunk sums. Alone
(one rank) nothing is sent and the round stays exact.

Scaled by the inner learning rate (``scale_by_inner_lr``, SlowMo's own
update, Wang et al. 2020, Algorithm 1): the outer gradient is ``Delta /
gamma_t`` and the outer optimizer steps with its learning rate times
``gamma_t``, where ``gamma_t`` is the learning rate of the bucket's inner
optimizer (its first parameter group) for step ``t``, the step whose round
is the outer round. With SGD and momentum ``beta`` that is ``u = beta u +
Delta / gamma_t``, ``x_outer -= alpha gamma_t u``; under a constant inner
rate it is the plain update, under a schedule the momentum buffer stays in
units of a gradient as the rate decays.

No error-feedback buffer is kept (the rounding of a round's ``Delta_i`` is
not added to the next one's). Measured with
:mod:`experiments.bench.outer_error_feedback` (4 workers, DiLoCo's outer
step, ``H = 8``, 480 AdamW steps on non-identical data, the two-phase int8
exchange): on softmax regression (650 parameters; 1e-6 of noise in ``x(0)``
moves the end by 1.8e-7) error feedback on both roundings brings ``x_outer``
from 7.0e-4 to 4.8e-5 of its travel away from the exact run (bf16: 2.4e-4 to
1.4e-5), while the final loss (0.419685 exact) moves by -2.6e-5 without it
and -2.5e-6 with it. On an MLP (85k parameters, where that 1e-6 of noise
already moves the end by 12% and the loss by 2.2e-3) both are 20-22% away,
with loss differences of -8.2e-3 without and +3.8e-3 with: run-to-run
scatter. The buffer would cost one more model copy per rank (beside
``x_outer`` and the outer optimizer's state) and a checkpointed state, for an
effect that does not show above the noise of training.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from .._comm.compressed import start_exchange
from .._comm.inflight import InFlight, decoded_sum
from ..compression.codecs import CompressionSpec, exchange_len, exchange_nbytes
from ..topo import Edge
from .bucket import Bucket

__all__ = [
    "OUTER_COMPRESSIONS",
    "OuterOptimFn",
    "OuterOptimizer",
    "check_outer_args",
]

OUTER_COMPRESSIONS = ("none", "bf16", "int8")

OuterOptimFn = Callable[[list[torch.Tensor]], Optimizer]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def outer_compression_name(value: Any) -> str:
    """``None``, ``"none"``, ``"bf16"`` or ``"int8"`` as one of :data:`OUTER_COMPRESSIONS`.

    Raises:
        ValueError: Another value.
    """
    name = "none" if value is None else value
    if not isinstance(name, str) or name not in OUTER_COMPRESSIONS:
        raise ValueError(
            f"outer_compression={value!r} is invalid; use None, 'none', 'bf16' or 'int8'"
        )
    return name


def check_outer_args(
    outer_optim_fn: Any,
    outer_every: Any,
    like: torch.Tensor,
    fragments: Any = 1,
    compression: Any = None,
    scale_by_inner_lr: Any = False,
) -> None:
    """Raise a one-line error unless both are given (``outer_every`` an int >= 1) or neither.

    ``fragments`` must be an int >= 1 that divides ``outer_every``, and
    ``compression`` one of :data:`OUTER_COMPRESSIONS`; both other than their
    defaults (1, ``"none"``) only with an outer optimizer, as ``scale_by_inner_lr``
    (a bool) ``True``. A trial optimizer is
    built over one element shaped like ``like``, so a factory that fails or
    returns something else fails here, on every rank, before any collective.

    Raises:
        ValueError: Only one of the two is given, ``outer_every`` is not an int >= 1,
            ``fragments`` is not an int >= 1 dividing it, ``compression`` is unknown,
            ``scale_by_inner_lr`` is not a bool, or any of them is given without an outer
            optimizer.
        TypeError: ``outer_optim_fn`` is not callable or does not return an optimizer.
    """
    name = outer_compression_name(compression)
    if not isinstance(scale_by_inner_lr, bool):
        raise ValueError(
            f"outer_scale_by_inner_lr={scale_by_inner_lr!r} is invalid; it must be True or False"
        )
    if outer_optim_fn is None and outer_every is None:
        if scale_by_inner_lr:
            raise ValueError(
                "outer_scale_by_inner_lr=True is given without an outer optimizer; it needs "
                "outer_optim_fn and outer_every (leave it False otherwise)"
            )
        if not (_is_int(fragments) and fragments == 1):
            raise ValueError(
                f"outer_fragments={fragments!r} is given without an outer optimizer; it needs "
                "outer_optim_fn and outer_every (leave it at 1 otherwise)"
            )
        if name != "none":
            raise ValueError(
                f"outer_compression={compression!r} is given without an outer optimizer; it "
                "needs outer_optim_fn and outer_every (leave it at 'none' otherwise)"
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


def inner_lr(inner: Optimizer) -> float:
    """``gamma_t``: the inner optimizer's learning rate (its first group) at an outer step.

    Raises:
        ValueError: It is not > 0 (the scaled update divides by it).
    """
    gamma = float(inner.param_groups[0]["lr"])
    if not (gamma > 0 and math.isfinite(gamma)):
        raise ValueError(
            f"outer_scale_by_inner_lr: the inner learning rate is {gamma!r} at this outer "
            "step; it must be > 0 (start the warm-up above 0, or turn the scaling off)"
        )
    return gamma


def step_scaled(opt: Optimizer, gamma: float) -> None:
    """One step of ``opt`` with every group's learning rate times ``gamma``, restored after."""
    saved = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = g["lr"] * gamma
    try:
        opt.step()
    finally:
        for g, lr in zip(opt.param_groups, saved):
            g["lr"] = lr


class OuterOptimizer:
    """The outer copies of the buckets, their optimizers, and the outer rounds' schedule.

    Args:
        optim_fn: Builds a torch optimizer over a list of tensors (one bucket's outer copy).
        every: ``H``, the steps between outer steps; step ``t`` is one when ``t % H == 0``.
        world_size: Number of ranks; the outer round averages all of them.
        fragments: ``F``, a divisor of ``H``: bucket ``b`` belongs to fragment ``b % F``,
            whose schedule is shifted by ``(b % F) H / F`` steps (see the module docstring).
        compression: ``none`` (the exact all-reduce), ``bf16`` or ``int8``: what the
            outer rounds send of ``Delta`` (see the module docstring).
        scale_by_inner_lr: Step on ``Delta / gamma_t`` with the outer learning rate
            times ``gamma_t``, the inner optimizer's current learning rate (SlowMo's
            update; see the module docstring).

    Attributes:
        edge: The outer round's group (every rank, weight ``1/n``).
        group: Its process group (the default group).
        second: Where a compressed two-phase round runs its second phase, and the
            queue of those started there (:func:`decent_dp._comm.compressed.start_exchange`),
            or ``None`` for the default group.
    """

    def __init__(
        self,
        optim_fn: OuterOptimFn,
        every: int,
        world_size: int,
        fragments: int = 1,
        compression: str = "none",
        scale_by_inner_lr: bool = False,
    ):
        self.optim_fn = optim_fn
        self.scale_by_inner_lr = bool(scale_by_inner_lr)
        self.every = int(every)
        self.fragments = int(fragments)
        self.stride = self.every // self.fragments  # H / F: the shift between fragments
        self.compression = outer_compression_name(compression)
        self.second: tuple[Any, list[Any]] | None = None
        self._inflight: dict[int, InFlight] = {}  # compressed rounds between launch and step
        self._scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
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
        """Start the bucket's outer copy from rank 0's values, and build its optimizer.

        Every rank calls this at the same point (when the buckets are built),
        so the broadcasts line up; where the values already agree they change
        nothing.
        """
        copies = [v.detach().clone() for v in bucket.values()]
        if len(self.edge.ranks) > 1:
            for x in copies:  # the outer loop has one start, not one per rank
                dist.broadcast(x, src=self.edge.ranks[0], group=self.group)
        opt = self.optim_fn(copies)
        if not isinstance(opt, Optimizer):
            raise TypeError(
                f"outer_optim_fn must return a torch.optim.Optimizer, got {type(opt).__name__}"
            )
        self.copies.append(copies)
        self.optimizers.append(opt)
        self._delta_sq.append(None)

    @property
    def compressed(self) -> bool:
        """Whether the outer rounds send compressed ``Delta`` (nothing is sent alone)."""
        return self.compression != "none" and len(self.edge.ranks) > 1

    def _delta(self, bucket: Bucket, length: int) -> torch.Tensor:
        """``x_outer - x(t-1)`` over the bucket's block, zero-padded to ``length`` elements.

        One scratch block per dtype and device serves every bucket: the payload
        is encoded from it at the launch, and the block is free after that.
        """
        key = (bucket.dtype, bucket.device)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < length:
            buf = torch.zeros(length, dtype=bucket.dtype, device=bucket.device)
            self._scratch[key] = buf
        out, n = buf[:length], bucket.numel
        copies = self.copies[bucket.index]
        if bucket.flat is not None:
            torch.sub(copies[0], bucket.flat, out=out[:n])
        else:
            out[:n].zero_()  # the padding between the parameters
            for x, p, o in zip(copies, bucket.params, bucket.offsets):
                m = p.numel()
                torch.sub(x.reshape(-1), p.data.reshape(-1), out=out[o : o + m])
        out[n:].zero_()
        return out

    @torch.no_grad()
    def launch(
        self, bucket: Bucket, stream: Any = None, on_encoded: Callable[[], None] | None = None
    ) -> Any:
        """Start a compressed outer round: every rank's ``Delta`` compressed, summed exactly.

        Args:
            bucket: The bucket whose outer round it is; its parameters are ``x(t-1)``.
            stream: The CUDA side stream of the bucket work, or ``None``.
            on_encoded: Called once the payload is encoded, just before it is sent.

        Returns:
            The work handle; :meth:`step` reads the result.
        """
        name, k, n = self.compression, len(self.edge.ranks), bucket.numel
        delta = self._delta(bucket, exchange_len(name, n, k))
        work, fl = start_exchange(
            name, delta, n, k, self.group, stream=stream, on_encoded=on_encoded, second=self.second
        )
        self._inflight[bucket.index] = fl
        return work

    def nbytes(self, bucket: Bucket) -> int:
        """The bytes of the bucket's compressed outer round, as the network emulation counts them."""
        spec = CompressionSpec(self.compression)
        return exchange_nbytes(spec, bucket.numel, bucket.comm.element_size(), len(self.edge.ranks))

    def release(self) -> None:
        """Drop the payloads of rounds in flight and the scratch block."""
        self._inflight.clear()
        self._scratch.clear()

    @torch.no_grad()
    def step(self, bucket: Bucket) -> None:
        """Turn the outer round's result in the bucket's gossip buffer into the stepped ``x_outer``.

        Exact rounds leave ``W x(t-1)`` there, with ``W`` the uniform average;
        it first becomes ``Delta = x_outer - xbar``. Compressed rounds give the
        sum of the decoded ``Delta_j``, which becomes their mean. Either way
        that is the outer optimizer's gradient (divided by the inner learning
        rate with ``scale_by_inner_lr``, whose step is then scaled by it), and
        the buffer then holds the new ``x_outer``.

        Raises:
            ValueError: ``scale_by_inner_lr`` with an inner learning rate that is
                not > 0 at this step.
        """
        i = bucket.index
        copies, opt = self.copies[i], self.optimizers[i]
        sq = torch.zeros((), dtype=torch.float64, device=bucket.device)
        fl = self._inflight.pop(i, None)
        if fl is not None:
            decoded_sum(self.compression, fl, bucket.comm)
            bucket.comm.div_(fl.k)  # the mean, the same bits on every rank
        for x, c in zip(copies, bucket.comm_views):
            if fl is None:
                torch.sub(x, c, out=c)
            x.grad = c
            sq += torch.linalg.vector_norm(c, dtype=torch.float64).square()
        self._delta_sq[i] = sq
        if self.scale_by_inner_lr:
            self._scaled_step(bucket, opt)
        else:
            opt.step()
        for x, c in zip(copies, bucket.comm_views):
            x.grad = None
            c.copy_(x)

    def _scaled_step(self, bucket: Bucket, opt: Optimizer) -> None:
        """SlowMo's step: the gradient ``Delta / gamma``, the learning rates times ``gamma``."""
        assert bucket.optimizer is not None
        gamma = inner_lr(bucket.optimizer)  # once per outer round
        for c in bucket.comm_views:
            c.div_(gamma)
        step_scaled(opt, gamma)

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
            "compression": self.compression,
            "scale_by_inner_lr": self.scale_by_inner_lr,
            "copies": [[x.detach().clone() for x in xs] for xs in self.copies],
            "optimizers": [opt.state_dict() for opt in self.optimizers],
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into buckets already built with the same layout.

        Raises:
            ValueError: The state has another ``every``, another number of fragments
                (a state without the key has one), another compression (``none``
                without the key), another ``scale_by_inner_lr`` (off without the
                key), or another number of buckets or tensors.
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
        if state.get("compression", "none") != self.compression:
            raise ValueError(
                f"the outer state was saved with outer_compression="
                f"{state.get('compression', 'none')!r}; this wrapper has "
                f"outer_compression={self.compression!r}"
            )
        if bool(state.get("scale_by_inner_lr", False)) != self.scale_by_inner_lr:
            raise ValueError(
                f"the outer state was saved with outer_scale_by_inner_lr="
                f"{bool(state.get('scale_by_inner_lr', False))}; this wrapper has "
                f"outer_scale_by_inner_lr={self.scale_by_inner_lr}"
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
