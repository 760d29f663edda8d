"""One rank of a short run that ends as user scripts do: ``destroy_process_group()``, then exit.

Run under torchrun (4 ranks) by tests/decent_dp/test_exit.py::

    torchrun --standalone --nproc_per_node=4 tests/decent_dp/exit_script.py diloco

``diloco``: streaming DiLoCo (``outer_fragments=2``, Nesterov outer step) over
``one-peer-exp``; ``hierarchical``: 2 hosts of 2 with ``int8`` between hosts (the
phase thread). With ``close`` the wrapper is closed first; without, it is still
alive when the interpreter exits, with its last gossip in flight. A process that
frees a gloo group while the interpreter finalizes aborts with ``terminate called
without an active exception``; the test reads stderr and the exit code.
"""

import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from decent_dp import DecentralizedDataParallel  # noqa: E402
from tests.support.ddp_cases import make_model, make_optim, train_steps  # noqa: E402

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
if "hierarchical" in sys.argv[1:]:
    kwargs = {"topology": "hierarchical", "local_world_size": 2, "compression": "int8"}
else:
    nesterov = partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)
    kwargs = {
        "topology": "one-peer-exp",
        "outer_optim_fn": nesterov,
        "outer_every": 6,
        "outer_fragments": 2,
    }
ddp = DecentralizedDataParallel(
    make_model("mlp", seed=rank), optim_fn=make_optim({}), bucket_size_in_mb=0, **kwargs
)
train_steps(ddp, rank, {}, 1, 14)
if "close" in sys.argv[1:]:
    ddp.close()
dist.destroy_process_group()
print(f"done {rank}", flush=True)
