"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009) from the "python version" archives, searched like the
IDX datasets. Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fedge.core.errors import ConfigError, DataNotFoundError
from fedge.data.formats import file_key, locate_files, read_cifar_batch
from fedge.data.spec import DatasetSpec, RawData

__all__ = ["CIFAR100_CLASSES", "CIFAR10_CLASSES", "SPECS", "load_cifar10", "load_cifar100"]

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
CIFAR100_CLASSES = tuple(
    """
apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly
camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup
dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower
leopard lion lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid
otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray
road rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar
sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip turtle
wardrobe whale willow_tree wolf woman worm
""".split()
)

# name -> (train batch files, test batch files, label key, archive folder, classes, archive)
_LAYOUT = {
    "cifar10": (
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        b"labels",
        "cifar-10-batches-py",
        CIFAR10_CLASSES,
        "cifar-10-python.tar.gz",
    ),
    "cifar100": (
        ("train",),
        ("test",),
        b"fine_labels",
        "cifar-100-python",
        CIFAR100_CLASSES,
        "cifar-100-python.tar.gz",
    ),
}


def _how(name: str) -> str:
    train, test, _, folder, _, archive = _LAYOUT[name]
    return (
        f"get {archive} on a machine with network access and extract it (tar xzf {archive}) "
        f"into $FEDGE_DATA/{name} or ~/.cache/fedge/{name}, or point to it with --set dataset.root=DIR (Python: "
        f"load_dataset(root=DIR)); fedge reads {folder}/{{{','.join(train + test)}}}"
    )


def _find(name: str, root: str | Path | None) -> dict[str, Path]:
    train, test, _, folder, _, _ = _LAYOUT[name]
    stems = {stem: stem for stem in train + test}
    return locate_files(name, stems, root=root, subdirs=(folder, ""), how_to_get=_how(name))


@functools.lru_cache(maxsize=2)
def _read_cached(name: str, key: tuple[tuple[str, str, int, int], ...]) -> tuple[np.ndarray, ...]:
    train, test, label_key, _, classes, _ = _LAYOUT[name]
    paths = {role: Path(path) for role, path, _, _ in key}
    out = []
    for stems in (train, test):
        batches = [read_cifar_batch(paths[stem], label_key) for stem in stems]
        x = np.concatenate([b[0] for b in batches])  # (N, 3, 32, 32) uint8
        y = np.concatenate([b[1] for b in batches])  # (N,) int64
        if len(y) and (y.min() < 0 or y.max() >= len(classes)):
            raise ConfigError(
                f"{paths[stems[0]].parent}: {name} labels must lie in [0, {len(classes)}), found "
                f"{y.min()}..{y.max()}; these are not {name} batches"
            )
        x.flags.writeable = y.flags.writeable = False
        out += [x, y]
    return tuple(out)


def _load(name: str, root: str | Path | None) -> RawData:
    paths = _find(name, root)
    x_tr, y_tr, x_te, y_te = _read_cached(name, file_key(paths))
    source = str(next(iter(paths.values())).parent)
    return RawData(x_tr, y_tr, x_te, y_te, _LAYOUT[name][4], 255.0, source)


def _where(name: str, *, root: str | Path | None) -> str | None:
    try:
        return str(next(iter(_find(name, root).values())).parent)
    except DataNotFoundError:
        return None


def load_cifar10(*, root: str | Path | None, seed: int) -> RawData:
    return _load("cifar10", root)


def load_cifar100(*, root: str | Path | None, seed: int) -> RawData:
    return _load("cifar100", root)


SPECS = (
    DatasetSpec(
        "cifar10",
        "CIFAR-10: 50k/10k 32x32 RGB, 10 classes (your python batches)",
        load_cifar10,
        functools.partial(_where, "cifar10"),
        _how("cifar10"),
    ),
    DatasetSpec(
        "cifar100",
        "CIFAR-100: 50k/10k 32x32 RGB, 100 fine classes (your python batches)",
        load_cifar100,
        functools.partial(_where, "cifar100"),
        _how("cifar100"),
    ),
)
