"""Pathological non-IID split of McMahan et al. 2017 (FedAvg, arXiv:1602.05629v4, Sec. 3): sort by
label, cut into shards, give each client ``shards_per_client`` of them. Design notes: docs/decisions.md#data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedge.core.errors import ConfigError
from fedge.core.rng import PortableGenerator
from fedge.data.partition._common import check_int, even_sizes

__all__ = ["DEFAULTS", "split", "validate"]

DEFAULTS: dict[str, Any] = {"shards_per_client": 2}


def validate(params: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "shards_per_client": check_int(
            "shards",
            "shards_per_client",
            params["shards_per_client"],
            low=1,
            fix="use 2 for McMahan et al.'s pathological split",
        )
    }


def split(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator | PortableGenerator,
    *,
    domains: np.ndarray | None,
    shards_per_client: int,
) -> np.ndarray:
    n = len(labels)
    num_shards = num_clients * shards_per_client
    if num_shards > n:
        raise ConfigError(
            f"partitioner 'shards': clients.num * shards_per_client = {num_clients} * "
            f"{shards_per_client} = {num_shards} shards, more than the {n} samples; lower "
            "partition.shards_per_client or clients.num"
        )
    perm = rng.permutation(n)
    by_label = perm[np.argsort(labels[perm], kind="stable")]  # sorted by label, random within
    shard_owner = rng.permutation(np.repeat(np.arange(num_clients), shards_per_client))
    owner = np.empty(n, dtype=np.int64)
    owner[by_label] = np.repeat(shard_owner, even_sizes(n, num_shards))
    return owner
