"""Process-group set-up, device choice, and the module behind ``torch.compile``.

:func:`initialize_dist` works the same under ``torchrun`` and under a plain
``python train.py``: without ``WORLD_SIZE`` in the environment it creates a
one-process group, so the rest of the code never needs a special case for a
single worker.
"""

from __future__ import annotations

import datetime
import inspect
import os
import socket

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["initialize_dist", "get_device", "get_backend_for", "unwrap_compiled"]

_BACKENDS = ("nccl", "gloo")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _local_rank() -> int:
    """``LOCAL_RANK``, else ``SLURM_LOCALID``, else ``RANK`` modulo the GPU count."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        if os.environ.get(name, "") != "":
            return _env_int(name, 0)
    n_gpus = _visible_gpus()
    return _env_int("RANK", 0) % n_gpus if n_gpus > 0 else 0


def _local_world_size() -> int:
    """``LOCAL_WORLD_SIZE``, else SLURM's tasks on this node (``4`` or ``4(x2)``), else 1."""
    if os.environ.get("LOCAL_WORLD_SIZE", "") != "":
        return _env_int("LOCAL_WORLD_SIZE", 1)
    raw = os.environ.get("SLURM_NTASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE") or ""
    head = raw.split("(")[0].split(",")[0]
    return int(head) if head.isdigit() else 1


def _plan() -> tuple[int | None, str]:
    """This process's GPU index (``None``: the CPU) and the backend every rank chooses alike.

    The backend depends only on what every rank of a node sees the same (the
    number of visible GPUs, the processes per node, whether the launcher
    restricts ``CUDA_VISIBLE_DEVICES``), never on the rank itself, so that no
    rank waits in a rendezvous of another backend:

    * no GPU: the CPU and gloo;
    * one visible GPU: ``cuda:0``; NCCL when it is this process's own (one
      process per node, or ``CUDA_VISIBLE_DEVICES`` set per task, as SLURM's
      ``--gpus-per-task`` does), gloo when several processes share it;
    * several GPUs: ``cuda:LOCAL_RANK`` (modulo the count); NCCL when there are
      at least as many GPUs as processes per node, else gloo with the GPUs shared.
    """
    n_gpus = _visible_gpus()
    local_rank = _local_rank()
    if n_gpus == 0:
        return None, "gloo"
    per_node = _local_world_size()
    if n_gpus == 1:
        own = per_node <= 1 or os.environ.get("CUDA_VISIBLE_DEVICES", "") != ""
        return 0, "nccl" if own else "gloo"
    return local_rank % n_gpus, "nccl" if per_node <= n_gpus else "gloo"


def _free_port() -> int:
    # Port 0 asks the kernel for any free port; it is released before init binds it again.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_device() -> torch.device:
    """Return the device this process should compute on.

    Returns:
        ``cpu`` without a GPU; ``cuda:0`` when one GPU is visible (a launcher
        that binds one GPU per task); else ``cuda:LOCAL_RANK`` (modulo the
        number of GPUs). ``LOCAL_RANK`` falls back to ``SLURM_LOCALID``, then
        to ``RANK``.

    Raises:
        ValueError: If ``LOCAL_RANK`` is set but is not an integer.
    """
    index, _ = _plan()
    return torch.device("cpu") if index is None else torch.device("cuda", index)


def get_backend_for(device: torch.device | str) -> str:
    """Return the collective backend that suits ``device``.

    Args:
        device: A ``cuda`` or ``cpu`` device.

    Returns:
        ``"nccl"`` for CUDA devices, ``"gloo"`` for CPU.

    Raises:
        ValueError: If the device type is neither ``cuda`` nor ``cpu``.
    """
    device_type = torch.device(device).type
    if device_type == "cuda":
        return "nccl"
    if device_type == "cpu":
        return "gloo"
    raise ValueError(f"device must be of type 'cuda' or 'cpu', got {device_type!r}")


def initialize_dist(backend: str | None = None, timeout_s: float = 1800.0) -> tuple[int, int]:
    """Initialize the default process group once and return ``(rank, world_size)``.

    Calling it again returns the existing group's rank and world size.
    Without ``WORLD_SIZE`` in the environment (a plain ``python train.py``)
    it sets ``RANK=0``, ``WORLD_SIZE=1``, ``LOCAL_RANK=0``,
    ``LOCAL_WORLD_SIZE=1`` and, unless already set, ``MASTER_ADDR=127.0.0.1``
    and a free ``MASTER_PORT``, then builds a one-process group. On a GPU it
    selects :func:`get_device`'s GPU before initializing.

    Args:
        backend: ``"nccl"``, ``"gloo"`` or ``None`` to choose the same way
            on every rank: ``"nccl"`` when each process has a GPU of its own
            (see :func:`get_device`), else ``"gloo"``.
        timeout_s: Seconds a collective may wait before failing, so that a
            dead peer surfaces as an error rather than a hang; ``> 0``.

    Returns:
        ``(rank, world_size)`` of the default process group.

    Raises:
        ValueError: If ``backend`` is not ``nccl``/``gloo``/``None``, if
            ``nccl`` is asked for without a visible GPU, or if
            ``timeout_s`` is not positive.
        RuntimeError: If ``torch.distributed`` is not available in this build.
    """
    if backend is not None and backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS} or None, got {backend!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of torch")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()

    # Resolve everything that can fail before touching the environment.
    single = "WORLD_SIZE" not in os.environ
    if single:
        index, auto = (0, "nccl") if _visible_gpus() > 0 else (None, "gloo")
    else:
        index, auto = _plan()
    if backend is None:
        backend = auto
    if backend == "nccl" and index is None:
        raise ValueError(
            f"backend 'nccl' needs a CUDA device for LOCAL_RANK={_local_rank()}, "
            f"but {_visible_gpus()} GPU(s) are visible; use backend='gloo' or None"
        )

    if single:
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"
        os.environ["LOCAL_RANK"] = "0"
        os.environ["LOCAL_WORLD_SIZE"] = "1"
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))

    kwargs: dict[str, object] = {}
    if index is not None:
        # NCCL binds to the current device at init, so it must be chosen first.
        torch.cuda.set_device(index)
        if (
            backend == "nccl"
            and "device_id" in inspect.signature(dist.init_process_group).parameters
        ):
            kwargs["device_id"] = torch.device("cuda", index)

    timeout = datetime.timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store for all restarts of the group and the env://
        # rendezvous no longer separates attempts, so a restarted group would read the
        # dead group's addresses: give every attempt its own key prefix
        store = dist.PrefixStore(
            f"decent_dp/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/",
            dist.TCPStore(
                os.environ["MASTER_ADDR"],
                _env_int("MASTER_PORT", 0),
                is_master=False,
                timeout=timeout,
            ),
        )
        kwargs.update(store=store, rank=_env_int("RANK", 0), world_size=_env_int("WORLD_SIZE", 1))
    else:
        kwargs["init_method"] = "env://"
    dist.init_process_group(backend=backend, timeout=timeout, **kwargs)  # type: ignore[arg-type]
    return dist.get_rank(), dist.get_world_size()


def unwrap_compiled(module: nn.Module) -> nn.Module:
    """The module behind ``torch.compile(module)``, or ``module`` itself when not compiled.

    Its parameter and state-dict names carry no ``_orig_mod.`` prefix, so a
    checkpoint saved from it loads into compiled and eager runs alike.

    Example::

        model = torch.compile(net)
        assert decent_dp.utils.unwrap_compiled(model) is net
    """
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else module
