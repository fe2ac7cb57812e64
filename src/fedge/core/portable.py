"""Portable seeded draws: numbers defined by the algorithm alone (Philox4x64-10, Salmon et al.,
SC 2011, then exactly rounded float32 arithmetic), the same bits on every machine. Design notes: docs/decisions.md#core.

Example:
    >>> key = stream_key(0, "zo", "conv1.weight")
    >>> z = normal_rows(key, range(4), (6, 1, 5, 5))  # directions 0..3 of one parameter
    >>> torch.equal(z[2], normal_rows(key, [2], (6, 1, 5, 5))[0])
    True
"""

from __future__ import annotations

import hashlib
import math
import operator
import statistics
import sys
import threading
from collections.abc import Iterator, Sequence
from functools import lru_cache
from importlib import resources
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Key",
    "NORMAL_TABLE_SHA256",
    "NORMAL_TAIL",
    "bernoulli",
    "build_normal_table",
    "integers",
    "normal",
    "normal_from_words",
    "normal_many",
    "normal_row_many",
    "normal_rows",
    "permutation",
    "row_stride",
    "philox4x64_10",
    "signs",
    "stream_key",
    "symmetric_uniform",
    "uniform",
    "words",
]

_Part = int | str
_Device = str | torch.device
_M64 = (1 << 64) - 1
_CHUNK = 1 << 15  # words per pass of the transforms: their scratch stays in the L2 cache


class Key(NamedTuple):
    """A stream's 128-bit Philox key, as two 64-bit words (``k0`` the low one)."""

    k0: int
    k1: int


@lru_cache(maxsize=4096, typed=True)
def stream_key(seed: int, *path: _Part) -> Key:
    """The key of the stream for ``seed`` and a purpose path (``"zo", name`` or
    ``"client", rnd, cid``): BLAKE2b-128 of the canonical encoding of ``(seed, *path)``.

    Encoding: the ASCII tag ``fedge/portable/1`` then, per part, a type byte (``i`` for an int,
    ``s`` for a str), the payload's length as 4 little-endian bytes and the payload (an int's
    decimal digits with a leading ``-`` if negative; a str's UTF-8 bytes). So ``("zo", 1)`` and
    ``("zo", "1")`` differ, and no part can run into the next.

    Example:
        >>> stream_key(0, "zo", 3, "conv1.weight") == stream_key(0, "zo", 3, "conv1.weight")
        True
    """
    h = hashlib.blake2b(b"fedge/portable/1", digest_size=16)
    for part in (seed, *path):
        if isinstance(part, str):
            tag, payload = b"s", part.encode("utf-8")
        elif isinstance(part, bool) or not hasattr(part, "__index__"):
            raise TypeError(
                f"a stream path is made of ints and strs, got {part!r} "
                f"({type(part).__name__}); pass it as int(...) or str(...)"
            )
        else:
            tag, payload = b"i", str(operator.index(part)).encode("ascii")
        h.update(tag + len(payload).to_bytes(4, "little") + payload)
    d = h.digest()
    return Key(int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little"))


# --- Philox4x64-10 -----------------------------------------------------------------------------

_PHILOX_M = (0xD2E7470EE14C6C93, 0xCA5A826395121157)  # multipliers (Salmon et al., Table 2)
_PHILOX_W = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)  # key increments (golden ratio, sqrt(3)-1)


def philox4x64_10(counter: Sequence[int], key: Sequence[int]) -> tuple[int, int, int, int]:
    """The Philox4x64-10 block function (Salmon et al. 2011, Sec. 4): four 64-bit words of
    ``counter`` and two of ``key`` to four 64-bit output words, in pure Python integers.

    Ten rounds of ``(hi, lo) = M · x`` (a 64x64 → 128-bit product) on words 0 and 2, the
    high halves xored with words 1/3 and the round key, the key bumped by the Weyl constants
    between rounds. This is the definition the fast path (numpy's ``Philox``) is tested against.
    """
    c0, c1, c2, c3 = (int(v) & _M64 for v in counter)
    k0, k1 = (int(v) & _M64 for v in key)
    for r in range(10):
        if r:
            k0, k1 = (k0 + _PHILOX_W[0]) & _M64, (k1 + _PHILOX_W[1]) & _M64
        p0, p1 = _PHILOX_M[0] * c0, _PHILOX_M[1] * c2
        c0, c1, c2, c3 = (p1 >> 64) ^ c1 ^ k0, p1 & _M64, (p0 >> 64) ^ c3 ^ k1, p0 & _M64
    return c0, c1, c2, c3


