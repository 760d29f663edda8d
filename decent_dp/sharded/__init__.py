"""The wrapper over a 2-D ``DeviceMesh`` (``device_mesh=``), and its checkpoints.

:func:`save_sharded_checkpoint` and :func:`load_sharded_checkpoint`
(:mod:`decent_dp.sharded.checkpoint`) write and read one replica per directory
through ``torch.distributed.checkpoint``. The wrapper itself is
:class:`~decent_dp.ddp.DecentralizedDataParallel` given a ``device_mesh``;
what it builds then is this package's.
"""

from __future__ import annotations

from .checkpoint import load_sharded_checkpoint, save_sharded_checkpoint

__all__ = ["load_sharded_checkpoint", "save_sharded_checkpoint"]
