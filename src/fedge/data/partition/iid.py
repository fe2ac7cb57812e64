"""IID partition: a seeded shuffle cut into ``num_clients`` pieces as even as possible."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedge.core.rng import PortableGenerator
from fedge.data.partition._common import even_sizes

__all__ = ["DEFAULTS", "split", "validate"]

DEFAULTS: dict[str, Any] = {}


def validate(params: Mapping[str, Any]) -> dict[str, Any]:
    return {}


def split(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator | PortableGenerator,
    *,
    domains: np.ndarray | None,
) -> np.ndarray:
    """Owner of each sample: client sizes differ by at most one."""
    owner = np.empty(len(labels), dtype=np.int64)
    owner[rng.permutation(len(labels))] = np.repeat(
        np.arange(num_clients), even_sizes(len(labels), num_clients)
    )
    return owner
