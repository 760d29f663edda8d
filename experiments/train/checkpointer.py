"""When and what a job checkpoints, and how it resumes; the files are :mod:`.checkpoint`'s.

The global average for a reshard comes from :mod:`.reshard`.

Every rank saves its own shard (decentralized workers hold different models)
every ``checkpoint.every_steps`` steps and at the end, keeping the newest
``checkpoint.keep``. A shard holds::

    model     the bare model's state dict
    training  optimizer, scheduler and scaler state (the wrapper's, per bucket)
    rng       torch's CPU generator, and the CUDA one on CUDA
    step, epoch, batch
    time_s, window, history   the metrics' part (experiments.train.metrics)
    loader    the training loader's position, for loaders that keep one (token windows)

and the index's meta holds ``step``, ``world_size``, ``topology`` and
``config_hash``. These keys are the format: a checkpoint written by an older
version of this code resumes as long as they stay.

Resuming picks the newest complete checkpoint that every rank sees. With the
same world size and topology each rank continues from its own shard, bit for
bit. With another one (``checkpoint.allow_reshard=true``) every worker starts
from the global average of the old shards, with fresh optimizer state,
schedule and data position; the old layout's checkpoints are then moved aside.

With ``train.shard_size > 1`` no rank holds a whole model: each replica is saved
through ``decent_dp.save_sharded_checkpoint`` into the step's ``dcp/`` directory
before the shards (which then hold no ``model`` or ``training``) and the index (whose
meta adds ``sharded``). The same layout resumes bit for bit; another replica or shard
count or topology, with ``allow_reshard``, loads replica ``r`` from saved replica
``r mod R`` and continues from the saved step (:mod:`.sharding` says which layouts
resume into which).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from decent_dp import load_sharded_checkpoint
from experiments.train import checkpoint as ckpt
from experiments.train.metrics import Metrics
from experiments.train.reshard import check_compatible, global_average_from_checkpoint
from experiments.train.sharding import (
    SHARDED_DIR,
    check_sharded_resume,
    save_replicas,
    sharded_layout,
)
from experiments.train.step import TrainStep

__all__ = ["Checkpointer", "rng_state", "load_rng_state"]

log = logging.getLogger(__name__)


def rng_state(device: torch.device) -> dict[str, Any]:
    """The random generators' state: ``torch`` (CPU) and, on CUDA, ``cuda``."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def load_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore :func:`rng_state` (the CUDA part only on CUDA)."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


