"""Train one configuration (or a sweep) with decentralized or all-reduce data parallelism.

Every option lives in ``conf/`` (Hydra); override anything on the command line::

    make train                                       # 4 CPU workers, digits, one-peer-exp, < 1 min
    python train.py                                  # no torchrun: one process (world size 1)
    torchrun --nproc_per_node=4 train.py topology=one-peer-exp
    torchrun --nproc_per_node=4 train.py -m topology=complete,ring,one-peer-exp,allreduce
    torchrun --nproc_per_node=4 train.py experiment=cifar10_resnet18 dataset.root=/data/cifar
    make train-lm                                    # a tiny GPT on the stdlib's sources, < 2 min
    torchrun --nproc_per_node=4 train.py model=gpt dataset=tokens dataset.root=data/tokens
    torchrun --nnodes=4 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 \\
        train.py experiment=imagenet_resnet50 dataset.root=/data/imagenet
    python train.py -m hydra/launcher=slurm experiment=imagenet_resnet50   # SLURM, no torchrun
    torchrun --nproc_per_node=4 --max-restarts=3 train.py checkpoint.every_steps=100  # see docs/recovery.md

A run writes ``metrics.jsonl``, ``summary.json`` and ``.hydra/`` into
``outputs/<date>/<time>/`` (a sweep: ``multirun/<date>/<time>/<job>/``);
``make report`` compares the newest sweep. Under ``-m`` every rank walks the
same jobs in the same order and the process group is set up once.

Errors print one line and give exit status 1. An unknown option or a value of
the wrong type fails when Hydra composes the config; any other bad config value
is found on every rank before any communication, so a sweep skips that job and
goes on; any other error stops the process at once, and torchrun stops its peers.
"""

from __future__ import annotations

import gc
import os
import sys
import time

import hydra
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig

from experiments.train.config import compose_error_line
from experiments.train.run import ConfigError, run

failed_jobs: list[int] = []
_CONFIG_ERROR_GRACE_S = 1.0


def _rank() -> int:
    if dist.is_initialized():
        return dist.get_rank()
    raw = os.environ.get("RANK", "0")  # set by torchrun, or from SLURM's variables by run()
    return int(raw) if raw.isdigit() else 0


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """One Hydra job: train, evaluate, and return the final ``eval/acc`` (for sweepers).

    A language model, which has no accuracy, returns its final ``eval/loss``.
    """
    try:
        summary = run(cfg)
        acc = summary.get("eval/acc")  # absent where an elastic job lost a member at the end
        return summary.get("eval/loss") if acc is None else acc
    except Exception as exc:
        rank = _rank()
        if rank == 0 or not isinstance(exc, ConfigError):  # a ConfigError is the same on all ranks
            message = " ".join(str(exc).split())
            print(
                f"train.py: error on rank {rank}: {type(exc).__name__}: {message}", file=sys.stderr
            )
        if isinstance(exc, ConfigError) and HydraConfig.get().mode == RunMode.MULTIRUN:
            failed_jobs.append(HydraConfig.get().job.num)
            return None
        if rank != 0 and isinstance(exc, ConfigError):
            # rank 0 fails alike; torchrun stops every rank once one exits: let it print first
            time.sleep(_CONFIG_ERROR_GRACE_S)
        sys.exit(1)  # a peer may be waiting on this rank: stop here, not in the next job


if __name__ == "__main__":
    # Hydra prints a composition error (unknown option, bad value) over many lines unless
    # HYDRA_FULL_ERROR is set, in which case it raises it: print it on one line instead
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except HydraException as exc:
        if full_error:
            raise
        line = f"{type(exc).__name__}: {compose_error_line(exc)}"
        print(f"train.py: error on rank {_rank()}: {line}", file=sys.stderr)
        sys.exit(1)
    gc.collect()  # free any DDP reducer before its process group goes away
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(1 if failed_jobs else 0)
