"""Network emulation on one machine: a slower network, imposed on real collectives.

Workers that share one host talk over loopback or NVLink, which is far faster
than the data-centre network a real multi-node job would use. This module
holds every collective back until a simple cost model of a chosen network
says it could have finished, so that timings measured on one machine show
how a topology would behave on, say, 25 Gb/s Ethernet. The real data still
moves through the real process group, so the numbers computed are unchanged.

Cost model (seconds), with bandwidth ``B`` in bytes/s (``gbps * 1e9 / 8``)
and per-message latency ``a``: a ring all-reduce of ``S`` bytes over ``n``
members takes ``c + 2 (n-1)/n * S/B + 2 (n-1) a`` (0 for ``n == 1``), ``c``
being a fixed cost per collective call (``collective_ms``, 0 by default). A
gossip round is the same ring over the group's members, so a pair costs
``c + S/B + 2a``.

Hosts that spend CPU on their network stack (``stack_cpu_ms_per_mb``, 0 by
default) are emulated by spending it: for every collective, each rank burns
that many CPU milliseconds per MB it sends (``2 (n-1)/n * S``) on a thread of
its own (:class:`CpuBurner`), where it competes for the cores with training as
a kernel's network stack does. The testbed's value, measured against loopback,
is in ``docs/results/network/calibration.json``.

Two mechanisms, chosen by :func:`apply_network` from the model's type:

* :class:`~decent_dp.ddp.DecentralizedDataParallel`: ``set_comm_delay`` with
  :func:`make_gossip_delay`; the wrapper holds each gossip's completion
  until the modelled time has passed since its launch. A worker's gossips
  share its link, like the all-reduce buckets below.
* :class:`torch.nn.parallel.DistributedDataParallel`: a communication hook
  (:func:`emulated_allreduce_hook`) that launches the usual asynchronous
  all-reduce of each gradient bucket and returns a future that completes only
  when the all-reduce is done *and* the modelled time has passed.

How the all-reduce hook waits. Callbacks of ``Future.then`` run on the
thread that completes the parent future. With gloo that is one of the
process group's worker threads (two by default), never the autograd thread
(checked on CPU with torch 2.x). With NCCL the all-reduce's future is
complete as soon as the kernel is queued, so a callback chained on it runs
inline, on the autograd thread. Sleeping inside such a callback would
therefore stall either gloo (no later collective can use a sleeping worker
thread) or, with NCCL, the backward pass itself. Instead, each bucket gets a
short-lived timer thread that completes a "deadline" future; the returned
future is chained on that one and then waits for the all-reduce, so neither
autograd nor the process group ever sleeps. Buckets share one emulated link,
as they share one NIC (and one NCCL stream) on a real machine: a bucket's
transfer starts when it is launched or when the previous bucket's transfer
ends, whichever is later. Measured on 2 CPU gloo workers, 6 buckets of 4 MB
(median backward; the backward alone takes 0.03 s): at 1 Gb/s and 1 ms the
model says 0.204 s and backward takes 0.208 s; at 5 Gb/s, 0.05 ms, 0.039 s
modelled and 0.043 s taken. A variant that sleeps inside the gloo callback
measured the same on gloo, so the link model, not the waiting, decides the
time; the timer threads cost about 1 ms per bucket on a busy 2-core machine.
For CUDA tensors the deadline future is created with the tensor's device, so
the usual CUDA-stream synchronisation of ``Future.then`` applies (NCCL works
by construction).

With emulation off (``network: none``) nothing is installed at all.

One module past 500 lines: the profiles, the cost model and the two mechanisms
that impose it are one formula and its two users; split, a change to the model
would have to be made in step in several files.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.
import hashlib
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "NetworkProfile",
    "CpuBurner",
    "PROFILES",
    "INTRA_NODE_PROFILE",
    "profile_from_cfg",
    "ring_allreduce_time",
    "gossip_time",
    "sent_bytes",
    "make_gossip_delay",
    "EmulatedAllreduceState",
    "emulated_allreduce_hook",
    "apply_network",
]


@dataclass(frozen=True)
class NetworkProfile:
    """A network described by its per-message latency and link bandwidth.

    Args:
        name: Profile name, used in logs and reports.
        latency_ms: One-way latency of one message, in milliseconds (>= 0; 0 for a
            profile calibrated on a wire, whose ``collective_ms`` holds it).
        bandwidth_gbps: Link bandwidth in gigabits per second (> 0).
        efficiency: The share of the line rate a collective's payload gets, in
            ``(0, 1]``: framing, acknowledgements and the transport's own pauses
            take the rest (measured on the testbed: see
            ``docs/results/network/README.md``).
        collective_ms: A fixed cost of every collective call, in milliseconds
            (>= 0): the transport's start and finish, beyond the per-hop latency.
        stack_cpu_ms_per_mb: CPU milliseconds the host's network stack spends
            per MB (1e6 bytes) a rank sends (>= 0), burned beside training.

    Raises:
        ValueError: ``bandwidth_gbps`` is not a finite number > 0, ``latency_ms``,
            ``collective_ms`` or ``stack_cpu_ms_per_mb`` not a finite number >= 0, or
            ``efficiency`` not in ``(0, 1]``.

    Example::

        eth = NetworkProfile("ethernet_25g", latency_ms=0.02, bandwidth_gbps=25.0)
        ring_allreduce_time(100e6, 4, eth)  # seconds for a 100 MB all-reduce
    """

    name: str
    latency_ms: float
    bandwidth_gbps: float
    efficiency: float = 1.0
    collective_ms: float = 0.0
    stack_cpu_ms_per_mb: float = 0.0

    def __post_init__(self) -> None:
        eff = self.efficiency
        if isinstance(eff, bool) or not (isinstance(eff, (int, float)) and 0 < eff <= 1):
            raise ValueError(
                f"network profile '{self.name}': efficiency={self.efficiency!r} is invalid; "
                "it must be a number in (0, 1]"
            )
        object.__setattr__(self, "efficiency", float(self.efficiency))
        value = self.bandwidth_gbps
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"network profile '{self.name}': bandwidth_gbps={value!r} is invalid; "
                "it must be a finite number > 0"
            )
        object.__setattr__(self, "bandwidth_gbps", float(value))
        # latency 0: a calibrated profile, whose collective_ms holds the wire's latency
        for key in ("latency_ms", "collective_ms", "stack_cpu_ms_per_mb"):
            value = getattr(self, key)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"network profile '{self.name}': {key}={value!r} is invalid; "
                    "it must be a finite number >= 0"
                )
            object.__setattr__(self, key, float(value))

    @property
    def latency_s(self) -> float:
        """Latency in seconds."""
        return self.latency_ms * 1e-3

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Payload bandwidth in bytes per second (``efficiency * gbps * 1e9 / 8``)."""
        return self.efficiency * self.bandwidth_gbps * 1e9 / 8.0

    def as_dict(self) -> dict[str, Any]:
        """``{"network": name, "latency_ms": ..., "bandwidth_gbps": ...}``: every field, in order."""
        fields = asdict(self)
        return {"network": fields.pop("name"), **fields}