_local = threading.local()  # per thread: numpy Philox objects by key, and where each stands
_LITTLE = sys.byteorder == "little"
_KEPT = 256  # keys whose generator a thread keeps positioned (the lean client's parameters)


class _Positioned:
    """A numpy Philox on one key, and which of the stream's 64-bit words (4 a block) is next."""

    def __init__(self, key: Key) -> None:
        self.bg = np.random.Philox(key=np.array([key.k0, key.k1], dtype=np.uint64))
        self.state = self.bg.state  # a dict of the right form, refilled by seek
        self.next = -1  # unknown (numpy's fresh Philox computes block 1 first)

    def seek(self, pos: int) -> np.random.Philox:
        """The generator, its next output the 64-bit word ``pos`` (= block ``pos // 4``, word
        ``pos % 4``): kept as it is when it stands there (a sequential read), else moved."""
        if pos != self.next:
            # numpy increments the counter before computing a block: set it one block back
            ctr = (pos // 4 - 1) % (1 << 256)
            self.state["state"]["counter"][:] = [(ctr >> (64 * i)) & _M64 for i in range(4)]
            self.state["buffer_pos"], self.state["has_uint32"] = 4, 0  # nothing buffered
            self.bg.state = self.state
            if pos % 4:
                self.bg.random_raw(pos % 4)
        return self.bg


def _positioned(key: Key) -> _Positioned:
    kept: dict[Key, _Positioned] | None = getattr(_local, "kept", None)
    if kept is None:
        kept = _local.kept = {}
    gen = kept.get(key)
    if gen is None:
        if len(kept) >= _KEPT:
            del kept[next(iter(kept))]
        gen = kept[key] = _Positioned(key)
    return gen


def _chunks(key: Key, count: int, offset: int, chunk: int = _CHUNK) -> Iterator[np.ndarray]:
    """32-bit words ``offset .. offset+count-1`` of ``key``'s stream, ``chunk`` at a time
    (native-order uint32 arrays, fresh and writable)."""
    if count <= 0:
        return
    gen = _positioned(key)
    pos = offset // 2  # the 64-bit word holding the first 32-bit word
    bg = gen.seek(pos)
    gen.next = -1  # unknown until the last chunk is drawn (a caller may stop early)
    skip = offset % 2
    first = True
    while count > 0:
        m = min(chunk - skip if first else chunk, count)  # skip + m is even until the last
        raw = bg.random_raw((skip + m + 1) // 2)
        pos += raw.size
        if _LITTLE:  # the low half of each 64-bit word first
            w = raw.view(np.uint32)[skip : skip + m]
        else:
            w = raw.astype("<u8").view("<u4")[skip : skip + m].astype(np.uint32)
        count, skip, first = count - m, 0, False
        if count == 0:
            gen.next = pos
        yield w


def words(key: Key, count: int, *, offset: int = 0) -> np.ndarray:
    """The 32-bit words ``offset .. offset+count-1`` of ``key``'s stream (uint32 numpy).

    Block ``b`` of the stream is ``Philox4x64-10(counter=b, key=(k0, k1))`` (:func:`philox4x64_10`;
    ``b`` spread over the four 64-bit counter words, least significant first): four 64-bit
    words, each split into its low then its high 32-bit half, are words ``8b .. 8b+7``. The
    draws run Philox through numpy's ``Philox`` bit generator, whose docstring guarantees "that a
    fixed seed will always produce the same random integer stream" (numpy's random compatibility
    policy gives BitGenerators "stronger guarantees of version-to-version stream compatibility"
    than its distributions); importing this module checks two blocks (across a carry of the
    counter) against the pure-Python definition and refuses a numpy that differs, and the tests
    check Random123's known answers. The other draws read these words: ``offset`` there counts
    the draw's elements.
    """
    _check_count(count, offset)
    if count <= _CHUNK:
        return next(_chunks(key, count, offset), np.empty(0, np.uint32))
    return np.concatenate(list(_chunks(key, count, offset)))


def _check_numpy_philox() -> None:
    """Refuse a numpy whose Philox is not Philox4x64-10 (checked once, at import: ~50 µs)."""
    key, block = Key(0x0123456789ABCDEF, 0xFEDCBA9876543210), (1 << 64) - 1
    want = []
    for b in (block, block + 1):
        for v in philox4x64_10([(b >> (64 * i)) & _M64 for i in range(4)], key):
            want += [v & 0xFFFFFFFF, v >> 32]
    got = words(key, 16, offset=8 * block).tolist()
    if got != want:
        raise RuntimeError(
            f"numpy {np.__version__}'s Philox does not compute Philox4x64-10 as fedge defines it "
            f"(block {block}: got {got[:2]}..., expected {want[:2]}...); portable draws would "
            "differ from other machines' — install a numpy that does (any from 1.17 to 2.x did)"
        )


# --- the standard normal: inverse CDF through a committed table ----------------------------------

_S = 7  # 2^S interpolation cells per octave of the tail probability
_SHIFT = 23 - _S  # float32 bits >> _SHIFT = sign · 2^(S+8) + biased exponent · 2^S + cell
_OCTAVES = 32  # |V| in [2^e, 2^(e+1)), e = 0..31 (2^31 itself is e = 31, cell 0)
NORMAL_TABLE_SHA256 = "abd24068ab3cec651fd574b11c64d74d08581b7b6bd8d93fb3eccf72e2b53ce0"
#: The largest |z| a portable normal takes: fl32(Q(2^-31)); P(|Z| > 6.2303) ≈ 4.66e-10 for
#: Z ~ N(0, 1).
NORMAL_TAIL = 6.230260372161865


def _two_sided_quantile(u: float) -> float:
    """Q(u) with P(|Z| > Q(u)) = u for Z ~ N(0, 1), u in (0, 1]."""
    return -statistics.NormalDist().inv_cdf(u / 2) if u < 1 else 0.0


def build_normal_table(cells_log2: int = _S) -> np.ndarray:
    """The interpolation table behind :func:`normal`, computed in float64: ``(2, 32, 2^s)``
    with ``[0]`` the intercepts A and ``[1]`` the slopes D (see :func:`normal`).

    For octave ``e`` and cell ``i`` (|V| in [L, R), L = 2^e (1 + i/2^s), R = 2^e (1 + (i+1)/2^s))
    the line through ``(L, Q(L/2^31))`` and ``(R, Q(R/2^31))`` is ``A + D·|V|``; Q is the
    two-sided normal quantile (``statistics.NormalDist().inv_cdf``, Wichura's AS241, ~1e-16
    relative). Cells past |V| = 2^31 are never reached and hold 0. The shipped table is this,
    rounded to float32 and pinned by :data:`NORMAL_TABLE_SHA256`.
    """
    n = 1 << cells_log2
    out = np.zeros((2, _OCTAVES, n), dtype=np.float64)
    top = float(1 << 31)
    for e in range(_OCTAVES):
        for i in range(n):
            lo, hi = 2.0**e * (1 + i / n), 2.0**e * (1 + (i + 1) / n)
            if lo >= top:
                continue
            q_lo, q_hi = _two_sided_quantile(lo / top), _two_sided_quantile(hi / top)
            d = (q_hi - q_lo) / (hi - lo)
            out[0, e, i], out[1, e, i] = q_lo - lo * d, d
    return out


def _load_table() -> tuple[np.ndarray, np.ndarray]:
    """The committed float32 table, spread over the index a float32's bits give (sign, exponent,
    top S mantissa bits): ``(A, D)``, each ``2^(S+9)`` float32, negated intercepts for V < 0."""
    raw = resources.files("fedge.core").joinpath("portable_normal.f32").read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != NORMAL_TABLE_SHA256:
        raise RuntimeError(
            f"fedge/core/portable_normal.f32 has sha256 {digest}, expected "
            f"{NORMAL_TABLE_SHA256}: the installed file is damaged; reinstall fedge"
        )
    table = np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(2, _OCTAVES, 1 << _S)
    a = np.zeros(1 << (_S + 9), dtype=np.float32)
    d = np.zeros(1 << (_S + 9), dtype=np.float32)
    for sign in (0, 1):
        start = (sign << (_S + 8)) + (127 << _S)  # biased exponent 127 + e, e = 0..31
        a[start : start + table[0].size] = -table[0].ravel() if sign else table[0].ravel()
        d[start : start + table[1].size] = table[1].ravel()
    return a, d


_TABLE_A, _TABLE_D = _load_table()
_DEVICE_TABLES: dict[str, tuple[Tensor, Tensor]] = {}


def _scratch() -> tuple[np.ndarray, np.ndarray]:
    """This thread's scratch of the numpy transform, ``_CHUNK`` each: the table index (intp)
    and one float32 operand. Reused call after call, so the transform's working set stays the
    same few hundred kB (hot in the cache) instead of fresh temporaries per call."""
    buf: tuple[np.ndarray, np.ndarray] | None = getattr(_local, "scratch", None)
    if buf is None:
        buf = _local.scratch = (np.empty(_CHUNK, np.intp), np.empty(_CHUNK, np.float32))
    return buf


def _normal_np(w: np.ndarray, out: np.ndarray) -> None:
    """The normal transform of 32-bit words ``w`` into float32 ``out`` (1-D, contiguous), in
    numpy: separate, exactly rounded float32 operations (numpy never fuses a multiply and an
    add), out doubling as the scratch of V and then of A."""
    n = w.size
    if n > _CHUNK:
        for i in range(0, n, _CHUNK):
            _normal_np(w[i : i + _CHUNK], out[i : i + _CHUNK])
        return
    jbuf, tbuf = _scratch()
    # V = fl32(int32(w | 1)): the or in int32, cast to float32 as it is written into out
    np.bitwise_or(w.view(np.int32), np.int32(1), out=out, casting="unsafe")
    j = np.right_shift(out.view(np.uint32), np.uint32(_SHIFT), out=jbuf[:n])  # < 2^(S+9)
    d = _TABLE_D.take(j, out=tbuf[:n], mode="wrap")  # j is in range: no wrap ever happens
    np.multiply(out, d, out=d)  # V·D, rounded ...
    a = _TABLE_A.take(j, out=out, mode="wrap")  # V is spent: A takes its place
    np.add(a, d, out=out)  # ... then A + (V·D), rounded


def _fill_normal(key: Key, out: np.ndarray, offset: int) -> None:
    """Standard normals ``offset ..`` of ``key`` into the 1-D float32 array ``out``."""
    if out.size <= _CHUNK:  # one pass (no generator: most draws are small)
        _normal_np(words(key, out.size, offset=offset), out)
        return
    at = 0
    for w in _chunks(key, out.size, offset):
        _normal_np(w, out[at : at + w.size])
        at += w.size


def _normal_torch(w: Tensor) -> Tensor:
    """The same transform on any device, from int32 words (a tensor on that device)."""
    dev = str(w.device)
    if dev not in _DEVICE_TABLES:
        _DEVICE_TABLES[dev] = (
            torch.from_numpy(_TABLE_A).to(w.device),
            torch.from_numpy(_TABLE_D).to(w.device),
        )
    a, d = _DEVICE_TABLES[dev]
    v = (w | 1).to(torch.float32)
    j = ((v.view(torch.int32) >> _SHIFT) & ((1 << (32 - _SHIFT)) - 1)).long()
    vd = v * d[j]  # a separate multiply and add: no fused multiply-add on any device
    return a[j] + vd


def normal_from_words(w: np.ndarray | Tensor) -> Tensor:
    """Standard normals from 32-bit words, one each, as :func:`normal` maps them: uint32 numpy
    words through numpy (a CPU tensor), a torch int32 tensor on its own device."""
    if isinstance(w, Tensor):
        return _normal_torch(w.to(torch.int32))
    w = np.ascontiguousarray(w, dtype=np.uint32)
    out = np.empty(w.shape, dtype=np.float32)
    _normal_np(w.reshape(-1), out.reshape(-1))
    return torch.from_numpy(out)


def normal(key: Key, shape: Sequence[int], *, offset: int = 0, device: _Device = "cpu") -> Tensor:
    """Standard normals (float32), one 32-bit word each, by a table inverse CDF with exact ops.

    From word ``w``: ``V = fl32(int32(w | 1))`` (odd, so ``|V|/2^31`` is uniform on the
    midpoints of 2^30 cells of (0, 1) and the sign independent of it); the float32 bits of V
    give ``j`` = (sign, exponent, top 7 mantissa bits), i.e. an octave of the tail probability
    ``u = |V|/2^31`` and one of 128 cells in it; then ``z = fl(A[j] + fl(V · D[j]))``: the line
    through the two-sided quantile ``Q(u)`` at the cell's ends (:func:`build_normal_table`),
    negated for V < 0. So ``z(−V) = −z(V)`` exactly.

    Accuracy (measured over every cell, tested): ``sup_z |F(z) − Φ(z)| < 1.1e-6`` for the
    distribution F of the draws, largest near |z| ≈ 0.67 where the top octave's cells are
    widest; ``|z| ≤`` :data:`NORMAL_TAIL` ``≈ 6.23``. The mean is exactly 0 by the symmetry.

    Args:
        key: the stream (:func:`stream_key`).
        shape: the result's shape; ``prod(shape)`` words from word ``offset`` on.
        offset: the first element's index in the stream.
        device: where the result lives; the words are drawn on the CPU, the transform runs there.
    """
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    _check_count(n, offset)
    if not _on_cpu(device):
        w = torch.from_numpy(words(key, n, offset=offset).view(np.int32)).to(device)
        return _normal_torch(w).view(shape)
    out = np.empty(shape, dtype=np.float32)
    _fill_normal(key, out.reshape(-1), offset)
    return torch.from_numpy(out)


def normal_rows(
    key: Key, rows: Sequence[int], shape: Sequence[int], *, device: _Device = "cpu"
) -> Tensor:
    """Row ``r`` of a ``(R, *shape)`` array of standard normals for each ``r`` in ``rows``:
    ``(len(rows), *shape)``, row ``r`` being ``normal(key, shape, offset=r · stride)`` with
    ``stride = prod(shape)`` rounded up to a multiple of 8 (a row starts a Philox block).

    For perturbation directions: ``key = stream_key(seed, "zo", name)``, row = direction k; a
    run of consecutive rows is one draw from one stream position, so the server's chunk of
    directions per parameter costs one call, and direction k alone costs only its own words.
    """
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    stride = row_stride(shape)
    starts = [int(r) * stride for r in rows]
    if starts and min(starts) < 0:
        raise ValueError(f"rows must be non-negative, got {list(rows)}")
    if len(starts) == 1 and n <= _CHUNK and _LITTLE and _on_cpu(device):
        return _one_row(key, starts[0], n, stride).view(1, *shape)  # the lean client's draw
    if not _on_cpu(device):
        w = np.empty((len(starts), n), dtype=np.uint32)
        for i, start in enumerate(starts):
            w[i] = words(key, n, offset=start)
        z = _normal_torch(torch.from_numpy(w.view(np.int32)).to(device))
        return z.view(len(starts), *shape)
    out = np.empty((len(starts), *shape), dtype=np.float32).reshape(len(starts), n)
    i = 0
    while i < len(starts):  # a run of consecutive rows is one stretch of the stream
        j = i + 1
        while j < len(starts) and starts[j] == starts[j - 1] + stride:
            j += 1
        if n == stride:
            _fill_normal(key, out[i:j].reshape(-1), starts[i])
        else:
            padded = np.empty((j - i, stride), dtype=np.float32)
            _fill_normal(key, padded.reshape(-1), starts[i])
            out[i:j] = padded[:, :n]
        i = j
    return torch.from_numpy(out.reshape(len(starts), *shape))


def row_stride(shape: Sequence[int]) -> int:
    """Words between the starts of two rows of :func:`normal_rows` for ``shape``: its size
    rounded up to a multiple of 8 (so a row starts a Philox block)."""
    return -(-math.prod(int(s) for s in shape) // 8) * 8


def normal_row_many(rows: Sequence[tuple[Key, int, Sequence[int]]]) -> list[Tensor]:
    """Row ``r`` of :func:`normal_rows` ``(key, ·, shape)`` for each ``(key, r, shape)``, in one
    transform pass (:func:`normal_many`): the same tensors as ``normal_rows(key, [r], shape)[0]``
    one by one, at a fraction of the per-call cost for small shapes (a lean client's direction
    k over every small parameter). The tensors are views of one buffer: do not write into them.
    """
    if any(int(r) < 0 for _, r, _ in rows):
        raise ValueError(f"rows must be non-negative, got {[int(r) for _, r, _ in rows]}")
    shapes = [tuple(int(s) for s in shape) for _, _, shape in rows]
    sizes = [math.prod(shape) for shape in shapes]
    if not _LITTLE or sum(sizes) > _CHUNK:
        return normal_many(
            [(k, sh, int(r) * row_stride(sh)) for (k, r, _), sh in zip(rows, shapes)]
        )
    # each row's whole stride read (a whole number of Philox blocks), as _one_row does: the
    # next row of each key then follows without a seek; one transform pass for all rows
    w = np.empty(sum(sizes), dtype=np.uint32)
    at = 0
    for (key, r, _), n in zip(rows, sizes):
        if n:
            half = -(-n // 8) * 4  # 64-bit words in a row's stride
            gen = _positioned(key)
            pos = int(r) * half
            w[at : at + n] = gen.seek(pos).random_raw(half).view(np.uint32)[:n]
            gen.next = pos + half
            at += n
    flat = torch.empty(w.size)
    _normal_np(w, flat.numpy())
    return [z.view(shape) for z, shape in zip(flat.split(sizes), shapes)]


def _one_row(key: Key, start: int, n: int, stride: int) -> Tensor:
    """``normal(key, (n,), offset=start)`` for a row start (a multiple of 8) and a small row,
    with the least per-call work (a lean client draws one small tensor per call): the row's
    whole stride is read, so the next row of the key follows without a seek."""
    gen = _positioned(key)
    pos = start // 2
    raw = gen.seek(pos).random_raw(stride // 2)
    gen.next = pos + stride // 2
    out = np.empty(n, dtype=np.float32)
    _normal_np(raw.view(np.uint32)[:n], out)
    return torch.from_numpy(out)


def normal_many(
    draws: Sequence[tuple[Key, Sequence[int], int]], *, device: _Device = "cpu"
) -> list[Tensor]:
    """Several :func:`normal` draws, ``(key, shape, offset)`` each, in one transform pass: the
    same tensors as drawing them one by one, at a fraction of the per-call cost when they are
    small (a lean client's direction k over every parameter: one call instead of one per
    parameter; a bias of 10 costs about as much to draw alone as a 10,000-weight layer).
    """
    shapes = [tuple(int(s) for s in shape) for _, shape, _ in draws]
    sizes = [math.prod(shape) for shape in shapes]
    parts = []
    for (key, _, offset), n in zip(draws, sizes):
        _check_count(n, offset)
        parts.append(words(key, n, offset=offset))
    w = np.concatenate([*parts, np.empty(0, np.uint32)])
    if _on_cpu(device):
        flat = torch.empty(w.size)
        _normal_np(w, flat.numpy())
    else:
        flat = _normal_torch(torch.from_numpy(w.view(np.int32)).to(device))
    return [z.view(shape) for z, shape in zip(flat.split(sizes), shapes)]


# --- uniforms, integers, permutations, signs, masks ----------------------------------------------


def uniform(
    key: Key,
    shape: Sequence[int],
    *,
    low: float = 0.0,
    high: float = 1.0,
    dtype: torch.dtype = torch.float32,
    offset: int = 0,
    device: _Device = "cpu",
) -> Tensor:
    """Uniforms on [low, high). float32: one word each, ``u = (w >> 8) · 2^-24``; float64 (for
    comparisons against small probabilities, e.g. Poisson sampling): two words each,
    ``u = (r >> 11) · 2^-53`` with ``r = lo + 2^32 · hi`` as in :func:`integers`. Both exact, a
    multiple of the step in [0, 1); for other bounds ``fl(fl(u · (high − low)) + low)`` with the
    bounds rounded to the dtype.
    """
    if dtype == torch.float32:
        w = _words_for(key, shape, offset)
        ftype: type[np.floating] = np.float32
        u = (w >> 8).astype(np.float32) * np.float32(2.0**-24)
    elif dtype == torch.float64:
        r = _pairs(key, math.prod(int(s) for s in shape), offset)
        ftype = np.float64
        u = (r >> np.uint64(11)).astype(np.float64) * 2.0**-53
    else:
        raise ValueError(f"uniform draws float32 or float64, got dtype={dtype}")
    if (low, high) != (0.0, 1.0):
        u = u * ftype(high - low) + ftype(low)
    return _tensor(u, shape, device)


def symmetric_uniform(
    key: Key, shape: Sequence[int], bound: float, *, offset: int = 0, device: _Device = "cpu"
) -> Tensor:
    """Uniforms on (−bound, bound) (float32), one word each, for seeded initialisations
    (kaiming-uniform: ``bound = 1/sqrt(fan_in)``): ``fl(c · fl32(bound))`` with
    ``c = ((int32(w) >> 7) | 1) · 2^-24``, an odd multiple of 2^-24 in (−1, 1), exact; so the
    distribution is symmetric and never hits ±bound or 0.
    """
    w = _words_for(key, shape, offset)
    c = ((w.view(np.int32) >> 7) | 1).astype(np.float32) * np.float32(2.0**-24)
    return _tensor(c * np.float32(bound), shape, device)


def integers(
    key: Key, shape: Sequence[int], high: int, *, offset: int = 0, device: _Device = "cpu"
) -> Tensor:
    """Integers uniform on [0, high) (int64), two words each (``r = lo + 2^32 · hi``, 64 bits):
    ``floor(r · high / 2^64)``, exact in 64-bit integer arithmetic, ``1 ≤ high ≤ 2^32``; the
    bias is below ``high / 2^64`` per value (no rejection, so every value has a fixed position).
    """
    high = operator.index(high)
    if not 1 <= high <= 1 << 32:
        raise ValueError(f"high must be in [1, 2^32], got {high}")
    w = _words_for(key, (2 * math.prod(int(s) for s in shape),), 2 * offset).astype(np.uint64)
    lo, hi = w[0::2], w[1::2]
    h = np.uint64(high)
    carry = (lo * h) >> np.uint64(32)  # lo · high < 2^64
    r = (hi * h + carry) >> np.uint64(32)  # < 2^64: hi · high + carry < 2^32 · high
    return _tensor(r.astype(np.int64), shape, device)


def permutation(key: Key, n: int, *, device: _Device = "cpu") -> Tensor:
    """A uniformly random permutation of ``0..n-1`` (int64): the order that sorts n 64-bit keys
    (two words each, as in :func:`integers`) ascending, ties by index — a stable sort, so any
    correct sort gives the same result."""
    n = operator.index(n)
    keys = _pairs(key, n, 0)
    return _tensor(np.argsort(keys, kind="stable").astype(np.int64), (n,), device)


def signs(key: Key, shape: Sequence[int], *, offset: int = 0, device: _Device = "cpu") -> Tensor:
    """Rademacher ±1 (float32), one bit each: element i is ``1 − 2·b`` with b bit ``i mod 32``
    (least significant first) of word ``i // 32``."""
    n = math.prod(int(s) for s in shape)
    _check_count(n, offset)
    first = offset // 32
    w = words(key, -(-(offset + n) // 32) - first, offset=first)
    bits = np.unpackbits(w.astype("<u4").view(np.uint8), bitorder="little")
    b = bits[offset - 32 * first : offset - 32 * first + n]
    return _tensor((1 - 2 * b.astype(np.int8)).astype(np.float32), shape, device)


def bernoulli(
    key: Key, shape: Sequence[int], p: float, *, offset: int = 0, device: _Device = "cpu"
) -> Tensor:
    """True with probability ``t / 2^32``, ``t = round(p · 2^32)`` (bool), one word each:
    ``w < t`` (so p = 0 gives no True and p = 1 all True)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p}")
    t = round(p * (1 << 32))
    w = _words_for(key, shape, offset).astype(np.uint64)
    return _tensor(w < np.uint64(t), shape, device)


def _pairs(key: Key, count: int, offset: int) -> np.ndarray:
    """64-bit values ``lo + 2^32 · hi`` of words ``2i, 2i + 1``, i = offset .. (uint64)."""
    w = words(key, 2 * count, offset=2 * offset).astype(np.uint64)
    return w[0::2] | (w[1::2] << np.uint64(32))


def _words_for(key: Key, shape: Sequence[int], offset: int) -> np.ndarray:
    return words(key, math.prod(int(s) for s in shape), offset=offset)


def _tensor(a: np.ndarray, shape: Sequence[int], device: _Device) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).view(tuple(int(s) for s in shape)).to(device)


def _on_cpu(device: _Device) -> bool:
    return device == "cpu" or torch.device(device).type == "cpu"


def _check_count(count: int, offset: int) -> None:
    if count < 0 or offset < 0:
        raise ValueError(
            f"a draw needs count >= 0 and offset >= 0, got count={count}, offset={offset}"
        )


_check_numpy_philox()
