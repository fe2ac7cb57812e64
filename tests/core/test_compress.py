"""The codecs against their defining properties: top-k keeps exactly the k largest |x_i|;
random-k, QSGD and b-bit quantization are unbiased (the mean of many seeded draws within five
standard errors derived from each codec's own variance); QSGD's variance equals its closed form
and stays under Alistarh et al.'s Lemma 3.1 bound; quantization errs by at most one step; the
scaled sign is (‖x‖₁/d)·sign(x); bit-packing round-trips; :func:`payload_bytes` is the byte count
of the arrays on the wire; the same seed gives the same bytes."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
import torch

from fedge.core.compress import (
    CompressSpec,
    decode,
    encode,
    pack_bits,
    payload_bytes,
    unpack_bits,
)
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.core.rng import make_generator

DRAWS = ["torch", "portable"]


def _x(d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _roundtrip(spec: CompressSpec, x: torch.Tensor, seed: int, draws: str = "torch"):
    arrays = encode(spec, x, make_generator(draws, seed, "c"), seed=seed)
    return decode(spec, arrays, x.numel(), gen=make_generator(draws, seed, "c"))


def _mean_of_draws(spec, x, n, draws="torch"):
    return torch.stack([_roundtrip(spec, x, s, draws) for s in range(n)]).to(torch.float64)


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.37, 1.0])
def test_topk_keeps_exactly_the_k_largest_magnitudes(ratio):
    x = _x(1000)
    spec = CompressSpec("topk", ratio=ratio)
    k = max(1, round(ratio * 1000))
    y = _roundtrip(spec, x, 0)
    kept = set(torch.nonzero(y).reshape(-1).tolist())
    oracle = set(sorted(range(1000), key=lambda i: -abs(float(x[i])))[:k])
    assert kept == oracle and len(kept) == spec.k(1000) == k
    assert torch.equal(y[sorted(kept)], x[sorted(kept)])  # the values as they are


@pytest.mark.parametrize("draws", DRAWS)
def test_randk_is_unbiased_and_sends_k_scaled_values(draws):
    """C(x)_i = (d/k)·x_i with probability k/d, else 0: variance x_i²·(d/k − 1)."""
    d, n = 40, 3000
    x = _x(d)
    spec = CompressSpec("randk", ratio=0.25)
    y = _roundtrip(spec, x, 7, draws)
    assert int((y != 0).sum()) == 10 and torch.allclose(y[y != 0], x[y != 0] * 4)
    mean = _mean_of_draws(spec, x, n, draws).mean(0)
    sem = x.abs().to(torch.float64) * math.sqrt((d / 10 - 1) / n)
    assert bool(((mean - x).abs() <= 5 * sem + 1e-7).all())


def _qsgd_variance(x: torch.Tensor, s: int, bucket: int) -> float:
    """E‖Q_s(x) − x‖² = Σ_buckets ‖v‖²/s² · Σ_i p_i(1 − p_i), p_i = frac(s|v_i|/‖v‖)."""
    total = 0.0
    for v in x.to(torch.float64).split(bucket):
        norm = float(v.norm())
        if norm:
            r = v.abs() / norm * s
            p = r - r.floor()
            total += norm**2 / s**2 * float((p * (1 - p)).sum())
    return total


@pytest.mark.parametrize(("levels", "bucket"), [(1, 64), (7, 100), (15, 1000)])
def test_qsgd_is_unbiased_with_its_closed_form_variance_under_lemma_3_1(levels, bucket):
    d, n = 300, 2000
    x = _x(d, 3)
    spec = CompressSpec("qsgd", levels=levels, bucket=bucket)
    draws = _mean_of_draws(spec, x, n)
    # unbiased: each coordinate's variance is ‖v‖²/s²·p(1−p) ≤ ‖v‖²/(4s²)
    norms = torch.cat(
        [torch.full((len(v),), float(v.norm())) for v in x.to(torch.float64).split(bucket)]
    )
    sem = norms / (2 * levels) / math.sqrt(n)
    assert bool(((draws.mean(0) - x).abs() <= 5 * sem).all())
    # the variance: its closed form, and Lemma 3.1's min(n/s², √n/s)·‖x‖² per bucket
    measured = float(((draws - x) ** 2).sum(1).mean())
    exact = _qsgd_variance(x, levels, bucket)
    assert measured == pytest.approx(exact, rel=0.1)
    lemma = sum(
        min(len(v) / levels**2, math.sqrt(len(v)) / levels) * float(v.norm()) ** 2
        for v in x.to(torch.float64).split(bucket)
    )
    assert exact <= lemma


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("draws", DRAWS)
def test_quantization_errs_by_at_most_one_step_and_is_unbiased(bits, draws):
    d, bucket, n = 250, 64, 1500
    x = _x(d, 5) * 3
    spec = CompressSpec("quantize", bits=bits, bucket=bucket)
    step = torch.cat(
        [torch.full((len(v),), float(v.max() - v.min()) / (2**bits - 1)) for v in x.split(bucket)]
    )
    for seed in range(20):
        err = (_roundtrip(spec, x, seed, draws) - x).abs()
        assert bool((err <= step * (1 + 1e-5) + 1e-6).all())
    mean = _mean_of_draws(spec, x, n, draws).mean(0)
    assert bool(((mean - x).abs() <= 5 * (step / 2) / math.sqrt(n) + 1e-6).all())


def test_a_constant_bucket_quantizes_exactly():
    x = torch.full((10,), 0.25)
    assert torch.equal(_roundtrip(CompressSpec("quantize", bits=4, bucket=4), x, 0), x)


@pytest.mark.parametrize("bucket", [None, 7, 1000])
def test_scaled_sign_is_the_l1_mean_times_the_sign(bucket):
    x = _x(50)
    x[3] = 0.0  # sign(0) is sent as +
    y = _roundtrip(CompressSpec("sign", bucket=bucket), x, 0)
    size = bucket or 50
    for start in range(0, 50, size):
        v = x[start : start + size]
        expected = v.abs().sum() / len(v) * torch.where(v >= 0, 1.0, -1.0)
        assert torch.allclose(y[start : start + size], expected)


@pytest.mark.parametrize("width", [1, 3, 4, 5, 8, 9, 17])
@pytest.mark.parametrize("count", [1, 7, 8, 101])
def test_bit_packing_round_trips(width, count):
    values = torch.randint(0, 2**width, (count,), generator=torch.Generator().manual_seed(width))
    packed = pack_bits(values, width)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(count * width / 8)
    assert torch.equal(unpack_bits(packed, width, count), values)


def test_sign_bits_are_packed_eight_to_a_byte():
    x = torch.tensor([1.0, -1, -1, 1, 1, 1, -1, 1, -2])  # + − − + + + − + | −
    arrays = encode(CompressSpec("sign"), x, make_generator("torch", 0, "c"))
    assert arrays["compress.levels"].tolist() == [0b10111001, 0]


def _bin_header(n: int) -> int:
    return 2 if n < 2**8 else 3 if n < 2**16 else 5


SPECS = [
    CompressSpec("topk", ratio=0.01),
    CompressSpec("randk", ratio=0.1),
    CompressSpec("qsgd", levels=7, bucket=512),
    CompressSpec("qsgd", levels=1, bucket=None),
    CompressSpec("sign"),
    CompressSpec("sign", bucket=128),
    CompressSpec("quantize", bits=8, bucket=512),
    CompressSpec("quantize", bits=4, bucket=100),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.name}-{s.ratio or s.levels or s.bits}")
@pytest.mark.parametrize("d", [1, 999, 61706])
def test_payload_bytes_is_the_wire_size_of_the_encoded_arrays(spec, d):
    """The formula against the serialized message: the arrays' raw bytes on the wire sum to
    payload_bytes, and the message is those plus MessagePack's framing, byte for byte."""
    arrays = encode(spec, _x(d), make_generator("torch", 1, "c"), seed=1)
    wire = Message(arrays, config={"compress": spec.name}).to_bytes()
    _, items, _, _ = msgpack.unpackb(wire, raw=False)
    assert sum(len(raw) for *_, raw in items) == payload_bytes(spec, d)
    empty = [[name, code, shape, b""] for name, code, shape, _ in items]
    framing = len(msgpack.packb([1, empty, {"compress": spec.name}, {}], use_bin_type=True))
    framing += sum(_bin_header(len(raw)) - _bin_header(0) for *_, raw in items)
    assert len(wire) == framing + payload_bytes(spec, d)
    assert payload_bytes(spec, d) < 4 * d or d == 1 or spec.name == "quantize"