# Latencies are small-message one-way times as seen by a collective library:
# TCP/IP over a 25 GbE switch is in the tens of microseconds, RDMA over a
# 100 Gb/s InfiniBand (EDR) switch about 1-2 microseconds plus software.
PROFILES: dict[str, NetworkProfile] = {
    "ethernet_25g": NetworkProfile("ethernet_25g", latency_ms=0.02, bandwidth_gbps=25.0),
    "infiniband_100g": NetworkProfile("infiniband_100g", latency_ms=0.002, bandwidth_gbps=100.0),
}

# GPUs of one node over NVLink (300 GB/s per GPU, as on V100/A100 NVSwitch systems).
INTRA_NODE_PROFILE = NetworkProfile("nvlink_300GBps", latency_ms=0.003, bandwidth_gbps=2400.0)

_NONE = "none"
_CUSTOM = "custom"


def _cfg_get(cfg: Any, key: str) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key)
    return getattr(cfg, key, None)


def profile_from_cfg(net_cfg: Any) -> NetworkProfile | None:
    """Build the profile a ``network`` config section asks for.

    Args:
        net_cfg: A mapping (dict or ``DictConfig``), or a plain profile name,
            with ``name`` in ``none | ethernet_25g | infiniband_100g | custom``;
            ``custom`` also needs ``latency_ms`` and ``bandwidth_gbps``. ``None``
            means ``none``.

    Returns:
        The profile, or ``None`` when emulation is off.

    Raises:
        ValueError: Unknown name, a custom profile with a missing or invalid value
            (see :class:`NetworkProfile`), or a preset given values that differ from its own.
    """
    if net_cfg is None:
        return None
    name = net_cfg if isinstance(net_cfg, str) else _cfg_get(net_cfg, "name")
    if isinstance(name, Enum):  # structured configs hold names as enum members
        name = name.value
    if name is None or name == _NONE:
        return None
    known = [_NONE, *PROFILES, _CUSTOM]
    if not isinstance(name, str) or name not in known:
        raise ValueError(f"unknown network profile {name!r}; known profiles: {', '.join(known)}")
    if isinstance(net_cfg, str):
        if name == _CUSTOM:
            raise ValueError("network 'custom' needs latency_ms and bandwidth_gbps; pass a mapping")
        return PROFILES[name]
    latency, bandwidth = _cfg_get(net_cfg, "latency_ms"), _cfg_get(net_cfg, "bandwidth_gbps")
    if name == _CUSTOM:
        for key, value in (("latency_ms", latency), ("bandwidth_gbps", bandwidth)):
            if value is None:
                raise ValueError(f"network 'custom' needs {key}; it is missing")
        efficiency = _cfg_get(net_cfg, "efficiency")
        collective = _cfg_get(net_cfg, "collective_ms")
        stack = _cfg_get(net_cfg, "stack_cpu_ms_per_mb")
        return NetworkProfile(
            _CUSTOM,
            latency_ms=latency,
            bandwidth_gbps=bandwidth,
            efficiency=1.0 if efficiency is None else efficiency,
            collective_ms=0.0 if collective is None else collective,
            stack_cpu_ms_per_mb=0.0 if stack is None else stack,
        )
    preset = PROFILES[name]
    given = [("latency_ms", latency), ("bandwidth_gbps", bandwidth)]
    given += [
        (k, _cfg_get(net_cfg, k)) for k in ("efficiency", "collective_ms", "stack_cpu_ms_per_mb")
    ]
    for key, value in given:
        if value is not None and float(value) != getattr(preset, key):
            raise ValueError(
                f"network '{name}' has {key}={getattr(preset, key)}, not {value}; "
                "use name=custom to choose your own values"
            )
    return preset


