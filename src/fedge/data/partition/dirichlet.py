r"""Label-skew partition with Dirichlet class proportions.

For each class ``k``, draw ``p_k ~ Dir(alpha * 1_C)`` over the ``C`` clients and deal the
class's samples (shuffled) to the clients in those proportions. Small ``alpha`` (0.1) gives
clients dominated by one or two classes; large ``alpha`` (100) approaches IID. This is the
scheme of Yurochkin et al. 2019 (arXiv:1905.12022) as implemented in NIID-Bench (Li et al.
2022, arXiv:2102.02079v4, Sec. 4.1) and used by the BAFFLE and NTK experiments; Hsu et al.
2019 (arXiv:1909.06335) study the same Dirichlet label skew.

``balance=True`` (NIID-Bench's rule) gives no more samples of the current class to a client
that already holds ``>= N / C`` samples, which keeps client sizes from exploding. The whole
draw is repeated until every client holds at least ``min_size`` samples, at most
``MAX_TRIES`` times; then a ConfigError says to lower ``min_size`` or raise ``alpha``.

Draws: numpy's generator only, also under ``draws="portable"``: a Dirichlet draw needs gamma
variates, which numpy computes with transcendental functions (log, exp, pow) whose last bits
may differ across CPUs, libms and numpy versions, so this partition is reproducible bit for bit
only on the same numpy and platform; :mod:`fedge.core.portable` has no gamma variate.
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
