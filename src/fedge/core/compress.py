"""Uplink compression codecs: a float32 vector encoded into the few arrays a client sends
instead of it, and decoded back on the server. Pure functions of tensors and explicit
generators; the mechanism that applies them to a method's replies, with error feedback, is
:mod:`fedge.methods.compress`.

Five codecs (:data:`Codec`), each a lossy operator C on x ∈ R^d:

- ``topk``: the k = round(ratio·d) coordinates of largest |x_i| (indices and values);
  biased, for error feedback (Stich et al., NeurIPS 2018, arXiv:1809.07599v2).
- ``randk``: k coordinates drawn uniformly without replacement, scaled by d/k so that
  E[C(x)] = x; the indices are regenerated from a seed sent with the values.
- ``qsgd``: QSGD's Q_s (Alistarh et al., NeurIPS 2017, arXiv:1610.02132v4, Eq. (3.1)) per
  bucket of ``bucket`` coordinates: the bucket's L2 norm and each coordinate's sign and
  stochastically rounded level in {0, …, s}; unbiased.
- ``sign``: the scaled sign (‖x‖₁/d)·sign(x) per bucket (Karimireddy et al., ICML 2019,
  arXiv:1901.09847v2, Algorithm 1); biased, for error feedback.
- ``quantize``: b-bit uniform quantization (b = 4 or 8) of each bucket onto 2^b levels
  between its min and max, stochastically rounded; unbiased.

Every encoded message holds real arrays whose bytes are what travels: indices as int32,
values and per-bucket scales as float32, levels and signs bit-packed (:func:`pack_bits`,
``numpy.packbits``). :func:`payload_bytes` is the formula of those bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from fedge.core.errors import MessageError
from fedge.core.rng import AnyGenerator, PortableGenerator, rand

__all__ = [
    "CODECS",
    "Codec",
    "CompressSpec",
    "decode",
    "encode",
    "pack_bits",
    "payload_bytes",
    "unpack_bits",
]

Codec = Literal["topk", "randk", "qsgd", "sign", "quantize"]
CODECS: tuple[Codec, ...] = ("topk", "randk", "qsgd", "sign", "quantize")

#: the names of the encoded arrays
IDX, VAL, LEVELS, SCALE = "compress.idx", "compress.val", "compress.levels", "compress.scale"


@dataclass(frozen=True)
class CompressSpec:
    """A codec and its parameters (built once from ``method.compress``).

    Args:
        name: the codec (:data:`Codec`).
        ratio: topk/randk: the fraction of coordinates kept, k = max(1, round(ratio·d)).
        levels: qsgd: s, the quantization levels of |x_i|/‖x‖₂.
        bits: quantize: b, 4 or 8.
        bucket: qsgd/sign/quantize: coordinates sharing one scale (None: the whole vector).
    """

    name: Codec
    ratio: float | None = None
    levels: int | None = None
    bits: int | None = None
    bucket: int | None = None

    def k(self, d: int) -> int:
        """topk/randk: the coordinates kept of ``d``."""
        assert self.ratio is not None
        return min(d, max(1, round(self.ratio * d)))

    def buckets(self, d: int) -> int:
        """qsgd/sign/quantize: the number of buckets (scales sent) of a ``d``-vector."""
        return max(1, math.ceil(d / (self.bucket or max(d, 1))))

    def width(self) -> int:
        """qsgd/quantize/sign: bits per coordinate (qsgd: ⌈log2(2s+1)⌉ for the signed level)."""
        if self.name == "qsgd":
            assert self.levels is not None
            return math.ceil(math.log2(2 * self.levels + 1))
        if self.name == "quantize":
            assert self.bits is not None
            return self.bits
        return 1


def payload_bytes(spec: CompressSpec, d: int) -> int:
    """The bytes of the encoded arrays of a ``d``-vector (what :func:`encode` returns; the
    message adds its framing and, for randk, the 8-byte seed in its config).

    topk: 8k (int32 index, float32 value); randk: 4k; qsgd and sign: 4 per bucket (a float32
    scale) + ⌈d·w/8⌉ (w bits per coordinate); quantize: 8 per bucket (min and step) + ⌈d·b/8⌉.
    """
    if spec.name == "topk":
        return 8 * spec.k(d)
    if spec.name == "randk":
        return 4 * spec.k(d)
    per_bucket = 8 if spec.name == "quantize" else 4
    return per_bucket * spec.buckets(d) + math.ceil(d * spec.width() / 8)


def pack_bits(values: Tensor, width: int) -> Tensor:
    """Unsigned integers < 2^width, ``width`` bits each, packed little-endian into uint8."""
    if width == 8:  # a byte each: the packing's own result, without the (n, 8) bit matrix
        return values.to(torch.uint8)
    v = values.to(torch.int64).numpy()
    bits = ((v[:, None] >> np.arange(width)) & 1).astype(np.uint8)  # (n, width)
    return torch.from_numpy(np.packbits(bits.reshape(-1), bitorder="little"))


def unpack_bits(packed: Tensor, width: int, count: int) -> Tensor:
    """The ``count`` integers :func:`pack_bits` packed (int64)."""
    need = math.ceil(count * width / 8)
    if packed.dtype != torch.uint8 or packed.numel() != need:
        raise MessageError(
            f"compressed levels: expected {need} uint8 bytes for {count} values of {width} bits, "
            f"got {packed.numel()} {packed.dtype}"
        )
    if width == 8:
        return packed.to(torch.int64)
    bits = np.unpackbits(packed.numpy(), count=count * width, bitorder="little")
    weights = (1 << np.arange(width)).astype(np.int64)
    return torch.from_numpy(bits.reshape(count, width).astype(np.int64) @ weights)


def _subset(d: int, k: int, gen: AnyGenerator) -> Tensor:
    """k of range(d) drawn uniformly without replacement, sorted (int64)."""
    if isinstance(gen, PortableGenerator):
        perm = torch.from_numpy(gen.permutation(d))
    else:
        perm = torch.randperm(d, generator=gen)
    return perm[:k].sort().values


def _rows(spec: CompressSpec, x: Tensor) -> Tensor:
    """x zero-padded to whole buckets, one per row: (buckets, bucket)."""
    d = x.numel()
    size = spec.bucket or max(d, 1)
    padded = torch.zeros(spec.buckets(d) * size, dtype=torch.float32)
    padded[:d] = x
    return padded.reshape(-1, size)


def encode(spec: CompressSpec, x: Tensor, gen: AnyGenerator, *, seed: int = 0) -> dict[str, Tensor]:
    """The arrays that carry C(x) for the 1-D float32 ``x``.

    Args:
        spec: the codec.
        x: (d,) float32.
        gen: draws of the stochastic rounding (qsgd, quantize) and randk's indices: for randk
            it must be the generator :func:`decode` rebuilds from ``seed``.
        seed: randk: the seed ``gen`` was made from (the caller sends it; nothing encoded here).
    """
    x = x.detach().to(torch.float32).reshape(-1)
    d = x.numel()
    if spec.name == "topk":
        idx = torch.topk(x.abs(), spec.k(d), sorted=False).indices.sort().values
        return {IDX: idx.to(torch.int32), VAL: x[idx].clone()}
    if spec.name == "randk":
        k = spec.k(d)
        return {VAL: x[_subset(d, k, gen)] * (d / k)}
    rows = _rows(spec, x)  # (buckets, bucket)
    if spec.name == "sign":
        scale = rows.abs().sum(dim=1) / _bucket_sizes(spec, d)  # ‖x‖₁/d per bucket
        return {SCALE: scale, LEVELS: pack_bits((x >= 0).to(torch.int64), 1)}
    u = rand(rows.shape, gen)  # (buckets, bucket) uniforms on [0, 1)
    if spec.name == "qsgd":
        assert spec.levels is not None
        s = spec.levels
        norm = rows.norm(dim=1)  # ‖x‖₂ per bucket
        safe = torch.where(norm > 0, norm, torch.ones_like(norm))
        r = rows.abs() / safe[:, None] * s  # in [0, s]
        low = r.floor()
        xi = (low + (u < r - low).to(torch.float32)).clamp(max=s)  # ξ ∈ {0, …, s}
        signed = torch.where(rows < 0, -xi, xi).reshape(-1)[:d]
        return {SCALE: norm, LEVELS: pack_bits(signed.to(torch.int64) + s, spec.width())}
    assert spec.bits is not None
    top = 2**spec.bits - 1
    lo, hi = _bucket_min_max(spec, rows, d)
    step = (hi - lo) / top
    safe = torch.where(step > 0, step, torch.ones_like(step))
    q = ((rows - lo[:, None]) / safe[:, None] + u).floor().clamp(0, top)
    q = torch.where(step[:, None] > 0, q, torch.zeros_like(q)).reshape(-1)[:d]
    return {SCALE: torch.stack([lo, step], dim=1).reshape(-1), LEVELS: pack_bits(q, spec.bits)}


def _bucket_sizes(spec: CompressSpec, d: int) -> Tensor:
    """The real (unpadded) length of each bucket, float32 (the last may be short)."""
    size = spec.bucket or max(d, 1)
    n = spec.buckets(d)
    sizes = torch.full((n,), float(size))
    sizes[-1] = float(d - size * (n - 1)) or 1.0
    return sizes


def _bucket_min_max(spec: CompressSpec, rows: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """Each bucket's min and max over its real coordinates (not the padding)."""
    valid = torch.arange(rows.numel()).reshape(rows.shape) < d
    lo = torch.where(valid, rows, torch.full_like(rows, math.inf)).min(dim=1).values
    hi = torch.where(valid, rows, torch.full_like(rows, -math.inf)).max(dim=1).values
    return lo, hi


