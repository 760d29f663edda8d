"""decent-dp: decentralized data-parallel training for PyTorch.

The public API: :class:`DecentralizedDataParallel`, the topology registry
(:class:`Topology`, :class:`TopologyReg`, :class:`Edge`), the optimizer and
LR-scheduler factories of :mod:`decent_dp.optim`, and the consensus metrics of
:mod:`decent_dp.metrics`.
"""

from . import optim, utils
from .ddp import DecentralizedDataParallel
from .metrics import consensus_distance_exact, consensus_distance_sketch, count_sketch
from .optim import (
    AccumAdam,
    lr_scheduler_fn_constant,
    lr_scheduler_fn_cosine_with_warmup,
    lr_scheduler_fn_step,
    optim_fn_accum_adam,
    optim_fn_accum_adamw,
    optim_fn_adam,
    optim_fn_adamw,
    optim_fn_sgd,
)
from .topo import Edge, Topology, TopologyReg, mixing_matrices, period_contraction, spectral_gap
from .utils import get_device, initialize_dist

__version__ = "0.1.0"

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
    "optim",
    "utils",
]
