"""Shared pieces of the partitioners: parameter checks and the ``owner`` array (the client of each
sample, so each sample is assigned exactly once by construction), which
:func:`parts_from_owner` turns into one sorted index array per client.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedge.core.errors import ConfigError

__all__ = ["check_bool", "check_float", "check_int", "even_sizes", "parts_from_owner"]


def check_int(partitioner: str, key: str, value: Any, *, low: int, fix: str) -> int:
    """``value`` as an int >= ``low``, else a ConfigError naming parameter, value, range, fix."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(
            f"partitioner {partitioner!r}: {key} must be an integer >= {low}, got {value!r}; {fix}"
        )
    return int(value)


def check_float(partitioner: str, key: str, value: Any, *, fix: str) -> float:
    """``value`` as a finite float > 0, else a ConfigError."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"partitioner {partitioner!r}: {key} must be a finite number > 0, got {value!r}; {fix}"
        )
    return float(value)


def check_bool(partitioner: str, key: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(
            f"partitioner {partitioner!r}: {key} must be true or false, got {value!r}"
        )
    return bool(value)


def parts_from_owner(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Sorted int64 index arrays, one per client, from ``owner`` (N,) with values in [0, C)."""
    order = np.argsort(owner, kind="stable")  # stable: indices stay increasing per client
    counts = np.bincount(owner, minlength=num_clients)
    return [part.astype(np.int64) for part in np.split(order, np.cumsum(counts)[:-1])]


def even_sizes(n: int, k: int) -> np.ndarray:
    """Sizes of ``k`` pieces of ``n`` items, as even as possible (the first n % k get one more)."""
    return np.full(k, n // k, dtype=np.int64) + (np.arange(k) < n % k)
