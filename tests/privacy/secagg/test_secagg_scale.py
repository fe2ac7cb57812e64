"""1000 clients on the sparse graph, 10 % dropping out after key agreement: the unmasked
aggregate equals the fixed-point sum of the survivors' inputs exactly."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.privacy.secagg import recommended_neighbors, recommended_threshold, secure_sum


@pytest.mark.slow
def test_thousand_clients_ten_percent_dropouts_exact() -> None:
    # Prepare: 1000 clients, K = 100, BAFFLE-like magnitudes; 100 drop after sharing keys
    n, k = 1000, 100
    rng = np.random.default_rng(11)
    inputs = {u: rng.normal(scale=0.5, size=k) for u in range(n)}
    dropped = set(rng.choice(n, size=n // 10, replace=False).tolist())
    degree = recommended_neighbors(n)
    assert degree == 60
    # Execute
    res = secure_sum(
        inputs,
        threshold=recommended_threshold(degree),
        round=9,
        seed=123,
        neighbors=degree,
        dropouts_after_keys=dropped,
    )
    # Assert: exact ring equality with the plain sum of the survivors' encodings
    fp = res.fixed_point
    survivors = sorted(set(inputs) - dropped)
    oracle = fp.ring_sum(fp.encode(inputs[u], n_summands=n) for u in survivors)
    assert res.survivors == frozenset(survivors) and res.dropped == frozenset(dropped)
    np.testing.assert_array_equal(res.sum_fixed, oracle)
    plain = np.sum([inputs[u] for u in survivors], axis=0)
    assert np.max(np.abs(res.sum_float - plain)) <= len(survivors) * 0.5 / fp.scale
    # sparse graph: per-client traffic depends on k, not n
    assert max(res.bytes_up_per_client.values()) < 10_000