def _check_size(nbytes: float, members: int, what: str) -> None:
    if not (isinstance(nbytes, (int, float)) and math.isfinite(nbytes) and nbytes >= 0):
        raise ValueError(f"nbytes={nbytes!r} is invalid; it must be a finite number >= 0")
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"{what}={members!r} is invalid; it must be an integer >= 1")


def ring_allreduce_time(nbytes: float, n: int, profile: NetworkProfile) -> float:
    """Modelled seconds of a ring all-reduce of ``nbytes`` over ``n`` members.

    ``collective + 2 (n-1)/n * nbytes / B + 2 (n-1) * latency`` with ``B`` in
    bytes/s: a reduce-scatter and an all-gather, each ``n - 1`` steps that move
    ``nbytes / n`` per link, after the call's fixed cost.

    Args:
        nbytes: Size of the reduced buffer in bytes.
        n: Number of members; 1 costs nothing.
        profile: The network.

    Returns:
        Seconds.

    Raises:
        ValueError: ``nbytes < 0`` or ``n < 1``.
    """
    _check_size(nbytes, n, "n")
    if n == 1:
        return 0.0
    steps = 2 * (n - 1)
    wire = steps / n * nbytes / profile.bandwidth_bytes_per_s + steps * profile.latency_s
    return profile.collective_ms * 1e-3 + wire


def sent_bytes(nbytes: float, n: int) -> float:
    """Bytes one member of a ring all-reduce of ``nbytes`` over ``n`` sends: ``2 (n-1)/n``."""
    return 2 * (n - 1) / n * nbytes


class CpuBurner:
    """Spends CPU time on a thread of its own, as a host's network stack does.

    ``burn(seconds)`` returns at once; the thread then hashes a buffer until its
    own CPU clock (``time.thread_time``) has advanced by ``seconds``, so the CPU
    spent does not depend on how busy the cores are. ``hashlib`` releases the
    GIL on large buffers, so the training thread runs meanwhile, as it would
    beside a kernel's softirq work. One per process: :meth:`shared`.
    """

    _instance: "CpuBurner | None" = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._todo: queue.SimpleQueue[float] = queue.SimpleQueue()
        self._buf = bytes(64 * 1024)
        self.burned_s = 0.0
        # A daemon: it runs no torch code, so it may be cut at interpreter exit.
        self._thread = threading.Thread(target=self._loop, name="cpu-burner", daemon=True)
        self._thread.start()

    @classmethod
    def shared(cls) -> "CpuBurner":
        """The process's burner, started on first use."""
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def burn(self, seconds: float) -> None:
        """Queue ``seconds`` of CPU time to spend (ignored when not > 0)."""
        if seconds > 0:
            self._todo.put(seconds)

    def _loop(self) -> None:
        while True:
            seconds = self._todo.get()
            end = time.thread_time() + seconds
            while time.thread_time() < end:
                hashlib.sha1(self._buf).digest()
            self.burned_s += seconds


