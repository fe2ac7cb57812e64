"""Which machine ran which rounds of a run (``sessions.jsonl``, :func:`machine`,
:func:`segments`): the provenance a reproduction's reader needs. Design notes: docs/decisions.md#experiment-and-reports.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
from functools import cache
from pathlib import Path
from typing import Any

import torch

__all__ = ["machine", "segments"]

# The widest x86 vector extension decides which oneDNN/ATen kernels run, hence the roundoff.
_ISA_FLAGS = ("avx512f", "avx2", "avx")


# Keys that differ between sessions on one machine (when, and which cores it was pinned to).
_PER_SESSION = ("started_utc", "usable_cores")


@cache
def _cpu(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, str | None]:
    """(CPU model name, widest vector extension among ``_ISA_FLAGS`` or None) of this machine."""
    model, flags = "", set[str]()
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
            if model and flags:
                break
    except OSError:  # not Linux: what platform knows
        pass
    model = model or platform.processor() or platform.machine() or "unknown"
    return model, next((f for f in _ISA_FLAGS if f in flags), None)


def _fedge_version() -> str:
    """The installed distribution's version (read from its metadata: this layer does not import
    the top-level package); "not installed" when fedge runs from a source tree on PYTHONPATH."""
    try:
        return importlib.metadata.version("fedge")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    """This machine and software, as one ``sessions.jsonl`` line records it (JSON-ready)."""
    cpu, isa = _cpu()
    return {
        "cpu": cpu,
        "isa": isa,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "fedge": _fedge_version(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def segments(sessions: list[dict[str, Any]], rounds: int) -> list[dict[str, Any]]:
    """The rounds 1..``rounds`` split by the session that last ran each: ``[{"rounds": [a, b],
    "machine": {...} or None}, ...]``, in round order.

    ``sessions``: the ``sessions.jsonl`` lines, ``{"first_round": r, "machine": {...}}``, in the
    order they were written. A later session that starts at or before an earlier one's rounds
    (a run resumed from an older checkpoint, or a divergence rerun) replaces those rounds; rounds
    no session claims are ``"machine": None``. Adjacent segments on the same machine (start time
    and pinned cores aside) are merged: one machine resumed twice is one segment.
    """
    by_round: list[dict[str, Any] | None] = [None] * rounds
    for s in sessions:
        first = int(s["first_round"])
        for r in range(max(first, 1), rounds + 1):
            by_round[r - 1] = s.get("machine")
    out: list[dict[str, Any]] = []
    for r, m in enumerate(by_round, start=1):
        if out and _same_machine(out[-1]["machine"], m):
            out[-1]["rounds"][1] = r
        else:
            out.append({"rounds": [r, r], "machine": m})
    return out


def _same_machine(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    strip = lambda m: {k: v for k, v in m.items() if k not in _PER_SESSION}  # noqa: E731
    return strip(a) == strip(b)
