"""A job's ``_target_`` sections: typed once, checked before any collective, the topology built.

Any of the ``model``, ``dataset``, ``optim``, ``scheduler`` and ``topology`` sections may
name a user's class or function by ``_target_`` in place of a registered ``name``
(``docs/framework.md``, "Your own code by _target_"). :func:`resolve_targets` types such
sections with their group's target schema, so the rest of the job reads them as it reads
a registered option (``cfg.model.name`` is the ``_target_`` path, ``cfg.topology.kwargs``
the class's arguments). :func:`check_targets` then imports and builds the dataset, the model and the
scheduler on every rank before any process group exists (``validate`` builds every
optimizer and every topology, with :func:`build_topology`), so that a target that does not
import, a key that is no argument of it, a constructor that raises, or a dataset returning
something else than ``(input, target)`` pairs is one :class:`ConfigError` line on every rank:

- the dataset: both splits, checked (:mod:`experiments.data.target`), kept for the build;
- the model: built on the ``meta`` device with the data's sizes
  (:mod:`experiments.models.target`); a built-in model on a user's dataset must fit it;
- the scheduler: built over an optimizer of one probe parameter.

Example::

    cfg = resolve_targets(cfg)
    check_targets(cfg)  # one-line ConfigError, the same on every rank
    topology = build_topology(cfg.topology, world_size=4)
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig, open_dict

from decent_dp.topo import Topology, TopologyReg
from experiments.data import builtin_values
from experiments.data.schema import dataset_section
from experiments.data.target import load_splits, model_values
from experiments.instantiate import Target
from experiments.models.schema import LANGUAGE_MODELS, model_section
from experiments.models.target import check_target_model
from experiments.schema import ConfigError, is_target, require, target_section
from experiments.train.config import ALLREDUCE, TopologyTargetConfig
from experiments.train.optim import build_optim_fn, build_scheduler_fn
from experiments.train.optim_schema import OptimTargetConfig, SchedulerTargetConfig
from experiments.train.task import model_block

__all__ = ["TARGET_GROUPS", "resolve_targets", "check_targets", "build_topology"]

TARGET_GROUPS: dict[str, Callable[[Any], DictConfig]] = {
    "model": model_section,
    "dataset": dataset_section,
    "optim": lambda s: target_section(s, "optim", OptimTargetConfig),
    "scheduler": lambda s: target_section(s, "scheduler", SchedulerTargetConfig),
    "topology": lambda s: target_section(s, "topology", TopologyTargetConfig),
}
"""The groups whose section may be a ``_target_``, and how such a section is typed."""


def resolve_targets(cfg: DictConfig) -> DictConfig:
    """``cfg`` with each ``_target_`` section typed by its group's target schema.

    Args:
        cfg: The composed config.

    Returns:
        ``cfg`` itself when no section has a ``_target_``, else a copy; a config this
        function returned comes back unchanged.

    Raises:
        ConfigError: One line, for a framework key of the wrong type.
    """
    groups = [g for g in TARGET_GROUPS if is_target(cfg.get(g))]
    if not groups:
        return cfg
    typed = {g: TARGET_GROUPS[g](cfg[g]) for g in groups}
    if all(typed[g] is cfg[g] for g in groups):
        return cfg
    out = copy.deepcopy(cfg)
    with open_dict(out):
        for group, section in typed.items():
            out[group] = section
    return out


def _data_values(cfg: DictConfig) -> dict[str, int | None]:
    """What a model gets from the data, without loading a built-in dataset."""
    d = cfg.dataset
    if is_target(d):
        splits = load_splits(d, int(cfg.train.seed), keep=True)
        return model_values(splits.task, splits.input_shape, splits.num_classes, splits.vocab_size)
    return builtin_values(d, model_block(cfg.model))


def _check_builtin_model(cfg: DictConfig, values: dict[str, int | None]) -> None:
    """A registered model on a user's dataset: square images, or windows that fit ``gpt``."""
    shape = load_splits(cfg.dataset, int(cfg.train.seed), keep=True).input_shape
    if str(cfg.model.name) in LANGUAGE_MODELS:
        block, limit = values["block_size"], model_block(cfg.model)
        if block is not None and limit is not None:
            fits = f"<= model.block_size={limit}"
            require(
                f"the token windows of dataset._target_={cfg.dataset.name}",
                block,
                block <= limit,
                fits,
            )
        return
    if values["num_classes"] is None:
        return
    image = values["in_channels"] is not None and values["image_size"] is not None
    require(
        f"model={cfg.model.name} with dataset._target_",
        f"{cfg.dataset.name} (inputs of shape {shape})",
        image,
        "a dataset of square (channels, side, side) images, or a model._target_",
    )
    model_section(cfg.model, image_size=values["image_size"])


def check_targets(cfg: DictConfig) -> None:
    """Import and build the dataset, model and scheduler ``_target_`` of a resolved config.

    Nothing communicates. The optimizer and the topology, of any kind, are built by
    ``experiments.train.run.validate``.

    Args:
        cfg: The config, after :func:`resolve_targets`.

    Raises:
        ConfigError: One line naming the key and its value, the same on every rank.
    """
    if is_target(cfg.model) or is_target(cfg.dataset):
        values = _data_values(cfg)
        if is_target(cfg.model):
            check_target_model(cfg.model, values)
        else:
            _check_builtin_model(cfg, values)
    if is_target(cfg.scheduler):
        optimizer = build_optim_fn(cfg.optim)([(torch.nn.Parameter(torch.zeros(2, 2)), "probe")])
        build_scheduler_fn(cfg.scheduler, 1, 1)(optimizer)


def build_topology(section: Any, world_size: int) -> Topology | None:
    """The topology a ``topology`` section describes, for ``world_size`` ranks.

    Args:
        section: A registered topology's section or a ``_target_`` one (resolved).
        world_size: Number of ranks.

    Returns:
        The topology; ``None`` for ``allreduce`` (torch DDP).

    Raises:
        ConfigError: One line: the topology does not fit the world size, a key is no
            argument of it, a ``_target_`` that does not import or is no ``Topology``
            subclass.
    """
    if not is_target(section):
        name = str(section.name)
        if name == ALLREDUCE:
            return None
        try:
            return TopologyReg.create(
                name, world_size, section.local_world_size, **dict(section.kwargs)
            )
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"topology={name} with world size {world_size}: {exc}") from None
    target = Target.of("topology", section)
    if not (isinstance(target.obj, type) and issubclass(target.obj, Topology)):
        raise ConfigError(
            f"{target.key}={target.path} is invalid; it must name a decent_dp.topo.Topology "
            "subclass"
        )
    target.check(positional=2)
    try:
        return target.call(world_size, section.local_world_size)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (world size {world_size})") from exc.__cause__
