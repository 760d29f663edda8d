"""One process of a replica group launched by torchrun: ``torchrun ... -m this REPLICA_ID LIGHTHOUSE``.

It finds its group through torchrun's own store (``MASTER_ADDR``/``MASTER_PORT``),
asks for a quorum of 2, sums ``2 ** flat_rank`` over a flat gloo group of every
process from ``world_store`` and prints one JSON line of what it saw.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from decent_dp.elastic._quorum import Membership


def main() -> None:
    rid, lighthouse = sys.argv[1], sys.argv[2]
    g, n = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    m = Membership(
        lighthouse,
        rid,
        2,
        5.0,
        host="127.0.0.1",
        log=lambda line: None,
        group_rank=g,
        group_world_size=n,
    )
    view = m.quorum(0)
    flat = view.rank * n + g
    pg = dist.ProcessGroupGloo(
        m.world_store("flat"), flat, view.world_size * n, timedelta(seconds=10)
    )
    t = torch.tensor([2.0**flat], dtype=torch.float64)
    pg.allreduce([t]).wait()
    line = {"rid": rid, "g": g, "members": list(view.members), "flat": flat, "sum": t.item()}
    print("RESULT " + json.dumps(line), flush=True)
    m.close()


if __name__ == "__main__":
    main()
