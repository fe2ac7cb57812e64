"""Cryptographic pseudo-random generator (Bonawitz et al., CCS 2017, §4): a 32-byte seed to a
vector of Z_{2^b} elements, the AES-256-CTR keystream under that seed. Design notes: docs/decisions.md#secure-aggregation.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedge.core.errors import ConfigError
from fedge.privacy.secagg.fixedpoint import RingArray

__all__ = ["SEED_BYTES", "prg"]

SEED_BYTES = 32
_ZERO_COUNTER = bytes(16)


def prg(seed: bytes, length: int, *, bits: int = 64) -> RingArray:
    """Expand ``seed`` into ``length`` uniform elements of Z_{2^bits}, as ``uint64``.

    Args:
        seed: exactly 32 secret bytes (an AES-256 key).
        length: number of ring elements K (>= 0).
        bits: 32 or 64; the ring width (reads 4 or 8 keystream bytes per element).

    Returns:
        ``uint64`` array of shape ``(length,)``; deterministic in (seed, length, bits), and the
        first m elements of a longer expansion equal a shorter one.
    """
    if len(seed) != SEED_BYTES:
        raise ConfigError(f"PRG seed must be {SEED_BYTES} bytes, got {len(seed)}")
    if bits not in (32, 64):
        raise ConfigError(f"bits must be 32 or 64, got {bits!r}")
    if length < 0:
        raise ConfigError(f"length must be >= 0, got {length}")
    width = bits // 8
    enc = Cipher(algorithms.AES(seed), modes.CTR(_ZERO_COUNTER)).encryptor()
    stream = enc.update(bytes(length * width)) + enc.finalize()
    return np.frombuffer(stream, dtype="<u8" if bits == 64 else "<u4").astype(np.uint64)
