"""PRG: deterministic AES-256-CTR keystream read as ring elements."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedge.core.errors import ConfigError
from fedge.privacy.secagg import prg


def test_deterministic_and_of_requested_length() -> None:
    seed = bytes(range(32))
    a, b = prg(seed, 257), prg(seed, 257)
    assert a.dtype == np.uint64 and a.shape == (257,)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(prg(seed, 10), a[:10])  # a prefix of a longer expansion
    assert prg(seed, 0).shape == (0,)
    assert not np.array_equal(prg(bytes(32), 257), a)


def test_matches_aes_ecb_on_the_counter_blocks() -> None:
    # Oracle: CTR keystream block i = AES_k(i as a 128-bit big-endian counter)
    seed = bytes(range(100, 132))
    ecb = Cipher(algorithms.AES(seed), modes.ECB()).encryptor()
    blocks = b"".join(ecb.update(i.to_bytes(16, "big")) for i in range(4))
    expected = [int.from_bytes(blocks[i : i + 8], "little") for i in range(0, 64, 8)]
    assert prg(seed, 8).tolist() == expected
    expected32 = [int.from_bytes(blocks[i : i + 4], "little") for i in range(0, 64, 4)]
    assert prg(seed, 16, bits=32).tolist() == expected32


def test_output_looks_uniform() -> None:
    v = prg(b"\x07" * 32, 20000)
    top = (v >> np.uint64(63)).astype(np.float64)
    assert abs(top.mean() - 0.5) < 0.02
    assert int(prg(b"\x07" * 32, 20000, bits=32).max()) < 2**32


@pytest.mark.parametrize("seed", [b"", b"x" * 16, b"x" * 33])
def test_seed_must_be_32_bytes(seed: bytes) -> None:
    with pytest.raises(ConfigError, match="32 bytes"):
        prg(seed, 4)
