"""The dataset registry: ``load_dataset(name, ...)``, ``dataset_names()``, ``available_datasets()``,
and :func:`register_function` for a Python function of one's own. Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedge.core.errors import ConfigError
from fedge.core.registry import Registry
from fedge.core.rng import numpy_rng
from fedge.data import builtin, cifar, idx_datasets, user
from fedge.data.dataset import Dataset, normalize_, resize_images, stratified_subset
from fedge.data.spec import DatasetSpec, RawData, check_int

__all__ = [
    "DATASETS",
    "DatasetStatus",
    "available_datasets",
    "dataset_names",
    "get_dataset_spec",
    "limited_indices",
    "load_dataset",
    "register_dataset",
    "register_function",
    "resolve_dataset_options",
]

_REGISTRY: Registry[DatasetSpec] = Registry("dataset")
#: name -> spec, read-only view (add entries with :func:`register_dataset`).
DATASETS: Mapping[str, DatasetSpec] = _REGISTRY.view()


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    """Add ``spec`` to the registry; a name already taken is an error."""
    return _REGISTRY.register(spec.name, spec)


for _spec in builtin.SPECS + idx_datasets.SPECS + cifar.SPECS + user.SPECS:
    register_dataset(_spec)


def register_function(
    name: str, fn: Callable[..., Any], *, description: str = "", replace: bool = False
) -> DatasetSpec:
    """Register ``fn`` (returning ``(x_train, y_train, x_test, y_test)`` or a dict of them)
    as dataset ``name``.

    ``fn`` gets the run seed as ``seed=`` if it takes that argument, and the config's other
    ``dataset.*`` keys as keyword arguments. When ``fn`` is importable (a module-level
    function of an installed or on-path module), the run's config records it as
    ``dataset.target: "module:function"``, so ``fedge run --resume`` reloads it in a fresh
    process; a function defined in a notebook or ``__main__`` can only be resumed from Python
    after registering it again.

    Args:
        replace: replace an earlier registration of ``name`` made by this function (a
            notebook cell run twice); built-in names can never be replaced.
    """
    target = user.callable_target(fn)
    source = target or f"function {getattr(fn, '__qualname__', fn)!r}"

    def load(
        *, root: str | Path | None, seed: int, target: str | None = None, **kwargs: Any
    ) -> RawData:
        return user.call_target(name, fn, seed=seed, kwargs=kwargs, source=source)

    def locate(*, root: str | Path | None, **options: object) -> str:
        return source

    options: dict[str, Any] = {"target": target}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise ConfigError(
            f"register_dataset({name!r}): cannot read the parameters of {fn!r}; register a Python "
            "function (def or lambda) returning the arrays"
        ) from None
    for key, param in params.items():
        if key != "seed" and param.default is not inspect.Parameter.empty:
            if not _plain(param.default):  # it becomes dataset.<key> in config.yaml
                raise ConfigError(
                    f"register_dataset({name!r}): the default of parameter {key!r} is {param.default!r} "
                    f"({type(param.default).__name__}); a dataset option must be a plain value (int, float, str, "
                    "bool, None, or lists and mappings of them) to be written to config.yaml, e.g. float(x)"
                )
            options[key] = param.default
    if replace and name in _FUNCTIONS:
        _REGISTRY.unregister(name)
    spec = DatasetSpec(
        name,
        description or f"your function {source}",
        load,
        locate,
        "registered from Python with fedge.register_dataset",
        options,
    )
    register_dataset(spec)
    _FUNCTIONS.add(name)
    return spec


_FUNCTIONS: set[str] = set()  # names registered by register_function (replaceable)


def _plain(value: Any) -> bool:
    """Whether ``value`` is what YAML and JSON hold as they are (so config.yaml records it)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def dataset_names() -> list[str]:
    """Registered dataset names, sorted."""
    return _REGISTRY.names()


