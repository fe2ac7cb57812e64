"""Process-wide heap policy: keep freed memory for reuse instead of returning it to the OS.

glibc serves blocks of 128 KiB and more by fresh ``mmap`` calls and gives them back with
``munmap`` when freed, and it trims the heap top as soon as 128 KiB are free. A forward pass
allocates and frees activations of hundreds of KiB to a few MiB every layer, so by default
each forward maps, page-faults (zero-fills) and unmaps them again. Measured here (1 thread,
batch 64, see docs/benchmarks.md): up to 2x forward time on large models, 10-20% on LeNet.

:func:`retain_freed_memory` raises the mmap threshold to glibc's ceiling (32 MiB on 64-bit)
and disables trimming, so the pages stay mapped and are reused. The cost is resident memory
that stays at its high-water mark rather than shrinking between steps. The same effect from
outside the process: ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=2147483647``.
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
