"""Number formats of reports and comparisons.

Bytes in decimal units (1 MB = 10^6 B) with the exact count beside them on request, FLOPs with
SI prefixes, accuracy (logged as a fraction) in percent, durations in s / min / h.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "DASH",
    "NOT_MEASURED",
    "format_accuracy",
    "format_bytes",
    "format_duration",
    "format_flops",
    "format_number",
]

DASH = "—"
_DASH = DASH
#: what a figure that was not measured shows (e.g. FLOPs under ``measure.flops=false``)
NOT_MEASURED = "not measured"


def _si(n: float, units: Sequence[tuple[float, str]], base_unit: str) -> str:
    sign, a = ("-" if n < 0 else ""), abs(n)
    for div, name in units:
        if a >= div:
            v = a / div
            digits = 0 if v >= 100 else 1 if v >= 10 else 2
            return f"{sign}{v:.{digits}f} {name}"
    return f"{sign}{a:g} {base_unit}".rstrip()


_BYTE_UNITS = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
_FLOP_UNITS = (
    (1e18, "EFLOP"),
    (1e15, "PFLOP"),
    (1e12, "TFLOP"),
    (1e9, "GFLOP"),
    (1e6, "MFLOP"),
    (1e3, "kFLOP"),
)


def _count(
    n: float | None,
    units: Sequence[tuple[float, str]],
    base_unit: str,
    *,
    exact: bool,
    exact_unit: str,
) -> str:
    """``n`` in SI units (a dash for None); with ``exact``, the exact count (from 1000 up) after it."""
    if n is None:
        return _DASH
    text = _si(n, units, base_unit)
    if exact and abs(n) >= 1000:
        text += f" ({int(n):,}{exact_unit})"
    return text


def format_bytes(n: float | None, *, exact: bool = False) -> str:
    """Human-readable byte count in decimal units: ``format_bytes(1_234_567) == "1.23 MB"``.

    Args:
        n: a byte count (``None`` gives a dash).
        exact: append the exact count: ``"1.23 MB (1,234,567 B)"``.
    """
    return _count(n, _BYTE_UNITS, "B", exact=exact, exact_unit=" B")


def format_flops(n: float | None, *, exact: bool = False) -> str:
    """Human-readable FLOP count: ``format_flops(2.5e9) == "2.50 GFLOP"``.

    Args:
        n: a FLOP count (``None``, FLOPs not counted (``measure.flops=false``), gives
            ``"not measured"``: never 0, never a dash that reads as nothing).
        exact: append the exact count: ``"2.50 GFLOP (2,500,000,000)"``.
    """
    if n is None:
        return NOT_MEASURED
    return _count(n, _FLOP_UNITS, "FLOP", exact=exact, exact_unit="")


def format_accuracy(acc: float | None) -> str:
    """An accuracy logged as a fraction, in percent: ``format_accuracy(0.8765) == "87.65%"``."""
    return _DASH if acc is None else f"{100 * acc:.2f}%"


def format_duration(seconds: float | None) -> str:
    """``"12.3 s"``, ``"4 min 05 s"`` or ``"2 h 03 min"``."""
    if seconds is None:
        return _DASH
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(round(seconds), 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def format_number(v: Any, digits: int = 4) -> str:
    if v is None:
        return _DASH
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)
