"""What this machine can do, and whether it is doing something else: the one-thread peak
(:func:`one_thread_peak`) and a load probe (:func:`load_probe`, :func:`busy_warnings`).
Design notes: docs/decisions.md#benchmarks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from fedge.core.allocator import retain_freed_memory

__all__ = [
    "BUSY_SPREAD",
    "busy_warnings",
    "conv_peak_gflops",
    "load_probe",
    "matmul_peak_gflops",
    "one_thread_peak",
    "retain_freed_memory",
    "usable_cores",
]

# A 1-thread reference timing that moves by more than this factor means other work ran.
BUSY_SPREAD = 1.25


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _best(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-call costs (oneDNN primitive creation, page faults)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of ``torch.mm`` on two ``n × n`` float32 matrices (best of ``repeats``), at the
    current torch thread count."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    out = torch.empty(n, n)
    return 2 * n**3 / _best(lambda: torch.mm(a, b, out=out), repeats) / 1e9


def conv_peak_gflops(repeats: int = 5) -> float:
    """GFLOP/s of a 3×3 convolution, 64 -> 64 channels on a 64×64×16×16 batch (padding 1: the
    shape of a wide ResNet's middle stage), best of ``repeats``, at the current thread count."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 64, 16, 16, generator=g), torch.randn(64, 64, 3, 3, generator=g)
    flops = 2 * 64 * 64 * 16 * 16 * 64 * 9
    with torch.no_grad():
        return flops / _best(lambda: F.conv2d(x, w, padding=1), repeats) / 1e9


def one_thread_peak(repeats: int = 5) -> dict[str, float]:
    """The float32 peak of one core: 1-thread matmul (1024²) and conv GFLOP/s, and their max.

    The thread count is set to 1 for the measurement and restored after.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mm, conv = matmul_peak_gflops(1024, repeats), conv_peak_gflops(repeats)
    finally:
        torch.set_num_threads(threads)
    return {"matmul": mm, "conv": conv, "peak": max(mm, conv)}


def load_probe(repeats: int = 5) -> dict[str, Any]:
    """A quick look at contention: the 1-minute load average and a 1-thread reference matmul
    (512², a few ms) timed ``repeats`` times; ``spread`` = slowest / fastest."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
        torch.mm(a, b)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "load_1min": load,
        "cores": usable_cores(),
        "matmul_512_s": min(times),
        "spread": max(times) / min(times),
        "repeats": repeats,
    }


def busy_warnings(
    before: dict[str, Any],
    after: dict[str, Any],
    *,
    threads: int,
    peak_before: float,
    peak_after: float,
) -> list[str]:
    """Why this run's timings may not show the machine's speed (empty if nothing was seen).

    ``before``/``after`` are :func:`load_probe` results taken at the start and the end of the
    run, ``peak_before``/``peak_after`` the 1-thread peak measured at both ends: other work shows
    as a load average that leaves fewer idle cores than the run's threads, a reference timing
    that spreads within a probe, or a peak that moved between the ends.
    """
    out = []
    cores = before["cores"]
    for when, probe in (("start", before), ("end", after)):
        load = probe["load_1min"]
        if load is not None and load + threads > cores + 0.5:
            out.append(
                f"machine busy at the {when}: 1-minute load average {load:.2f} on {cores} cores "
                f"leaves fewer than {threads} idle; timings with {threads} thread(s) are slowed"
            )
        if probe["spread"] > BUSY_SPREAD:
            out.append(
                f"machine busy at the {when}: a 1-thread reference matmul varied "
                f"{probe['spread']:.2f}x over {probe['repeats']} runs (> {BUSY_SPREAD}x)"
            )
    moved = max(peak_before, peak_after) / min(peak_before, peak_after)
    if moved > BUSY_SPREAD:
        out.append(
            f"machine busy during the run: the 1-thread peak moved {moved:.2f}x between start "
            f"({peak_before:.0f} GFLOP/s) and end ({peak_after:.0f} GFLOP/s)"
        )
    return out
