"""The ``state_sync=`` option: which optimizer states the wrapper gossips with the parameters.

With ``state_sync={"exp_avg_sq": K}``, every ``K``-th step each bucket's
gossip also carries the named state tensors of its optimizer, and the
optimizer steps from the mixed state (the mechanism is the wrapper's, in its
engine). This module holds the check of the option itself, which needs no
process group, so that a configuration can be checked before any worker
starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["check_state_sync"]


def check_state_sync(spec: Any) -> dict[str, int]:
    """Check a ``state_sync`` option: optimizer state names, each with its period.

    Args:
        spec: ``{state name: K}`` (``K`` an int >= 1: the state is mixed every
            ``K``-th step), or ``None`` for no optimizer state.

    Returns:
        The checked ``{name: K}``; ``{}`` for ``None``.

    Raises:
        ValueError: ``spec`` is no mapping, a name is not a non-empty string, or
            a period is not an int >= 1.
    """
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"state_sync={spec!r}: give a mapping of optimizer state names to periods, "
            "e.g. {'exp_avg_sq': 1}"
        )
    out: dict[str, int] = {}
    for name, k in spec.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"state_sync names must be optimizer state names, got {name!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"state_sync[{name!r}]={k!r}: the period must be an int >= 1")
        out[name] = int(k)
    return out
