"""The sealed channel between a client enclave and the server enclave (PPFL, seed 001, Sec. 4.1):
X25519 + HKDF session keys, AES-256-GCM with counter-plus-random nonces and associated data.
Design notes: docs/decisions.md#trusted-execution-environment.
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