class Checkpointer:
    """Saves and resumes one job's training state.

    Args:
        ckpt_cfg: The ``checkpoint`` config section (``every_steps``, ``keep``,
            ``allow_reshard``).
        root: The checkpoint directory, ``<run dir>/checkpoints``.
        train_step: Holds the model and the optimizer state.
        metrics: Holds the metrics window, the training time, the history and
            the epoch length.
        rank: This process's rank.
        world_size: Number of ranks.
        config_hash: The job's config hash, stored in the index.
        loader: The training loader; its ``state_dict()``, if it has one, goes into the
            shard as ``loader`` and is restored on resume.

    Example::

        checkpointer = Checkpointer(cfg.checkpoint, run_dir / "checkpoints", train_step,
                                    metrics, rank=0, world_size=1, config_hash=job.config_hash)
        step = checkpointer.resume()  # 0 without a checkpoint
        ...
        if checkpointer.due(step, last=step == total):
            checkpointer.save(step)
    """

    def __init__(
        self,
        ckpt_cfg: Any,
        root: Path,
        train_step: TrainStep,
        metrics: Metrics,
        *,
        rank: int,
        world_size: int,
        config_hash: str,
        loader: Any = None,
    ) -> None:
        self.root = root
        # only loaders that keep a position add the key, so other shards keep their format
        self.loader = loader if hasattr(loader, "state_dict") else None
        self.train_step, self.metrics = train_step, metrics
        self.rank, self.world_size, self.config_hash = rank, world_size, config_hash
        self.every = int(ckpt_cfg.every_steps)
        self.keep = int(ckpt_cfg.keep)
        self.allow_reshard = bool(ckpt_cfg.allow_reshard)
        self.resumed_from: int | None = None  # the step of the checkpoint resumed from
        self.resumed_path: str | None = None  # and its directory
        self.last_saved: int | None = None  # the step of this job's latest save
        # train.shard_size > 1: the replicas go through torch.distributed.checkpoint
        self.layout = sharded_layout(train_step)

    def due(self, step: int, last: bool) -> bool:
        """Whether a checkpoint is saved at ``step``."""
        return self.every > 0 and (step % self.every == 0 or last)

    @contextlib.contextmanager
    def _world(self) -> Iterator[None]:
        """The job's world: a world of one saves alone, whatever process group exists.

        An elastic host is rank 0 of a world of one; the process group beside it is its
        quorum's, which changes with the members and saves on no common schedule.
        """
        with ckpt.alone() if self.world_size == 1 else contextlib.nullcontext():
            yield

    def save(self, step: int) -> None:
        """Save every rank's shard of ``step`` (a collective) and prune to ``keep``."""
        with self._world():
            self._save(step)

    def _save(self, step: int) -> None:
        epoch, batch = divmod(step, self.metrics.steps_per_epoch)
        shard: dict[str, Any] = {}
        if self.layout is None:
            shard["model"] = self.train_step.model_state()  # the same keys whatever compile says
            shard["training"] = self.train_step.training_state()
        shard |= {
            "rng": rng_state(self.train_step.device),
            "step": step,
            "epoch": epoch,
            "batch": batch,
            **self.metrics.state(),
        }
        if self.loader is not None:
            shard["loader"] = self.loader.state_dict()
        meta = {
            "step": step,
            "world_size": self.world_size,
            "topology": self.train_step.topology,
            "config_hash": self.config_hash,
        }
        if self.layout is not None:
            # the replicas first, the per-rank shards and the index last: complete or skipped
            meta["sharded"] = {**self.layout, "dir": SHARDED_DIR}
            path = ckpt.checkpoint_dir(self.root, step)
            ckpt.run_on_rank0(path, lambda: _clear_replicas(path))
            save_replicas(self.train_step.ddp, path / SHARDED_DIR)
        ckpt.save_checkpoint(self.root, step, shard, meta, keep=self.keep)
        self.last_saved = step

    def resume(self) -> int:
        """Load the newest checkpoint, if any; return the step training continues from.

        Raises:
            RuntimeError: Ranks see different latest checkpoints, or the old layout
                could not be moved aside after a reshard.
            ValueError: Another world size or topology without ``allow_reshard``.
        """
        with self._world():
            return self._resume()

    def _resume(self) -> int:
        info = ckpt.latest_checkpoint(self.root)
        seen: list[Any] = [None if info is None else info.step]
        if self.world_size > 1:
            seen = [None] * self.world_size
            dist.all_gather_object(seen, None if info is None else info.step)
        if len(set(seen)) > 1:
            raise RuntimeError(
                f"ranks see different latest checkpoints in {self.root} (steps {seen}); "
                "every rank must see the same checkpoint directory"
            )
        if info is None:
            return 0
        self.resumed_from, self.resumed_path = info.step, str(info.path)
        saved = info.meta.get("sharded")
        if saved is not None or self.layout is not None:
            return self._resume_replicas(info, saved)
        if check_compatible(
            info,
            world_size=self.world_size,
            topology=self.train_step.topology,
            allow_reshard=self.allow_reshard,
        ):
            # a new world size or topology cannot reuse per-rank state: restart from the mean
            self.train_step.load_model(global_average_from_checkpoint(info, key="model"))
            log.warning(
                "resharded: every worker starts from the global average of the checkpoint at step %d "
                "(optimizer state, schedule and data position start afresh)",
                info.step,
            )
            if self.every > 0:
                self._retire_old_layout(info.step, info.world_size)
            return 0
        shard = ckpt.load_shard(info, self.rank)
        self.train_step.load_model(shard["model"])
        self.train_step.load_training_state(shard["training"])
        load_rng_state(shard["rng"], self.train_step.device)
        return self._continue(info, shard)

    def _resume_replicas(self, info: ckpt.CheckpointInfo, saved: dict[str, Any] | None) -> int:
        """Resume sharded replicas: the same layout bit for bit, another one resharded.

        With another replica or shard count (``allow_reshard``), replica ``r`` loads saved
        replica ``r mod R`` resharded, with its optimizer state and schedule, and training
        continues from the saved step; the random generators start afresh and the metrics
        state comes from the old rank ``rank mod world size``.
        """
        topologies = (str(info.meta.get("topology")), self.train_step.topology)
        reshard = check_sharded_resume(
            saved, self.layout, info.path, self.allow_reshard, topologies
        )
        assert saved is not None and self.layout is not None  # else check_sharded_resume raised
        load_sharded_checkpoint(self.train_step.ddp, info.path / str(saved["dir"]))
        shard = ckpt.load_shard(info, self.rank % info.world_size)
        if reshard:
            log.warning(
                "resharded: %d x %d replicas x shards resume from the checkpoint at step %d "
                "of %d x %d (replica r from saved replica r mod %d)",
                self.layout["replicas"],
                self.layout["shards"],
                info.step,
                saved["replicas"],
                saved["shards"],
                saved["replicas"],
            )
            shard.pop("loader", None)  # the data position follows from the step
        else:
            load_rng_state(shard["rng"], self.train_step.device)
        return self._continue(info, shard)

    def _continue(self, info: ckpt.CheckpointInfo, shard: dict[str, Any]) -> int:
        """Restore the data position and the metrics of ``shard``; return its step."""
        step = int(shard["step"])
        if self.loader is not None and "loader" in shard:
            self.loader.load_state_dict(shard["loader"])
            position = self.loader.state_dict()
            expected = dict(zip(("epoch", "batch"), divmod(step, self.metrics.steps_per_epoch)))
            if position != expected:
                log.warning(
                    "the saved loader position %s is not step %d's %s (another epoch length?); "
                    "training continues from the step's",
                    position,
                    step,
                    expected,
                )
        self.metrics.load_state(shard)
        dropped = self.metrics.drop_after(step)
        log.info(
            "resumed from step %d (%s); %d metrics lines after it will be recomputed",
            info.step,
            info.path,
            dropped,
        )
        return step

    def _retire_old_layout(self, step: int, world_size: int) -> None:
        """Save step 0 of the resharded run, then move the old layout's checkpoints aside.

        Left in place, their higher steps would stay the latest, so a crash before this
        run passed them would reshard again instead of resuming it. They are moved oldest
        first, so a crash in between leaves the same newest one to reshard from.
        """
        with warnings.catch_warnings():  # the old checkpoints are newer, for a moment
            warnings.filterwarnings("ignore", message=".*holds complete checkpoints newer")
            self.save(0)
        aside = self.root / f"before_reshard_step{step}_ws{world_size}"
        error: str | None = None
        if self.rank == 0:
            try:
                aside.mkdir(exist_ok=True)
                for old in ckpt.list_checkpoints(self.root):
                    if old.step != 0:
                        os.replace(old.path, aside / old.path.name)
            except OSError as exc:
                error = f"{type(exc).__name__}: {exc}"
        # gathered rather than a barrier, so that a failure on rank 0 stops every rank
        errors: list[str | None] = [error]
        if self.world_size > 1:
            errors = [None] * self.world_size
            dist.all_gather_object(errors, error)
        if errors[0] is not None:
            raise RuntimeError(f"could not move the old checkpoints to {aside}: {errors[0]}")
        log.info("moved the checkpoints of the old layout to %s", aside)


def _clear_replicas(path: Path) -> None:
    """Invalidate an earlier save of this step before its replicas are overwritten."""
    path.mkdir(parents=True, exist_ok=True)
    (path / ckpt.INDEX_NAME).unlink(missing_ok=True)
    if (path / SHARDED_DIR).exists():
        shutil.rmtree(path / SHARDED_DIR)
