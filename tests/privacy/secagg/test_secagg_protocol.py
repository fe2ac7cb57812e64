"""The protocol against its oracle: the unmasked aggregate equals the plain sum of the
survivors' fixed-point encodings, exactly, with and without dropouts."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest

from fedge.core.errors import ConfigError
from fedge.privacy.secagg import (
    ClientState,
    FixedPoint,
    FixedPointRangeError,
    MaskGraph,
    SecAggConfig,
    SecAggError,
    ServerState,
    ShareDecryptionError,
    secure_sum,
)
from fedge.privacy.secagg.messages import BLOB_BYTES, Advertise, Forward

N, K = 5, 7
Entropy = Callable[[str], Callable[[int], bytes]]


def _inputs(n: int, k: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {u: rng.normal(scale=10.0, size=k) for u in range(n)}


def _oracle(inputs: dict[int, np.ndarray], survivors: set[int], fp: FixedPoint) -> np.ndarray:
    return fp.ring_sum(fp.encode(inputs[u], n_summands=len(inputs)) for u in sorted(survivors))


def test_complete_graph_sum_is_exact() -> None:
    # Prepare
    inputs = _inputs(N, K)
    # Execute
    res = secure_sum(inputs, threshold=3, round=1, seed=0)
    # Assert
    np.testing.assert_array_equal(res.sum_fixed, _oracle(inputs, set(inputs), res.fixed_point))
    plain = np.sum(list(inputs.values()), axis=0)
    assert np.max(np.abs(res.sum_float - plain)) <= N * 0.5 / res.fixed_point.scale
    assert res.survivors == frozenset(range(N)) and res.dropped == frozenset()
    assert res.degree == N - 1 and res.threshold == 3


@pytest.mark.parametrize("dropped", [{1}, {0, 4}, {2, 3}])
@pytest.mark.parametrize("bits", [32, 64])
def test_dropouts_after_key_agreement_still_exact(dropped: set[int], bits: int) -> None:
    inputs = _inputs(N, K, seed=len(dropped))
    res = secure_sum(
        inputs, threshold=3, round=7, seed=1, dropouts_after_keys=dropped, bits=bits, frac_bits=12
    )
    survivors = set(inputs) - dropped
    assert res.survivors == survivors and res.dropped == dropped
    np.testing.assert_array_equal(res.sum_fixed, _oracle(inputs, survivors, res.fixed_point))


def test_dropouts_during_unmasking_keep_their_inputs() -> None:
    inputs = _inputs(N, K)
    res = secure_sum(
        inputs,
        threshold=3,
        round=2,
        seed=0,
        dropouts_after_keys={0},
        dropouts_before_unmask={3},
    )
    np.testing.assert_array_equal(res.sum_fixed, _oracle(inputs, {1, 2, 3, 4}, res.fixed_point))


def test_too_many_dropouts_abort_with_a_clear_error() -> None:
    inputs = _inputs(N, K)
    with pytest.raises(SecAggError, match="threshold t=3"):
        secure_sum(inputs, threshold=3, round=1, seed=0, dropouts_after_keys={0, 1, 3})
    with pytest.raises(SecAggError, match="cannot unmask: only 2 of the threshold t=3"):
        secure_sum(inputs, threshold=3, round=1, seed=0, dropouts_before_unmask={0, 1, 2})


def test_sparse_graph_with_dropouts_is_exact() -> None:
    inputs = _inputs(40, 5)
    dropped = {3, 17, 18, 29}
    res = secure_sum(inputs, threshold=6, round=4, seed=3, neighbors=8, dropouts_after_keys=dropped)
    assert res.degree == 8
    np.testing.assert_array_equal(
        res.sum_fixed, _oracle(inputs, set(inputs) - dropped, res.fixed_point)
    )


def test_shape_is_kept_and_results_are_reproducible() -> None:
    inputs = {u: np.full((2, 3), float(u) - 2.5) for u in range(4)}
    a = secure_sum(inputs, threshold=3, round=0, seed=0, dropouts_after_keys={1})
    b = secure_sum(inputs, threshold=3, round=0, seed=0, dropouts_after_keys={1})
    assert a.sum_fixed.shape == (2, 3)
    np.testing.assert_array_equal(a.sum_fixed, b.sum_fixed)  # fresh keys, same exact sum
    np.testing.assert_array_equal(a.sum_float, np.full((2, 3), -2.5 - 0.5 + 0.5))  # u = 0, 2, 3


def test_weighted_sum_for_baffle_eq7() -> None:
    # BAFFLE Eq. (7): server needs Σ_c N_c/N ΔL_c; clients pre-multiply and append the weight
    rng = np.random.default_rng(4)
    n_c = {u: int(rng.integers(10, 100)) for u in range(6)}
    n_total = sum(n_c.values())
    dl = {u: rng.normal(size=4) for u in range(6)}
    inputs = {u: np.append(n_c[u] / n_total * dl[u], n_c[u] / n_total) for u in range(6)}
    res = secure_sum(inputs, threshold=4, round=1, seed=0, dropouts_after_keys={2})
    survivors = [u for u in range(6) if u != 2]
    expected = sum(n_c[u] * dl[u] for u in survivors) / sum(n_c[u] for u in survivors)
    weighted = res.sum_float[:-1] / res.sum_float[-1]
    np.testing.assert_allclose(weighted, expected, atol=1e-5)


def test_byte_counts_match_the_wire_format() -> None:
    # n = 10, K = 100, complete graph, no dropouts: every client sends/receives the same
    n, k = 10, 100
    res = secure_sum(_inputs(n, k), threshold=6, round=1, seed=0)
    hdr, cnt, share = 9, 4, 34
    up = (
        hdr
        + 64  # Advertise: c_pk, s_pk
        + hdr
        + cnt
        + (n - 1) * (4 + BLOB_BYTES)  # Shares to each neighbour
        + hdr
        + 8 * k  # MaskedInput, 64-bit ring
        + hdr
        + cnt
        + n * (4 + share)
        + cnt  # UnmaskResponse: b-shares of all n (self too)
    )
    down = (
        hdr
        + cnt
        + (n - 1) * (4 + 64)  # KeyList
        + hdr
        + cnt
        + (n - 1) * (4 + BLOB_BYTES)  # Forward
        + hdr
        + cnt
        + (n - 1) * 4
        + cnt  # UnmaskRequest
    )
    assert BLOB_BYTES == 12 + 2 * share + 16
    assert set(res.bytes_up_per_client.values()) == {up} == {2192}
    assert set(res.bytes_down_per_client.values()) == {down} == {1591}
    small = secure_sum(_inputs(n, k), threshold=6, round=1, seed=0, bits=32, frac_bits=16)
    assert small.bytes_up_per_client[0] == up - 4 * k


def test_threshold_validation() -> None:
    inputs = _inputs(N, K)
    with pytest.raises(ConfigError, match="exceeds the smallest share group"):
        secure_sum(inputs, threshold=6, round=1, seed=0)
    with pytest.warns(UserWarning, match="at most half"):
        secure_sum(inputs, threshold=2, round=1, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        secure_sum(inputs, threshold=3, round=1, seed=0)


def _run_to_forward(
    n: int, entropy: Entropy
) -> tuple[ServerState, dict[int, ClientState], dict[int, bytes]]:
    config = SecAggConfig(threshold=2, length=3)
    graph = MaskGraph.complete(range(n))
    server = ServerState(round=5, config=config, graph=graph)
    clients = {
        u: ClientState(u, round=5, config=config, graph=graph, entropy=entropy(f"c{u}"))
        for u in range(n)
    }
    for c in clients.values():
        server.receive_advertise(c.advertise_keys())
    for u, msg in server.broadcast_keys().items():
        server.receive_shares(clients[u].share_keys(msg))
    return server, clients, server.forward_shares()


def test_tampered_share_is_rejected_by_aes_gcm(fixed_entropy: Entropy) -> None:
    server, clients, fwd = _run_to_forward(3, fixed_entropy)
    # the server (or the network) flips one bit of client 1's ciphertext for client 0
    msg = Forward.from_bytes(fwd[0])
    blob = bytearray(msg.blobs[1])
    blob[BLOB_BYTES // 2] ^= 0x80
    tampered = Forward(msg.round, msg.party, {**msg.blobs, 1: bytes(blob)}).to_bytes()
    for u in range(3):
        y = clients[u].masked_input(tampered if u == 0 else fwd[u], np.ones(3))
        server.receive_masked_input(y)
    req = server.unmask_requests()
    with pytest.raises(ShareDecryptionError, match="from client 1 to client 0"):
        clients[0].unmask(req[0])


def test_steps_run_once_and_in_order(fixed_entropy: Entropy) -> None:
    server, clients, fwd = _run_to_forward(3, fixed_entropy)
    with pytest.raises(SecAggError, match="called at step"):
        clients[0].share_keys(b"")
    with pytest.raises(SecAggError, match="after its step closed"):
        server.receive_advertise(Advertise(5, 0, b"a" * 32, b"b" * 32).to_bytes())
    with pytest.raises(SecAggError, match="got a share forward for client 1"):
        clients[0].masked_input(fwd[1], np.ones(3))


def test_a_message_must_name_the_client_it_arrived_from(fixed_entropy: Entropy) -> None:
    """Authenticated channels (Bonawitz et al. Sec. 4): client 0 sending client 1's keys is refused
    and changes nothing, so client 1's own message is still taken."""
    config = SecAggConfig(threshold=2, length=3)
    graph = MaskGraph.complete(range(3))
    server = ServerState(round=5, config=config, graph=graph)
    clients = {
        u: ClientState(u, round=5, config=config, graph=graph, entropy=fixed_entropy(f"c{u}"))
        for u in range(3)
    }
    forged = Advertise(5, 1, b"a" * 32, b"b" * 32).to_bytes()
    with pytest.raises(SecAggError, match="claims to be from client 1 but arrived from client 0"):
        server.receive_advertise(forged, sender=0)
    for u, c in clients.items():
        server.receive_advertise(c.advertise_keys(), sender=u)
    replies = {u: clients[u].share_keys(msg) for u, msg in server.broadcast_keys().items()}
    with pytest.raises(
        SecAggError, match="Shares claims to be from client 2 but arrived from client 1"
    ):
        server.receive_shares(replies[2], sender=1)
    for u, msg in replies.items():
        server.receive_shares(msg, sender=u)
    fwd = server.forward_shares()
    ys = {u: clients[u].masked_input(fwd[u], np.full(3, float(u))) for u in range(3)}
    with pytest.raises(
        SecAggError, match="MaskedInput claims to be from client 0 but arrived from client 2"
    ):
        server.receive_masked_input(ys[0], sender=2)
    for u, y in ys.items():
        server.receive_masked_input(y, sender=u)
    answers = {u: clients[u].unmask(req) for u, req in server.unmask_requests().items()}
    with pytest.raises(
        SecAggError, match="UnmaskResponse claims to be from client 1 but arrived from client 0"
    ):
        server.receive_unmask(answers[1], sender=0)
    for u, a in answers.items():
        server.receive_unmask(a, sender=u)
    assert np.allclose(config.fixed_point.decode(server.finalize()), np.full(3, 3.0))


