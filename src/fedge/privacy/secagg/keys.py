"""Key material of one secure-aggregation round (Bonawitz et al., CCS 2017, §4, rounds 0-1):
X25519 key pairs from OS randomness, HKDF derivations, and the AES-GCM encryption of Shamir
shares. Design notes: docs/decisions.md#secure-aggregation.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedge.core.errors import MessageError
from fedge.privacy.secagg.errors import SecAggError, ShareDecryptionError

__all__ = [
    "Entropy",
    "KEY_BYTES",
    "KeyPair",
    "NONCE_BYTES",
    "TAG_BYTES",
    "agree",
    "decrypt_share",
    "encrypt_share",
    "pair_mask_seed",
    "share_key",
]

Entropy = Callable[[int], bytes]
"""``n -> n`` random bytes. ``os.urandom`` in production; a fixed stream only in tests."""

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
_LABEL = b"fedge/secagg/v1/"
_RAW = serialization.Encoding.Raw


@dataclass(frozen=True)
class KeyPair:
    """An X25519 key pair; ``public`` is the raw 32-byte key that goes on the wire."""

    private: X25519PrivateKey
    public: bytes

    @classmethod
    def generate(cls, entropy: Entropy = os.urandom) -> KeyPair:
        return cls.from_private_bytes(entropy(KEY_BYTES))

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> KeyPair:
        sk = X25519PrivateKey.from_private_bytes(raw)
        return cls(sk, sk.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw))

    def private_bytes(self) -> bytes:
        return self.private.private_bytes(
            _RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )


def agree(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    """X25519(private, peer_public): the 32-byte shared secret.

    Raises:
        SecAggError: the peer key is malformed or a low-order point (all-zero shared secret).
    """
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as e:
        raise SecAggError(f"X25519 agreement failed for peer key {peer_public.hex()}: {e}") from e


def _context(purpose: bytes, *ints: int) -> bytes:
    return _LABEL + purpose + b"".join(struct.pack("<Q", i) for i in ints)


def _hkdf(shared: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def pair_mask_seed(shared: bytes, *, round: int, u: int, v: int) -> bytes:
    """s_uv: the PRG seed of the pair mask between clients u and v (symmetric in u, v)."""
    return _hkdf(shared, _context(b"pair-mask", round, min(u, v), max(u, v)))


def share_key(shared: bytes, *, round: int, u: int, v: int) -> bytes:
    """k_uv: the AES-256-GCM key for shares between u and v (symmetric in u, v)."""
    return _hkdf(shared, _context(b"share-key", round, min(u, v), max(u, v)))


def encrypt_share(
    key: bytes,
    plaintext: bytes,
    *,
    round: int,
    sender: int,
    recipient: int,
    entropy: Entropy = os.urandom,
) -> bytes:
    """AES-GCM(key, nonce, plaintext, ad = round ‖ sender ‖ recipient) as nonce ‖ ct ‖ tag.

    The 96-bit nonce is random: both directions of a pair use the same k_uv, and a random nonce
    stays unique even if a step is retried.
    """
    nonce = entropy(NONCE_BYTES)
    ad = _context(b"share", round, sender, recipient)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, ad)


def decrypt_share(key: bytes, blob: bytes, *, round: int, sender: int, recipient: int) -> bytes:
    """Inverse of :func:`encrypt_share`.

    Raises:
        ShareDecryptionError: the ciphertext, nonce, tag, round or route was altered.
    """
    if len(blob) < NONCE_BYTES + TAG_BYTES:
        raise MessageError(f"encrypted share of {len(blob)} bytes is too short")
    ad = _context(b"share", round, sender, recipient)
    try:
        return AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], ad)
    except InvalidTag as e:
        raise ShareDecryptionError(
            f"AES-GCM rejected the share from client {sender} to client {recipient} in round "
            f"{round}: it was modified in transit, misrouted, or belongs to another round"
        ) from e
