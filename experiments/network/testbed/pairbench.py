"""Pair exchanges on the testbed's wire: how long one gossip exchange of S bytes takes.

Run on every host by the testbed (one process per host)::

    python -m experiments.network.testbed run --hosts 4 --rate 5mbit \\
        --script experiments/network/testbed/pairbench.py -- --bytes 212992 --reps 8

Each mode exchanges a float32 tensor of ``--bytes`` between pairs of ranks:

- ``allreduce-same``: ``all_reduce`` on a 2-rank group, the same pair every round;
- ``allreduce-ring``: ``all_reduce`` on 2-rank groups, pairs alternating as in
  ``ring`` gossip (``(2i, 2i+1)``, then ``(2i+1, 2i+2)``);
- ``sendrecv-same`` and ``sendrecv-ring``: the same pairs, each rank sending its
  whole tensor with ``isend`` and receiving its partner's with ``irecv`` on the
  world group.

Rank 0 prints one JSON line per mode: the median seconds of an exchange and its
ratio to ``S/B``, the time the payload needs on the link (``--rate-bps``). With
``--cpu`` it also reports the CPU time the whole machine spent over the mode's
exchanges (``/proc/stat``: every process and the kernel, so the machine must
be otherwise quiet), less what it spends idle over as long (measured for a
second first), per MB that the ranks sent: ``cpu_ms_per_mb``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

MODES = ("allreduce-same", "allreduce-ring", "sendrecv-same", "sendrecv-ring")


def partner(rank: int, world: int, rnd: int, alternate: bool) -> int:
    """The rank ``rank`` exchanges with in round ``rnd``."""
    shift = rnd % 2 if alternate else 0
    i = (rank - shift) % world
    mate = i + 1 if i % 2 == 0 else i - 1
    return (mate + shift) % world


def _groups(world: int) -> dict[tuple[int, int], dist.ProcessGroup]:
    pairs = sorted(
        {tuple(sorted((r, partner(r, world, k, True)))) for r in range(world) for k in (0, 1)}
    )
    return {p: dist.new_group(list(p)) for p in pairs}  # every rank creates every group, in order


def exchange(x: torch.Tensor, buf: torch.Tensor, mode: str, rnd: int, groups: dict) -> None:
    """One exchange of ``mode`` in round ``rnd``; the result is the pair's mean in ``x``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    base, _, chunks = mode.partition("/")
    mate = partner(rank, world, rnd, base.endswith("ring"))
    if chunks:
        group = groups[tuple(sorted((rank, mate)))]
        works = [dist.all_reduce(c, group=group, async_op=True) for c in x.chunk(int(chunks))]
        for w in works:
            w.wait()
    elif mode.startswith("allreduce"):
        dist.all_reduce(x, group=groups[tuple(sorted((rank, mate)))])
    else:
        ops = [dist.P2POp(dist.isend, x, mate), dist.P2POp(dist.irecv, buf, mate)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        x.add_(buf)
    x.mul_(0.5)


def busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=212_992)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--rate-bps", type=float, default=None, help="the link rate, for S/B")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--gap-s", type=float, default=0.0, help="idle time between exchanges")
    parser.add_argument("--cpu", action="store_true", help="the machine's CPU per MB sent")
    ns = parser.parse_args(argv)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if world % 2:
        raise SystemExit(f"pairbench needs an even world size, got {world}")
    groups = _groups(world)
    x = torch.ones(ns.bytes // 4)
    buf = torch.empty_like(x)
    idle = 0.0  # the quiet machine's own busy cores (daemons, the launchers' polling)
    if ns.cpu:
        dist.barrier()
        cpu0, t0 = busy_s(), time.perf_counter()
        time.sleep(1.0)
        idle = (busy_s() - cpu0) / (time.perf_counter() - t0)
        dist.barrier()
    for mode in ns.modes.split(","):
        if mode.partition("/")[0] not in MODES:
            raise SystemExit(f"mode {mode!r} is unknown; known: {', '.join(MODES)}")
        times = []
        dist.barrier()
        cpu0, wall0 = busy_s(), time.perf_counter()
        for rnd in range(ns.reps + 2):
            dist.barrier()
            if ns.gap_s:
                time.sleep(ns.gap_s)
            t0 = time.perf_counter()
            exchange(x, buf, mode, rnd, groups)
            times.append(time.perf_counter() - t0)
        dist.barrier()
        cpu = busy_s() - cpu0 - idle * (time.perf_counter() - wall0)
        spent = torch.tensor(times[2:], dtype=torch.float64)
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)  # an exchange ends when its slowest rank does
        if dist.get_rank() == 0:
            med = statistics.median(spent.tolist())
            row = {"mode": mode, "bytes": ns.bytes, "world": world, "median_s": med}
            if ns.rate_bps:
                row["s_over_b"] = ns.bytes * 8 / ns.rate_bps
                row["ratio"] = med / row["s_over_b"]
            if ns.cpu:  # each rank of a 2-rank exchange sends the tensor's size in all
                sent_mb = world * (ns.reps + 2) * ns.bytes / 1e6
                row.update(cpu_s=cpu, idle_cores=idle, cpu_ms_per_mb=cpu * 1e3 / sent_mb)
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