def get_dataset_spec(name: str) -> DatasetSpec:
    """The registry entry for ``name`` (UnknownNameError lists the valid names)."""
    return _REGISTRY.get(name)


def _spec_for(name: str, options: Mapping[str, Any]) -> DatasetSpec:
    """The entry for ``name``; a name registered from Python in another process, recorded
    with its ``target``, is reloaded through that target (how ``--resume`` finds it)."""
    if name in _REGISTRY or not options.get("target"):
        return get_dataset_spec(name)
    fn = user.import_target(options["target"], dataset=name)
    return register_function(name, fn)


def resolve_dataset_options(name: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``options`` checked against dataset ``name`` with its defaults filled in and file paths
    made absolute: what the run's ``config.yaml`` records so that a resume reloads the data."""
    options = dict(options or {})
    spec = _spec_for(name, options)
    _check_options(name, spec, options)
    out = {**spec.options, **options}
    return user.resolve_paths(out, user.PATH_OPTIONS.get(name, ()))


def _check_options(name: str, spec: DatasetSpec, options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        valid = ", ".join(sorted(spec.options)) or "(none)"
        raise ConfigError(
            f"dataset {name!r} has no option {', '.join(unknown)}; valid options: {valid}"
        )


@dataclass(frozen=True)
class DatasetStatus:
    """One row of ``fedge datasets``: whether ``name`` can be loaded now, and from where."""

    name: str
    available: bool
    location: str | None
    description: str
    how_to_get: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def available_datasets(root: str | Path | None = None) -> list[DatasetStatus]:
    """The status of every registered dataset (default options), sorted by name.

    Only checks that the files exist; it does not read them.
    """
    out = []
    for name in dataset_names():
        spec = _REGISTRY[name]
        location = spec.locate(root=root)
        out.append(
            DatasetStatus(name, location is not None, location, spec.description, spec.how_to_get)
        )
    return out


def load_dataset(
    name: str,
    *,
    root: str | Path | None = None,
    resize: int | None = None,
    limit_train: int | None = None,
    limit_test: int | None = None,
    seed: int = 0,
    **options: Any,
) -> Dataset:
    """Load a registered dataset into memory, scaled to [0, 1] then normalized per channel.

    Args:
        name: a registry name (:func:`dataset_names`).
        root: a directory searched first for the dataset's files.
        resize: side length ``r``: images become (C, r, r) by bilinear interpolation
            (e.g. ``resize=28`` makes ``digits`` MNIST-sized). None keeps the native size.
        limit_train: keep a seeded, class-stratified random subset of this many training
            samples (each class in proportion to its frequency, largest-remainder rounding;
            order preserved). None, or a limit >= the split size, keeps everything.
        limit_test: the same for the test split.
        seed: seeds the subsets (``numpy_rng(seed, "data", name, split)``) and the
            ``synthetic`` generator; it never changes which files are read.
        **options: dataset-specific options (``DATASETS[name].options`` lists them with
            their defaults), e.g. ``split="byclass"`` for EMNIST.

    Returns:
        A :class:`Dataset`; normalization statistics are computed on the returned training
        images (after ``limit_train`` and ``resize``) and kept in ``mean``/``std``.

    Raises:
        UnknownNameError: unknown dataset name.
        ConfigError: unknown option or out-of-range value; corrupt data files.
        DataNotFoundError: the files are missing (the message lists where fedge looked).
    """
    spec = _spec_for(name, options)
    _check_options(name, spec, options)
    if resize is not None:
        resize = check_int(name, "resize", resize, low=1, fix="or None to keep the native size")
    limits = {}
    for split, limit in (("train", limit_train), ("test", limit_test)):
        if limit is not None:
            limits[split] = check_int(
                name, f"limit_{split}", limit, low=1, fix="or None to keep the whole split"
            )
    raw = spec.load(root=root, seed=seed, **options)
    return _prepare(name, raw, resize, limits, seed)


_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def memory_limit() -> int | None:
    """The memory this process may use, in bytes: the machine's physical memory, or a
    container's (cgroup v2 or v1) limit where that is smaller; None where the OS does not say."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) or a huge number (v1): no limit
            limits.append(int(text))
    return min(limits) if limits else None


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _check_fits(name: str, raw: RawData, resize: int | None, limits: dict[str, int]) -> None:
    """Refuse, before allocating, a dataset whose float32 samples cannot fit in this machine's
    memory (a large ``resize`` would otherwise end in the OS killing the process, or in swap)."""
    shape = tuple(raw.x_train.shape[1:])
    if resize is not None and len(shape) == 3:
        shape = (shape[0], resize, resize)
    counts = {
        split: min(limits.get(split, len(x)), len(x))
        for split, x in (("train", raw.x_train), ("test", raw.x_test))
    }
    total = sum(counts.values()) * int(np.prod(shape)) * 4
    memory = memory_limit()
    if memory is not None and total > memory:
        raise ConfigError(
            f"dataset {name!r}{f' with resize={resize}' if resize else ''}: {counts['train']} train and "
            f"{counts['test']} test samples of {'x'.join(map(str, shape))} take {_size(total)} as "
            f"float32, more than the {_size(memory)} of memory this process may use; use a smaller "
            "dataset.resize, or fewer samples (dataset.limit_train, dataset.limit_test)"
        )


def limited_indices(name: str, split: str, labels: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """The sorted indices of the ``split`` ("train" or "test") samples that ``limit_train`` /
    ``limit_test`` = ``limit`` keeps of dataset ``name`` (labels ``labels``, in file order): a
    class-stratified draw from ``numpy_rng(seed, "data", name, split)``. What it leaves out is
    never loaded into the run, so a server may take a public set from it (``warm_start``)."""
    return stratified_subset(labels, limit, numpy_rng(seed, "data", name, split))


def _prepare(
    name: str, raw: RawData, resize: int | None, limits: dict[str, int], seed: int
) -> Dataset:
    _check_fits(name, raw, resize, limits)
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    domains = raw.train_domains
    for split, x, y in (("train", raw.x_train, raw.y_train), ("test", raw.x_test, raw.y_test)):
        if (
            len(y) == 0
        ):  # a test accuracy over no samples would read 0.0; no client could train on none
            raise ConfigError(
                f"dataset {name!r} ({raw.source}): the {split} split holds no samples; clients train on "
                "the train split and the run reports accuracy on the test split, so both need samples: "
                "check or replace the files"
            )
        if split in limits and limits[split] < len(y):
            idx = limited_indices(name, split, y, limits[split], seed)
            x, y = x[idx], y[idx]
            if split == "train" and domains is not None:
                domains = domains[idx]
        # (N, C, H, W): a fresh C-contiguous float32 copy; the raw arrays are shared and read-only
        xt = torch.from_numpy(np.array(x, dtype=np.float32, order="C"))
        if resize is not None and xt.ndim != 4:
            raise ConfigError(
                f"dataset {name!r}: resize={resize} applies to images, but this "
                f"data is tabular {tuple(xt.shape[1:])}; leave resize unset"
            )
        if resize is not None:
            xt = resize_images(xt, resize)
        splits[split] = (xt, torch.from_numpy(np.array(y, dtype=np.int64)))
    (x_tr, y_tr), (x_te, y_te) = splits["train"], splits["test"]
    mean, std = normalize_(x_tr, x_te, raw.scale)
    return Dataset(
        name=name,
        x_train=x_tr,
        y_train=y_tr,
        x_test=x_te,
        y_test=y_te,
        num_classes=len(raw.classes),
        input_shape=tuple(x_tr.shape[1:]),
        classes=raw.classes,
        train_domains=None if domains is None else np.array(domains),
        mean=mean,
        std=std,
        source=raw.source,
    )
