"""The wrapper's CUDA housekeeping: the device guard, the side stream, and checks made once.

Everything the wrapper does on the host thread runs under
:func:`device_guard`, so that a process that never called
``torch.cuda.set_device`` still stages object collectives, records events and
creates streams on its parameters' GPU rather than on GPU 0.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "GradStreams",
    "check_cuda_placement",
    "device_guard",
    "records_cuda_graphs",
    "side_stream",
    "warn_cuda_graphs_without_stable_storage",
]

# A stream priority of its own: torch.cuda.Stream() and ProcessGroupNCCL draw from
# round-robin pools of priority 0 (and NCCL's is_high_priority_stream from the
# highest), so a stream of another level is never one of a communicator's streams.
SIDE_STREAM_PRIORITY = -1

# one side stream per device per process: a multirun builds many wrappers, and each
# new stream drawn from a pool would sooner or later land on a communicator's stream
_SIDE_STREAMS: dict[Any, Any] = {}


def device_guard(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """``torch.cuda.device(device)`` for a CUDA device, else a no-op."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def cached_per_device(
    cache: dict[Any, Any], device: torch.device, make: Callable[[torch.device], Any]
) -> Any:
    """``make(device)`` once per device (by type and index), then the same object."""
    key = (device.type, device.index)
    if key not in cache:
        cache[key] = make(device)
    return cache[key]


def _make_side_stream(device: torch.device) -> Any:
    return torch.cuda.Stream(device, priority=SIDE_STREAM_PRIORITY)


def side_stream(device: torch.device) -> Any:
    """This process's side stream for ``device`` (``None`` off CUDA), the same for every wrapper."""
    if device.type != "cuda":
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return cached_per_device(_SIDE_STREAMS, device, _make_side_stream)


class GradStreams:
    """The streams a bucket's gradients were made on in this backward pass.

    A hook's current stream is the stream its gradient was made on. The
    first one per bucket is waited for as a whole when the bucket steps; a
    gradient made on any other stream (a branch run under
    ``torch.cuda.stream(s)``) records an event there, which the side stream
    waits for too.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._seen: dict[int, tuple[Any, list[Any]]] = {}

    def note(self, key: int) -> None:
        """Called from a gradient hook of bucket ``key``."""
        stream = torch.cuda.current_stream(self.device)
        entry = self._seen.get(key)
        if entry is None:
            self._seen[key] = (stream, [])
        elif stream != entry[0]:
            event = torch.cuda.Event()
            event.record(stream)
            entry[1].append(event)

    def make_wait(self, side: Any, keys: list[int]) -> None:
        """Order ``side`` after the current stream and the gradients of the buckets ``keys``."""
        current = torch.cuda.current_stream(self.device)
        side.wait_stream(current)
        for key in keys:
            first, events = self._seen.pop(key, (None, []))
            if first is not None and first != current:
                side.wait_stream(first)
            for event in events:
                side.wait_event(event)

    def clear(self) -> None:
        self._seen.clear()


def check_cuda_placement(named: list[tuple[str, nn.Parameter]]) -> torch.device:
    """The trained parameters' device; raises one line where NCCL would put ranks on the wrong GPU.

    Raises:
        ValueError: With NCCL, parameters on several devices, or on another GPU
            than the one the process group is bound to (``device_id``).
    """
    device = named[0][1].device
    if device.type != "cuda" or dist.get_backend() != "nccl":
        return device
    for n, p in named:
        if p.device != device:
            raise ValueError(
                f"parameter '{n}' is on {p.device} but '{named[0][0]}' is on {device}; with nccl "
                "one process trains on one GPU: move the whole model to cuda:LOCAL_RANK"
            )
    bound = getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None)
    if bound is not None and bound.index is not None and bound.index != device.index:
        raise ValueError(
            f"the parameters are on {device} but the nccl process group is bound to {bound}; "
            f"call torch.cuda.set_device({device.index}) and init_process_group(..., "
            f"device_id=torch.device('cuda', {device.index})), or move the model to {bound}"
        )
    return device


def _records_graphs(config: Any, backend: Any) -> bool:
    """Whether a compiler config asks for CUDA graphs, or the backend is ``cudagraphs``.

    ``backend`` may be wrapped once more (``_torchdynamo_orig_backend``), as
    ``torch.compile`` leaves it.
    """
    if config and config.get("triton.cudagraphs", False):
        return True
    backend = getattr(backend, "_torchdynamo_orig_backend", backend)
    return getattr(backend, "compiler_name", None) == "cudagraphs"


def _compiled_fn_records_graphs(fn: Any) -> bool:
    """Whether a function made by ``torch.compile`` records CUDA graphs (by its compiler config)."""
    get_config = getattr(fn, "get_compiler_config", None)
    if get_config is None:
        return False
    if _records_graphs(get_config(), None):
        return True
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if _records_graphs(None, getattr(content, "_torchdynamo_orig_backend", None)):
            return True
    return False


def records_cuda_graphs(model: nn.Module) -> bool:
    """Whether ``model`` or a submodule runs a ``torch.compile`` that records CUDA graphs.

    Reads what ``torch.compile`` leaves behind: an ``OptimizedModule``'s
    ``dynamo_ctx``, a compiled ``forward`` assigned to a module, or
    ``Module.compile()``'s ``_compiled_call_impl``. The Inductor modes
    ``"reduce-overhead"`` and ``"max-autotune"`` set ``triton.cudagraphs`` in
    their compiler config; ``backend="cudagraphs"`` records graphs too.
    """
    for m in model.modules():
        ctx = getattr(m, "dynamo_ctx", None)
        if ctx is not None and isinstance(getattr(m, "_orig_mod", None), nn.Module):
            callback = getattr(ctx, "callback", None)
            backend = getattr(callback, "_torchdynamo_orig_backend", None)
            if _records_graphs(getattr(ctx, "compiler_config", None), backend):
                return True
        for fn in (m.__dict__.get("forward"), m.__dict__.get("_compiled_call_impl")):
            if fn is not None and _compiled_fn_records_graphs(fn):
                return True
    return False


def warn_cuda_graphs_without_stable_storage(model: nn.Module, stable_storage: bool) -> None:
    """Warn (once per call site) when a CUDA-graph forward is wrapped with swapping storage."""
    if stable_storage or not records_cuda_graphs(model):
        return
    warnings.warn(
        "the model is compiled to record CUDA graphs (mode='reduce-overhead' or 'max-autotune'), "
        "but the parameters' storage alternates between two blocks every step, so the graphs "
        "are recorded again and again; wrap it with stable_param_storage=True",
        UserWarning,
        stacklevel=3,
    )
