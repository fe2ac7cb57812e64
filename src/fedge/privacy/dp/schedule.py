"""Client schedules the DP accountant assumes: ``shuffle`` (DP-FTRL) and ``poisson`` (DP-FedAvg).
Design notes: docs/decisions.md#differential-privacy.
"""

from __future__ import annotations

import secrets
from typing import Literal

import numpy as np
import torch

from fedge.core.rng import generator
from fedge.privacy.dp.accounting import rounds_per_pass
from fedge.privacy.dp.mechanisms import secure_uniform

__all__ = ["poisson_clients", "secret_clients", "shuffled_clients"]


def shuffled_clients(seed: int, rnd: int, *, population: int, clients_per_round: int) -> list[int]:
    """The sorted ids of the clients of round ``rnd`` (1-based) under shuffled passes."""
    if rnd < 1:
        raise ValueError(f"rounds are 1-based, got round {rnd}")
    r = rounds_per_pass(population, clients_per_round)
    p, i = divmod(rnd - 1, r)
    perm = torch.randperm(population, generator=generator(seed, "dp-shuffle", p))
    return sorted(perm[i * clients_per_round : (i + 1) * clients_per_round].tolist())


def poisson_clients(seed: int, rnd: int, *, population: int, clients_per_round: int) -> list[int]:
    """Round ``rnd``'s clients under Poisson sampling: each joins independently with
    q = m/N, from the generator (seed, "dp-poisson", rnd). The count varies (it may be 0)."""
    rounds_per_pass(population, clients_per_round)  # validates both
    u = torch.rand(population, generator=generator(seed, "dp-poisson", rnd), dtype=torch.float64)
    return torch.nonzero(u < clients_per_round / population).flatten().tolist()


def secret_clients(
    sampling: Literal["poisson", "fixed"], *, population: int, clients_per_round: int
) -> list[int]:
    """A round's clients drawn from the OS CSPRNG (``privacy.secure_noise``), so no one who knows
    the run seed knows the sample: ``poisson`` (each joins with q = m/N, from
    :func:`~fedge.privacy.dp.mechanisms.secure_uniform`) or ``fixed`` (a uniform m-subset,
    ``secrets.SystemRandom().sample``)."""
    rounds_per_pass(population, clients_per_round)  # validates both
    if sampling == "fixed":
        return sorted(secrets.SystemRandom().sample(range(population), clients_per_round))
    return np.flatnonzero(secure_uniform(population) < clients_per_round / population).tolist()
