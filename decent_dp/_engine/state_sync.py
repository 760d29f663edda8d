"""Optimizer-state averaging: named state tensors gossiped with the parameters.

With ``state_sync={"exp_avg_sq": K}``, every ``K``-th step (``t % K == 0``,
1-based) each bucket's gossip also carries the named state tensors of its
parameters, on the same group and at the same time as the parameters, and
the optimizer steps from the mixed state::

    s_i(t-1) <- sum_j W_ij(t) s_j(t-1)        then   d_i(t) from x_i(t-1), s_i(t-1)

The state that is sent is the one after step ``t-1``, so nothing waits for
the neighbours' step ``t``. With ``complete`` and ``K=1`` every worker steps
from the mean of the workers' states (Adam's second moment shared, the first
moment local). A round alone (``local-sgd`` between averages) mixes nothing.

Every bucket's optimizer is checked, once each of its parameters has state: a
named state that a parameter group does not keep is refused in one line that
names the state, the group and the states the group does keep. A parameter that
has state on some members of a group but none yet on another (it got no
gradient there so far) is mixed by none of them at that step: the member without
state sends NaN in its place, which every member sees in the sum and answers by
keeping its own state, so no member mixes in a zero, and they all agree without
a further collective or a wait on the host.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .bucket import Bucket, aligned_zeros

__all__ = ["StateSync"]


class StateSync:
    """The state tensors each bucket sends, their buffers and their mix (see the module docstring).

    Args:
        spec: ``{state name: K}`` from :func:`decent_dp.optim.check_state_sync`, not empty.
    """

    def __init__(self, spec: dict[str, int]):
        self.spec = dict(sorted(spec.items()))
        self._buffers: dict[int, torch.Tensor] = {}
        self._checked: set[int] = set()  # the buckets whose every parameter passed the check

    def due(self, for_step: int) -> list[str]:
        """The names whose round falls on step ``for_step``."""
        return [n for n, k in self.spec.items() if for_step % k == 0]

    def rounds_in(self, span: int) -> list[int]:
        """How many names are sent at each step ``t = 1 .. span``."""
        return [len(self.due(t)) for t in range(1, span + 1)]

    def _check(self, bucket: Bucket, states: list[dict[str, Any]]) -> None:
        """Refuse a named state that a parameter group of ``bucket``'s optimizer does not keep."""
        opt = bucket.optimizer
        assert opt is not None
        group_of = {id(q): g for g, group in enumerate(opt.param_groups) for q in group["params"]}
        complete = True
        for p, s in zip(bucket.params, states):
            if not s:
                complete = False  # no step yet: checked at a later launch
                continue
            for name in self.spec:
                t = s.get(name)
                if isinstance(t, torch.Tensor) and t.shape == p.shape:
                    continue
                g = group_of.get(id(p))
                members = [
                    n for n, q in zip(bucket.names, bucket.params) if group_of.get(id(q)) == g
                ]
                kept = sorted(
                    k for k, v in s.items() if isinstance(v, torch.Tensor) and v.shape == p.shape
                )
                raise ValueError(
                    f"state_sync names {name!r}, which {type(opt).__name__} does not keep for "
                    f"parameter group {g} of bucket {bucket.index} ({', '.join(members)}); "
                    f"state_sync needs it for every parameter, and that group keeps: "
                    f"{', '.join(kept) or 'nothing'}"
                )
        if complete:
            self._checked.add(bucket.index)

    def launch(
        self, bucket: Bucket, names: list[str], peer_w: float, group: Any
    ) -> tuple[Any, tuple[list[str], torch.Tensor]]:
        """Start the all-reduce of ``peer_w`` times the named states on ``group``.

        A parameter without state yet (no step so far) sends NaN, so every rank
        issues the same collective and every member of the group learns that the
        parameter is not to be mixed this time (see :meth:`apply`).

        Returns:
            The work and the pending mix for :meth:`apply`.
        """
        assert bucket.optimizer is not None
        states = [bucket.optimizer.state.get(p, {}) for p in bucket.params]
        if bucket.index not in self._checked:
            self._check(bucket, states)
        n = bucket.numel
        size = n * len(names)
        buf = self._buffers.get(bucket.index)
        if buf is None or buf.numel() < size:
            buf = aligned_zeros(n * len(self.spec), bucket.dtype, bucket.device)
            self._buffers[bucket.index] = buf  # the padding stays zero
        buf = buf[:size]
        for i, name in enumerate(names):
            base = i * n
            for p, off, s in zip(bucket.params, bucket.offsets, states):
                view = buf[base + off : base + off + p.numel()]
                t = s.get(name)
                if t is None:
                    view.fill_(float("nan"))  # no state here: nobody mixes it (see apply)
                else:
                    torch.mul(t.reshape(-1), peer_w, out=view)
        work = dist.all_reduce(buf, group=group, async_op=True)
        return work, (names, buf)

    @torch.no_grad()
    def apply(
        self, bucket: Bucket, pending: tuple[list[str], torch.Tensor], self_w: float, peer_w: float
    ) -> None:
        """``s_i <- self_w s_i + peer_w sum_{j != i} s_j`` for each named state (the gossip arrived).

        Where the sum is NaN, a member of the group had no state for the parameter
        (it sent NaN): every member keeps its own state there instead of mixing.
        """
        names, buf = pending
        assert bucket.optimizer is not None
        n = bucket.numel
        for i, name in enumerate(names):
            base = i * n
            for p, off in zip(bucket.params, bucket.offsets):
                s = bucket.optimizer.state.get(p)
                if not s:
                    continue
                t = s[name]
                got = buf[base + off : base + off + p.numel()].view(t.shape)
                mixed = torch.mul(t, self_w - peer_w).add_(got)
                t.copy_(torch.where(torch.isnan(got), t, mixed))

    def state_dict(self) -> dict[str, int]:
        """The spec, saved with the training state and checked on load."""
        return dict(self.spec)


class BothWork:
    """Two collectives waited for as one (the parameters' and the states' of one bucket)."""

    def __init__(self, first: Any, second: Any):
        self.first, self.second = first, second

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        self.first.wait(*args, **kwargs)
        self.second.wait(*args, **kwargs)
        return True

    def is_completed(self) -> bool:
        return bool(self.first.is_completed()) and bool(self.second.is_completed())
