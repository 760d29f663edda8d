"""decent-dp: decentralized data-parallel training for PyTorch.

The public API: :class:`DecentralizedDataParallel`, the topology registry
(:class:`Topology`, :class:`TopologyReg`, :class:`Edge`) with its pure-data
analysis, the optimizer and LR-scheduler factories of :mod:`decent_dp.optim`,
the consensus metrics of :mod:`decent_dp.metrics`, and the process-group
helpers of :mod:`decent_dp.utils`.

Names are imported on first use, so ``python -m decent_dp.topo`` runs the
topology table without importing the wrapper first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "DecentralizedDataParallel": "ddp",
    "Edge": "topo",
    "Topology": "topo",
    "TopologyReg": "topo",
    "mixing_matrices": "topo",
    "spectral_gap": "topo",
    "period_contraction": "topo",
    "consensus_distance_exact": "metrics",
    "consensus_distance_sketch": "metrics",
    "count_sketch": "metrics",
    "AccumAdam": "optim",
    "AccumAdamW": "optim",
    "QGMSGD": "optim",
    "optim_fn_qgm_sgd": "optim",
    "LocalSGDTopology": "topo",
    "BaseKTopology": "topo",
    "optim_fn_sgd": "optim",
    "optim_fn_adam": "optim",
    "optim_fn_adamw": "optim",
    "optim_fn_accum_adam": "optim",
    "optim_fn_accum_adamw": "optim",
    "lr_scheduler_fn_cosine_with_warmup": "optim",
    "lr_scheduler_fn_constant": "optim",
    "lr_scheduler_fn_step": "optim",
    "initialize_dist": "utils",
    "get_device": "utils",
}
_SUBMODULES = ("ddp", "topo", "metrics", "optim", "utils", "mixing")

__all__ = [
    "DecentralizedDataParallel",
    "Edge",
    "Topology",
    "TopologyReg",
    "mixing_matrices",
    "spectral_gap",
    "period_contraction",
    "consensus_distance_exact",
    "consensus_distance_sketch",
    "count_sketch",
    "AccumAdam",
    "AccumAdamW",
    "QGMSGD",
    "optim_fn_qgm_sgd",
    "LocalSGDTopology",
    "BaseKTopology",
    "optim_fn_sgd",
    "optim_fn_adam",
    "optim_fn_adamw",
    "optim_fn_accum_adam",
    "optim_fn_accum_adamw",
    "lr_scheduler_fn_cosine_with_warmup",
    "lr_scheduler_fn_constant",
    "lr_scheduler_fn_step",
    "initialize_dist",
    "get_device",
]

if TYPE_CHECKING:
    from .ddp import DecentralizedDataParallel
    from .metrics import consensus_distance_exact, consensus_distance_sketch, count_sketch
    from .optim import (
        QGMSGD,
        AccumAdam,
        AccumAdamW,
        lr_scheduler_fn_constant,
        lr_scheduler_fn_cosine_with_warmup,
        lr_scheduler_fn_step,
        optim_fn_accum_adam,
        optim_fn_accum_adamw,
        optim_fn_adam,
        optim_fn_adamw,
        optim_fn_qgm_sgd,
        optim_fn_sgd,
    )
    from .topo import (
        BaseKTopology,
        Edge,
        LocalSGDTopology,
        Topology,
        TopologyReg,
        mixing_matrices,
        period_contraction,
        spectral_gap,
    )
    from .utils import get_device, initialize_dist


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'decent_dp' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(list(_EXPORTS) + list(_SUBMODULES) + ["__version__"])
