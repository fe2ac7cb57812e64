"""Feature-skew partition by domain: each client's data comes from one domain (or, with fewer
clients than domains, from whole domains dealt round-robin). Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedge.core.errors import ConfigError
from fedge.core.rng import PortableGenerator
from fedge.data.partition._common import even_sizes

__all__ = ["DEFAULTS", "split", "validate"]

DEFAULTS: dict[str, Any] = {}


def validate(params: Mapping[str, Any]) -> dict[str, Any]:
    return {}


def split(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator | PortableGenerator,
    *,
    domains: np.ndarray | None,
) -> np.ndarray:
    if domains is None:
        raise ConfigError(
            "partitioner 'domain' needs a domain key per sample, got domains=None; pass "
            "domains= (e.g. Dataset.train_domains, set by synthetic with num_domains > 0) or "
            "use another partitioner (iid, dirichlet, shards)"
        )
    domains = np.asarray(domains)
    if domains.shape != labels.shape:
        raise ConfigError(
            f"partitioner 'domain': domains has shape {domains.shape}, labels "
            f"{labels.shape}; give one domain key per sample"
        )
    keys, dom = np.unique(domains, return_inverse=True)
    num_domains = len(keys)
    owner = np.empty(len(labels), dtype=np.int64)
    for j, d in enumerate(rng.permutation(num_domains)):  # j-th domain in the random order
        members = rng.permutation(np.flatnonzero(dom == d))
        clients = (
            np.arange(j, num_clients, num_domains)
            if num_clients >= num_domains
            else np.array([j % num_clients])
        )
        if len(members) < len(clients):
            raise ConfigError(
                f"partitioner 'domain': domain {keys[d]!r} has {len(members)} samples for "
                f"{len(clients)} clients, so some client would be empty; use fewer clients "
                f"(clients.num={num_clients} puts about {num_clients / num_domains:.1f} on each "
                f"of the {num_domains} domains) or merge small domains"
            )
        owner[members] = np.repeat(clients, even_sizes(len(members), len(clients)))
    return owner