def gossip_time(nbytes: float, group_size: int, profile: NetworkProfile) -> float:
    """Modelled seconds of one gossip averaging among ``group_size`` members.

    The same ring model over the group's members; a pair costs
    ``nbytes / B + 2 * latency``.

    Raises:
        ValueError: ``nbytes < 0`` or ``group_size < 1``.
    """
    _check_size(nbytes, group_size, "group_size")
    return ring_allreduce_time(nbytes, group_size, profile)


def make_gossip_delay(
    profile: NetworkProfile,
    shared_link: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    procs_per_host: int = 1,
) -> Callable[..., float]:
    """The delay function for ``DecentralizedDataParallel.set_comm_delay``.

    Args:
        profile: The emulated network.
        shared_link: Let the gossips of one worker share its link, like the
            buckets of the all-reduce hook: a gossip's transfer starts when it
            is launched or when the previous one ends, whichever is later. This
            relies on ``fn`` being called when the gossip is launched, as the
            wrapper does. ``False`` gives every gossip its own full link.
        clock: Seconds, monotonic; only differences between calls matter.
        procs_per_host: Ranks per emulated host ``L`` (consecutive ranks, as
            torchrun places them). A gossip whose group stays inside one host is
            not held back: its ranks talk over the real loopback, as on a node.
            One that crosses hosts, with ``c`` of its members on each host
            (``len(ranks) / hosts``), shares the host's link with the ``L / c``
            groups that the host's ranks form in that round (a ring over a group
            leaves each of its hosts once): it is timed as ``L / c`` times its
            bytes. Pairs across hosts and a ``hierarchical`` edge's chunks (``c =
            1``) count ``L`` times, one model per host link for the latter; a
            group of whole hosts (``c = L``) once. 1: every rank is a host with
            a link of its own.

    Returns:
        ``fn(nbytes, group_size, ranks=None) -> seconds`` to hold the gossip
        after its launch: :func:`gossip_time` on ``profile``, plus the time the
        link is still busy with earlier gossips when ``shared_link``. The
        wrapper passes ``ranks``, the group's global ranks. With
        ``profile.stack_cpu_ms_per_mb`` each call also burns the rank's stack CPU
        for the bytes it sends across hosts (:class:`CpuBurner`).

    Raises:
        ValueError: ``procs_per_host`` is not an integer >= 1.
    """
    if (
        isinstance(procs_per_host, bool)
        or not isinstance(procs_per_host, int)
        or procs_per_host < 1
    ):
        raise ValueError(
            f"procs_per_host={procs_per_host!r} is invalid; it must be an integer >= 1"
        )
    lock = threading.Lock()
    link_free_at = -math.inf
    burner = CpuBurner.shared() if profile.stack_cpu_ms_per_mb > 0 else None

    def delay(nbytes: int, group_size: int, ranks: Sequence[int] | None = None) -> float:
        nonlocal link_free_at
        hosts = len({r // procs_per_host for r in ranks}) if procs_per_host > 1 and ranks else 0
        if burner is not None and group_size > 1 and hosts != 1:  # 0: a link per rank
            burner.burn(profile.stack_cpu_ms_per_mb * sent_bytes(nbytes, group_size) * 1e-9)
        if hosts == 1:
            return 0.0  # inside one host: the loopback's own time
        if hosts > 1:
            nbytes = nbytes * procs_per_host * hosts / len(ranks)  # L / c groups share the link
        cost = gossip_time(nbytes, group_size, profile)
        if not shared_link or group_size == 1:
            return cost
        with lock:
            now = clock()
            link_free_at = max(now, link_free_at) + cost
            return link_free_at - now

    delay.__qualname__ = f"gossip_delay[{profile.name}]"
    return delay


@dataclass
class EmulatedAllreduceState:
    """State of :func:`emulated_allreduce_hook`, kept apart from the hook itself.

    Args:
        profile: The emulated network.
        world_size: Members of the all-reduce (the DDP process group's size).
        process_group: The group to reduce over; ``None`` is the default group.

    Attributes:
        link_free_at: ``time.monotonic()`` at which the emulated link is free again.
        modelled_s: Sum of the modelled transfer times of every bucket so far.
        buckets: Number of buckets all-reduced so far.

    Example::

        state = EmulatedAllreduceState(PROFILES["ethernet_25g"], dist.get_world_size())
        ddp_model.register_comm_hook(state, emulated_allreduce_hook)
    """

    profile: NetworkProfile
    world_size: int
    process_group: Any = None
    link_free_at: float = 0.0
    modelled_s: float = 0.0
    buckets: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reserve(self, nbytes: int, now: float) -> float:
        """Book the link for one bucket launched at ``now``; returns its deadline.

        Also burns the rank's stack CPU for the bucket when the profile has any.
        """
        cost = ring_allreduce_time(nbytes, self.world_size, self.profile)
        if self.profile.stack_cpu_ms_per_mb > 0 and self.world_size > 1:
            sent = sent_bytes(nbytes, self.world_size)
            CpuBurner.shared().burn(self.profile.stack_cpu_ms_per_mb * sent * 1e-9)
        with self._lock:
            deadline = max(now, self.link_free_at) + cost
            self.link_free_at = deadline
            self.modelled_s += cost
            self.buckets += 1
        return deadline


def _deadline_future(deadline: float, device: torch.device) -> torch.futures.Future:
    """A future completed by a short-lived timer thread at ``deadline`` (monotonic clock)."""
    fut: torch.futures.Future = torch.futures.Future(
        devices=[device] if device.type == "cuda" else None
    )
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), fut.set_result, (None,))
    # Not a daemon: a daemon thread still inside torch's C++ code at interpreter exit
    # aborts the process ("terminate called without an active exception").
    timer.daemon = False
    timer.start()
    return fut


