"""Keep freed gradient memory inside the process on CPU (glibc's malloc only).

The wrapper drops every gradient after its bucket's step, so that the next
backward hands its own tensors over without an accumulation pass. On CPU,
glibc gives such large freed blocks back to the kernel (``munmap``, or a trim
of the heap top), and the next backward page-faults them in again,
zero-filled: thousands of minor faults per step, as costly as the zeroing
pass that was saved. Raising glibc's mmap and trim thresholds once keeps
those blocks for reuse.

The setting is process-wide. It is applied only on Linux with glibc, never
when the user tuned malloc through the environment (``MALLOC_*_`` variables
or ``GLIBC_TUNABLES``), and not at all with ``DECENT_DP_KEEP_FREED_MEMORY=0``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

__all__ = ["keep_freed_memory"]

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's upper limit on 64-bit systems
_USER_KNOBS = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "GLIBC_TUNABLES",
)
_applied_trim = 0


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory(nbytes: int) -> bool:
    """Let glibc keep about ``2 * nbytes`` (at least 128 MiB) of freed memory; True if set.

    Calls only ever raise the kept amount, so several wrappers in one process
    keep what the largest needs.
    """
    global _applied_trim
    if os.environ.get("DECENT_DP_KEEP_FREED_MEMORY", "1") == "0":
        return False
    if any(k in os.environ for k in _USER_KNOBS):
        return False
    trim = max(2 * int(nbytes), 128 * 1024 * 1024)
    if trim <= _applied_trim:
        return True
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1
    ok = ok and libc.mallopt(_M_TRIM_THRESHOLD, min(trim, 2**31 - 1)) == 1
    if ok:
        _applied_trim = trim
        logger.debug("glibc malloc keeps up to %d MiB of freed memory", trim >> 20)
    return ok
