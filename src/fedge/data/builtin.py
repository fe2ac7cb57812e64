"""Datasets that need no files: scikit-learn's ``digits`` (a fixed 1437/360 split) and a seeded
Gaussian class-conditional ``synthetic`` task. Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedge.core.errors import ConfigError
from fedge.core.rng import numpy_rng
from fedge.data.dataset import stratified_subset
from fedge.data.spec import DatasetSpec, Locator, RawData, check_int

__all__ = ["SPECS", "load_digits", "load_synthetic"]

_DIGITS_SPLIT_SEED = 0  # never change: it defines the digits test set
_DIGITS_TEST_SIZE = 360


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits as sk_load_digits  # import lazily: sklearn is slow

    bunch = sk_load_digits()
    x = bunch.images.astype(np.uint8)[:, None]  # (1797, 1, 8, 8), values 0..16
    y = bunch.target.astype(np.int64)
    test = stratified_subset(
        y, _DIGITS_TEST_SIZE, numpy_rng(_DIGITS_SPLIT_SEED, "data", "digits", "test-split")
    )
    train = np.setdiff1d(np.arange(len(y)), test)
    out = (x[train], y[train], x[test], y[test])
    for a in out:
        a.flags.writeable = False
    return out


def load_digits(*, root: str | Path | None, seed: int) -> RawData:
    x_tr, y_tr, x_te, y_te = _digits()
    return RawData(x_tr, y_tr, x_te, y_te, tuple(str(d) for d in range(10)), 16.0, "scikit-learn")


def _check_shape(shape: object) -> tuple[int, int, int]:
    if (
        not isinstance(shape, Sequence)
        or len(shape) != 3
        or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1 for s in shape
        )
    ):
        raise ConfigError(
            f"dataset 'synthetic': option shape must be three positive integers (C, H, W), "
            f"got {shape!r}; e.g. shape=(1, 8, 8)"
        )
    c, h, w = (int(s) for s in shape)
    return c, h, w


def load_synthetic(
    *,
    root: str | Path | None,
    seed: int,
    num_train: int = 600,
    num_test: int = 200,
    shape: Sequence[int] = (1, 8, 8),
    num_classes: int = 10,
    noise: float = 1.0,
    num_domains: int = 0,
) -> RawData:
    """Gaussian class-conditional images; see the module docstring for the model."""
    num_train = check_int("synthetic", "num_train", num_train, low=1)
    num_test = check_int("synthetic", "num_test", num_test, low=1)
    num_classes = check_int("synthetic", "num_classes", num_classes, low=2)
    num_domains = check_int(
        "synthetic", "num_domains", num_domains, low=0, fix="0 disables domains"
    )
    c, h, w = _check_shape(shape)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not noise >= 0:
        raise ConfigError(f"dataset 'synthetic': option noise must be a number >= 0, got {noise!r}")

    mu = numpy_rng(seed, "data", "synthetic", "means").standard_normal((num_classes, c, h, w))
    delta = 0.5 * numpy_rng(seed, "data", "synthetic", "domains").standard_normal(
        (max(num_domains, 1), c, h, w)
    )

    def draw(split: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        rng = numpy_rng(seed, "data", "synthetic", split)
        y = rng.permutation(np.arange(n) % num_classes)  # balanced classes, random order
        x = mu[y] + float(noise) * rng.standard_normal((n, c, h, w))
        d = None
        if num_domains:
            d = rng.integers(num_domains, size=n)
            x += delta[d]
        return x.astype(np.float32), y.astype(np.int64), d

    x_tr, y_tr, d_tr = draw("train", num_train)
    x_te, y_te, _ = draw("test", num_test)
    return RawData(
        x_tr,
        y_tr,
        x_te,
        y_te,
        tuple(f"class_{k}" for k in range(num_classes)),
        1.0,
        "generated",
        d_tr,
    )


def _always(where: str) -> Locator:
    def locate(*, root: str | Path | None, **options: object) -> str:
        return where

    return locate


SPECS = (
    DatasetSpec(
        "digits",
        "scikit-learn digits: 1437/360 fixed split, 8x8 grayscale, 10 classes "
        "(bundled; resize=28 for MNIST-sized models)",
        load_digits,
        _always("bundled with scikit-learn"),
        "nothing to do: ships with scikit-learn",
    ),
    DatasetSpec(
        "synthetic",
        "Gaussian class-conditional images generated from the seed "
        "(for tests; options num_train, num_test, shape, num_classes, noise, num_domains)",
        load_synthetic,
        _always("generated from the seed"),
        "nothing to do: generated at load time",
        {
            "num_train": 600,
            "num_test": 200,
            "shape": (1, 8, 8),
            "num_classes": 10,
            "noise": 1.0,
            "num_domains": 0,
        },
    ),
)
