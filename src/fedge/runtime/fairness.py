"""Fairness across devices: the global model evaluated on each client's local test split
(``partition.local_test``), and the four figures q-FFL reports of the per-client accuracies
(Li, Sanjabi, Beirami & Smith, "Fair Resource Allocation in Federated Learning", ICLR 2020,
arXiv:1905.10497v4, Table 1): their mean, the worst 10%, the best 10% and their variance.
Personalised per-client models are not evaluated: every client sees the same global model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fedge.core import rundir_schema as schema
from fedge.runtime.evaluate import evaluate

__all__ = ["FAIRNESS_KEYS", "PER_CLIENT_KEY", "client_accuracies", "fairness_stats"]

#: The metrics-line keys of the four statistics, in the order reports show them.
FAIRNESS_KEYS = schema.FAIRNESS_KEYS
#: The metrics-line key of the per-client accuracies (index = client id; null: no local split).
PER_CLIENT_KEY = schema.CLIENT_ACCURACY


def fairness_stats(accuracies: Sequence[float | None]) -> dict[str, float]:
    """q-FFL's four statistics of per-client accuracies (clients given as None are left out).

    With the ``N`` accuracies sorted ascending as ``a_(1) <= ... <= a_(N)`` and
    ``k = ceil(0.1·N)``:

    - ``client_acc_mean`` = (1/N) Σ a_i (each device counts once, whatever its size);
    - ``client_acc_worst10`` = (1/k) Σ_{j<=k} a_(j), the mean of the k lowest;
    - ``client_acc_best10`` = (1/k) Σ_{j>N-k} a_(j), the mean of the k highest;
    - ``client_acc_var`` = (1/N) Σ (a_i − mean)², the population variance (of fractions,
      not percentages: ×10⁴ gives q-FFL's units).

    Example:
        >>> s = fairness_stats([0.5, 1.0, 0.0, 0.75])    # N = 4, k = 1
        >>> s["client_acc_mean"], s["client_acc_worst10"], s["client_acc_best10"]
        (0.5625, 0.0, 1.0)
    """
    a = np.sort(np.array([x for x in accuracies if x is not None], dtype=np.float64))
    if a.size == 0:
        return {}
    k = math.ceil(0.1 * a.size)
    return {
        "client_acc_mean": float(a.mean()),
        "client_acc_worst10": float(a[:k].mean()),
        "client_acc_best10": float(a[-k:].mean()),
        "client_acc_var": float(a.var()),
    }


def client_accuracies(
    model: torch.nn.Module,
    splits: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
    *,
    num_classes: int,
    batch_size: int = 1000,
) -> list[float | None]:
    """``model``'s top-1 accuracy on each client's local test split (None: the client has none)."""
    return [
        None
        if split is None or len(split[1]) == 0
        else evaluate(model, *split, batch_size=batch_size, num_classes=num_classes)[
            "test_accuracy"
        ]
        for split in splits
    ]
