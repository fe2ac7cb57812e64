"""The in-memory ``Dataset`` and the preprocessing every loader shares: limit (stratified subset),
float32, resize, per-channel (or per-feature) normalization. Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedge.core.errors import ConfigError

__all__ = ["Dataset", "normalize_", "resize_images", "stratified_subset"]


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A classification dataset held in memory as tensors.

    Attributes:
        name: registry name, e.g. ``"fashion-mnist"``.
        x_train: (N, C, H, W) float32 images, normalized per channel with the train statistics;
            or (N, F) float32 tabular features, normalized per feature.
        y_train: (N,) int64 labels in ``[0, num_classes)``.
        x_test: (M, C, H, W) float32, normalized with the same (train) statistics.
        y_test: (M,) int64.
        num_classes: number of classes (also ``len(classes)``).
        input_shape: (C, H, W) of one image, or (F,) of one tabular sample.
        classes: label names, index = label.
        train_domains: (N,) domain/feature key per training sample, or None; used by the
            ``domain`` partitioner.
        mean: per-channel mean of the [0, 1]-scaled training images (before normalization).
        std: per-channel std of the same.
        source: where the data came from (a directory, ``"scikit-learn"``, ``"generated"``).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    classes: tuple[str, ...]
    train_domains: np.ndarray | None = None
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        splits = (("train", self.x_train, self.y_train), ("test", self.x_test, self.y_test))
        for split, x, y in splits:
            if x.dtype != torch.float32 or y.dtype != torch.int64:
                raise ConfigError(
                    f"{self.name} {split}: expected float32 images and int64 labels, got {x.dtype} and {y.dtype}"
                )
            if (
                x.ndim not in (2, 4)
                or tuple(x.shape[1:]) != tuple(self.input_shape)
                or len(x) != len(y)
            ):
                raise ConfigError(
                    f"{self.name} {split}: images {tuple(x.shape)} and labels "
                    f"{tuple(y.shape)} do not match input_shape {self.input_shape}"
                )
        if len(self.classes) != self.num_classes:
            raise ConfigError(
                f"{self.name}: {len(self.classes)} class names for num_classes={self.num_classes}"
            )
        if self.train_domains is not None and len(self.train_domains) != len(self.y_train):
            raise ConfigError(
                f"{self.name}: {len(self.train_domains)} domain keys for {len(self.y_train)} training samples"
            )

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def num_test(self) -> int:
        return len(self.y_test)

    def describe(self) -> dict[str, Any]:
        """A JSON-serializable summary: sizes, shape, classes, statistics, source."""
        return {
            "name": self.name,
            "num_train": self.num_train,
            "num_test": self.num_test,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "classes": list(self.classes),
            "train_label_counts": _counts(self.y_train, self.num_classes),
            "test_label_counts": _counts(self.y_test, self.num_classes),
            "num_domains": (
                None if self.train_domains is None else len(np.unique(self.train_domains))
            ),
            "mean": list(self.mean),
            "std": list(self.std),
            "source": self.source,
        }

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, train={self.num_train}, test={self.num_test}, "
            f"shape={tuple(self.input_shape)}, classes={self.num_classes})"
        )


def _counts(y: torch.Tensor, num_classes: int) -> list[int]:
    return torch.bincount(y, minlength=num_classes).tolist()


def stratified_subset(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a class-stratified random subset of ``size`` samples.

    Each class gets ``size * n_c / N`` samples, rounded by largest remainder (ties to the
    lower class), drawn without replacement with ``rng``. ``size >= N`` returns every index.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if size >= n:
        return np.arange(n)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    quota = size * counts / n
    take = np.floor(quota).astype(np.int64)
    remainder = size - int(take.sum())
    # largest fractional part first; a stable sort breaks ties by class order
    take[np.argsort(-(quota - take), kind="stable")[:remainder]] += 1
    chosen = [
        rng.choice(np.flatnonzero(inverse == k), size=int(take[k]), replace=False)
        for k in range(len(classes))
    ]
    return np.sort(np.concatenate(chosen))


def resize_images(x: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of (N, C, H, W) images to (N, C, size, size)."""
    if tuple(x.shape[-2:]) == (size, size):
        return x
    shrink = size < max(x.shape[-2:])
    return F.interpolate(
        x, size=(size, size), mode="bilinear", align_corners=False, antialias=shrink
    )


def normalize_(
    x_train: torch.Tensor, x_test: torch.Tensor, scale: float = 1.0
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Standardize both splits in place, per channel, with the train split's mean and std.

    Args:
        x_train: (N, C, H, W) float images in ``[0, scale]``, or (N, F) tabular features
            (standardized per feature); overwritten.
        x_test: (M, C, H, W) or (M, F), overwritten with the same (train) statistics.
        scale: the pixel range; the returned statistics are divided by it, i.e. they are
            those of the images scaled to [0, 1].

    Returns:
        ``(mean, std)`` per channel. A channel with zero spread keeps std 1 (no division by 0).
    """
    # (N, C, H, W) -> per-channel statistics (C,), (N, F) -> per-feature (F,);
    # var_mean is one numerically stable pass
    dims = (0,) if x_train.ndim == 2 else (0, 2, 3)
    var, mean = torch.var_mean(x_train, dim=dims, correction=0)
    std = var.sqrt()
    std = torch.where(std > 0, std, torch.full_like(std, scale))
    view = (1, -1) if x_train.ndim == 2 else (1, -1, 1, 1)
    m, s = mean.view(view), std.view(view)
    x_train.sub_(m).div_(s)  # in place: a second 60k-image buffer would cost time and memory
    x_test.sub_(m).div_(s)
    return tuple((mean / scale).tolist()), tuple((std / scale).tolist())
