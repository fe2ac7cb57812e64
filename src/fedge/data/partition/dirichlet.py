r"""Label-skew partition with Dirichlet class proportions ``p_k ~ Dir(alpha * 1_C)`` per class
(Yurochkin et al. 2019, as in NIID-Bench, Li et al. 2022, Sec. 4.1). It draws from numpy's
generator even under ``draws="portable"``: gamma variates need transcendental math (log, exp,
pow) whose last bits may differ across CPUs, libms and numpy versions, and
:mod:`fedge.core.portable` has none, so this partition is bit-reproducible only on the same numpy
and platform. Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedge.core.errors import ConfigError
from fedge.data.partition._common import check_bool, check_float, check_int

__all__ = ["DEFAULTS", "MAX_TRIES", "split", "validate"]

DEFAULTS: dict[str, Any] = {"alpha": 0.5, "min_size": 10, "balance": True}
MAX_TRIES = 100


def validate(params: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "alpha": check_float(
            "dirichlet", "alpha", params["alpha"], fix="smaller is more skewed; 0.1 to 1 are usual"
        ),
        "min_size": check_int(
            "dirichlet", "min_size", params["min_size"], low=0, fix="0 allows empty clients"
        ),
        "balance": check_bool("dirichlet", "balance", params["balance"]),
    }


def split(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    domains: np.ndarray | None,
    alpha: float,
    min_size: int,
    balance: bool,
) -> np.ndarray:
    n = len(labels)
    if min_size * num_clients > n:
        raise ConfigError(
            f"partitioner 'dirichlet': min_size={min_size} for {num_clients} clients needs "
            f"{min_size * num_clients} samples, only {n} available; lower partition.min_size or the number of clients (clients.num)"
        )
    class_indices = [np.flatnonzero(labels == k) for k in np.unique(labels)]
    smallest = 0
    for _ in range(MAX_TRIES):
        owner = np.empty(n, dtype=np.int64)
        sizes = np.zeros(num_clients, dtype=np.int64)
        for idx_k in class_indices:
            idx_k = rng.permutation(idx_k)
            p = rng.dirichlet(np.full(num_clients, alpha))  # p_k ~ Dir(alpha), over clients
            if balance:
                masked = p * (sizes < n / num_clients)
                if masked.sum() > 0:  # all-zero only if tiny alpha underflowed: keep p
                    p = masked
            p = p / p.sum()
            cuts = (np.cumsum(p)[:-1] * len(idx_k)).astype(np.int64)
            counts = np.diff(np.concatenate(([0], cuts, [len(idx_k)])))
            owner[idx_k] = np.repeat(np.arange(num_clients), counts)
            sizes += counts
        smallest = int(sizes.min())
        if smallest >= min_size:
            return owner
    raise ConfigError(
        f"partitioner 'dirichlet': no draw in {MAX_TRIES} gave every client at least "
        f"min_size={min_size} samples (alpha={alpha}, {num_clients} clients, {n} samples; the "
        f"last draw's smallest client had {smallest}); lower partition.min_size or raise partition.alpha"
    )
