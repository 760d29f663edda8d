"""What the torchft clients share: the workload, the Manager, the metrics lines.

The workload is the one ``train.py fault_tolerance=torchft`` trains
(the Trainer with :mod:`experiments.train.elastic`): the config composed from
``conf/`` with the same overrides, the task's data and model builders, the
same optimizer and scheduler, every host reading the whole training set in its
own order (seeded by ``train.seed`` and the replica id), the same initial model
on every host. Each host is a torchft replica group of one process, with its
own ``TCPStore`` (as torchft's tests start one), a gloo process group and
:class:`torchft.checkpointing.pg_transport.PGTransport` for healing, as in
torchft's ``train_ddp.py``.

Metrics: a line ``{"step", "time", "train/loss"}`` per step (``train/loss`` of
that batch), a line with ``elastic/change`` when the host healed from a peer
(its step after the heal), and at the end the local model's evaluation and a
``summary.json`` (``steps``, ``eval/*_local``), the keys the benches read from
an elastic host's lines and summary too.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[3]


class DataPosition:
    """The data position a joiner heals with: batches read, across epochs, and the next ones."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.load({"read": 0})

    def _from(self, position: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch, start = divmod(position, len(self.loader))
        while True:
            yield from self.loader.iterate(epoch, start)
            epoch, start = epoch + 1, 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch."""
        self.read += 1
        return next(self.batches)

    def load(self, state: dict[str, int]) -> None:
        """Continue from a healed ``{"read": n}``."""
        self.read = int(state["read"])
        self.batches = self._from(self.read)


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """The command line of a client: its torchft settings, then ``train.py`` overrides."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--lighthouse", required=True, help="the lighthouse's address (http://...)")
    p.add_argument("--replica-id", required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--min-replicas", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=20.0)
    p.add_argument("--sync-every", type=int, default=10, help="DiLoCo's H (inner steps)")
    p.add_argument(
        "--grad-sync",
        choices=("ddp", "allreduce"),
        default="ddp",
        help="DDP's gradients: torchft's DDP wrapper, or Manager.allreduce of one flat buffer",
    )
    p.add_argument("overrides", nargs="*", help="train.py overrides (train.max_steps=...)")
    args = p.parse_args(argv)
    if args.min_replicas < 1:
        p.error(f"--min-replicas={args.min_replicas}: must be at least 1")
    return args


def compose(overrides: list[str]) -> Any:
    """``conf/config.yaml`` with the overrides, as ``train.py`` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import experiments.train.config  # noqa: F401 - registers the schemas

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=["logger=none", *overrides])


class Workload:
    """The task, data, model, optimizer and scheduler of one host, as the elastic job builds them."""

    def __init__(self, cfg: Any, replica_id: str) -> None:
        from experiments.train.optim import build_optim_fn, build_scheduler_fn
        from experiments.train.task import task_for
        from experiments.train.trainer import per_worker_batch

        t = cfg.train
        self.task = task_for(cfg)
        seed = int(t.seed) * 100003 + zlib.crc32(replica_id.encode()) % 100003
        torch.manual_seed(int(t.seed))
        self.data = self.task.build_data(
            cfg.dataset,
            cfg.model,
            rank=0,
            world_size=1,
            batch_size=per_worker_batch(t, 1),
            seed=seed,
            device=torch.device("cpu"),
        )
        per_epoch = len(self.data.train)
        self.total = int(t.max_steps) if t.max_steps is not None else int(t.epochs) * per_epoch
        torch.manual_seed(int(t.seed))  # the same initial model on every host
        self.model = self.task.build_model(cfg.model)
        named = [(p, n) for n, p in self.model.named_parameters() if p.requires_grad]
        self.optimizer = build_optim_fn(cfg.optim)(named)
        self.scheduler = build_scheduler_fn(cfg.scheduler, per_epoch, self.total)(self.optimizer)
        self.position = DataPosition(self.data.train)

    def state_dict(self) -> dict[str, Any]:
        """What a joiner heals with: the model, optimizer and scheduler states, the data position."""
        return {
            "model": self.model.state_dict(),
            "optim": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "read": self.position.read,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a live peer's :meth:`state_dict` (a client's own keys may come along)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.position.load(state)  # its "read"

    def loss(self, model: torch.nn.Module) -> torch.Tensor:
        """The next batch's loss through ``model`` (the wrapped or the plain module)."""
        x, y = self.position.next()
        loss, _, _ = self.task.forward(model, x, y)
        return loss

    def evaluate(self) -> dict[str, float]:
        """The local model on the test set (``eval/*_local``), as the elastic job reports it."""
        task, model = self.task, self.model
        model.eval()
        sums: torch.Tensor | None = None
        with torch.no_grad():
            for x, y in self.data.test:
                s = task.eval_sums(model(x), y)
                sums = s if sums is None else sums + s
        model.train()
        own = sums.tolist() if sums is not None else []
        if not own:
            return {}
        result = task.eval_metrics(task.eval_totals(own, own))
        return {k: v for k, v in result.items() if k.endswith("_local")}


class Metrics:
    """``<run dir>/<replica id>/metrics.jsonl``, one flushed line per call."""

    def __init__(self, run_dir: Path, replica_id: str) -> None:
        self.dir = Path(run_dir) / replica_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed in close()
        self.start = now()

    def log(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def summary(self, summary: dict[str, Any]) -> None:
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))

    def healed(self, step: int) -> None:
        """The line of a heal from a peer: ``elastic/change`` at the step healed to."""
        self.log({"step": step, "elastic/change": {"healed": True, "step": step}})

    def finish(self, work: Workload, summary: dict[str, Any]) -> None:
        """The last lines: the local model's evaluation at ``summary["steps"]``, and ``summary.json``.

        ``summary`` is the client's (replica id, steps, ...), in order; ``wall_s`` and the
        evaluation follow it.
        """
        result = work.evaluate()
        self.log({"step": summary["steps"], **result})
        self.summary({**summary, "wall_s": now() - self.start, **result})

    def close(self) -> None:
        self._file.close()


def start(args: argparse.Namespace) -> tuple[Workload, Metrics]:
    """A client's workload (``train.py``'s config with its overrides) and its metrics file."""
    return Workload(compose(args.overrides), args.replica_id), Metrics(
        args.run_dir, args.replica_id
    )


def manager(
    args: argparse.Namespace,
    load_state_dict: Any,
    state_dict: Any,
    use_async_quorum: bool,
) -> Any:
    """A torchft Manager for a replica group of one process on loopback."""
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    timeout = timedelta(seconds=args.timeout_s)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupGloo(timeout=timeout)
    transport = PGTransport(pg, timeout=timeout, device=torch.device("cpu"))
    m = Manager(
        pg=pg,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=args.min_replicas,
        use_async_quorum=use_async_quorum,
        timeout=timeout,
        quorum_timeout=2 * timeout,
        connect_timeout=timeout,
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        replica_id=args.replica_id,
        hostname="127.0.0.1",
        checkpoint_transport=transport,
    )
    m._decent_dp_store = store  # the store lives as long as the manager
    return m


def now() -> float:
    return time.time()
