"""A user's own data, named in a config without writing Python: ``npz``, ``csv``, ``module``.
Formats and rules: docs/guide/data.md#your-own-data.
"""

from __future__ import annotations

import csv
import importlib
import inspect
import math
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedge.core.errors import ConfigError, DataNotFoundError
from fedge.data.spec import DatasetSpec, RawData

__all__ = ["SPECS", "callable_target", "import_target", "raw_from_arrays", "resolve_paths"]

ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def raw_from_arrays(
    dataset: str,
    arrays: Mapping[str, Any],
    *,
    source: str,
    classes: tuple[str, ...] | None = None,
) -> RawData:
    """Check user arrays and return them as :class:`RawData`.

    ``x`` may be (N, C, H, W) or (N, H, W) images (a channel axis is added) or (N, F)
    features; uint8 images are scaled by 255, anything else is taken as is (normalization
    standardizes it anyway). Labels must be whole numbers >= 0.
    """
    missing = [k for k in ARRAYS if k not in arrays]
    if missing:
        raise ConfigError(
            f"dataset {dataset!r} ({source}): missing array(s) {', '.join(missing)}; expected "
            f"{', '.join(ARRAYS)} (e.g. np.savez(path, x_train=..., y_train=..., x_test=..., "
            "y_test=...))"
        )
    xs, ys = {}, {}
    for split in ("train", "test"):
        x = np.asarray(arrays[f"x_{split}"])
        y = np.asarray(arrays[f"y_{split}"])
        if x.ndim == 3:
            x = x[:, None]  # (N, H, W) -> (N, 1, H, W)
        if x.ndim not in (2, 4) or 0 in x.shape:
            raise ConfigError(
                f"dataset {dataset!r} ({source}): x_{split} has shape {x.shape}; expected "
                "(N, C, H, W) or (N, H, W) images, or (N, F) tabular features, with no empty axis"
            )
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            raise ConfigError(
                f"dataset {dataset!r} ({source}): x_{split} holds {x.dtype}, expected numbers"
            )
        if x.dtype != np.uint8:
            x = x.astype(np.float32)
            if not np.isfinite(x).all():
                raise ConfigError(
                    f"dataset {dataset!r} ({source}): x_{split} holds NaN or "
                    "infinite values; clean or impute them first"
                )
        if y.ndim != 1 or len(y) != len(x):
            raise ConfigError(
                f"dataset {dataset!r} ({source}): x_{split} has {len(x)} samples but y_{split} "
                f"has shape {y.shape}; expected one label per sample, shape ({len(x)},)"
            )
        xs[split], ys[split] = x, _integer_labels(dataset, source, f"y_{split}", y)
    if xs["train"].shape[1:] != xs["test"].shape[1:] or xs["train"].dtype != xs["test"].dtype:
        raise ConfigError(
            f"dataset {dataset!r} ({source}): x_train samples are {xs['train'].shape[1:]} "
            f"{xs['train'].dtype} but x_test samples are {xs['test'].shape[1:]} "
            f"{xs['test'].dtype}; both splits must have the same sample shape and dtype"
        )
    num_classes = int(max(ys["train"].max(), ys["test"].max())) + 1
    seen = np.union1d(np.unique(ys["train"]), np.unique(ys["test"]))
    if num_classes > max(
        2 * len(seen), len(seen) + 100
    ):  # ids, not class indices: a model this wide is a mistake
        raise ConfigError(
            f"dataset {dataset!r} ({source}): labels are class indices 0..C-1, but these run up to {num_classes - 1} "
            f"with only {len(seen)} distinct values ({', '.join(map(str, seen[:5].tolist()))}"
            f"{', ...' if len(seen) > 5 else ''}): the model would have {num_classes} outputs; map them to "
            f"0..{len(seen) - 1} (e.g. np.unique(y, return_inverse=True)[1])"
        )
    unseen = np.setdiff1d(np.unique(ys["test"]), np.unique(ys["train"]))
    if len(unseen):
        warnings.warn(
            f"dataset {dataset!r} ({source}): test labels {unseen[:5].tolist()}{' ...' if len(unseen) > 5 else ''} never "
            "occur in the training labels; no client can learn them, so test accuracy on them is 0",
            stacklevel=2,
        )
    if classes is None:
        classes = tuple(str(k) for k in range(num_classes))
    scale = 255.0 if xs["train"].dtype == np.uint8 else 1.0
    return RawData(xs["train"], ys["train"], xs["test"], ys["test"], classes, scale, source)


