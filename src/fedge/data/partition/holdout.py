"""Each client's local test split: part of every client's shard held out, never trained on, on
which the global model is evaluated client by client (the per-device accuracies whose spread
q-FFL reports; :mod:`fedge.runtime.fairness`). The split of client ``i`` draws from
``make_generator(draws, seed, "local-test", i)`` only, so it is the same for a given run seed
and ``draws`` whatever the other clients hold.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedge.core.errors import ConfigError
from fedge.core.rng import Draws, PortableGenerator, make_generator

__all__ = ["held_out_count", "split_local_tests"]


def held_out_count(n: int, fraction: float) -> int:
    """How many of a client's ``n`` samples its local test split takes: ``round(fraction·n)``,
    at least 1 and at most ``n − 1`` (a client keeps one sample to train on and, with two or
    more, is evaluated); a client of 0 or 1 samples holds none out."""
    if n < 2:
        return 0
    return min(n - 1, max(1, math.floor(fraction * n + 0.5)))


def split_local_tests(
    parts: list[np.ndarray], fraction: float, *, seed: int, draws: Draws = "torch"
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split each client's indices into (train, local test).

    Args:
        parts: one index array per client (as :func:`fedge.data.partition.partition` returns).
        fraction: the share of each client's samples held out, ``0 < fraction < 1``
            (:func:`held_out_count` rounds it per client).
        seed: run seed.
        draws: ``"torch"`` (a torch generator's ``randperm``) or ``"portable"``
            (:class:`~fedge.core.rng.PortableGenerator`'s permutation, the same on every machine).

    Returns:
        ``(train, test)``: per client, two sorted int64 arrays, disjoint, whose union is the
        client's indices.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError(
            f"partition.local_test={fraction!r}: expected a fraction in (0, 1) of each client's "
            "samples to hold out as its local test split (e.g. 0.2); null turns it off"
        )
    train, test = [], []
    for cid, part in enumerate(parts):
        idx = np.sort(np.asarray(part, dtype=np.int64))
        m = held_out_count(len(idx), float(fraction))
        gen = make_generator(draws, seed, "local-test", cid)
        if isinstance(gen, PortableGenerator):
            order = gen.permutation(len(idx))
        else:
            order = torch.randperm(len(idx), generator=gen).numpy()
        test.append(np.sort(idx[order[:m]]))
        train.append(np.sort(idx[order[m:]]))
    return train, test
