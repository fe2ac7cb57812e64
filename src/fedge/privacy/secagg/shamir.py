"""Shamir t-out-of-n secret sharing over the prime field F_p, p = 2^130 - 5 (Shamir, CACM 1979;
Bonawitz et al., CCS 2017, §3). Design notes: docs/decisions.md#secure-aggregation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fedge.core.errors import ConfigError, MessageError
from fedge.privacy.secagg.errors import SecAggError

__all__ = ["ELEMENT_BYTES", "PRIME", "Share", "combine", "combine_elements", "split"]

PRIME = (1 << 130) - 5
_BLOCK = 16  # secret bytes per field element (2^128 < p)
ELEMENT_BYTES = 17  # wire bytes per field element (p < 2^136)


@dataclass(frozen=True)
class Share:
    """One party's share: the evaluation point ``x`` and one field element per secret block."""

    x: int
    ys: tuple[int, ...]

    def to_bytes(self) -> bytes:
        """The field elements, 17 bytes little-endian each (``x`` travels with the message)."""
        return b"".join(y.to_bytes(ELEMENT_BYTES, "little") for y in self.ys)

    @classmethod
    def from_bytes(cls, x: int, buf: bytes) -> Share:
        if len(buf) % ELEMENT_BYTES:
            raise MessageError(f"share of {len(buf)} bytes is not a multiple of {ELEMENT_BYTES}")
        ys = tuple(
            int.from_bytes(buf[i : i + ELEMENT_BYTES], "little")
            for i in range(0, len(buf), ELEMENT_BYTES)
        )
        if any(y >= PRIME for y in ys):
            raise MessageError("share element is not reduced modulo p = 2^130 - 5")
        return cls(x, ys)


def _check_points(xs: Iterable[int]) -> list[int]:
    xs = list(xs)
    if any(not 0 < x < PRIME for x in xs):
        raise ConfigError(f"share points must be in [1, p), got {sorted(xs)}")
    if len(set(xs)) != len(xs):
        raise ConfigError(f"share points must be distinct, got {sorted(xs)}")
    return xs


def _random_element(entropy: Callable[[int], bytes]) -> int:
    while True:  # rejection sampling: uniform on [0, p); accepts with probability 1 - 5/2^130
        r = int.from_bytes(entropy(ELEMENT_BYTES), "little") & ((1 << 130) - 1)
        if r < PRIME:
            return r


def split(
    secret: bytes,
    xs: Sequence[int],
    *,
    threshold: int,
    entropy: Callable[[int], bytes] = os.urandom,
) -> dict[int, Share]:
    """Share ``secret`` at the points ``xs`` so that any ``threshold`` of them recover it.

    Args:
        secret: the bytes to share (any length; padded to 16-byte blocks, so pass
            ``nbytes=len(secret)`` to :func:`combine`).
        xs: distinct non-zero evaluation points, one per recipient (fedge uses client id + 1).
        threshold: t, 1 <= t <= len(xs).
        entropy: source of the random coefficients (``os.urandom``; tests may fix it).

    Returns:
        ``{x: Share}`` for every x in ``xs``.
    """
    xs = _check_points(xs)
    if not 1 <= threshold <= len(xs):
        raise ConfigError(
            f"threshold must be in [1, {len(xs)}] for {len(xs)} share holders, got {threshold}"
        )
    padded = secret + bytes(-len(secret) % _BLOCK)
    blocks = [
        int.from_bytes(padded[i : i + _BLOCK], "little") for i in range(0, len(padded), _BLOCK)
    ]
    # coeffs[j] = (s_j, a_1, ..., a_{t-1}) for block j
    coeffs = [[s] + [_random_element(entropy) for _ in range(threshold - 1)] for s in blocks]
    out: dict[int, Share] = {}
    for x in xs:
        ys = []
        for poly in coeffs:
            acc = 0
            for a in reversed(poly):  # Horner
                acc = (acc * x + a) % PRIME
            ys.append(acc)
        out[x] = Share(x, tuple(ys))
    return out


def combine_elements(shares: Sequence[Share]) -> list[int]:
    """f(0) for each block by Lagrange interpolation over the given shares (field elements).

    With at least t shares of one sharing this is the secret; with fewer it is an unrelated
    field element (no error can be raised: the shares do not carry t).
    """
    if not shares:
        raise SecAggError("cannot reconstruct a secret from zero shares")
    xs = _check_points(s.x for s in shares)
    nblocks = len(shares[0].ys)
    if any(len(s.ys) != nblocks for s in shares):
        raise MessageError("shares disagree on the number of blocks; they are not one sharing")
    # λ_i = Π_{j≠i} x_j / (x_j - x_i)  (mod p)
    lambdas = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        lambdas.append(num * pow(den, -1, PRIME) % PRIME)
    return [
        sum(lam * s.ys[b] for lam, s in zip(lambdas, shares, strict=True)) % PRIME
        for b in range(nblocks)
    ]


def combine(shares: Sequence[Share], *, nbytes: int) -> bytes:
    """Reconstruct an ``nbytes``-long secret from at least t shares of it.

    Raises:
        SecAggError: a reconstructed block is not a 128-bit value — too few or inconsistent
            shares (caught with probability ~3/4 per block; the caller must still count shares).
    """
    elems = combine_elements(shares)
    if any(e >> (8 * _BLOCK) for e in elems):
        raise SecAggError(
            "reconstruction gave a value outside the secret range: fewer than t shares, or "
            "shares of different secrets were mixed"
        )
    raw = b"".join(e.to_bytes(_BLOCK, "little") for e in elems)
    if len(raw) < nbytes:
        raise SecAggError(f"shares hold {len(raw)} bytes, expected a {nbytes}-byte secret")
    return raw[:nbytes]
