"""A client's masked upload y_u is independent of its plaintext: uniform over Z_{2^64}
whatever x_u is, and uncorrelated with it. Client randomness comes from fixed streams, so the
test cannot flake; the last test shows the same statistics reject unmasked or weakly
masked uploads, so this test would fail if masking broke."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from fedge.privacy.secagg import ClientState, FixedPoint, MaskGraph, SecAggConfig, ServerState
from fedge.privacy.secagg.messages import MaskedInput
from fedge.privacy.secagg.prg import prg

N, K, RUNS = 3, 128, 40  # 40 rounds × 128 coordinates = 5120 uploads per plaintext
FP = FixedPoint(bits=64, frac_bits=24)
ALPHA = 1e-3

Entropy = Callable[[str], Callable[[int], bytes]]


def _plaintexts(kind: str) -> np.ndarray:  # (RUNS, K)
    if kind == "zeros":
        return np.zeros((RUNS, K))
    rng = np.random.default_rng(2024)
    return rng.uniform(0.0, 0.9 * FP.max_abs(N), size=(RUNS, K))  # huge and positive


def _masked_uploads(plain: np.ndarray, label: str, entropy: Entropy) -> np.ndarray:
    """Client 0's y_0 in RUNS independent rounds, driven through the real message flow."""
    out = np.empty((RUNS, K), dtype=np.uint64)
    config = SecAggConfig(threshold=2, length=K, fixed_point=FP)
    for r in range(RUNS):
        graph = MaskGraph.complete(range(N))
        server = ServerState(round=r, config=config, graph=graph)
        clients = {
            u: ClientState(
                u, round=r, config=config, graph=graph, entropy=entropy(f"{label}/{r}/{u}")
            )
            for u in range(N)
        }
        for c in clients.values():
            server.receive_advertise(c.advertise_keys())
        for u, msg in server.broadcast_keys().items():
            server.receive_shares(clients[u].share_keys(msg))
        fwd = server.forward_shares()
        y0 = MaskedInput.from_bytes(clients[0].masked_input(fwd[0], plain[r]))
        out[r] = FP.from_bytes(y0.y)
    return out


def _top_bits_counts(v: np.ndarray) -> np.ndarray:
    return np.bincount((v.ravel() >> np.uint64(60)).astype(np.int64), minlength=16)


def _uniformity_pvalues(v: np.ndarray) -> tuple[float, float]:
    """(chi-square on the top 4 bits, Kolmogorov-Smirnov of v / 2^64) against uniform."""
    chi = stats.chisquare(_top_bits_counts(v)).pvalue
    ks = stats.kstest(v.ravel().astype(np.float64) / 2.0**64, "uniform").pvalue
    return float(chi), float(ks)


def _correlation(plain: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(plain.ravel(), y.ravel().astype(np.float64))[0, 1])


@pytest.fixture(scope="module")
def uploads(fixed_entropy: Entropy) -> dict[str, np.ndarray]:
    return {k: _masked_uploads(_plaintexts(k), k, fixed_entropy) for k in ("zeros", "large")}


def test_masked_uploads_are_uniform_for_very_different_plaintexts(
    uploads: dict[str, np.ndarray],
) -> None:
    for kind, y in uploads.items():
        chi, ks = _uniformity_pvalues(y)
        assert chi > ALPHA and ks > ALPHA, (kind, chi, ks)
    # the two upload distributions are indistinguishable from each other
    table = np.stack([_top_bits_counts(uploads["zeros"]), _top_bits_counts(uploads["large"])])
    assert stats.chi2_contingency(table).pvalue > ALPHA
    assert (
        stats.ks_2samp(
            uploads["zeros"].ravel().astype(np.float64), uploads["large"].ravel().astype(np.float64)
        ).pvalue
        > ALPHA
    )


def test_masked_upload_is_uncorrelated_with_plaintext(uploads: dict[str, np.ndarray]) -> None:
    assert abs(_correlation(_plaintexts("large"), uploads["large"])) < 0.05


def test_the_statistics_catch_missing_or_weak_masks() -> None:
    # Power check: the same tests reject the unmasked encoding, and a mask below 2^32.
    plain = _plaintexts("large")
    enc = FP.encode(plain, n_summands=N)
    small = prg(b"\x05" * 32, RUNS * K).reshape(RUNS, K) & np.uint64(2**32 - 1)
    for y in (enc, FP.add(enc, small), FP.encode(_plaintexts("zeros"), n_summands=N) + small):
        chi, ks = _uniformity_pvalues(y)
        assert chi < 1e-6 and ks < 1e-6
    assert _correlation(plain, enc) > 0.99
    assert _correlation(plain, FP.add(enc, small)) > 0.99
