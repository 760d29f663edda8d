"""The ``outer`` config group: an outer optimizer over the wrapper's topology (DiLoCo, SlowMo).

``outer=none`` (the default) trains as before. ``outer=average`` is a periodic global
average: every ``every`` steps every worker continues from the workers' exact mean
(outer SGD with lr 1 and no momentum, so ``x_outer`` becomes ``xbar``). ``outer=diloco``
and ``outer=slowmo``
give the wrapper an ``outer_optim_fn`` (torch SGD with the section's ``lr``,
``momentum`` and ``nesterov``) and ``outer_every`` (``every``): every ``every``
steps the workers' exact average ``xbar`` gives the outer gradient
``x_outer - xbar``, the outer copy takes one SGD step and every worker continues
from it (see :class:`decent_dp.DecentralizedDataParallel`). ``every: null`` takes
the period of ``topology=local-sgd``, whose averaging round is then the outer
round at no extra communication; other topologies need an explicit ``every``.
``fragments`` (1 by default) staggers the outer rounds: the wrapper's buckets
are dealt to ``fragments`` groups whose schedules are shifted by
``every / fragments`` steps each (streaming DiLoCo on ``local-sgd``, streaming
SlowMo on a gossip topology; the wrapper's ``outer_fragments``).
``compression`` (``none``, ``bf16`` or ``int8``) compresses what the outer rounds
send: each worker's ``x_outer - x_i`` (the wrapper's ``outer_compression``).
``scale_by_inner_lr`` (off by default) takes SlowMo's own update under a
schedule: the outer gradient divided by the inner learning rate of the outer
step, the outer step multiplied by it (the wrapper's ``outer_scale_by_inner_lr``).
The ``allreduce`` baseline (torch DDP) has no outer optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from experiments.schema import name_enum, require, require_number, typed_section

__all__ = [
    "OuterName",
    "OuterConfig",
    "SCHEMAS",
    "outer_section",
    "outer_every",
    "outer_kwargs",
]

OuterName = name_enum("OuterName", ["none", "diloco", "slowmo", "average"], __name__)

_COMPRESSIONS = ("none", "bf16", "int8")
_LOCAL_SGD = "local-sgd"
_ALLREDUCE = "allreduce"


@dataclass
class OuterConfig:
    """``outer`` group: the outer optimizer, SGD on the outer copy every ``every`` steps.

    It checks its own values when built; what depends on the topology (``every: null``,
    ``allreduce``) is :func:`outer_every`'s.

    Attributes:
        name: ``none``, ``diloco`` or ``slowmo`` (the same update, with their
            published hyper-parameters).
        every: Steps between outer steps ``H``; ``None`` takes ``topology.kwargs.period``
            of ``topology=local-sgd`` and is an error on other topologies.
        lr: The outer learning rate.
        momentum: The outer momentum.
        nesterov: Nesterov momentum.
        fragments: Streaming outer rounds: the number of fragments (a divisor of
            ``every``) whose outer rounds are staggered by ``every / fragments``
            steps; 1 takes every bucket at once.
        compression: ``none``, ``bf16`` or ``int8``: what an outer round sends of
            each worker's ``x_outer - x_i`` (``none`` the exact all-reduce).
        scale_by_inner_lr: SlowMo's update: step on ``(x_outer - xbar) / gamma_t``
            with ``lr * gamma_t``, ``gamma_t`` the inner learning rate then.
    """

    name: OuterName = OuterName["none"]  # type: ignore[valid-type]
    every: int | None = None
    lr: float = 1.0
    momentum: float = 0.0
    nesterov: bool = False
    fragments: int = 1
    compression: str = "none"
    scale_by_inner_lr: bool = False

    def __post_init__(self) -> None:
        frags, scaled = self.fragments, self.scale_by_inner_lr
        if self.name == "none":  # none of the keys of an outer round may be set
            require("outer.fragments", frags, frags == 1, "1 with outer=none")
            none = self.compression == "none"
            require("outer.compression", self.compression, none, "none with outer=none")
            require("outer.scale_by_inner_lr", scaled, not scaled, "false with outer=none")
            return
        require_number("outer.lr", self.lr, at_least=0)
        require_number("outer.momentum", self.momentum, at_least=0, below=1)
        nesterov = not self.nesterov or self.momentum > 0
        require("outer.nesterov", self.nesterov, nesterov, "false with momentum 0")
        require_number("outer.every", self.every, at_least=1, kind="integer", nullable=True)
        require_number("outer.fragments", frags, at_least=1, kind="integer")
        known = self.compression in _COMPRESSIONS
        require("outer.compression", self.compression, known, "none, bf16 or int8")


SCHEMAS: dict[str, type] = {name: OuterConfig for name in ("none", "diloco", "slowmo", "average")}


def outer_section(section: Any) -> Any:
    """The ``outer`` section with its schema's defaults (``None`` reads as ``outer=none``)."""
    return typed_section(section, "outer", SCHEMAS, "none")


def outer_every(section: Any, topology: Any) -> int | None:
    """``H`` of the ``outer`` section under ``topology``, checked; ``None`` for ``outer=none``.

    Args:
        section: The ``outer`` section (or ``None``).
        topology: The ``topology`` section.

    Raises:
        ConfigError: One line naming the bad key: the section's own (see
            :class:`OuterConfig`), ``every: null`` on a topology other than ``local-sgd``
            (or a ``period`` of it that is not an integer >= 1), ``fragments`` that do not
            divide ``every``, or an outer optimizer with ``topology=allreduce``.
    """
    o = outer_section(section)
    if str(o.name) == "none":
        return None
    topo = str(topology.name)
    require("outer.name", o.name, topo != _ALLREDUCE, "none with topology=allreduce (torch DDP)")
    every = o.every
    if every is None:
        require(
            "outer.every",
            None,
            topo == _LOCAL_SGD,
            f"an integer >= 1 with topology={topo} (null takes the period of local-sgd)",
        )
        every = dict(topology.get("kwargs") or {}).get("period", 8)  # local-sgd's default
        require_number("outer.every", every, at_least=1, kind="integer")
    divisor = f"a divisor of outer.every={int(every)}"
    require("outer.fragments", o.fragments, int(every) % o.fragments == 0, divisor)
    return int(every)


def outer_kwargs(section: Any, topology: Any) -> dict[str, Any]:
    """The wrapper's ``outer_optim_fn``, ``outer_every``, ``outer_fragments``,
    ``outer_compression`` and ``outer_scale_by_inner_lr``; ``{}`` for none.

    Example::

        ddp = DecentralizedDataParallel(model, optim_fn, **outer_kwargs(cfg.outer, cfg.topology))
    """
    every = outer_every(section, topology)
    if every is None:
        return {}
    o = outer_section(section)
    fn = partial(
        torch.optim.SGD, lr=float(o.lr), momentum=float(o.momentum), nesterov=bool(o.nesterov)
    )
    return {
        "outer_optim_fn": fn,
        "outer_every": every,
        "outer_fragments": int(o.fragments),
        "outer_compression": str(o.compression),
        "outer_scale_by_inner_lr": bool(o.scale_by_inner_lr),
    }
