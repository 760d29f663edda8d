"""The state dicts of :class:`~decent_dp.ddp.DecentralizedDataParallel`.

The model's state dict carries the wrapped module's own keys (no wrapper or
``torch.compile`` prefix), and loading it restarts the gossip from the loaded
values; the training state (per-bucket optimizers and schedulers, the step,
the scaler, compression references and the outer optimizer) is the engine's.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..topo import Topology
from .engine import Engine

__all__ = ["StateDictMixin"]


class StateDictMixin:
    """The checkpoint methods of :class:`~decent_dp.ddp.DecentralizedDataParallel`."""

    _engine: Engine
    _plain: nn.Module
    _world_size: int
    topology: Topology

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's state dict, with its own keys (no wrapper or compile prefix).

        ``torch.compile(wrapper).state_dict()`` gives the same keys, so that a
        checkpoint loads into compiled and eager runs alike.
        """
        if kwargs.get("prefix") == "_orig_mod.":
            kwargs["prefix"] = ""  # called by torch.compile's wrapper around this one
        return self._plain.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load into the wrapped module in place; gossip restarts from the loaded values."""
        if assign:
            raise ValueError(
                "assign=True would detach parameters from their buckets; use assign=False"
            )
        engine = self._engine
        engine.drain()
        result = self._plain.load_state_dict(state_dict, strict=strict)
        if engine.buckets is not None:
            engine.forget_gossip()
            engine.relaunch = engine.step_count > 0
        return result

    def training_state_dict(self) -> dict[str, Any]:
        """Per-bucket optimizer and scheduler states, the step counter, the scaler and the bucket layout."""
        return self._engine.training_state()

    def load_training_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`training_state_dict`; load the model's ``state_dict`` too.

        The gossip that was in flight when the state was saved is relaunched
        from the current parameters before the next forward pass, so a resumed
        run repeats an uninterrupted one exactly.

        Raises:
            ValueError: The state was saved with another world size or topology.
        """
        if (
            state.get("world_size") != self._world_size
            or state.get("topology") != self.topology.name
        ):
            raise ValueError(
                f"training state was saved with world_size={state.get('world_size')} "
                f"topology={state.get('topology')}; this run has world_size={self._world_size} "
                f"topology={self.topology.name}"
            )
        self._engine.load_training_state(state)
