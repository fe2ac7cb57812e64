import pytest

from fedge.privacy.tee import (
    DOWN,
    UP,
    KeyPair,
    SealedChannel,
    SealError,
    open_blob,
    seal_blob,
    session_key,
)


def _pair(client=3):
    a, b = KeyPair.generate(), KeyPair.generate()
    k1, k2 = session_key(a, b.public, client=client), session_key(b, a.public, client=client)
    assert k1 == k2  # X25519 agreement is symmetric
    return SealedChannel(k1, client, UP), SealedChannel(k2, client, DOWN)


def test_roundtrip_both_directions():
    c, s = _pair()
    assert s.open(c.seal(b"layer", rnd=1, stage=0), rnd=1, stage=0) == b"layer"
    assert c.open(s.seal(b"global", rnd=1, stage=0), rnd=1, stage=0) == b"global"


def test_nonces_unique_over_1e5_seals_both_directions():
    c, s = _pair()
    nonces = set()
    for _i in range(50_000):
        nonces.add(c.seal(b"", rnd=1, stage=0)[:12])
        nonces.add(s.seal(b"", rnd=1, stage=0)[:12])
    assert len(nonces) == 100_000


def test_a_rolled_back_sender_does_not_repeat_a_nonce():
    """The REE keeps a sender's sealed state and can roll it back (a reply lost after the
    enclave sealed): the sender then seals another plaintext under the same counter. The
    nonces must still differ (else C1 xor C2 = P1 xor P2), the receiver still opens the new
    message, the counter is still bound in the associated data and still checked for replay."""
    c, s = _pair()
    c.seal(b"round 1", rnd=1, stage=0)
    saved = (c.send_ctr, c.recv_ctr)  # the REE's copy of the sender's state
    m1 = c.seal(b"upload A", rnd=2, stage=0)
    c.send_ctr, c.recv_ctr = saved  # rolled back
    m2 = c.seal(b"upload B", rnd=2, stage=0)
    assert m1[1:5] == m2[1:5]  # the same counter...
    assert m1[:12] != m2[:12]  # ...but not the same nonce
    assert s.open(m2, rnd=2, stage=0) == b"upload B"
    with pytest.raises(SealError, match="replayed or reordered"):
        s.open(m1, rnd=2, stage=0)  # its counter was accepted already
    fresh = SealedChannel(s.key, 3, DOWN)  # a receiver that accepted nothing yet
    moved = bytearray(m1)
    moved[1:5] = (7).to_bytes(4, "big")  # another counter in the clear: the AD no longer matches
    with pytest.raises(SealError, match="authentication"):
        fresh.open(bytes(moved), rnd=2, stage=0)


def test_counter_refuses_to_wrap():
    c, _ = _pair()
    c.send_ctr = (1 << 32) - 1
    with pytest.raises(SealError, match="exhausted"):
        c.seal(b"", rnd=1, stage=0)


@pytest.mark.parametrize("pos", [0, 5, 12, 20, -1])
def test_one_tampered_byte_is_rejected(pos):
    c, s = _pair()
    blob = bytearray(c.seal(b"x" * 64, rnd=2, stage=1))
    blob[pos] ^= 1
    with pytest.raises(SealError):
        s.open(bytes(blob), rnd=2, stage=1)


def test_replay_and_reorder_rejected():
    c, s = _pair()
    m1, m2 = c.seal(b"a", rnd=1, stage=0), c.seal(b"b", rnd=1, stage=0)
    assert s.open(m2, rnd=1, stage=0) == b"b"
    with pytest.raises(SealError, match="replayed or reordered"):
        s.open(m1, rnd=1, stage=0)  # reordered (older counter)
    with pytest.raises(SealError, match="replayed or reordered"):
        s.open(m2, rnd=1, stage=0)  # replayed


@pytest.mark.parametrize("where", [dict(rnd=2, stage=0), dict(rnd=1, stage=1)])
def test_associated_data_binds_round_and_stage(where):
    c, s = _pair()
    with pytest.raises(SealError, match="authentication"):
        s.open(c.seal(b"a", rnd=1, stage=0), **where)


def test_bound_to_client_and_direction():
    c, s = _pair(client=3)
    blob = c.seal(b"a", rnd=1, stage=0)
    other = SealedChannel(s.key, 4, DOWN)  # same key, other client id in the AD
    with pytest.raises(SealError):
        other.open(blob, rnd=1, stage=0)
    with pytest.raises(SealError, match="direction"):
        c.open(blob, rnd=1, stage=0)  # reflected back to its sender


def test_sealed_storage():
    key = b"k" * 32
    blob = seal_blob(key, b"state", label=b"x")
    assert open_blob(key, blob, label=b"x") == b"state"
    with pytest.raises(SealError):
        open_blob(b"j" * 32, blob, label=b"x")
    with pytest.raises(SealError, match="failed authentication"):
        open_blob(key, blob, label=b"y")  # another enclave's storage
    with pytest.raises(SealError):
        open_blob(key, blob[:20], label=b"x")
    # the hardware key outlives runs: every blob is sealed under its own derived key, so the
    # same state sealed twice never repeats a (key, nonce) pair and the ciphertexts differ
    again = seal_blob(key, b"state", label=b"x")
    assert (
        again[:16] != blob[:16]
        and again[16:] != blob[16:]
        and open_blob(key, again, label=b"x") == b"state"
    )
