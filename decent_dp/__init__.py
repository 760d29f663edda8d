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

__version__ = "0.3.0"

_EXPORTS = {
    "DecentralizedDataParallel": "ddp",
    "PackedWorkers": "packed",
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
    "LaggedVAdamW": "optim",
    "optim_fn_qgm_sgd": "optim",
    "LocalSGDTopology": "topo",
    "BaseKTopology": "topo",
    "optim_fn_sgd": "optim",
    "optim_fn_adam": "optim",
    "optim_fn_adamw": "optim",
    "optim_fn_accum_adam": "optim",
    "optim_fn_accum_adamw": "optim",
    "optim_fn_lagged_v_adamw": "optim",
    "lr_scheduler_fn_cosine_with_warmup": "optim",
    "lr_scheduler_fn_constant": "optim",
    "lr_scheduler_fn_step": "optim",
    "initialize_dist": "utils",
    "get_device": "utils",
    "save_sharded_checkpoint": "sharded",
    "load_sharded_checkpoint": "sharded",
}
_SUBMODULES = ("ddp", "topo", "metrics", "optim", "utils", "mixing", "packed")

# the names above, in that order, each imported from its module on first use
__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    # "X as X": re-exported for type checkers, which do not run __getattr__
    from .ddp import DecentralizedDataParallel as DecentralizedDataParallel
    from .metrics import consensus_distance_exact as consensus_distance_exact
    from .metrics import consensus_distance_sketch as consensus_distance_sketch
    from .metrics import count_sketch as count_sketch
    from .optim import QGMSGD as QGMSGD
    from .optim import AccumAdam as AccumAdam
    from .optim import AccumAdamW as AccumAdamW
    from .optim import LaggedVAdamW as LaggedVAdamW
    from .optim import lr_scheduler_fn_constant as lr_scheduler_fn_constant
    from .optim import lr_scheduler_fn_cosine_with_warmup as lr_scheduler_fn_cosine_with_warmup
    from .optim import lr_scheduler_fn_step as lr_scheduler_fn_step
    from .optim import optim_fn_accum_adam as optim_fn_accum_adam
    from .optim import optim_fn_accum_adamw as optim_fn_accum_adamw
    from .optim import optim_fn_adam as optim_fn_adam
    from .optim import optim_fn_adamw as optim_fn_adamw
    from .optim import optim_fn_lagged_v_adamw as optim_fn_lagged_v_adamw
    from .optim import optim_fn_qgm_sgd as optim_fn_qgm_sgd
    from .optim import optim_fn_sgd as optim_fn_sgd
    from .packed import PackedWorkers as PackedWorkers
    from .sharded import load_sharded_checkpoint as load_sharded_checkpoint
    from .sharded import save_sharded_checkpoint as save_sharded_checkpoint
    from .topo import BaseKTopology as BaseKTopology
    from .topo import Edge as Edge
    from .topo import LocalSGDTopology as LocalSGDTopology
    from .topo import Topology as Topology
    from .topo import TopologyReg as TopologyReg
    from .topo import mixing_matrices as mixing_matrices
    from .topo import period_contraction as period_contraction
    from .topo import spectral_gap as spectral_gap
    from .utils import get_device as get_device
    from .utils import initialize_dist as initialize_dist


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
