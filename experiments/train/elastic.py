"""``fault_tolerance=torchft``: one host's replica of an elastic gossip job.

Each host runs ``torchrun --nproc_per_node=1 train.py fault_tolerance=torchft
...``; :func:`run_elastic` builds the data, the model, the optimizer and its
scheduler as the non-elastic job does, and trains with
:class:`decent_dp.elastic.ElasticDataParallel` (the wrapper's own path: each
bucket's optimizer step inside the backward pass, its gossip overlapping the
next computation) on the lighthouse the config names:

- every ``fault_tolerance.quorum_every`` steps the hosts meet in a quorum; a
  host that died is gone from the next one, and the topology is rebuilt for
  the hosts that are left, without a restart;
- a host that starts (or restarts after a kill) asks for a quorum at once and
  heals from a live neighbour: the model, the optimizer and scheduler states,
  the step and the data position; it continues from there, not from its own
  checkpoint;
- with ``checkpoint.every_steps > 0`` each host saves that same state every
  ``every_steps`` steps and at the end, in ``<run dir>/<replica id>/checkpoints``
  (atomically, :mod:`experiments.train.checkpoint`), and on start loads its own
  newest complete one before its first quorum: when the whole job restarts
  (no member alive) every host resumes from its own checkpoint; a host behind
  the others still heals from a neighbour at that quorum;
- ``compression=...`` is gossiped compressed; a change of membership starts
  the references afresh on every member;
- with ``outer=diloco`` or ``slowmo`` (``outer.every`` a multiple of
  ``fault_tolerance.quorum_every``) the outer rounds fall on quorum steps, and
  a change of membership restarts the round in progress from the members' mean
  (:mod:`decent_dp._elastic_outer`);
- each host writes its own metrics lines (``<run dir>/<replica id>/metrics.jsonl``):
  ``train/loss`` every ``log.every`` steps, and at every quorum
  ``consensus/distance`` over the members (the merge of a joiner shows there),
  ``elastic/members`` and ``elastic/quorum_id``; at the end the local model's
  evaluation and a ``summary.json``.

Its data: every host reads the whole training set in its own order (the seed
and the replica's place in the first quorum are not used, since membership
changes; the order comes from ``train.seed`` and the replica id), batch after
batch; the data position is the number of batches read, which a joiner takes
from its source.
"""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from decent_dp.elastic import ElasticDataParallel, default_replica_id
from decent_dp.utils import get_device
from experiments.schema import plain
from experiments.train.checkpoint import alone, latest_checkpoint, load_shard, save_checkpoint
from experiments.train.config import compression_arg
from experiments.train.logger import MetricsLogger
from experiments.train.optim import build_optim_fn, build_scheduler_fn
from experiments.train.outer import outer_kwargs
from experiments.train.task import task_for
from experiments.train.trainer import per_worker_batch

__all__ = ["DataPosition", "batches_from", "run_elastic"]

log = logging.getLogger(__name__)


