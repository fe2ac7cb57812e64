"""Federated partitions: split a dataset's training indices across clients with a registered
partitioner (``iid``, ``dirichlet``, ``shards``, ``domain``), drawn from
``numpy_rng(seed, "partition", name)`` only; with ``draws="portable"`` the partitioners that
only shuffle (``iid``, ``shards``, ``domain``) draw from :class:`fedge.core.rng.PortableGenerator`
instead, the same on every machine (``dirichlet`` needs gamma variates and stays on numpy).
Design notes: docs/decisions.md#data.

>>> import numpy as np
>>> labels = np.repeat(np.arange(10), 6000)                      # 60,000 samples, 10 classes
>>> parts = partition("dirichlet", labels, 100, seed=0, alpha=0.1)   # list of 100 index arrays
>>> len(parts), sum(len(p) for p in parts)
(100, 60000)
>>> partition_summary(parts, labels, 10)["clients"][0]["label_counts"]
[10, 0, 132, 0, 0, 0, 7, 0, 0, 0]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from fedge.core.errors import ConfigError
from fedge.core.registry import Registry
from fedge.core.rng import Draws, PortableGenerator, check_draws, numpy_rng
from fedge.data.partition import dirichlet, domain, iid, shards
from fedge.data.partition._common import parts_from_owner

__all__ = [
    "PARTITIONERS",
    "PartitionerSpec",
    "partition",
    "partition_summary",
    "partitioner_names",
    "register_partitioner",
    "resolve_partition_params",
]


@dataclass(frozen=True)
class PartitionerSpec:
    """A registry entry.

    Attributes:
        name: registry name.
        description: one line.
        split: ``(labels, num_clients, rng, *, domains, **params) -> owner`` (N,) client ids.
        validate: checks a full params dict (defaults filled in), returns it normalized.
        params: parameter names and their defaults.
        needs_domains: whether ``domains`` must be given.
        portable: whether ``split`` draws only ``rng.permutation`` (of an int or an array), so
            ``draws="portable"`` hands it a :class:`~fedge.core.rng.PortableGenerator`.
    """

    name: str
    description: str
    split: Callable[..., np.ndarray]
    validate: Callable[[Mapping[str, Any]], dict[str, Any]]
    params: Mapping[str, Any] = field(default_factory=dict)
    needs_domains: bool = False
    portable: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))


_REGISTRY: Registry[PartitionerSpec] = Registry("partitioner")
#: name -> spec, read-only view (add entries with :func:`register_partitioner`).
PARTITIONERS: Mapping[str, PartitionerSpec] = _REGISTRY.view()


def register_partitioner(spec: PartitionerSpec) -> PartitionerSpec:
    """Add a partitioner; a name already taken, or anything but a :class:`PartitionerSpec` with
    callable ``split`` and ``validate``, is a :class:`ConfigError`."""
    if (
        not isinstance(spec, PartitionerSpec)
        or not callable(spec.split)
        or not callable(spec.validate)
    ):
        raise ConfigError(
            f"register_partitioner takes a PartitionerSpec(name, description, split, validate, params) "
            f"with callable split and validate; got {spec!r}"
        )
    return _REGISTRY.register(spec.name, spec)


for _spec_ in (
    PartitionerSpec(
        "iid",
        "seeded shuffle split as evenly as possible",
        iid.split,
        iid.validate,
        iid.DEFAULTS,
        portable=True,
    ),
    PartitionerSpec(
        "dirichlet",
        "label skew: per-class proportions ~ Dir(alpha) over clients",
        dirichlet.split,
        dirichlet.validate,
        dirichlet.DEFAULTS,
    ),
    PartitionerSpec(
        "shards",
        "McMahan et al. pathological split: label-sorted shards",
        shards.split,
        shards.validate,
        shards.DEFAULTS,
        portable=True,
    ),
    PartitionerSpec(
        "domain",
        "feature skew: each client's samples come from one domain",
        domain.split,
        domain.validate,
        domain.DEFAULTS,
        needs_domains=True,
        portable=True,
    ),
):
    register_partitioner(_spec_)


def partitioner_names() -> list[str]:
    """Registered partitioner names, sorted."""
    return _REGISTRY.names()


def _spec(name: str) -> PartitionerSpec:
    return _REGISTRY.get(name)


def resolve_partition_params(name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``params`` with defaults filled in and validated, without any data (for config checks).

    Raises:
        UnknownNameError: unknown partitioner.
        ConfigError: an unknown parameter name (the valid ones are listed) or a bad value.
    """
    spec = _spec(name)
    params = dict(params or {})
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        valid = ", ".join(sorted(spec.params)) or "(none)"
        raise ConfigError(
            f"partitioner {name!r} has no parameter {', '.join(unknown)}; valid parameters: {valid}"
        )
    return spec.validate({**spec.params, **params})


