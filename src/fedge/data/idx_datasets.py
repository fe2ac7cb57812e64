"""MNIST, Fashion-MNIST and EMNIST (Cohen et al. 2017, arXiv:1702.05373): 28x28 grayscale images
in IDX files (optionally gzipped). Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

import functools
import string
from pathlib import Path
from typing import Any

import numpy as np

from fedge.core.errors import ConfigError, DataNotFoundError
from fedge.data.formats import file_key, locate_files, read_idx
from fedge.data.spec import DatasetSpec, RawData

__all__ = ["EMNIST_SPLITS", "SPECS", "load_emnist", "load_fashion_mnist", "load_mnist"]

_STEMS = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_FASHION_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_DIGITS = tuple(string.digits)
_MERGED = _DIGITS + tuple(string.ascii_uppercase) + tuple("abdefghnqrt")

#: EMNIST split -> class names (index = label after the ``letters`` shift).
EMNIST_SPLITS: dict[str, tuple[str, ...]] = {
    "balanced": _MERGED,
    "byclass": _DIGITS + tuple(string.ascii_uppercase) + tuple(string.ascii_lowercase),
    "bymerge": _MERGED,
    "digits": _DIGITS,
    "letters": tuple(string.ascii_uppercase),  # upper and lower case merged
    "mnist": _DIGITS,
}

_PLACE = (
    "put them (plain or .gz) in $FEDGE_DATA/{name} or ~/.cache/fedge/{name}, or point to them "
    "with --set dataset.root=DIR (Python: load_dataset(root=DIR))"
)
_HOW = {
    "mnist": "get the four MNIST IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, "
    "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte) on a machine with network access and "
    + _PLACE.format(name="mnist"),
    "fashion-mnist": "apt-get install dataset-fashion-mnist (installs them into "
    "/usr/share/datasets/fashion-mnist), or get the four Fashion-MNIST IDX files "
    "(same names as MNIST's) and " + _PLACE.format(name="fashion-mnist"),
    "emnist": "get EMNIST's gzip.zip (NIST) on a machine with network access, unzip it, take the "
    "emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte files and "
    + _PLACE.format(name="emnist"),
}
_SUBDIRS = {
    "mnist": ("", "MNIST/raw"),
    "fashion-mnist": ("", "FashionMNIST/raw"),
    "emnist": ("", "gzip", "EMNIST/raw"),
}


def _stems(name: str, split: str) -> dict[str, str]:
    if name != "emnist":
        return _STEMS
    return {role: f"emnist-{split}-{stem.replace('t10k', 'test')}" for role, stem in _STEMS.items()}


def _check_split(split: Any) -> str:
    if split not in EMNIST_SPLITS:
        raise ConfigError(
            f"dataset 'emnist': option split must be one of {', '.join(sorted(EMNIST_SPLITS))}, got {split!r}"
        )
    return str(split)


def _find(name: str, root: str | Path | None, split: str) -> dict[str, Path]:
    return locate_files(
        name, _stems(name, split), root=root, subdirs=_SUBDIRS[name], how_to_get=_HOW[name]
    )


@functools.lru_cache(maxsize=4)
def _read_cached(
    key: tuple[tuple[str, str, int, int], ...], transpose: bool, label_offset: int, num_classes: int
) -> tuple[np.ndarray, ...]:
    paths = {role: Path(path) for role, path, _, _ in key}
    out = []
    for split in ("train", "test"):
        x, y = read_idx(paths[f"{split}_images"]), read_idx(paths[f"{split}_labels"])
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y) or x.dtype != np.uint8:
            raise ConfigError(
                f"{paths[f'{split}_images']}: expected uint8 images (N, H, W) and N labels, got "
                f"images {x.dtype}{x.shape} and labels {y.shape}; the files do not belong together"
            )
        if x.shape[1:] != (28, 28):
            raise ConfigError(
                f"{paths[f'{split}_images']}: expected 28x28 images (every MNIST, Fashion-MNIST "
                f"and EMNIST image is), got {x.shape[1]}x{x.shape[2]}; the file is not one of "
                "this dataset's. For other images use dataset.name=npz (dataset.path: a .npz "
                "file with x_train, y_train, x_test, y_test); dataset.resize changes the input "
                "size a model sees"
            )
        if transpose:  # EMNIST stores column-major images: (N, W, H) -> (N, H, W)
            x = x.transpose(0, 2, 1)
        y = y.astype(np.int64) - label_offset
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ConfigError(
                f"{paths[f'{split}_labels']}: labels must lie in [{label_offset}, "
                f"{num_classes + label_offset}), found {y.min() + label_offset}.."
                f"{y.max() + label_offset}; the file is not a label file of this dataset"
            )
        y.flags.writeable = False
        out += [x[:, None], y]  # add the channel axis: (N, 1, H, W)
    return tuple(out)


def _load(name: str, root: str | Path | None, classes: tuple[str, ...], split: str = "") -> RawData:
    paths = _find(name, root, split)
    emnist = name == "emnist"
    x_tr, y_tr, x_te, y_te = _read_cached(
        file_key(paths), emnist, int(split == "letters"), len(classes)
    )
    return RawData(x_tr, y_tr, x_te, y_te, classes, 255.0, str(paths["train_images"].parent))


def _where(name: str, root: str | Path | None, split: str = "") -> str | None:
    try:
        return str(_find(name, root, split)["train_images"].parent)
    except DataNotFoundError:
        return None


def load_mnist(*, root: str | Path | None, seed: int) -> RawData:
    return _load("mnist", root, _DIGITS)


def load_fashion_mnist(*, root: str | Path | None, seed: int) -> RawData:
    return _load("fashion-mnist", root, _FASHION_CLASSES)


def load_emnist(*, root: str | Path | None, seed: int, split: str = "balanced") -> RawData:
    split = _check_split(split)
    return _load("emnist", root, EMNIST_SPLITS[split], split)


def locate_emnist(*, root: str | Path | None, split: str = "balanced") -> str | None:
    return _where("emnist", root, _check_split(split))


SPECS = (
    DatasetSpec(
        "mnist",
        "MNIST handwritten digits: 60k/10k 28x28 grayscale, 10 classes (your IDX files)",
        load_mnist,
        functools.partial(_where, "mnist"),
        _HOW["mnist"],
    ),
    DatasetSpec(
        "fashion-mnist",
        "Fashion-MNIST clothing: 60k/10k 28x28 grayscale, 10 classes (Debian package dataset-fashion-mnist)",
        load_fashion_mnist,
        functools.partial(_where, "fashion-mnist"),
        _HOW["fashion-mnist"],
    ),
    DatasetSpec(
        "emnist",
        "EMNIST handwritten characters, 28x28 grayscale; option split (default "
        "balanced: 112.8k/18.8k, 47 classes) (your IDX files)",
        load_emnist,
        locate_emnist,
        _HOW["emnist"],
        {"split": "balanced"},
    ),
)