def batches_from(loader: Any, position: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The loader's batches from ``position`` (batches read so far, across epochs) on."""
    per_epoch = len(loader)
    epoch, start = divmod(int(position), per_epoch)
    while True:
        yield from loader.iterate(epoch, start)
        epoch, start = epoch + 1, 0


class DataPosition:
    """The data position a joiner heals with: batches read, and where they come from."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.read = 0
        self.batches = batches_from(loader, 0)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = next(self.batches)
        self.read += 1
        return batch

    def state(self) -> dict[str, int]:
        return {"read": self.read}

    def load(self, state: dict[str, int]) -> None:
        self.read = int(state["read"])
        self.batches = batches_from(self.loader, self.read)


def _members_mean(edp: ElasticDataParallel, model: torch.nn.Module) -> list[torch.Tensor] | None:
    """The members' mean of the parameters (one all-reduce of the quorum), or ``None``.

    ``None`` where a member is gone since the latest quorum (its all-reduce fails
    within ``timeout_s``): the average model is then not evaluated.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        flat = edp.members_mean()
    except (RuntimeError, OSError) as exc:
        log.warning("%s: no members' average to evaluate (%s)", edp.replica_id, exc)
        return None
    out, offset = [], 0
    for p in params:
        out.append(flat[offset : offset + p.numel()].view_as(p).clone())
        offset += p.numel()
    return out


def _evaluate_average(
    task: Any, model: torch.nn.Module, test: Any, mean: list[torch.Tensor]
) -> dict[str, float]:
    """The members' average model on the test set (``eval/*``, as a non-elastic run reports)."""
    params = [p for p in model.parameters() if p.requires_grad]
    own = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, m in zip(params, mean):
            p.copy_(m)
    try:
        result = _evaluate(task, model, test, local=False)
    finally:
        with torch.no_grad():
            for p, o in zip(params, own):
                p.copy_(o)
    return result


def _evaluate(task: Any, model: torch.nn.Module, test: Any, local: bool = True) -> dict[str, float]:
    """A model on this host's test set: ``eval/*_local``, or with ``local=False`` ``eval/*``."""
    model.eval()
    sums: torch.Tensor | None = None
    with torch.no_grad():
        for x, y in test:
            s = task.eval_sums(model(x), y)
            sums = s if sums is None else sums + s
    model.train()
    own = sums.tolist() if sums is not None else []
    if not own:
        return {}
    result = task.eval_metrics(task.eval_totals(own, own))
    return {k: v for k, v in result.items() if k.endswith("_local") == local}


def _resume(edp: ElasticDataParallel, root: Path) -> int | None:
    """Load this host's newest complete checkpoint, if any; return its step."""
    info = latest_checkpoint(root)
    if info is None:
        return None
    edp.load_elastic_state(load_shard(info, 0)["elastic"])
    log.warning("%s: resumed from %s (step %d)", edp.replica_id, info.path, info.step)
    return info.step


def run_elastic(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Train this host's replica of an elastic gossip job; return its summary.

    Args:
        cfg: The composed config, already validated (``fault_tolerance=torchft``).
        run_dir: The job's run directory; this host writes under ``<run_dir>/<replica id>``.

    Returns:
        The summary (also in ``summary.json``).
    """
    ft = cfg.fault_tolerance
    wall_start = time.time()
    t = cfg.train
    device = get_device()
    task = task_for(cfg)
    host = ft.get("host") or None
    replica_id = ft.replica_id or default_replica_id(str(ft.lighthouse), host)
    # a host's processes (one torchrun per host): each its own data order and directory
    group_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    group_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    name = replica_id if group_size == 1 else f"{replica_id}.{group_rank}"
    # every process's own order of the whole training set
    seed = int(t.seed) * 100003 + zlib.crc32(name.encode()) % 100003
    torch.manual_seed(int(t.seed))
    batch = per_worker_batch(t, 1)
    data = task.build_data(
        cfg.dataset, cfg.model, rank=0, world_size=1, batch_size=batch, seed=seed, device=device
    )
    steps_per_epoch = len(data.train)
    total = int(t.max_steps) if t.max_steps is not None else int(t.epochs) * steps_per_epoch
    # the same initial model on every host (the first quorum also aligns them)
    torch.manual_seed(int(t.seed))
    model = task.build_model(cfg.model).to(device)
    optim_fn = build_optim_fn(cfg.optim)
    scheduler_fn = build_scheduler_fn(cfg.scheduler, steps_per_epoch, total)
    position = DataPosition(data.train)
    out_dir = Path(run_dir) / name
    sink = MetricsLogger(
        out_dir,
        enabled=True,
        wandb_cfg=cfg.logger,
        config=plain(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)),
        run_name=name,
    )
    outer = outer_kwargs(cfg.get("outer"), cfg.topology)
    edp = ElasticDataParallel(
        model,
        optim_fn,
        scheduler_fn,
        topology=str(cfg.topology.name),
        topology_kwargs=dict(cfg.topology.get("kwargs") or {}),
        lighthouse=str(ft.lighthouse),
        replica_id=replica_id,
        min_replicas=int(ft.min_replicas),
        timeout_s=float(ft.timeout_s),
        quorum_every=int(ft.quorum_every),
        host=host,
        state_fn=position.state,
        load_state_fn=position.load,
        log=log.warning,
        compression=compression_arg(cfg.get("compression")),
        bucket_size_in_mb=float(cfg.topology.bucket_size_in_mb),
        grad_clip_norm=float(t.grad_clip_norm),
        # outer rounds on quorum steps (fault_tolerance refuses streamed, compressed, scaled)
        outer_optim_fn=outer.get("outer_optim_fn"),
        outer_every=outer.get("outer_every"),
    )
    every, keep = int(cfg.checkpoint.every_steps), int(cfg.checkpoint.keep)
    ckpt_root = out_dir / "checkpoints"
    # each host's own checkpoint (alone(): a world of one, whatever the quorum's group)
    resumed = _resume(edp, ckpt_root) if every > 0 else None
    history: list[dict[str, Any]] = []
    loss_sum = torch.zeros((), device=device)
    count = 0
    last_change: dict[str, Any] | None = None
    try:
        while edp.step_count < total:
            edp.quorum()  # before the batch is read: healing moves the data position
            step = edp.step_count + 1
            if edp.last_change is not last_change and edp.last_change is not None:
                last_change = edp.last_change
                history.append(dict(last_change, time=time.time()))
                sink.log({"step": edp.step_count, "elastic/change": last_change})
            x, y = position.next()
            loss, _, _ = task.forward(edp, x, y)
            loss.backward()  # the wrapper steps each bucket here
            loss_sum += loss.detach()
            count += 1
            line: dict[str, Any] = {}
            if edp.last_quorum_step == step - 1:
                line.update(
                    {
                        "consensus/distance": edp.last_consensus_distance,
                        "elastic/members": len(edp.members),
                        "elastic/quorum_id": edp.view.quorum_id if edp.view else None,
                    }
                )
            if step % int(cfg.log.every) == 0 or step == total:
                line["train/loss"] = float(loss_sum) / max(count, 1)
                loss_sum.zero_()
                count = 0
            if line:
                sink.log({"step": step, "time": time.time(), **line})
            if every > 0 and (step % every == 0 or step == total):
                meta = {"replica_id": replica_id, "elastic": True}
                with alone():  # this host's own: the quorum's group is not the job's
                    save_checkpoint(ckpt_root, step, {"elastic": edp.elastic_state()}, meta, keep)
        result = _evaluate(task, model, data.test)
        mean = _members_mean(edp, model)
        if mean is not None:
            result.update(_evaluate_average(task, model, data.test, mean))
        summary = {
            "replica_id": replica_id,
            "steps": edp.step_count,
            "resumed_from_step": resumed,
            "members": list(edp.members),
            "changes": history,
            "wall_s": time.time() - wall_start,
            **result,
        }
        sink.log({"step": edp.step_count, **result})
        sink.summary(summary)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        return summary
    finally:
        edp.close()
        sink.close()
