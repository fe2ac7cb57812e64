"""Fixed-point encoding of real vectors into the ring Z_{2^b}, where masks cancel exactly;
a value whose sum could wrap around raises :class:`FixedPointRangeError`. Design notes: docs/decisions.md#secure-aggregation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from fedge.core.errors import ConfigError, MessageError
from fedge.privacy.secagg.errors import FixedPointRangeError

__all__ = ["FixedPoint", "RingArray"]

RingArray = npt.NDArray[np.uint64]
"""Elements of Z_{2^b} stored as ``uint64`` (only the low b bits are ever set)."""


@dataclass(frozen=True)
class FixedPoint:
    """Fixed-point codec for Z_{2^b} with ``frac_bits`` fractional bits.

    Args:
        bits: ring width b: 64 (default: wide range, 8 bytes per value on the wire) or 32
            (4 bytes per value, BAFFLE's 4·K upload bytes, but a much smaller range).
        frac_bits: f, the number of fractional bits (scale 2^f). Default 24: resolution 6e-8.

    Example:
        >>> fp = FixedPoint(bits=64, frac_bits=16)
        >>> a = fp.encode([1.5, -2.0], n_summands=2)  # uint64: 98304, 2^64 - 131072
        >>> b = fp.encode([0.25, 1.0], n_summands=2)
        >>> fp.decode(fp.ring_sum([a, b])).tolist()
        [1.75, -1.0]
    """

    bits: Literal[32, 64] = 64
    frac_bits: int = 24

    def __post_init__(self) -> None:
        if self.bits not in (32, 64):
            raise ConfigError(f"bits must be 32 or 64, got {self.bits!r}")
        if not isinstance(self.frac_bits, int) or not 0 <= self.frac_bits <= self.bits - 2:
            raise ConfigError(
                f"frac_bits must be an int in [0, {self.bits - 2}] for bits={self.bits}, "
                f"got {self.frac_bits!r}; fewer fractional bits leave more integer range"
            )

    # ---- ring parameters --------------------------------------------------------------------
    @property
    def modulus(self) -> int:
        """2^b."""
        return 1 << self.bits

    @property
    def mask(self) -> np.uint64:
        """2^b - 1 as ``uint64``: ``v & mask`` reduces mod 2^b."""
        return np.uint64(self.modulus - 1)

    @property
    def nbytes(self) -> int:
        """Bytes per ring element on the wire."""
        return self.bits // 8

    @property
    def scale(self) -> float:
        """2^f."""
        return float(1 << self.frac_bits)

    def max_abs_int(self, n_summands: int) -> int:
        """Largest |q| each of ``n_summands`` encodings may have so their sum cannot wrap."""
        if n_summands < 1:
            raise ConfigError(f"n_summands must be >= 1, got {n_summands}")
        return ((1 << (self.bits - 1)) - 1) // n_summands

    def _max_abs_float(self, n_summands: int) -> float:
        """max_abs_int as the largest float64 not above it (float(2^63 - 1) would be 2^63)."""
        limit = self.max_abs_int(n_summands)
        limit_f = float(limit)
        return float(np.nextafter(limit_f, 0.0)) if int(limit_f) > limit else limit_f

    def max_abs(self, n_summands: int) -> float:
        """Largest |x| (real) each of ``n_summands`` inputs may have: ~max_abs_int / 2^f."""
        return self._max_abs_float(n_summands) / self.scale

    # ---- codec ----------------------------------------------------------------------------
    def encode(self, x: npt.ArrayLike, *, n_summands: int) -> RingArray:
        """round(x · 2^f) mod 2^b, two's complement for negatives.

        Args:
            x: real array-like (numpy array, list, CPU torch tensor); any shape.
            n_summands: how many such vectors will be summed (the number of clients); sets
                the range bound in the module docstring.

        Raises:
            FixedPointRangeError: a value is non-finite or too large for ``n_summands``.
        """
        xf = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(xf)):
            bad = xf[~np.isfinite(xf)].ravel()[0]
            raise FixedPointRangeError(
                f"cannot encode non-finite value {bad!r}; secure aggregation needs finite inputs",
                cause=f"cannot encode non-finite value {bad!r}",
            )
        q = np.rint(xf * self.scale)
        over = np.abs(q) > self._max_abs_float(n_summands)
        if np.any(over):
            worst = float(xf.ravel()[np.argmax(np.abs(q).ravel())])
            what = (
                f"value {worst!r} exceeds the fixed-point range ±{self.max_abs(n_summands):.6g} "
                f"for a sum of {n_summands} clients (bits={self.bits}, frac_bits={self.frac_bits})"
            )
            raise FixedPointRangeError(
                f"{what}; the sum could wrap around. Clip or scale the inputs, use fewer "
                "frac_bits, or bits=64",
                cause=what,
            )
        return q.astype(np.int64).view(np.uint64) & self.mask

    def to_signed(self, v: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Ring elements as signed integers in [-2^(b-1), 2^(b-1))."""
        u = np.asarray(v, dtype=np.uint64) & self.mask
        if self.bits == 64:
            return u.view(np.int64)
        s = u.astype(np.int64)
        return np.where(s >= (1 << (self.bits - 1)), s - (1 << self.bits), s)

    def decode(self, v: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Signed value / 2^f as float64 (exact while |signed value| <= 2^53)."""
        return self.to_signed(v).astype(np.float64) / self.scale

    # ---- exact ring arithmetic --------------------------------------------------------------
    def add(self, a: RingArray, b: RingArray) -> RingArray:
        """(a + b) mod 2^b."""
        return np.add(a, b, dtype=np.uint64) & self.mask

    def sub(self, a: RingArray, b: RingArray) -> RingArray:
        """(a - b) mod 2^b."""
        return np.subtract(a, b, dtype=np.uint64) & self.mask

    def ring_sum(self, arrays: Iterable[RingArray]) -> RingArray:
        """Σ arrays mod 2^b (wraparound is the point, not an error)."""
        total: RingArray | None = None
        for a in arrays:
            a = np.asarray(a, dtype=np.uint64)
            total = a.copy() if total is None else np.add(total, a, out=total)
        if total is None:
            raise ValueError("ring_sum of no arrays; pass at least one")
        return total & self.mask

    # ---- wire format ------------------------------------------------------------------------
    def to_bytes(self, v: RingArray) -> bytes:
        """Little-endian, ``nbytes`` per element (flattened, C order)."""
        dt = "<u8" if self.bits == 64 else "<u4"
        return (np.asarray(v, dtype=np.uint64) & self.mask).astype(dt).tobytes()

    def from_bytes(self, buf: bytes, shape: tuple[int, ...] | None = None) -> RingArray:
        """Inverse of :meth:`to_bytes`."""
        if len(buf) % self.nbytes:
            raise MessageError(
                f"buffer of {len(buf)} bytes is not a multiple of {self.nbytes} (bits={self.bits})"
            )
        dt = "<u8" if self.bits == 64 else "<u4"
        out = np.frombuffer(buf, dtype=dt).astype(np.uint64)
        return out if shape is None else out.reshape(shape)
