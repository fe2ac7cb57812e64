"""Explicit, derived randomness.

Every random draw in fedge takes a ``torch.Generator`` derived from the run seed and a
*purpose path* such as ``("sample", round)`` or ``("client", round, cid)``. Derivation
hashes the path with BLAKE2b, so generators for different purposes are independent,
adding a new purpose never shifts the others, and no global RNG is ever touched.

Example:
    >>> g = generator(0, "client", 3, 17)   # run seed 0, round 3, client 17
    >>> torch.randn(2, generator=g)          # same two numbers on every machine
    tensor([ 0.3206, -0.8424])
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

__all__ = ["derive_seed", "generator", "numpy_rng"]

_Part = int | str


def derive_seed(seed: int, *path: _Part, bits: int = 63) -> int:
    """A ``bits``-bit integer seed derived from ``seed`` and a purpose path.

    Args:
        seed: the run seed (any int).
        *path: strings/ints naming the purpose, e.g. ``"partition"`` or ``"client", rnd, cid``.
        bits: width of the result (63 keeps it a non-negative int64, what torch accepts).
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((int(seed),) + tuple(path)).encode())
    return int.from_bytes(h.digest(), "little") & ((1 << bits) - 1)


def generator(seed: int, *path: _Part, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` seeded by :func:`derive_seed` ``(seed, *path)``."""
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, *path))
    return g


def numpy_rng(seed: int, *path: _Part) -> np.random.Generator:
    """A numpy ``Generator`` (PCG64) for the same derived seed: used by data partitioners."""
    return np.random.default_rng(derive_seed(seed, *path))