def _expect(arrays: dict[str, Tensor], name: str, numel: int, dtype: torch.dtype) -> Tensor:
    a = arrays.get(name)
    if a is None or a.dim() != 1 or a.numel() != numel or a.dtype != dtype:
        got = None if a is None else (tuple(a.shape), str(a.dtype))
        raise MessageError(
            f"compressed message: expected {name} of shape ({numel},) {dtype}, got {got}"
        )
    return a


def decode(
    spec: CompressSpec, arrays: dict[str, Tensor], d: int, *, gen: AnyGenerator | None = None
) -> Tensor:
    """C(x) as a (d,) float32 vector from :func:`encode`'s arrays (randk: ``gen`` rebuilt from
    the seed the client sent); a MessageError names an array of the wrong shape or dtype."""
    expected = {
        "topk": {IDX, VAL},
        "randk": {VAL},
    }.get(spec.name, {SCALE, LEVELS})
    if set(arrays) != expected:
        raise MessageError(
            f"compressed message ({spec.name}): expected arrays {sorted(expected)}, got {sorted(arrays)}"
        )
    out = torch.zeros(d, dtype=torch.float32)
    if spec.name in ("topk", "randk"):
        k = spec.k(d)
        val = _expect(arrays, VAL, k, torch.float32)
        if spec.name == "topk":
            idx = _expect(arrays, IDX, k, torch.int32).to(torch.int64)
            if k and (int(idx.min()) < 0 or int(idx.max()) >= d):
                raise MessageError(f"compressed message: an index is outside [0, {d})")
        else:
            if gen is None:
                raise MessageError("compressed message (randk): no generator to redraw indices")
            idx = _subset(d, k, gen)
        out[idx] = val
        return out
    n = spec.buckets(d)
    size = spec.bucket or max(d, 1)
    per_bucket = 2 if spec.name == "quantize" else 1
    scale = _expect(arrays, SCALE, per_bucket * n, torch.float32)
    q = unpack_bits(arrays[LEVELS], spec.width(), d).to(torch.float32)
    padded = torch.zeros(n * size, dtype=torch.float32)
    if spec.name == "sign":
        padded[:d] = 2 * q - 1
        return (padded.reshape(n, size) * scale[:, None]).reshape(-1)[:d]
    if spec.name == "qsgd":
        assert spec.levels is not None
        padded[:d] = (q - spec.levels) / spec.levels
        return (padded.reshape(n, size) * scale[:, None]).reshape(-1)[:d]
    lo, step = scale.reshape(n, 2).unbind(dim=1)
    padded[:d] = q
    return (lo[:, None] + padded.reshape(n, size) * step[:, None]).reshape(-1)[:d]
