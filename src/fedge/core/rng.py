"""Explicit, derived randomness: every draw takes a ``torch.Generator`` derived from the run seed
and a purpose path (hashed with BLAKE2b); no global RNG is touched. Design notes: docs/decisions.md#core.

Example:
    >>> g = generator(0, "client", 3, 17)   # run seed 0, round 3, client 17
    >>> torch.randn(2, generator=g)          # same two numbers on every machine
    tensor([ 0.3206, -0.8424])
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

__all__ = ["GlobalStream", "derive_seed", "generator", "numpy_rng"]

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


_STREAM_SALT = 0x5EED_D809  # separates a global stream's seed from its generator's own


class GlobalStream:
    """A stream of torch's global RNG of a party's own, for draws no generator reaches
    (``nn.Dropout`` samples its mask from the global RNG).

    Its seed is ``gen.initial_seed()`` (not drawn from ``gen``, so the party's other draws,
    such as its batch order, are untouched) mixed with a salt. Within :meth:`active` the global
    RNG is forked, seeded from the stream (or set to where the stream's previous use left it)
    and restored afterwards, so what ran before in the process — another client, a test —
    changes nothing, and the same party step draws the same masks in the engine's process,
    a worker, a Flower node or after a resume. Code that draws nothing from the global RNG
    (a model without random layers) computes exactly what it would without the stream.

    Args:
        gen: the party's own generator (a client's ``ctx.generator``, a side party's).

    Example:
        >>> stream = GlobalStream(generator(0, "client", 1, 7))
        >>> with stream.active():
        ...     a = torch.rand(2)
        >>> with stream.active():  # continues where the last use stopped
        ...     b = torch.rand(2)
        >>> _ = torch.rand(1000)  # someone else uses the global RNG
        >>> again = GlobalStream(generator(0, "client", 1, 7))
        >>> with again.active():
        ...     torch.equal(torch.rand(2), a)
        True
    """

    def __init__(self, gen: torch.Generator) -> None:
        self.seed = gen.initial_seed() ^ _STREAM_SALT
        self._state: torch.Tensor | None = None  # the global RNG's state when the last use ended

    @contextmanager
    def active(self) -> Iterator[None]:
        """torch's global RNG as this stream for the ``with`` block, restored after it."""
        with torch.random.fork_rng(devices=[]):
            if self._state is None:
                torch.manual_seed(self.seed)
            else:
                torch.set_rng_state(self._state)
            try:
                yield
            finally:
                self._state = torch.get_rng_state()