def test_payload_formulas_by_hand():
    d = 10_000
    assert payload_bytes(CompressSpec("topk", ratio=0.01), d) == 100 * 8
    assert payload_bytes(CompressSpec("randk", ratio=0.01), d) == 100 * 4
    assert payload_bytes(CompressSpec("qsgd", levels=7, bucket=512), d) == 20 * 4 + d // 2
    assert payload_bytes(CompressSpec("sign"), d) == 4 + d // 8
    assert payload_bytes(CompressSpec("quantize", bits=8, bucket=512), d) == 20 * 8 + d
    assert payload_bytes(CompressSpec("quantize", bits=4, bucket=512), d) == 20 * 8 + d // 2


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("draws", DRAWS)
def test_the_same_seed_gives_the_same_bytes(spec, draws):
    x = _x(3000)

    def wire(seed):
        return Message(encode(spec, x, make_generator(draws, seed, "c"), seed=seed)).to_bytes()

    assert wire(4) == wire(4)
    if spec.name in ("randk", "qsgd", "quantize"):  # the stochastic ones
        assert wire(4) != wire(5)


def test_a_malformed_message_is_named():
    spec = CompressSpec("topk", ratio=0.1)
    arrays = encode(spec, _x(100), make_generator("torch", 0, "c"))
    with pytest.raises(MessageError, match="compress.val of shape"):
        decode(spec, {**arrays, "compress.val": arrays["compress.val"][:-1]}, 100)
    with pytest.raises(MessageError, match="outside"):
        bad = arrays["compress.idx"].clone()
        bad[0] = 100
        decode(spec, {**arrays, "compress.idx": bad}, 100)
    with pytest.raises(MessageError, match="expected arrays"):
        decode(spec, {"compress.val": arrays["compress.val"]}, 100)


def test_a_byte_wide_packing_is_the_general_one():
    values = torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(0))
    bits = ((values[:, None] >> torch.arange(8)) & 1).to(torch.uint8).reshape(-1).numpy()
    general = torch.from_numpy(np.packbits(bits, bitorder="little"))
    assert torch.equal(pack_bits(values, 8), general)


def test_portable_randk_indices_are_pinned():
    """With portable draws the indices are a function of the seed alone (Philox and exact
    arithmetic): pinned here, so a change of the draw shows on every machine."""
    x = torch.arange(1.0, 1001.0)
    spec = CompressSpec("randk", ratio=0.008)
    arrays = encode(spec, x, make_generator("portable", 12345, "compress"))
    y = decode(spec, arrays, 1000, gen=make_generator("portable", 12345, "compress"))
    assert torch.nonzero(y).reshape(-1).tolist() == [177, 315, 393, 457, 617, 854, 876, 918]
