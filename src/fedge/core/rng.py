"""Explicit, derived randomness: every draw takes a ``torch.Generator`` derived from the run seed
and a purpose path (hashed with BLAKE2b); no global RNG is touched. Design notes: docs/decisions.md#core.

Which generator a draw uses is an explicit choice, :data:`Draws`: ``"torch"`` (torch's and
numpy's generators, bit-identical only on identical hardware and library versions) or
``"portable"`` (:mod:`fedge.core.portable`: Philox words and exact arithmetic, the same bits on
every machine). :class:`PortableGenerator` is the portable counterpart of a ``torch.Generator``
for code that consumes one generator in order (pruning's inputs and ΔW, a partition's shuffles).

Example:
    >>> g = generator(0, "client", 3, 17)   # run seed 0, round 3, client 17
    >>> torch.randn(2, generator=g)          # same two numbers on this machine's kernels
    tensor([ 0.3206, -0.8424])
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeAlias, get_args

import numpy as np
import torch
from torch import Tensor

from fedge.core import portable
from fedge.core.errors import ConfigError

__all__ = [
    "AnyGenerator",
    "Draws",
    "GlobalStream",
    "PortableGenerator",
    "check_draws",
    "derive_seed",
    "generator",
    "make_generator",
    "numpy_rng",
    "rand",
    "randn",
    "recorded_draws",
    "seed_family",
]

_Part = int | str

#: Which generator seeded draws come from: ``"portable"`` (:mod:`fedge.core.portable`, a run's
#: default) or ``"torch"`` (torch's/numpy's, what every record made before portable became the
#: default was made with).
Draws = Literal["torch", "portable"]


def recorded_draws(raw: dict[str, Any]) -> dict[str, Any]:
    """A config read back from a run directory or a record: one without a ``draws`` key was
    written before the key existed and drew with torch's generators, so it comes back with
    ``draws: torch`` (a shallow copy); one with the key, as it is. Resuming, re-rendering or
    checking such a record then rebuilds its numbers, not the portable default's.

    Example:
        >>> recorded_draws({"seed": 1})
        {'seed': 1, 'draws': 'torch'}
    """
    if "draws" in raw:
        return raw
    return {**raw, "draws": "torch"}


def check_draws(draws: object) -> Draws:
    """``draws`` if it names a :data:`Draws`, else a ConfigError naming the choices."""
    if draws not in get_args(Draws):
        raise ConfigError(
            f"draws must be one of {list(get_args(Draws))}, got {draws!r}; 'portable' draws "
            "the same bits on every machine, 'torch' reproduces records made before it existed"
        )
    return draws  # type: ignore[return-value]


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


def seed_family(seed: int, *prefix: _Part, bits: int = 63) -> Callable[..., int]:
    """``seeds(*rest) == derive_seed(seed, *prefix, *rest, bits=bits)`` (``rest`` not empty),
    with the shared prefix hashed once: the seed is BLAKE2b of the path tuple's ``repr``, a string
    whose head every member shares, so each call hashes only its tail. For the many seeds of a
    step's directions (one per direction, and per layer or parameter).

    Example:
        >>> seeds = seed_family(0, "activity", 2)
        >>> seeds(5) == derive_seed(0, "activity", 2, 5)
        True
    """
    head = hashlib.blake2b(digest_size=16)
    head.update(("(" + ", ".join(map(repr, (int(seed), *prefix))) + ", ").encode())
    mask = (1 << bits) - 1

    def seeds(*rest: _Part) -> int:
        if not rest:
            raise TypeError("seed_family's seeds(*rest) takes at least one path part")
        h = head.copy()
        h.update((", ".join(map(repr, rest)) + ")").encode())
        return int.from_bytes(h.digest(), "little") & mask

    return seeds


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


class PortableGenerator:
    """Portable draws consumed in order, as code consumes a ``torch.Generator``: call ``i`` (of
    any kind) reads its own stream ``portable.stream_key(seed, *path, "seq", i)``.

    So a sequence of calls is a pure function of ``(seed, path)`` and the calls' kinds and
    shapes, the same bits on every machine (:mod:`fedge.core.portable`).

    Example:
        >>> g = PortableGenerator(0, "prune")
        >>> x = g.normal((8, 1, 28, 28))   # call 0
        >>> order = g.permutation(10)       # call 1
    """

    def __init__(self, seed: int, *path: _Part) -> None:
        self.seed, self.path, self.calls = int(seed), tuple(path), 0

    def next_key(self) -> portable.Key:
        """The stream of the next call (and count it)."""
        key = portable.stream_key(self.seed, *self.path, "seq", self.calls)
        self.calls += 1
        return key

    def normal(self, shape: tuple[int, ...] | list[int] | torch.Size) -> Tensor:
        """Standard normals (float32, CPU): :func:`fedge.core.portable.normal`."""
        return portable.normal(self.next_key(), tuple(shape))

    def uniform(self, shape: tuple[int, ...] | list[int] | torch.Size) -> Tensor:
        """Uniforms on [0, 1) (float32, CPU): :func:`fedge.core.portable.uniform`."""
        return portable.uniform(self.next_key(), tuple(shape))

    def permutation(self, x: int | np.ndarray) -> np.ndarray:
        """As numpy's ``Generator.permutation``: a permutation of ``range(x)`` (int64), or a
        shuffled copy of array ``x`` along its first axis (:func:`fedge.core.portable.permutation`)."""
        if isinstance(x, (int, np.integer)):
            return portable.permutation(self.next_key(), int(x)).numpy()
        arr = np.asarray(x)
        return arr[portable.permutation(self.next_key(), len(arr)).numpy()]


#: A generator that seeded draws in fedge accept: torch's, or the portable one.
AnyGenerator: TypeAlias = torch.Generator | PortableGenerator


def make_generator(draws: Draws, seed: int, *path: _Part) -> AnyGenerator:
    """:func:`generator` ``(seed, *path)`` for ``"torch"``, :class:`PortableGenerator` for
    ``"portable"``."""
    if check_draws(draws) == "portable":
        return PortableGenerator(seed, *path)
    return generator(seed, *path)


def randn(shape: tuple[int, ...] | list[int] | torch.Size, gen: AnyGenerator) -> Tensor:
    """Standard normals (float32, CPU) from either kind of generator."""
    if isinstance(gen, PortableGenerator):
        return gen.normal(shape)
    return torch.randn(tuple(shape), generator=gen)


def rand(shape: tuple[int, ...] | list[int] | torch.Size, gen: AnyGenerator) -> Tensor:
    """Uniforms on [0, 1) (float32, CPU) from either kind of generator."""
    if isinstance(gen, PortableGenerator):
        return gen.uniform(shape)
    return torch.rand(tuple(shape), generator=gen)
