"""Key agreement, HKDF derivations and AES-GCM share encryption; tampering is rejected."""

from __future__ import annotations

import pytest

from fedge.privacy.secagg import ShareDecryptionError
from fedge.privacy.secagg.keys import (
    KeyPair,
    agree,
    decrypt_share,
    encrypt_share,
    pair_mask_seed,
    share_key,
)


def test_agreement_and_derivations_are_symmetric_and_bound_to_round() -> None:
    a, b = KeyPair.generate(), KeyPair.generate()
    ab, ba = agree(a.private, b.public), agree(b.private, a.public)
    assert ab == ba and len(ab) == 32
    assert pair_mask_seed(ab, round=3, u=1, v=2) == pair_mask_seed(ba, round=3, u=2, v=1)
    assert pair_mask_seed(ab, round=3, u=1, v=2) != pair_mask_seed(ab, round=4, u=1, v=2)
    assert pair_mask_seed(ab, round=3, u=1, v=2) != share_key(ab, round=3, u=1, v=2)
    assert KeyPair.from_private_bytes(a.private_bytes()).public == a.public


def test_encrypted_share_round_trip_and_size() -> None:
    key = share_key(b"\x01" * 32, round=1, u=4, v=9)
    blob = encrypt_share(key, b"s" * 68, round=1, sender=4, recipient=9)
    assert len(blob) == 12 + 68 + 16
    assert decrypt_share(key, blob, round=1, sender=4, recipient=9) == b"s" * 68


@pytest.mark.parametrize("position", [0, 11, 12, 50, -1])
def test_modified_ciphertext_is_rejected(position: int) -> None:
    key = share_key(b"\x01" * 32, round=1, u=4, v=9)
    blob = bytearray(encrypt_share(key, b"s" * 68, round=1, sender=4, recipient=9))
    blob[position] ^= 0x01  # nonce, ciphertext or tag
    with pytest.raises(ShareDecryptionError, match="AES-GCM rejected"):
        decrypt_share(key, bytes(blob), round=1, sender=4, recipient=9)


@pytest.mark.parametrize(
    ("rnd", "sender", "recipient"), [(2, 4, 9), (1, 9, 4), (1, 4, 8), (1, 5, 9)]
)
def test_associated_data_binds_round_and_route(rnd: int, sender: int, recipient: int) -> None:
    key = share_key(b"\x01" * 32, round=1, u=4, v=9)
    blob = encrypt_share(key, b"s" * 68, round=1, sender=4, recipient=9)
    with pytest.raises(ShareDecryptionError):
        decrypt_share(key, blob, round=rnd, sender=sender, recipient=recipient)
