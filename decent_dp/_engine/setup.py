"""What the wrapper does once, across ranks: agree, broadcast, plan buckets.

Every function here that issues collectives issues them in the same order on
every rank, so each must be called by every rank at the same point. The
checks of the wrapper's own arguments (:func:`check_wrapper_args`,
:func:`check_wrapper_options`, :func:`trained_parameters`) issue none: they run first, so that a bad value
fails on its rank before any process can wait on a collective. The process
groups are created by :mod:`decent_dp._comm.groups`.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..compression import CompressionSpec, parse_compression
from ..optim._factories import check_scheduler, resolve_optim_fn
from ..optim.state_sync import check_state_sync
from ..topo import Topology

__all__ = [
    "broadcast_from_rank0",
    "check_ranks_agree",
    "check_wrapper_args",
    "check_wrapper_options",
    "check_wrapper_values",
    "plan_buckets",
    "trained_parameters",
]


def check_wrapper_args(model: Any, bucket_size_in_mb: Any, grad_clip_norm: Any) -> None:
    """The wrapper's arguments that each rank checks alone, before any collective.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialized.
        ValueError: A bucket size or clipping norm that is not a number ``>= 0``.
        TypeError: ``model`` is not a module.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "DecentralizedDataParallel needs an initialized process group; launch with torchrun "
            "and call decent_dp.utils.initialize_dist() (or torch.distributed.init_process_group())"
        )
    check_wrapper_values(model, bucket_size_in_mb, grad_clip_norm)


