"""Wire format of the secure-aggregation messages: real bytes, so byte counts are honest.
Design notes: docs/decisions.md#secure-aggregation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Self

from fedge.core.errors import MessageError
from fedge.privacy.secagg.keys import KEY_BYTES, NONCE_BYTES, TAG_BYTES
from fedge.privacy.secagg.shamir import ELEMENT_BYTES

__all__ = [
    "Advertise",
    "BLOB_BYTES",
    "Forward",
    "KeyList",
    "Kind",
    "MaskedInput",
    "SHARE_BYTES",
    "Shares",
    "UnmaskRequest",
    "UnmaskResponse",
]

SHARE_BYTES = 2 * ELEMENT_BYTES  # one share of a 32-byte secret
BLOB_BYTES = NONCE_BYTES + 2 * SHARE_BYTES + TAG_BYTES  # nonce ‖ enc(share_s ‖ share_b) ‖ tag

_HEADER = struct.Struct("<BII")
_U32 = struct.Struct("<I")


class Kind(IntEnum):
    ADVERTISE = 1
    KEY_LIST = 2
    SHARES = 3
    FORWARD = 4
    MASKED_INPUT = 5
    UNMASK_REQUEST = 6
    UNMASK_RESPONSE = 7


class _Reader:
    def __init__(self, buf: bytes, what: str) -> None:
        self.buf, self.pos, self.what = memoryview(buf), 0, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise MessageError(f"truncated {self.what} message ({len(self.buf)} bytes)")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def table(self, width: int) -> dict[int, bytes]:
        """n:u32 then n × (id:u32 ‖ width bytes), ids distinct."""
        out: dict[int, bytes] = {}
        for _ in range(self.u32()):
            i = self.u32()
            if i in out:
                raise MessageError(f"{self.what} message lists id {i} twice")
            out[i] = self.take(width)
        return out

    def ids(self) -> tuple[int, ...]:
        ids = tuple(self.u32() for _ in range(self.u32()))
        if len(set(ids)) != len(ids):
            raise MessageError(f"{self.what} message lists an id twice")
        return ids

    def rest(self) -> bytes:
        return self.take(len(self.buf) - self.pos)

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise MessageError(f"{len(self.buf) - self.pos} trailing bytes in {self.what} message")


def _table(entries: dict[int, bytes], width: int) -> bytes:
    parts = [_U32.pack(len(entries))]
    for i in sorted(entries):
        if len(entries[i]) != width:
            raise MessageError(f"entry for id {i} has {len(entries[i])} bytes, expected {width}")
        parts += [_U32.pack(i), entries[i]]
    return b"".join(parts)


def _ids(ids: tuple[int, ...]) -> bytes:
    return _U32.pack(len(ids)) + b"".join(_U32.pack(i) for i in ids)


@dataclass(frozen=True)
class _Message:
    """Header fields; subclasses add a body with ``_body`` / ``_parse``."""

    kind: ClassVar[Kind]
    round: int
    party: int

    def to_bytes(self) -> bytes:
        return _HEADER.pack(self.kind, self.round, self.party) + self._body()

    @classmethod
    def from_bytes(cls, buf: bytes) -> Self:
        r = _Reader(buf, cls.__name__)
        kind, rnd, party = _HEADER.unpack(r.take(_HEADER.size))
        if kind != cls.kind:
            raise MessageError(f"expected a {cls.__name__} message, got kind {kind}")
        msg = cls._parse(rnd, party, r)
        r.done()
        return msg

    def _body(self) -> bytes:
        raise NotImplementedError

    @classmethod
    def _parse(cls, rnd: int, party: int, r: _Reader) -> Self:
        raise NotImplementedError


@dataclass(frozen=True)
class Advertise(_Message):
    """Round 0, client u -> server: (c_pk_u, s_pk_u)."""

    kind: ClassVar[Kind] = Kind.ADVERTISE
    c_pk: bytes
    s_pk: bytes

    def _body(self) -> bytes:
        return self.c_pk + self.s_pk

    @classmethod
    def _parse(cls, rnd: int, party: int, r: _Reader) -> Self:
        return cls(rnd, party, r.take(KEY_BYTES), r.take(KEY_BYTES))


@dataclass(frozen=True)
class KeyList(_Message):
    """Round 0, server -> client u: ``keys[v] = (c_pk_v, s_pk_v)`` for u's live neighbours."""

    kind: ClassVar[Kind] = Kind.KEY_LIST
    keys: dict[int, tuple[bytes, bytes]]

    def _body(self) -> bytes:
        return _table({v: c + s for v, (c, s) in self.keys.items()}, 2 * KEY_BYTES)

    @classmethod
    def _parse(cls, rnd: int, party: int, r: _Reader) -> Self:
        t = r.table(2 * KEY_BYTES)
        return cls(rnd, party, {v: (b[:KEY_BYTES], b[KEY_BYTES:]) for v, b in t.items()})


@dataclass(frozen=True)
class _BlobTable(_Message):
    """A table of fixed-size encrypted share blobs keyed by the other client's id."""

    blobs: dict[int, bytes]

    def _body(self) -> bytes:
        return _table(self.blobs, BLOB_BYTES)

    @classmethod
    def _parse(cls, rnd: int, party: int, r: _Reader) -> Self:
        return cls(rnd, party, r.table(BLOB_BYTES))


@dataclass(frozen=True)
class Shares(_BlobTable):
    """Round 1, client u -> server: ``blobs[v]`` = u's encrypted shares for neighbour v."""

    kind: ClassVar[Kind] = Kind.SHARES


@dataclass(frozen=True)
class Forward(_BlobTable):
    """Round 1, server -> client u: ``blobs[v]`` = v's encrypted shares for u."""

    kind: ClassVar[Kind] = Kind.FORWARD


@dataclass(frozen=True)
class MaskedInput(_Message):
    """Round 2, client u -> server: y_u as K little-endian ring elements."""

    kind: ClassVar[Kind] = Kind.MASKED_INPUT
    y: bytes

    def _body(self) -> bytes:
        return self.y

    @classmethod
    def _parse(cls, rnd: int, party: int, r: _Reader) -> Self:
        return cls(rnd, party, r.rest())


@dataclass(frozen=True)
class UnmaskRequest(_Message):
    """Round 3, server -> client u: which of u's mask neighbours survived or dropped."""

    kind: ClassVar[Kind] = Kind.UNMASK_REQUEST
    alive: tuple[int, ...]
    dropped: tuple[int, ...]

    def _body(self) -> bytes:
        return _ids(self.alive) + _ids(self.dropped)

    @classmethod
    def _parse(cls, rnd: int, party: int, r: _Reader) -> Self:
        return cls(rnd, party, r.ids(), r.ids())


@dataclass(frozen=True)
class UnmaskResponse(_Message):
    """Round 3, client u -> server: shares of b_v (v alive) and of s_sk_v (v dropped)."""

    kind: ClassVar[Kind] = Kind.UNMASK_RESPONSE
    self_mask_shares: dict[int, bytes]
    key_shares: dict[int, bytes]

    def _body(self) -> bytes:
        return _table(self.self_mask_shares, SHARE_BYTES) + _table(self.key_shares, SHARE_BYTES)

    @classmethod
    def _parse(cls, rnd: int, party: int, r: _Reader) -> Self:
        return cls(rnd, party, r.table(SHARE_BYTES), r.table(SHARE_BYTES))
