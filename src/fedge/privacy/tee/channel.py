"""The sealed channel between a client enclave and the server enclave (PPFL, seed 001, Sec. 4.1).

Keys: X25519 agreement between the two attested enclaves' keys, then HKDF-SHA256 with
info ``"fedge/tee/v1/session" ‖ client`` gives one AES-256-GCM key per (client, session)
(reusing :func:`fedge.privacy.secagg.keys.agree`).

Nonces: ``direction (1 byte) ‖ counter (4 bytes) ‖ 7 random bytes`` (os.urandom), a
hybrid of NIST SP 800-38D §8.2.1 (deterministic) and §8.2.2 (random) construction. The
counter part alone would make every nonce unique *if a sender's state only went forward*; it
does not here: a sender's counters live in sealed state that the REE keeps and can roll back
(the server's REE keeps the old client enclave state when a Flower reply is lost after the
enclave sealed), and a rolled-back sender seals its next message under a counter it used
before. With a counter-only nonce that repeats a (key, nonce) pair with another plaintext:
C1 ⊕ C2 = P1 ⊕ P2, and GCM's authentication key falls too. The random part makes such a repeat
need a 56-bit collision as well: a (direction, counter) value sealed k times (k - 1 rollbacks
to it) repeats a nonce with probability ≤ k(k - 1)/2 · 2^-56, and a session with probability
≤ Σ_c k_c(k_c - 1)/2 · 2^-56 over its counter values c — at most 2^-32, the bound §8.3 sets
for random nonces, while Σ_c k_c(k_c - 1)/2 ≤ 2^24 (2^24 counter values sealed twice each, or
one sealed 2^12 times), and 0 without rollback (distinct counters, disjoint direction bytes).
The counter takes 4 bytes since a session carries one message per direction per round (a
sender refuses to go past 2^32 - 1); each byte left to the random part divides the bound by
256. The nonce keeps its 12 bytes, so sealed messages keep their size.

Associated data binds every message to ``round ‖ stage ‖ client ‖ direction ‖ counter``: a
message moved to another round, stage, client or direction fails authentication. The
receiver also requires the counter to be larger than the last one it accepted, so a replayed
or reordered message is rejected (:class:`SealError`) even though its tag is valid — as long
as the receiver's own state is not rolled back: sealed storage here has no monotonic counter
(SGX's platform counters, a TPM), so an REE that restores an older sealed receiver state can
replay what that state had not yet accepted.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedge.core.errors import MessageError
from fedge.privacy.secagg.keys import KeyPair, agree

__all__ = [
    "DOWN",
    "UP",
    "SealError",
    "SealedChannel",
    "session_key",
    "KeyPair",
    "seal_blob",
    "open_blob",
]

UP, DOWN = 1, 2  # client enclave -> server enclave, and back
_NONCE = struct.Struct(">BI")  # direction, counter; then _RANDOM bytes from os.urandom
_RANDOM = 7
_NONCE_LEN = _NONCE.size + _RANDOM  # 12: AES-GCM's 96-bit nonce
_AD = struct.Struct(">QQQIQ")
_MAX = (1 << 32) - 1


class SealError(MessageError):
    """A sealed message failed authentication or arrived out of order."""


def session_key(private: KeyPair, peer_public: bytes, *, client: int) -> bytes:
    shared = agree(private.private, peer_public)
    info = b"fedge/tee/v1/session" + struct.pack(">Q", client)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


@dataclass
class SealedChannel:
    """One side's view of a session: ``send_ctr`` is the next counter it seals with,
    ``recv_ctr`` the last counter it accepted (-1: none). Both persist with the enclave (in
    sealed state the REE keeps, so they may be rolled back: see the module docstring)."""

    key: bytes
    client: int
    send_dir: int
    send_ctr: int = 0
    recv_ctr: int = -1

    @property
    def recv_dir(self) -> int:
        return DOWN if self.send_dir == UP else UP

    def _ad(self, rnd: int, stage: int, direction: int, ctr: int) -> bytes:
        return b"fedge/tee/v1/msg" + _AD.pack(rnd, stage, self.client, direction, ctr)

    def seal(self, plaintext: bytes, *, rnd: int, stage: int) -> bytes:
        if self.send_ctr >= _MAX:
            raise SealError("sealed channel counter exhausted; re-key the session")
        ctr = self.send_ctr
        self.send_ctr += 1
        nonce = _NONCE.pack(self.send_dir, ctr) + os.urandom(_RANDOM)
        return nonce + AESGCM(self.key).encrypt(
            nonce, plaintext, self._ad(rnd, stage, self.send_dir, ctr)
        )

    def open(self, blob: bytes, *, rnd: int, stage: int) -> bytes:
        if len(blob) < _NONCE_LEN + 16:
            raise SealError(f"sealed message of {len(blob)} bytes is too short")
        direction, ctr = _NONCE.unpack(blob[: _NONCE.size])
        if direction != self.recv_dir:
            raise SealError(
                f"sealed message from client {self.client} has direction {direction}; expected {self.recv_dir}"
            )
        try:
            plain = AESGCM(self.key).decrypt(
                blob[:_NONCE_LEN], blob[_NONCE_LEN:], self._ad(rnd, stage, direction, ctr)
            )
        except InvalidTag as e:
            raise SealError(
                f"sealed message of client {self.client} (round {rnd}, stage {stage}) failed authentication: "
                "modified in transit, or bound to another round, stage or client"
            ) from e
        if ctr <= self.recv_ctr:
            raise SealError(
                f"sealed message of client {self.client} has counter {ctr} ≤ last accepted "
                f"{self.recv_ctr}: replayed or reordered; rejected"
            )
        self.recv_ctr = ctr
        return plain


def seal_blob(key: bytes, plaintext: bytes, *, label: bytes) -> bytes:
    """Seal an enclave's own state for storage outside it (sealed storage; ``key`` is a
    hardware key). As SGX's sealing does, each blob gets a fresh random 16-byte key id and is
    encrypted under HKDF(key, salt = key id, info = label): the hardware key outlives runs and
    processes, so counter nonces under it would repeat; a key used once needs no nonce care.
    Layout: ``key id (16) ‖ AES-GCM ciphertext and tag`` (nonce all zero)."""
    key_id = os.urandom(16)
    return key_id + AESGCM(_storage_key(key, key_id, label)).encrypt(
        _ZERO_NONCE, plaintext, _STORAGE_AD + label
    )


def open_blob(key: bytes, blob: bytes, *, label: bytes) -> bytes:
    try:
        if len(blob) < 16 + 16:
            raise InvalidTag
        return AESGCM(_storage_key(key, blob[:16], label)).decrypt(
            _ZERO_NONCE, blob[16:], _STORAGE_AD + label
        )
    except InvalidTag as e:
        raise SealError(
            f"sealed enclave storage {label!r} failed authentication: modified, or sealed on another "
            "platform (a TEE's sealed storage opens only where it was sealed)"
        ) from e


_STORAGE_AD = b"fedge/tee/v1/storage"
_ZERO_NONCE = bytes(12)


def _storage_key(key: bytes, key_id: bytes, label: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=key_id, info=_STORAGE_AD + label).derive(
        key
    )
