"""Shamir sharing: any t shares reconstruct, t - 1 do not."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.core.errors import ConfigError
from fedge.privacy.secagg.errors import SecAggError
from fedge.privacy.secagg.shamir import PRIME, Share, combine, combine_elements, split


def _is_probable_prime(n: int) -> bool:
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_field_modulus_is_prime_and_holds_a_block() -> None:
    assert PRIME == 2**130 - 5
    assert _is_probable_prime(PRIME)
    assert 2**128 < PRIME


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_any_t_shares_reconstruct_and_t_minus_1_do_not(data: st.DataObject) -> None:
    # Prepare
    secret = data.draw(st.binary(min_size=1, max_size=48), label="secret")
    n = data.draw(st.integers(1, 9), label="n")
    t = data.draw(st.integers(1, n), label="t")
    xs = data.draw(st.lists(st.integers(1, 2**32), min_size=n, max_size=n, unique=True), label="xs")
    shares = split(secret, xs, threshold=t)
    # Execute / Assert: a random subset of exactly t shares gives the secret back
    chosen = data.draw(st.permutations(xs), label="order")[:t]
    assert combine([shares[x] for x in chosen], nbytes=len(secret)) == secret
    # ... and so does any larger subset
    assert combine(list(shares.values()), nbytes=len(secret)) == secret
    # t - 1 shares interpolate to another field element (probability 1 - 1/p per block)
    if t >= 2:
        padded = secret + bytes(-len(secret) % 16)
        blocks = [int.from_bytes(padded[i : i + 16], "little") for i in range(0, len(padded), 16)]
        wrong = combine_elements([shares[x] for x in chosen[: t - 1]])
        assert all(w != b for w, b in zip(wrong, blocks, strict=True))


def test_fewer_than_t_shares_usually_raise_on_bytes() -> None:
    secret = bytes(range(32))
    shares = split(secret, [1, 2, 3, 4, 5], threshold=3)
    outcomes = []
    for pair in ([1, 2], [2, 3], [3, 4], [4, 5], [1, 5]):
        try:
            outcomes.append(combine([shares[x] for x in pair], nbytes=32))
        except SecAggError:
            outcomes.append(None)
    assert secret not in outcomes


def test_share_wire_format_round_trip() -> None:
    shares = split(b"k" * 32, [7, 8, 9], threshold=2)
    for x, sh in shares.items():
        buf = sh.to_bytes()
        assert len(buf) == 34
        assert Share.from_bytes(x, buf) == sh


@pytest.mark.parametrize("xs", [[0, 1, 2], [1, 1, 2], [1, PRIME]])
def test_bad_points(xs: list[int]) -> None:
    with pytest.raises(ConfigError):
        split(b"s", xs, threshold=2)


@pytest.mark.parametrize("t", [0, 4])
def test_bad_threshold(t: int) -> None:
    with pytest.raises(ConfigError, match="threshold"):
        split(b"s", [1, 2, 3], threshold=t)
