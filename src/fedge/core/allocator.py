"""Process-wide heap policy: :func:`retain_freed_memory` keeps freed memory mapped for reuse
instead of returning it to the OS (glibc's mmap and trim thresholds). Design notes: docs/decisions.md#core.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["MMAP_MAX_THRESHOLD", "retain_freed_memory"]

# glibc mallopt parameters (malloc.h): M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_MAX_THRESHOLD = 32 * 1024 * 1024  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def retain_freed_memory() -> bool:
    """Make glibc keep freed heap memory for reuse instead of returning it to the OS.

    Raises the mmap threshold to its maximum (32 MiB: smaller blocks come from the heap, not from
    fresh mmaps) and disables trimming of the heap top. A process-wide setting that cannot be
    undone; True if glibc accepted both, False elsewhere (musl, macOS: nothing is changed).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, MMAP_MAX_THRESHOLD) == 1
    ok_trim = mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    return ok_mmap and ok_trim
