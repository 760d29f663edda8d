"""``fault_tolerance=torchft``: membership, the Trainer's component for elastic gossip.

Each host runs ``torchrun --nproc_per_node=1 train.py fault_tolerance=torchft ...``
and, like every other job, the one :class:`~experiments.train.trainer.Trainer`.
The Trainer runs as rank 0 of a world of one: its data, checkpoints, metrics,
NaN policy, pre-emption stop and evaluation are this host's own, and none of
them is a collective of the job's. What joins the hosts is this module's
:class:`ElasticStep`, a :class:`~experiments.train.step.TrainStep` whose wrapper
is :class:`decent_dp.elastic.ElasticDataParallel` on the lighthouse the config
names (each bucket's optimizer step inside the backward pass, its gossip
overlapping the next computation):

- every ``fault_tolerance.quorum_every`` steps the hosts meet in a quorum, before
  the step's batch is read (:meth:`ElasticStep.quorum`); a host that died is gone
  from the next one, and the topology is rebuilt for the hosts that are left,
  without a restart;
- a host that starts (or restarts after a kill) asks for a quorum at once and
  heals from a live neighbour: the model, the optimizer and scheduler states and
  the step; the Trainer's batch loop then continues at the healed step (the data
  position is a function of the step), not from its own checkpoint;
- ``checkpoint.*`` saves and resumes this host's own checkpoints in
  ``<run dir>/<replica id>/checkpoints``: when the whole job restarts (no member
  alive) every host resumes from its own; a host behind the others still heals
  from a neighbour at the first quorum;
- with ``outer=diloco`` or ``slowmo`` the outer rounds fall on quorum steps
  (:mod:`decent_dp.elastic._outer`);
- the metrics lines are every run's (``train/loss``, ``train/lr``,
  ``perf/samples_per_s`` or ``perf/tokens_per_s``, ``comm/bytes_per_step``, ...)
  in ``<run dir>/<replica id>/metrics.jsonl``; a quorum's line adds the members'
  ``consensus/distance``, ``elastic/members`` and ``elastic/quorum_id``, and a
  change of membership an ``elastic/change`` line. ``log.consensus_every`` and
  ``log.consensus_sketch`` measure the distance between quorums too (a
  collective of every host: ``fault_tolerance=torchft`` sets both to 0 unless
  asked), and the evaluation's ``eval/acc`` is the members' average model
  (:class:`ElasticEvaluator`); where a member died since the latest quorum the
  first costs up to ``timeout_s``, and each is skipped, with a warning, for the
  rest of the interval.

Its data: every host reads the whole training set in its own order (the seed and
the replica id, :meth:`ElasticHost.data_seed`), since membership changes.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from decent_dp.elastic import ElasticDataParallel, default_replica_id
from decent_dp.optim import optimizer_kernels
from experiments.train.evaluation import Evaluator
from experiments.train.step import TrainStep

__all__ = ["ElasticEvaluator", "ElasticHost", "ElasticStep"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ElasticHost:
    """Who this process is in an elastic job: its replica id and its name in the run directory.

    Attributes:
        replica_id: The host's replica id (``fault_tolerance.replica_id`` or the default).
        name: The replica id, with ``.<local rank>`` for a host of several processes.
    """

    replica_id: str
    name: str

    @classmethod
    def from_config(cls, cfg: Any) -> ElasticHost:
        """This process's host, from ``fault_tolerance`` and torchrun's local variables."""
        ft = cfg.fault_tolerance
        rid = ft.replica_id or default_replica_id(str(ft.lighthouse), ft.get("host") or None)
        group_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        group_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        return cls(rid, rid if group_size == 1 else f"{rid}.{group_rank}")

    def data_seed(self, seed: int) -> int:
        """Each process's own order of the whole training set (membership changes)."""
        return int(seed) * 100003 + zlib.crc32(self.name.encode()) % 100003


