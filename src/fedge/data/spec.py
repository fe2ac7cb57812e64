"""What a dataset loader returns (``RawData``) and how it is registered (``DatasetSpec``).

A loader only reads files (or generates data) and returns raw arrays; the shared pipeline in
:mod:`fedge.data.registry` turns them into a normalized :class:`~fedge.data.dataset.Dataset`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

import numpy as np

from fedge.core.errors import ConfigError

__all__ = ["DatasetSpec", "Loader", "Locator", "RawData", "check_int"]


@dataclass(frozen=True, eq=False)
class RawData:
    """Raw splits as read from disk (shared, read-only arrays: never modify them).

    Attributes:
        x_train: (N, C, H, W) uint8 or float32 images, or (N, F) float32 tabular features.
        y_train: (N,) int64 labels in ``[0, len(classes))``.
        x_test: (M, C, H, W), same dtype as ``x_train``.
        y_test: (M,) int64.
        classes: label names, index = label.
        scale: divisor mapping pixel values to [0, 1] (255 for uint8 images, 16 for digits).
        source: where the data came from, for the record of a run.
        train_domains: (N,) domain key per training sample, or None.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: tuple[str, ...]
    scale: float
    source: str
    train_domains: np.ndarray | None = None


# A loader is called ``load(root=..., seed=..., **options)`` and a locator ``locate(root=..., **options)``,
# all keyword-only (root: str | Path | None, seed: int), where ``options`` are the dataset's own keywords
# (``DatasetSpec.options``). Each dataset names its options as explicit keyword parameters
# (``split: str = "balanced"``), which no Protocol with ``**options`` admits, so the aliases fix only the
# return type.
Loader: TypeAlias = Callable[..., RawData]
Locator: TypeAlias = Callable[..., "str | None"]


@dataclass(frozen=True)
class DatasetSpec:
    """A registry entry.

    Attributes:
        name: registry name.
        description: one line for ``fedge datasets``.
        load: reads the data (raises DataNotFoundError when the files are missing).
        locate: where the files are, or None when missing; never raises for missing files.
        how_to_get: how to obtain the files (shown by ``fedge datasets`` and in errors).
        options: dataset-specific options of ``load_dataset`` and their defaults.
    """

    name: str
    description: str
    load: Loader
    locate: Locator
    how_to_get: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


def check_int(dataset: str, key: str, value: Any, *, low: int, fix: str = "") -> int:
    """``value`` as an int >= ``low``, else a ConfigError naming the option."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(
            f"dataset {dataset!r}: option {key} must be an integer >= {low}, got {value!r}"
            + (f"; {fix}" if fix else "")
        )
    return int(value)