def partition(
    name: str,
    labels: np.ndarray,
    num_clients: int,
    *,
    seed: int,
    domains: np.ndarray | None = None,
    draws: Draws = "torch",
    **params: Any,
) -> list[np.ndarray]:
    """Split sample indices ``0..N-1`` across ``num_clients`` clients.

    Args:
        name: a partitioner name (:func:`partitioner_names`).
        labels: (N,) integer class labels (e.g. ``dataset.y_train.numpy()``).
        num_clients: number of clients, ``1 <= num_clients <= N``.
        seed: run seed; the partitioner draws from ``numpy_rng(seed, "partition", name)``.
        domains: (N,) domain key per sample; required by ``domain``, ignored by the others.
        draws: ``"torch"`` (numpy's PCG64, what earlier records used) or ``"portable"``
            (:class:`~fedge.core.rng.PortableGenerator` for the partitioners that only shuffle;
            ``dirichlet`` stays on numpy, see the module docstring).
        **params: partitioner parameters (see the table in this module's docstring).

    Returns:
        ``num_clients`` sorted int64 index arrays that together hold every index exactly once.
    """
    params = resolve_partition_params(name, params)
    labels = np.asarray(labels)
    if labels.ndim != 1 or not (np.issubdtype(labels.dtype, np.integer) or labels.size == 0):
        raise ConfigError(
            f"partition: labels must be a 1-D integer array, got {labels.dtype} of shape {labels.shape}"
        )
    n = len(labels)
    if (
        isinstance(num_clients, bool)
        or not isinstance(num_clients, (int, np.integer))
        or not 1 <= num_clients <= n
    ):
        raise ConfigError(
            f"partition: num_clients must be an integer in [1, {n}] (the number of samples), "
            f"got {num_clients!r}; lower the number of clients (clients.num) or use more data"
        )
    spec = _spec(name)
    rng: np.random.Generator | PortableGenerator = numpy_rng(seed, "partition", name)
    if check_draws(draws) == "portable" and spec.portable:
        rng = PortableGenerator(seed, "partition", name)
    owner = spec.split(labels, int(num_clients), rng, domains=domains, **params)
    _check_owner(name, owner, n, int(num_clients))
    return parts_from_owner(owner, int(num_clients))


def _check_owner(name: str, owner: Any, n: int, num_clients: int) -> None:
    """A partitioner's result must give each of the ``n`` samples a client in ``0..num_clients-1``
    (a registered one's mistake is named here, before any run starts; a client may get none)."""
    arr = np.asarray(owner) if owner is not None else None
    if arr is None or arr.shape != (n,) or not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(
            f"partitioner {name!r} returned {type(owner).__name__} of shape "
            f"{getattr(arr, 'shape', None)}; it must return an integer array of shape ({n},): "
            "each sample's client"
        )
    if n and (arr.min() < 0 or arr.max() >= num_clients):
        raise ConfigError(
            f"partitioner {name!r} gave client ids {int(arr.min())}..{int(arr.max())}; expected "
            f"0..{num_clients - 1} (clients.num={num_clients})"
        )


def partition_summary(
    parts: list[np.ndarray], labels: np.ndarray, num_classes: int
) -> dict[str, Any]:
    """Per-client sizes and label histograms, plus totals; JSON-serializable.

    Returns:
        ``{"num_clients", "num_samples", "num_classes", "size_min", "size_max", "size_mean",
        "size_std", "label_counts": [total per class], "clients": [{"client", "num_samples",
        "num_labels", "label_counts"}, ...]}``.
    """
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(
            f"partition_summary: labels must lie in [0, {num_classes}), found "
            f"{labels.min()}..{labels.max()}; pass the dataset's num_classes"
        )
    clients = []
    total = np.zeros(num_classes, dtype=np.int64)
    for i, part in enumerate(parts):
        hist = np.bincount(labels[part], minlength=num_classes)
        total += hist
        clients.append(
            {
                "client": i,
                "num_samples": int(len(part)),
                "num_labels": int(np.count_nonzero(hist)),
                "label_counts": hist.tolist(),
            }
        )
    sizes = np.array([len(p) for p in parts], dtype=np.float64)
    return {
        "num_clients": len(parts),
        "num_samples": int(sizes.sum()),
        "num_classes": int(num_classes),
        "size_min": int(sizes.min()) if len(parts) else 0,
        "size_max": int(sizes.max()) if len(parts) else 0,
        "size_mean": float(sizes.mean()) if len(parts) else 0.0,
        "size_std": float(sizes.std()) if len(parts) else 0.0,
        "label_counts": total.tolist(),
        "clients": clients,
    }
