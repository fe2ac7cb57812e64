"""Mask graphs: complete, and the seeded sparse Harary graph of Bell et al."""

from __future__ import annotations

import pytest

from fedge.core import portable
from fedge.core.errors import ConfigError
from fedge.privacy.secagg import MaskGraph, recommended_neighbors, recommended_threshold
from fedge.privacy.secagg.graph import connected_components


@pytest.mark.parametrize("draws", ["torch", "portable"])
def test_harary_graph_is_k_regular_symmetric_and_seeded(draws: str) -> None:
    ids = list(range(100, 300))
    g = MaskGraph.harary(ids, 10, seed=5, round=2, draws=draws)
    assert len(g) == 200
    for u in ids:
        assert len(g.neighbors(u)) == 10 and u not in g.neighbors(u)
        assert all(u in g.neighbors(v) for v in g.neighbors(u))
    assert g == MaskGraph.harary(reversed(ids), 10, seed=5, round=2, draws=draws)
    assert g != MaskGraph.harary(ids, 10, seed=5, round=3, draws=draws)
    assert MaskGraph.build(ids, 10, seed=5, round=2, draws=draws) == g


def test_portable_harary_graph_is_the_ring_of_the_portable_permutation() -> None:
    # Oracle: H(k, n) spelled out on the ring order portable.permutation gives for the key.
    ids = [3, 8, 11, 20, 21, 40, 41, 50]
    perm = portable.permutation(portable.stream_key(9, "secagg-graph", 4), len(ids)).tolist()
    ring = [ids[i] for i in perm]
    g = MaskGraph.harary(ids, 4, seed=9, round=4, draws="portable")
    for pos, u in enumerate(ring):
        want = {ring[(pos + d) % len(ids)] for d in (-2, -1, 1, 2)}
        assert g.neighbors(u) == frozenset(want)
    assert g != MaskGraph.harary(ids, 4, seed=9, round=4)  # the numpy ring differs
    with pytest.raises(ConfigError, match="draws must be one of"):
        MaskGraph.build(ids, 4, seed=9, round=4, draws="numpy")  # type: ignore[arg-type]
    assert len(connected_components(ids, g.adjacency)) == 1


def test_build_falls_back_to_complete_graph() -> None:
    g = MaskGraph.build(range(6), None, seed=0, round=0)
    assert g.min_degree == 5 and g == MaskGraph.complete(range(6))
    assert MaskGraph.build(range(6), 5, seed=0, round=0) == g


@pytest.mark.parametrize("k", [3, 0, 9])
def test_bad_degree(k: int) -> None:
    with pytest.raises(ConfigError, match="even int"):
        MaskGraph.harary(range(10), k, seed=0, round=0)


def test_bad_ids() -> None:
    with pytest.raises(ConfigError, match="at least 2"):
        MaskGraph.complete([1])
    with pytest.raises(ConfigError, match="2\\^32"):
        MaskGraph.complete([0, 2**32])


def test_recommendations() -> None:
    assert recommended_neighbors(1000) == 60
    assert recommended_neighbors(10) is None
    assert recommended_threshold(60) == 31  # majority of a 61-client share group
    assert recommended_threshold(4) == 3  # complete graph of 5
