"""Run on each testbed host by torchrun: one all-reduce across the hosts, timed, checked.

Prints ``{"rank": r, "seconds": s, "bytes": n}`` after checking the sum; exits 1 on a wrong sum.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

NUMEL = int(sys.argv[1]) if len(sys.argv) > 1 else 250_000

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.full((NUMEL,), float(rank + 1))
dist.barrier()
start = time.perf_counter()
dist.all_reduce(x)
seconds = time.perf_counter() - start
expected = world * (world + 1) / 2
ok = bool(torch.all(x == expected))
print(json.dumps({"rank": rank, "seconds": seconds, "bytes": x.numel() * 4, "ok": ok}), flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
