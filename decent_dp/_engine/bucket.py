"""A bucket: parameters that are stepped and gossiped as one contiguous block."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

__all__ = ["ALIGN_BYTES", "Bucket", "flat_view", "is_dense"]

# The CUDA caching allocator's granularity: every view starts where a fresh allocation
# would, so Inductor's 16-byte alignment assumption and vectorized kernels hold.
ALIGN_BYTES = 256


def flat_view(buf: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A view of ``buf[offset:offset+numel]`` with ``like``'s shape and strides."""
    n = like.numel()
    if like.is_contiguous():
        return buf[offset : offset + n].view(like.shape)
    # channels_last and other dense permuted layouts keep their strides
    return buf.as_strided(like.shape, like.stride(), buf.storage_offset() + offset)


def is_dense(t: torch.Tensor) -> bool:
    """Whether ``t`` covers a contiguous block (plain, channels_last or channels_last_3d)."""
    if t.is_contiguous():
        return True
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return True
    return t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)


def aligned_offsets(params: Sequence[torch.Tensor], element_size: int) -> tuple[list[int], int]:
    """Element offsets of each parameter, each a multiple of ``ALIGN_BYTES``, and the padded total."""
    step = max(1, ALIGN_BYTES // element_size)
    offsets, off = [], 0
    for p in params:
        offsets.append(off)
        off += -(-p.numel() // step) * step
    return offsets, off


def aligned_zeros(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero block whose first element sits on an ``ALIGN_BYTES`` boundary, on any allocator."""
    size = torch.empty((), dtype=dtype).element_size()
    spare = ALIGN_BYTES // size
    raw = torch.zeros(numel + spare, dtype=dtype, device=device)
    skip = (-raw.data_ptr() % ALIGN_BYTES) // size
    return raw[skip : skip + numel]


class Bucket:
    """A block of parameters that is stepped and gossiped as one unit.

    The padding between parameters is zero in every block and stays zero: the
    optimizer never sees it and mixing zeros gives zero. Gradients are the
    parameters' own tensors: set to ``None`` after each step, so that autograd
    hands its gradient over without an accumulation pass, and zeroing costs
    nothing.
    """

    def __init__(self, index: int, params: list[nn.Parameter], names: list[str], as_view: bool):
        self.index = index
        self.params = params
        self.names = names
        self.as_view = as_view
        ref = params[0]
        self.dtype, self.device = ref.dtype, ref.device
        self.offsets, self.numel = aligned_offsets(params, ref.element_size())
        self.comm = aligned_zeros(self.numel, self.dtype, self.device)
        self.flat: torch.Tensor | None = None
        # per-parameter views of `flat` and of `comm`, exchanged by swap_blocks()
        self.param_views: list[torch.Tensor] = []
        self.comm_param_views: list[torch.Tensor] = []
        if as_view:
            self.flat = aligned_zeros(self.numel, self.dtype, self.device)
            self.param_views = [flat_view(self.flat, o, p) for p, o in zip(params, self.offsets)]
            self.comm_param_views = [
                flat_view(self.comm, o, p) for p, o in zip(params, self.offsets)
            ]
            with torch.no_grad():
                for p, view in zip(params, self.param_views):
                    view.copy_(p.data)
                    p.data = view
            self.comm_views = [self.comm]
        else:
            self.comm_views = [
                self.comm[o : o + p.numel()].view(p.shape) for p, o in zip(params, self.offsets)
            ]
        self.position = {id(p): j for j, p in enumerate(params)}
        self.optimizer: Optimizer | None = None
        self.fused = False  # the wrapper switched the optimizer to torch's fused kernel
        self.grads_checked = False  # the first step looked for sparse gradients
        self.sparse_grads = False
        self.scheduler: Any = None
        # gossip state: the work handle, and the edge and weights of the value in `comm`
        self.work: Any = None
        self.pending: Any = None
        self.state_pending: Any = None  # optimizer states in flight with it (state_sync)
        self.group: Any = None  # the process group of the gossip in flight
        self.mixed: Any = None  # the edge the latest step mixed with (None: no gossip)
        self.launch_t = 0.0
        # the step the latest launched gossip is for: names a failed exchange (elastic)
        self.gossip_step = 0
        self.delay_s = 0.0
        # per-iteration state
        self.fired = [False] * len(params)  # a gradient arrived in the current backward pass
        self.expected = len(params)
        self.n_fired = 0
        self.stepped = False

    def swap_blocks(self) -> None:
        """Make ``comm`` the parameter block and the parameter block the next gossip buffer.

        Both blocks share one layout, so every parameter keeps its shape,
        strides and alignment; only its storage changes.
        """
        assert self.flat is not None
        self.flat, self.comm = self.comm, self.flat
        self.param_views, self.comm_param_views = self.comm_param_views, self.param_views
        for p, view in zip(self.params, self.param_views):
            p.data = view
        self.comm_views = [self.comm]

    def delay_left(self) -> float:
        """Seconds until the emulated network would deliver the gossip in flight."""
        return self.launch_t + self.delay_s - time.perf_counter()

    def values(self) -> list[torch.Tensor]:
        """The parameter storage: one flat block, or the parameters themselves."""
        return [self.flat] if self.flat is not None else [p.data for p in self.params]

    def grads(self) -> list[torch.Tensor]:
        """This iteration's gradients (parameters without one are skipped, as by optimizers)."""
        return [p.grad for p in self.params if p.grad is not None]

    def zero_grads(self) -> None:
        """Drop the gradients, so that the next backward hands its own tensors over uncopied."""
        for p in self.params:
            p.grad = None

    def reset_iteration(self) -> None:
        self.fired = [False] * len(self.params)
        self.n_fired = 0
        self.stepped = False
