"""Fixed-point codec: round trips, exact modular sums of negatives, and the overflow bound."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.core.errors import ConfigError, DivergenceError
from fedge.privacy.secagg import FixedPoint, FixedPointRangeError


@pytest.mark.parametrize(("bits", "frac_bits"), [(64, 24), (64, 0), (32, 16), (32, 8)])
def test_round_trip_within_half_a_step(bits: int, frac_bits: int) -> None:
    fp = FixedPoint(bits=bits, frac_bits=frac_bits)
    x = np.random.default_rng(0).uniform(-1, 1, size=1000) * fp.max_abs(1)
    back = fp.decode(fp.encode(x, n_summands=1))
    assert np.max(np.abs(back - x)) <= 0.5 / fp.scale


def test_negatives_are_twos_complement() -> None:
    fp = FixedPoint(bits=32, frac_bits=8)
    q = fp.encode([-1.0, -(2.0**-8), 0.0, 1.0], n_summands=1)
    assert q.dtype == np.uint64
    assert q.tolist() == [2**32 - 256, 2**32 - 1, 0, 256]
    fp64 = FixedPoint(bits=64, frac_bits=8)
    assert fp64.encode([-1.0], n_summands=1).tolist() == [2**64 - 256]


@pytest.mark.parametrize("bits", [32, 64])
def test_sum_of_negatives_is_exact(bits: int) -> None:
    # Prepare: 50 clients, mostly negative values, so the ring sum wraps many times
    fp = FixedPoint(bits=bits, frac_bits=10)
    rng = np.random.default_rng(1)
    xs = [rng.uniform(-1, 0.2, size=64) * fp.max_abs(50) for _ in range(50)]
    # Execute
    total = fp.ring_sum(fp.encode(x, n_summands=50) for x in xs)
    # Assert: against Python-int arithmetic on the rounded values
    exact = [sum(int(np.rint(x[i] * fp.scale)) for x in xs) for i in range(64)]
    assert fp.to_signed(total).tolist() == exact
    assert np.all(fp.decode(total) < 0)
    np.testing.assert_array_equal(fp.decode(total), np.array(exact, dtype=np.float64) / fp.scale)


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("n", [1, 3, 1000])
def test_extreme_values_at_the_bound_do_not_wrap(bits: int, n: int) -> None:
    fp = FixedPoint(bits=bits, frac_bits=12)
    for sign in (1.0, -1.0):
        q = fp.encode([sign * fp.max_abs(n)], n_summands=n)
        total = fp.ring_sum([q] * n)
        assert int(fp.to_signed(total)[0]) == int(fp.to_signed(q)[0]) * n
        assert np.sign(fp.decode(total)[0]) == sign


@pytest.mark.parametrize("bits", [32, 64])
def test_overflow_is_an_error_not_a_wrong_sum(bits: int) -> None:
    fp = FixedPoint(bits=bits, frac_bits=16)
    too_big = fp.max_abs(10) * 1.001
    with pytest.raises(FixedPointRangeError, match="exceeds the fixed-point range"):
        fp.encode([0.0, too_big], n_summands=10)
    with pytest.raises(FixedPointRangeError):
        fp.encode([-too_big], n_summands=10)
    fp.encode([too_big], n_summands=9)  # fine for fewer clients
    with pytest.raises(ValueError):  # FixedPointRangeError is a ValueError
        fp.encode([2.0 ** (bits - 16)], n_summands=1)


def test_a_value_out_of_range_is_a_divergence_naming_the_value() -> None:
    fp = FixedPoint(bits=32, frac_bits=16)
    with pytest.raises(DivergenceError) as info:  # in a run: the updates blew up
        fp.encode([1e9], n_summands=2)
    assert info.value.cause == (
        f"value 1000000000.0 exceeds the fixed-point range ±{fp.max_abs(2):.6g} for a sum of 2 "
        "clients (bits=32, frac_bits=16)"
    )
    with pytest.raises(DivergenceError) as info:
        fp.encode([np.nan], n_summands=2)
    assert str(info.value).startswith(info.value.cause + "; ")  # the message's first clause
    assert re.fullmatch(r"cannot encode non-finite value \S*nan\)?", info.value.cause)


def test_non_finite_is_rejected() -> None:
    fp = FixedPoint()
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(FixedPointRangeError, match="non-finite"):
            fp.encode([1.0, bad], n_summands=2)


@pytest.mark.parametrize(("bits", "frac_bits"), [(16, 8), (64, 63), (32, -1)])
def test_bad_config(bits: int, frac_bits: int) -> None:
    with pytest.raises(ConfigError):
        FixedPoint(bits=bits, frac_bits=frac_bits)  # type: ignore[arg-type]


@pytest.mark.parametrize("bits", [32, 64])
def test_wire_round_trip(bits: int) -> None:
    fp = FixedPoint(bits=bits, frac_bits=4)
    q = fp.encode(np.linspace(-100, 100, 17), n_summands=4)
    buf = fp.to_bytes(q)
    assert len(buf) == 17 * bits // 8
    np.testing.assert_array_equal(fp.from_bytes(buf), q)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=3, max_size=3),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from([32, 64]),
)
def test_decoded_ring_sum_equals_integer_sum(rows: list[list[float]], bits: int) -> None:
    fp = FixedPoint(bits=bits, frac_bits=12 if bits == 64 else 4)
    total = fp.ring_sum(fp.encode(r, n_summands=len(rows)) for r in rows)
    exact = [sum(round(r[i] * fp.scale) for r in rows) for i in range(3)]  # half-even, as rint
    assert fp.to_signed(total).tolist() == exact
