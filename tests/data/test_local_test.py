"""Each client's local test split: disjoint from its training shard, seeded, deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.core.errors import ConfigError
from fedge.data.partition import partition
from fedge.data.partition.holdout import held_out_count, split_local_tests


@pytest.mark.parametrize(
    ("n", "fraction", "expected"),
    [
        (100, 0.2, 20),
        (7, 0.2, 1),
        (2, 0.2, 1),
        (1, 0.5, 0),
        (0, 0.5, 0),
        (10, 0.95, 9),
        (5, 0.5, 3),
    ],
)
def test_held_out_count(n, fraction, expected):
    assert held_out_count(n, fraction) == expected


@pytest.mark.parametrize("draws", ["torch", "portable"])
def test_split_is_disjoint_covers_each_client_and_is_seeded(draws):
    labels = np.repeat(np.arange(10), 50)
    parts = partition("dirichlet", labels, 8, seed=3, alpha=0.5)
    train, test = split_local_tests(parts, 0.25, seed=3, draws=draws)
    for part, tr, te in zip(parts, train, test, strict=True):
        assert np.intersect1d(tr, te).size == 0
        assert np.array_equal(np.sort(np.concatenate([tr, te])), np.sort(part))
        assert len(te) == held_out_count(len(part), 0.25)
        assert np.all(np.diff(tr) > 0) and np.all(np.diff(te) > 0)
    again = split_local_tests(parts, 0.25, seed=3, draws=draws)
    assert all(np.array_equal(a, b) for a, b in zip(test, again[1], strict=True))
    other = split_local_tests(parts, 0.25, seed=4, draws=draws)
    assert any(not np.array_equal(a, b) for a, b in zip(test, other[1], strict=True))


def test_a_clients_split_does_not_depend_on_the_others():
    parts = [np.arange(0, 40), np.arange(40, 100)]
    _, both = split_local_tests(parts, 0.3, seed=0)
    _, alone = split_local_tests([np.arange(0, 40)], 0.3, seed=0)
    assert np.array_equal(both[0], alone[0])


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, True])
def test_fraction_outside_zero_one_is_refused(bad):
    with pytest.raises(ConfigError, match=r"partition.local_test=.*fraction in \(0, 1\)"):
        split_local_tests([np.arange(10)], bad, seed=0)
