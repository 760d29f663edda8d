"""What a rank hands to the collectives, recorded at the ``torch.distributed`` boundary.

:func:`recording` wraps ``all_reduce``, ``all_to_all_single`` and the
all-gather into one tensor, wherever a module of ``decent_dp`` holds them
(``torch.distributed`` itself, or a module that bound the function to a name
of its own), and reports each call's input bytes and group size. The bytes a
rank *sends* follow from them by the bandwidth-optimal volume of each
collective (:func:`sent_bytes`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import torch.distributed as dist

__all__ = ["recording", "sent_bytes"]

_NAMES = ("all_reduce", "all_to_all_single", "all_gather_into_tensor", "all_gather_single")
_KIND = {
    "all_reduce": "all_reduce",
    "all_to_all_single": "all_to_all",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
}


def sent_bytes(kind: str, nbytes: int, k: int) -> Fraction:
    """Bytes one rank sends for a collective over ``k`` ranks whose input is ``nbytes``.

    A ring all-reduce sends ``2 (k-1) / k`` of the tensor; an all-to-all keeps the
    own ``1/k`` of its input; an all-gather sends the own input to ``k - 1`` ranks.
    """
    if kind == "all_reduce":
        return Fraction(2 * (k - 1) * nbytes, k)
    if kind == "all_to_all":
        return Fraction((k - 1) * nbytes, k)
    return Fraction((k - 1) * nbytes)


@contextmanager
def recording(note: Callable[[str, int, int], None]) -> Iterator[None]:
    """Call ``note(kind, input_bytes, group_size)`` on every collective started inside.

    ``kind`` is ``all_reduce``, ``all_to_all`` or ``all_gather``.
    """
    originals = {n: getattr(dist, n) for n in _NAMES if hasattr(dist, n)}
    by_id = {id(f): n for n, f in originals.items()}

    def wrapped(name: str) -> Callable[..., Any]:
        real = originals[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            tensor = args[1] if name != "all_reduce" else args[0]  # (out, in) or (tensor)
            group = kwargs.get("group")
            k = dist.get_world_size(group)
            note(_KIND[name], tensor.numel() * tensor.element_size(), k)
            return real(*args, **kwargs)

        return call

    patched: list[tuple[Any, str, Any]] = []
    holders = [dist] + [m for n, m in list(sys.modules.items()) if n.startswith("decent_dp")]
    for holder in holders:
        for attr, value in list(vars(holder).items()):
            if callable(value) and id(value) in by_id:
                patched.append((holder, attr, value))
                setattr(holder, attr, wrapped(by_id[id(value)]))
    try:
        yield
    finally:
        for holder, attr, value in patched:
            setattr(holder, attr, value)