class ElasticStep(TrainStep):
    """:class:`~experiments.train.step.TrainStep` over :class:`~decent_dp.elastic.ElasticDataParallel`.

    The step, AMP, clipping, the NaN policy and the bytes are the parent's; the
    wrapper is the elastic one, and between two quorums :attr:`ddp` is the wrapper
    it holds for the current members.

    Args:
        model: The bare model, on the training device.
        train_cfg: The ``train`` section.
        topology_cfg: The ``topology`` section (a registered name).
        ft_cfg: The ``fault_tolerance`` section.
        host: This process's :class:`ElasticHost`.
        *factories: :class:`~experiments.train.step.TrainStep`'s ``optim_fn``,
            ``scheduler_fn`` and ``window``, in its order.
        **kwargs: :class:`~experiments.train.step.TrainStep`'s ``channels_last``,
            ``task``, ``compression`` and ``outer``.

    Example::

        step = ElasticStep(model, cfg.train, cfg.topology, cfg.fault_tolerance, host,
                           optim_fn, scheduler_fn, window, task=task)
        number = step.quorum() + 1  # healing may move the step
        step(x, y, number)
    """

    def __init__(
        self,
        model: nn.Module,
        train_cfg: Any,
        topology_cfg: Any,
        ft_cfg: Any,
        host: ElasticHost,
        *factories: Any,
        **kwargs: Any,
    ) -> None:
        self.ft, self.host = ft_cfg, host
        self.changes: list[dict[str, Any]] = []  # every change of membership, for the summary
        self._seen_change: dict[str, Any] | None = None
        self._unlogged: dict[str, Any] | None = None
        # a world of one: the NaN policy's record is this host's own
        super().__init__(model, train_cfg, topology_cfg, *factories, rank=0, world_size=1, **kwargs)

    def _wrap(self, model: nn.Module, topo: Any, *factories: Any) -> nn.Module:
        optim_fn, scheduler_fn, _ = factories  # the world is the quorum's, not the job's
        ft = self.ft
        return ElasticDataParallel(
            model,
            optim_fn,
            scheduler_fn,
            topology=str(topo.name),
            topology_kwargs=dict(topo.get("kwargs") or {}),
            lighthouse=str(ft.lighthouse),
            replica_id=self.host.replica_id,
            min_replicas=int(ft.min_replicas),
            timeout_s=float(ft.timeout_s),
            quorum_every=int(ft.quorum_every),
            host=ft.get("host") or None,
            log=log.warning,
            scaler=self.scaler,
            compression=self.compression,
            bucket_size_in_mb=float(topo.bucket_size_in_mb),
            grad_clip_norm=self.grad_clip_norm,
            sync_buffer_in_global_avg=bool(topo.sync_buffer_in_global_avg),
            # outer rounds on quorum steps (fault_tolerance refuses streamed, compressed, scaled)
            outer_optim_fn=self._outer.get("outer_optim_fn"),
            outer_every=self._outer.get("outer_every"),
        )

    @property
    def edp(self) -> ElasticDataParallel:
        """The elastic wrapper."""
        assert isinstance(self.model, ElasticDataParallel)
        return self.model

    @property
    def ddp(self) -> Any:
        """The wrapper of the current members (new at each rebuild)."""
        return self.edp.wrapper

    # ------------------------------------------------------------ membership
    def quorum(self) -> int:
        """Take part in the quorum if one is due; return the step taken so far (healed or not)."""
        self.edp.quorum()
        change = self.edp.last_change
        if change is not None and change is not self._seen_change:
            self._seen_change, self._unlogged = change, dict(change, time=time.time())
            self.changes.append(self._unlogged)
        return self.edp.step_count

    def new_change(self) -> dict[str, Any] | None:
        """The change of membership at the latest quorum, once; ``None`` without one."""
        change, self._unlogged = self._unlogged, None
        return change

    def quorum_line(self, step: int) -> dict[str, Any]:
        """What a quorum before ``step`` adds to its line (empty on other steps)."""
        edp = self.edp
        if edp.last_quorum_step != step - 1:
            return {}
        return {
            "consensus/distance": edp.last_consensus_distance,
            "elastic/members": len(edp.members),
            "elastic/quorum_id": edp.view.quorum_id if edp.view else None,
        }

    def summary(self) -> dict[str, Any]:
        """The host's part of the summary: replica id, members, changes, steps."""
        return {
            "replica_id": self.host.replica_id,
            "members": list(self.edp.members),
            "changes": self.changes,
            "steps": self.edp.step_count,
        }

    # ------------------------------------------------------------ what the others read
    def consensus(self, sketch: int | None = None) -> float | None:
        """The members' consensus distance between quorums; ``None`` if a member is gone."""
        return self.edp.consensus_distance(sketch)

    def optimizer_kernels(self) -> dict[str, Any]:
        """The current wrapper's optimizer kernels."""
        return optimizer_kernels(self.ddp) if self.ddp is not None else {}

    def training_state(self) -> dict[str, Any]:
        """The elastic wrapper's training state and outer round (the model is saved apart)."""
        state = self.edp.elastic_state()
        return {"training": state["training"], "outer": state["outer"]}

    def load_training_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`training_state` before the first quorum (a resumed host)."""
        model = self.module.state_dict()
        self.edp.load_elastic_state({"model": model, "extra": None, **state})

    def model_state(self) -> dict[str, Any]:
        """The bare model's state dict."""
        return self.module.state_dict()

    def load_model(self, state: dict[str, Any]) -> None:
        """Load the bare model (before the first quorum)."""
        self.module.load_state_dict(state)


class ElasticEvaluator(Evaluator):
    """:class:`~experiments.train.evaluation.Evaluator` of an elastic host.

    The test set is this host's whole one; ``eval/*_local`` is its own model, and
    ``eval/*`` the members' average (one all-reduce of the quorum's group, the same
    step on every member). Where a member died since the latest quorum there is no
    average: ``eval/*`` is then ``None`` for this evaluation.
    """

    train_step: ElasticStep

    def consensus(self, sketch: int | None = None) -> float | None:  # type: ignore[override]
        """The members' consensus distance (:meth:`ElasticStep.consensus`)."""
        return self.train_step.consensus(sketch)

    def evaluate(self, step: int) -> dict[str, float]:
        """The task's metrics of the own and the members' average model, and consensus."""
        task = self.train_step.task
        own = self._local()
        average = self._average()
        totals = task.eval_totals(own if average is None else average, own)
        result: dict[str, Any] = task.eval_metrics(totals)
        if average is None:
            result = {k: (v if k.endswith("_local") else None) for k, v in result.items()}
        result["consensus/distance"] = self.consensus()
        self.last, self.last_step = result, step
        return result

    def _average(self) -> list[float] | None:
        """The task's sums of the members' average model, or ``None`` if a member is gone."""
        edp = self.train_step.edp
        try:
            flat = edp.members_mean()
        except (RuntimeError, OSError) as exc:
            log.warning("%s: no members' average to evaluate (%s)", edp.replica_id, exc)
            return None
        params = [p for p in self.train_step.module.parameters() if p.requires_grad]
        own = [p.detach().clone() for p in params]
        with torch.no_grad():
            offset = 0
            for p in params:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        try:
            return self._local()
        finally:
            with torch.no_grad():
                for p, o in zip(params, own):
                    p.copy_(o)