def emulated_allreduce_hook(
    state: EmulatedAllreduceState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averaging all-reduce, completed no sooner than the model allows.

    Launches the ordinary asynchronous all-reduce of the bucket (divided by
    the world size, like DDP's default) and returns a future that completes
    once both the all-reduce is done and the bucket's modelled transfer time
    has passed (see the module docstring for why it never blocks a thread of
    autograd or gloo).

    Args:
        state: The :class:`EmulatedAllreduceState`.
        bucket: The gradient bucket DDP hands to the hook.

    Returns:
        A future holding the averaged bucket tensor.
    """
    tensor = bucket.buffer()
    tensor.div_(state.world_size)
    launched = time.monotonic()
    work = dist.all_reduce(tensor, group=state.process_group, async_op=True)
    reduced = work.get_future()
    deadline = state.reserve(tensor.numel() * tensor.element_size(), launched)
    held = _deadline_future(deadline, tensor.device)
    return held.then(lambda _: reduced.wait()[0])


def apply_network(net_cfg: Any, model: torch.nn.Module, world_size: int) -> dict[str, Any] | None:
    """Install network emulation on a wrapped model, as the ``network`` config asks.

    Args:
        net_cfg: The ``network`` config section (see :func:`profile_from_cfg`).
        model: A :class:`~decent_dp.ddp.DecentralizedDataParallel` (gets
            ``set_comm_delay``, with hosts of the section's ``procs_per_host``
            ranks) or a :class:`torch.nn.parallel.DistributedDataParallel` (gets
            :func:`emulated_allreduce_hook`, a link per rank; call before its first
            backward).
        world_size: Number of workers.

    Returns:
        ``None`` when the profile is ``none`` (nothing installed); otherwise
        ``{"network", "latency_ms", "bandwidth_gbps", "emulated": True}``.

    Raises:
        ValueError: Bad profile or world size, or a model of another type.
    """
    profile = profile_from_cfg(net_cfg)
    if profile is None:
        return None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} is invalid; it must be an integer >= 1")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        state = EmulatedAllreduceState(profile, world_size, model.process_group)
        model.register_comm_hook(state, emulated_allreduce_hook)
    else:
        from decent_dp.ddp import DecentralizedDataParallel

        if not isinstance(model, DecentralizedDataParallel):
            raise ValueError(
                f"network emulation needs a DecentralizedDataParallel or torch "
                f"DistributedDataParallel model, got {type(model).__name__}"
            )
        pph = _cfg_get(net_cfg, "procs_per_host") if not isinstance(net_cfg, str) else None
        model.set_comm_delay(make_gossip_delay(profile, procs_per_host=int(pph or 1)))
    return {**profile.as_dict(), "emulated": True}