def check_wrapper_values(model: Any, bucket_size_in_mb: Any, grad_clip_norm: Any) -> None:
    """:func:`check_wrapper_args` without a process group (the elastic wrapper's, before its quorum).

    Raises:
        ValueError: A bucket size or clipping norm that is not a number ``>= 0``.
        TypeError: ``model`` is not a module.
    """
    if not isinstance(bucket_size_in_mb, (int, float)) or not bucket_size_in_mb >= 0:
        raise ValueError(
            f"bucket_size_in_mb={bucket_size_in_mb!r} is invalid; it must be a number >= 0"
        )
    if not isinstance(grad_clip_norm, (int, float)) or not grad_clip_norm >= 0:
        raise ValueError(
            f"grad_clip_norm={grad_clip_norm!r} is invalid; it must be >= 0 (0 disables)"
        )
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def check_wrapper_options(
    model: Any,
    optim_fn: Any,
    lr_scheduler_fn: Any,
    options: Mapping[str, Any],
    defaults: Mapping[str, Any],
    backend: str = "gloo",
) -> tuple[CompressionSpec, dict[str, int]]:
    """The wrapper's options checked on this process alone, with no process group.

    For a wrapper built later than its options are given (the elastic one, at
    each quorum): the same checks as the wrapper's own, so that a bad option
    fails at once and not on one member after the others joined it.

    Args:
        model: The module.
        optim_fn: The optimizer factory (a trial optimizer is built).
        lr_scheduler_fn: The scheduler factory, or ``None``.
        options: The keyword options given.
        defaults: Every option the wrapper takes here, with its default.
        backend: The backend of the process group it will be built on.

    Returns:
        The compression and the ``state_sync`` spec, for the checks against a
        topology (:func:`decent_dp._comm.hierarchical.check_compression`).

    Raises:
        TypeError: An unknown option, a ``model`` that is no module, or a factory
            that returns the wrong type.
        ValueError: A bad value (one line naming it and what is allowed).
    """
    for key, value in options.items():
        if key not in defaults:
            near = difflib.get_close_matches(key, list(defaults), n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise TypeError(
                f"{key}={value!r} is not an option of the wrapper; {hint}"
                f"its options: {', '.join(sorted(defaults))}"
            )
    opts = {**defaults, **options}
    check_wrapper_values(model, opts["bucket_size_in_mb"], opts["grad_clip_norm"])
    compression = parse_compression(opts["compression"])
    sync = check_state_sync(opts["state_sync"])
    _, named = trained_parameters(model, opts["scaler"], backend)
    _, trial = resolve_optim_fn(optim_fn, named)
    check_scheduler(lr_scheduler_fn, trial)
    return compression, sync


def trained_parameters(
    module: nn.Module, scaler: Any, backend: str | None = None
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """Every named parameter of ``module``, and those it trains (``requires_grad``).

    ``backend`` is the process group's (by default the initialized one's).

    Raises:
        ValueError: No parameter, none trained, one off CUDA on NCCL, or a
            float16 one with an enabled GradScaler.
    """
    every = list(module.named_parameters())
    if not every:
        raise ValueError("model has no parameters; there is nothing to train")
    named = [(n, p) for n, p in every if p.requires_grad]
    if not named:
        raise ValueError("every parameter has requires_grad=False; there is nothing to train")
    backend = backend or dist.get_backend()
    for n, p in named:
        if backend == "nccl" and p.device.type != "cuda":
            raise ValueError(
                f"parameter '{n}' is on {p.device} but the backend is nccl; move the model to "
                "cuda:LOCAL_RANK before wrapping it, or use the gloo backend"
            )
        if p.dtype == torch.float16 and scaler is not None and scaler.is_enabled():
            raise ValueError(
                f"parameter '{n}' is float16, which a GradScaler cannot unscale; keep the "
                "parameters float32 and run the forward under torch.autocast(dtype=torch.float16)"
            )
    return every, named


def _round_digests(topology: Topology) -> list[str]:
    """A short digest of each round's edges (sorted ranks and weight), to compare across ranks."""
    digests = []
    for edges in topology.rounds:
        text = ";".join(
            f"{sorted(e.ranks)}:{e.weight!r}" for e in sorted(edges, key=lambda e: sorted(e.ranks))
        )
        digests.append(hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16])
    return digests


def check_ranks_agree(
    named: list[tuple[str, nn.Parameter]], topology: Topology, world_size: int
) -> None:
    """Raise ``ValueError`` on every rank if any rank has another model or topology."""
    sig = {
        "params": [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in named],
        "topology": (topology.name, topology.world_size, topology.period),
        # a custom topology built differently per rank would create groups in another order
        "edges": _round_digests(topology),
    }
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, sig)
    ref = gathered[0]
    for r, other in enumerate(gathered):
        if other == ref:
            continue
        if other["topology"] != ref["topology"]:
            raise ValueError(
                f"ranks disagree on the topology: rank 0 has {ref['topology']}, rank {r} has {other['topology']}"
            )
        if other["edges"] != ref["edges"]:
            k = next(i for i, (x, y) in enumerate(zip(ref["edges"], other["edges"])) if x != y)
            raise ValueError(
                f"ranks disagree on the edges of topology {topology.name!r}: rank 0 and rank {r} "
                f"have other groups or weights in round {k}; every rank must build the same topology"
            )
        a, b = ref["params"], other["params"]
        for i in range(max(len(a), len(b))):
            pa = a[i] if i < len(a) else None
            pb = b[i] if i < len(b) else None
            if pa != pb:
                raise ValueError(
                    f"model parameters differ across ranks: rank 0 has {pa}, rank {r} has {pb} "
                    f"(parameter #{i}: name, shape, dtype, requires_grad); every rank must "
                    "build the same model"
                )


@torch.no_grad()
def broadcast_from_rank0(module: nn.Module, world_size: int) -> None:
    """Start every rank from rank 0's parameters and buffers."""
    if world_size == 1:
        return
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=0)


def plan_buckets(
    order: list[int], params: list[nn.Parameter], bucket_bytes: int, world_size: int
) -> list[list[int]]:
    """Parameter indices per bucket, in rank 0's gradient order, cut at the size target.

    Args:
        order: The parameter indices in the order this rank's first backward
            produced their gradients.
        params: The trained parameters.
        bucket_bytes: Target bucket size in bytes; 0 gives one bucket per parameter.
        world_size: The number of ranks.
    """
    # the gradient order can differ between ranks (rank-dependent branches): use rank 0's
    shared: list[Any] = [order]
    if world_size > 1:
        dist.broadcast_object_list(shared, src=0)
    recorded = list(shared[0])
    seen = set(recorded)
    full_order = recorded + [i for i in reversed(range(len(params))) if i not in seen]
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in full_order:
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if current:
            head = params[current[0]]
            if head.dtype != p.dtype or head.device != p.device or size + nbytes > bucket_bytes:
                groups.append(current)
                current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        groups.append(current)
    return groups
