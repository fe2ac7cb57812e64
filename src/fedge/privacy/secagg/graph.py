"""Who masks with whom: the complete graph (Bonawitz et al., CCS 2017) or a sparse random
k-regular Harary graph over a seeded ordering of the clients (Bell et al., CCS 2020,
arXiv:2004.04637); the ordering is numpy's permutation (``draws="torch"``) or
:func:`fedge.core.portable.permutation` (``draws="portable"``, the same on every machine).
Design notes: docs/decisions.md#secure-aggregation.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from fedge.core import portable
from fedge.core.errors import ConfigError
from fedge.core.rng import Draws, check_draws, numpy_rng

__all__ = [
    "MaskGraph",
    "connected_components",
    "recommended_neighbors",
    "recommended_threshold",
]


def recommended_neighbors(n: int) -> int | None:
    """k = 2·⌈3·log2 n⌉ (even), or ``None`` (complete graph) when that is not below n - 1."""
    if n < 2:
        raise ConfigError(f"secure aggregation needs at least 2 clients, got {n}")
    k = 2 * math.ceil(3 * math.log2(n))
    return None if k >= n - 1 else k


def recommended_threshold(degree: int) -> int:
    """t = ⌊(k+1)/2⌋ + 1: a strict majority of a client's share group (itself and its k
    neighbours; k = n - 1 for the complete graph).

    2t > k + 1 means no server can collect t shares of both b_u and s_sk_u from honest holders
    (each reveals only one of the two), the condition of Bonawitz et al. (CCS 2017), §4.
    """
    if degree < 1:
        raise ConfigError(f"degree must be >= 1, got {degree}")
    return (degree + 1) // 2 + 1


@dataclass(frozen=True)
class MaskGraph:
    """An undirected graph on client ids; ``adjacency[u]`` = N(u), never containing u."""

    adjacency: Mapping[int, frozenset[int]]

    @classmethod
    def complete(cls, client_ids: Iterable[int]) -> MaskGraph:
        ids = _check_ids(client_ids)
        everyone = frozenset(ids)
        return cls({u: everyone - {u} for u in ids})

    @classmethod
    def harary(
        cls, client_ids: Iterable[int], k: int, *, seed: int, round: int, draws: Draws = "torch"
    ) -> MaskGraph:
        """H(k, n) on a random ring order drawn from (seed, "secagg-graph", round); k even.
        ``draws`` picks the generator of the order (module docstring)."""
        check_draws(draws)
        ids = _check_ids(client_ids)
        n = len(ids)
        if not isinstance(k, int) or k < 2 or k % 2 or k >= n - 1:
            raise ConfigError(
                f"neighbors must be an even int in [2, {n - 2}] for {n} clients, got {k!r}; "
                f"use neighbors=None for the complete graph"
            )
        if draws == "portable":
            perm = portable.permutation(portable.stream_key(seed, "secagg-graph", round), n)
            order = [ids[i] for i in perm.tolist()]
        else:
            order = [ids[i] for i in numpy_rng(seed, "secagg-graph", round).permutation(n)]
        adj: dict[int, frozenset[int]] = {}
        for pos, u in enumerate(order):
            adj[u] = frozenset(order[(pos + d) % n] for d in range(-(k // 2), k // 2 + 1) if d)
        return cls(adj)

    @classmethod
    def build(
        cls,
        client_ids: Iterable[int],
        neighbors: int | None,
        *,
        seed: int,
        round: int,
        draws: Draws = "torch",
    ) -> MaskGraph:
        """Complete graph if ``neighbors`` is None or >= n - 1, else :meth:`harary`."""
        ids = _check_ids(client_ids)
        check_draws(draws)
        if neighbors is None or neighbors >= len(ids) - 1:
            return cls.complete(ids)
        return cls.harary(ids, neighbors, seed=seed, round=round, draws=draws)

    def __len__(self) -> int:
        return len(self.adjacency)

    def __contains__(self, u: object) -> bool:
        return u in self.adjacency

    def neighbors(self, u: int) -> frozenset[int]:
        return self.adjacency[u]

    @property
    def min_degree(self) -> int:
        return min(len(a) for a in self.adjacency.values())


def connected_components(
    nodes: Collection[int], edges: Mapping[int, Collection[int]]
) -> list[frozenset[int]]:
    """Components of the graph induced on ``nodes`` (edges to other nodes ignored)."""
    todo, comps = set(nodes), []
    while todo:
        stack = [todo.pop()]
        comp = set(stack)
        while stack:
            for v in edges.get(stack.pop(), ()):
                if v in todo:
                    todo.discard(v)
                    comp.add(v)
                    stack.append(v)
        comps.append(frozenset(comp))
    return comps


def _check_ids(client_ids: Iterable[int]) -> list[int]:
    try:
        ids = sorted(operator.index(u) for u in client_ids)
    except TypeError as e:
        raise ConfigError(f"client ids must be ints: {e}") from e
    if len(ids) < 2:
        raise ConfigError(f"secure aggregation needs at least 2 clients, got {len(ids)}")
    if len(set(ids)) != len(ids):
        raise ConfigError("client ids must be distinct")
    if not 0 <= ids[0] <= ids[-1] < 2**32 - 1:
        raise ConfigError(f"client ids must be in [0, 2^32 - 1), got {ids[0]}..{ids[-1]}")
    return ids