def _integer_labels(dataset: str, source: str, key: str, y: np.ndarray) -> np.ndarray:
    ok = np.issubdtype(y.dtype, np.integer) or (
        np.issubdtype(y.dtype, np.floating) and np.isfinite(y).all() and (y == np.round(y)).all()
    )
    if not ok or (y.size and y.min() < 0):
        bad = y[:5].tolist()
        raise ConfigError(
            f"dataset {dataset!r} ({source}): {key} must hold integer class labels >= 0, got "
            f"{y.dtype} values such as {bad}; map the classes to 0..K-1 first"
        )
    return y.astype(np.int64)


def _file(dataset: str, key: str, value: Any) -> Path:
    if not isinstance(value, (str, Path)) or not str(value):
        raise ConfigError(
            f"dataset {dataset!r}: option {key} must be a file path, got {value!r}; set dataset.{key} in the config"
        )
    p = Path(value).expanduser()
    if not p.is_file():
        raise DataNotFoundError(
            f"dataset {dataset!r}: {key}={str(value)!r} is not a file (looked at "
            f"{str(p.resolve())!r}); check the path (relative paths are read from the "
            "working directory)"
        )
    return p


def resolve_paths(options: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """``options`` with the given path options made absolute (what ``config.yaml`` records)."""
    out = dict(options)
    for k in keys:
        if isinstance(out.get(k), str) and out[k]:
            out[k] = str(Path(out[k]).expanduser().resolve())
    return out


# --------------------------------------------------------------------------------- npz


def load_npz(*, root: str | Path | None, seed: int, path: str | None = None) -> RawData:
    p = _file("npz", "path", path)
    try:
        with np.load(p, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files if k in ARRAYS}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:  # EOFError: an empty file
        why = "the file is empty" if isinstance(exc, EOFError) else str(exc)
        raise ConfigError(
            f"dataset 'npz': {str(p)!r} is not a readable .npz file of numeric arrays ({why}); "
            f"a valid one holds the arrays {', '.join(ARRAYS)}: write it with "
            "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"
        ) from None
    return raw_from_arrays("npz", arrays, source=str(p.resolve()))


# --------------------------------------------------------------------------------- csv


def _read_csv(path: Path, label: str) -> tuple[list[str], np.ndarray, list[str]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ConfigError(
            f"dataset 'csv': {str(path)!r} is empty; expected a header row, then one row per sample"
        )
    header, body = [h.strip() for h in rows[0]], [r for r in rows[1:] if r]
    if label not in header:
        raise ConfigError(
            f"dataset 'csv': {str(path)!r} has no column {label!r} (columns: "
            f"{', '.join(header)}); set dataset.label to the label column"
        )
    li = header.index(label)
    features = [h for i, h in enumerate(header) if i != li]
    if not features or not body:
        raise ConfigError(
            f"dataset 'csv': {str(path)!r} needs at least one feature column and one sample row"
        )
    x = np.empty((len(body), len(features)), dtype=np.float32)
    labels = []
    for n, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ConfigError(
                f"dataset 'csv': {str(path)!r} line {n} has {len(row)} fields, the header has {len(header)}"
            )
        labels.append(row[li].strip())
        try:
            x[n - 2] = [float(v) for i, v in enumerate(row) if i != li]
        except ValueError:
            raise ConfigError(
                f"dataset 'csv': {str(path)!r} line {n} has a non-numeric feature "
                f"in {row!r}; features must be numbers (encode categories first)"
            ) from None
    return features, x, labels


def _label_codes(
    train: list[str], test: list[str], path: Path
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...] | None]:
    def as_int(v: str) -> int | None:
        try:
            f = float(v)
        except ValueError:
            return None
        if not math.isfinite(f) or f != int(f):
            raise ConfigError(
                f"dataset 'csv': {str(path)!r} has label {v!r}; numeric labels "
                "must be whole numbers >= 0 (or use class names)"
            )
        return int(f)

    ints = [as_int(v) for v in train + test]
    if all(i is not None for i in ints):
        y = np.array(ints, dtype=np.float64)
        return y[: len(train)], y[len(train) :], None
    names = sorted(set(train))
    unseen = sorted(set(test) - set(names))
    if unseen:
        raise ConfigError(
            f"dataset 'csv': the test file has class(es) {unseen} that the "
            "training file never shows; every test class must appear in training"
        )
    code = {c: i for i, c in enumerate(names)}
    return (np.array([code[v] for v in train]), np.array([code[v] for v in test]), tuple(names))


def load_csv(
    *,
    root: str | Path | None,
    seed: int,
    path: str | None = None,
    test_path: str | None = None,
    label: str = "label",
) -> RawData:
    train_p = _file("csv", "path", path)
    test_p = _file("csv", "test_path", test_path)
    f_tr, x_tr, l_tr = _read_csv(train_p, label)
    f_te, x_te, l_te = _read_csv(test_p, label)
    if f_tr != f_te:
        raise ConfigError(
            f"dataset 'csv': the feature columns differ between {str(train_p)!r} "
            f"({', '.join(f_tr)}) and {str(test_p)!r} ({', '.join(f_te)})"
        )
    y_tr, y_te, classes = _label_codes(l_tr, l_te, train_p)
    return raw_from_arrays(
        "csv",
        {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te},
        source=str(train_p.resolve()),
        classes=classes,
    )


# ------------------------------------------------------------------------------ module


def import_target(target: Any, *, dataset: str = "module") -> Callable[..., Any]:
    """The function named by ``"pkg.mod:function"`` (a ConfigError says what is wrong)."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise ConfigError(
            f"dataset {dataset!r}: target must be 'package.module:function', got {target!r}"
        )
    mod_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(
            f"dataset {dataset!r}: cannot import module {mod_name!r} of target "
            f"{target!r} ({exc}); put it on PYTHONPATH or install it"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"dataset {dataset!r}: module {mod_name!r} has no {attr!r} (target {target!r})"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"dataset {dataset!r}: target {target!r} is not callable")
    return obj


def callable_target(fn: Callable[..., Any]) -> str | None:
    """``"module:qualname"`` of ``fn`` when a fresh process can import it, else None
    (a lambda, a nested function, or one defined in ``__main__``/a notebook)."""
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod or mod == "__main__" or "<" in qual:
        return None
    try:
        return f"{mod}:{qual}" if import_target(f"{mod}:{qual}") is fn else None
    except ConfigError:
        return None


def call_target(
    dataset: str, fn: Callable[..., Any], *, seed: int, kwargs: Mapping[str, Any], source: str
) -> RawData:
    """Call a user's data function and check what it returns."""
    params = inspect.signature(fn).parameters
    args = dict(kwargs)
    if "seed" in params and "seed" not in args:
        args["seed"] = seed
    try:
        out = fn(**args)
    except (
        Exception
    ) as exc:  # the user's code: one line naming it (the traceback stays chained for the API)
        raise ConfigError(
            f"dataset {dataset!r}: {source} raised {type(exc).__name__}: {exc}; fix that function "
            "(call it alone to see its traceback)"
        ) from exc
    if isinstance(out, RawData):
        return out
    if isinstance(out, (tuple, list)) and len(out) == 4:
        out = dict(zip(ARRAYS, out))
    if not isinstance(out, Mapping):
        raise ConfigError(
            f"dataset {dataset!r}: {source} returned {type(out).__name__}; expected "
            "(x_train, y_train, x_test, y_test) or a dict with those keys"
        )
    return raw_from_arrays(dataset, out, source=source)


def load_module(
    *,
    root: str | Path | None,
    seed: int,
    target: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> RawData:
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigError(f"dataset 'module': kwargs must be a mapping, got {kwargs!r}")
    fn = import_target(target)
    return call_target("module", fn, seed=seed, kwargs=kwargs or {}, source=str(target))


def _nowhere(*, root: str | Path | None, **options: object) -> None:
    return None


SPECS = (
    DatasetSpec(
        "npz",
        "your arrays in a .npz file (x_train, y_train, x_test, y_test)",
        load_npz,
        _nowhere,
        "set dataset.path to a .npz file written with np.savez",
        {"path": None},
    ),
    DatasetSpec(
        "csv",
        "your tabular data: CSV files with a header and a label column",
        load_csv,
        _nowhere,
        "set dataset.path, dataset.test_path and dataset.label",
        {"path": None, "test_path": None, "label": "label"},
    ),
    DatasetSpec(
        "module",
        "arrays returned by your function 'package.module:function'",
        load_module,
        _nowhere,
        "set dataset.target to 'package.module:function'",
        {"target": None, "kwargs": {}},
    ),
)

#: The options of each user-data spec holding file paths (recorded absolute).
PATH_OPTIONS = {"npz": ("path",), "csv": ("path", "test_path")}
