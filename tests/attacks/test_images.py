"""Scoring reconstructions: one-to-one matching of a batch to the client's local set."""

from __future__ import annotations

import pytest


def test_a_batch_is_matched_one_to_one_and_one_image_to_its_closest() -> None:
    """Two reconstructions near the same local image: closest-image matching scores both
    against it (0.01 each); the one-to-one assignment must give the second the other image.
    Against brute force over every injective assignment on random images."""
    import itertools
    from types import SimpleNamespace

    import torch

    from fedge.attacks.images import match_images

    ds = SimpleNamespace(mean=(0.0,), std=(1.0,))  # normalized space = pixel space
    local = torch.stack([torch.zeros(1, 2, 2), torch.ones(1, 2, 2)])
    recs = torch.full((2, 1, 2, 2), 0.1)
    assert match_images(recs[:1], local, ds) == [(pytest.approx(0.01), 0)]
    got = match_images(recs, local, ds)
    assert sorted(at for _, at in got) == [0, 1]
    assert sorted(m for m, _ in got) == [pytest.approx(0.01), pytest.approx(0.81)]

    g = torch.Generator().manual_seed(0)
    local, recs = torch.rand(6, 1, 3, 3, generator=g), torch.rand(4, 1, 3, 3, generator=g)
    cost = [[float(((r - x) ** 2).mean()) for x in local] for r in recs]
    best = min(sum(cost[j][p[j]] for j in range(4)) for p in itertools.permutations(range(6), 4))
    got = match_images(recs, local, ds)
    assert len({at for _, at in got}) == 4
    assert sum(m for m, _ in got) == pytest.approx(best)
    with pytest.raises(ValueError, match="at most as many reconstructions as images"):
        match_images(recs, local[:3], ds)