def test_dropouts_at_every_step_together() -> None:
    inputs = _inputs(8, K)
    res = secure_sum(
        inputs,
        threshold=5,
        round=3,
        seed=0,
        dropouts_after_advertise={5},
        dropouts_after_keys={1},
        dropouts_before_unmask={2},
    )
    assert res.survivors == {0, 2, 3, 4, 6, 7} and res.dropped == {1}
    np.testing.assert_array_equal(
        res.sum_fixed, _oracle(inputs, {0, 2, 3, 4, 6, 7}, res.fixed_point)
    )


def test_disconnected_survivors_are_warned_about() -> None:
    # a ring (k = 2) cut in two places: the server could learn each arc's sum
    inputs = _inputs(12, K)
    graph = MaskGraph.build(range(12), 2, seed=0, round=0)
    a = 0
    b = next(v for v in range(12) if v != a and not graph.neighbors(a) & ({v} | graph.neighbors(v)))
    with pytest.warns(UserWarning, match="connected components"):
        res = secure_sum(
            inputs, threshold=2, round=0, seed=0, neighbors=2, dropouts_after_keys={a, b}
        )
    np.testing.assert_array_equal(
        res.sum_fixed, _oracle(inputs, set(range(12)) - {a, b}, res.fixed_point)
    )


@pytest.mark.parametrize("rnd", [-1, 2**32])
def test_round_must_fit_the_header(rnd: int) -> None:
    with pytest.raises(ConfigError, match="round"):
        secure_sum(_inputs(N, K), threshold=3, round=rnd, seed=0)


def test_bad_input_raises_before_masking_and_can_be_retried(fixed_entropy: Entropy) -> None:
    server, clients, fwd = _run_to_forward(3, fixed_entropy)
    fp = server.config.fixed_point
    with pytest.raises(FixedPointRangeError):
        clients[0].masked_input(fwd[0], np.array([0.0, np.inf, 1.0]))
    with pytest.raises(SecAggError, match="expected K=3"):
        clients[0].masked_input(fwd[0], np.ones(4))
    x = {0: np.array([1.0, -2.0, 3.5]), 1: np.full(3, 0.25), 2: np.zeros(3)}
    for u, c in clients.items():
        server.receive_masked_input(c.masked_input(fwd[u], x[u]))
    for u, msg in server.unmask_requests().items():
        server.receive_unmask(clients[u].unmask(msg))
    np.testing.assert_array_equal(fp.decode(server.finalize()), [1.25, -1.75, 3.75])
