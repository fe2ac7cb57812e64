"""The client side of secure aggregation with double masking (Bonawitz et al., CCS 2017, Fig. 4,
honest-but-curious variant): :class:`ClientState`, one method per protocol step, masking
``y_u = x_u + PRG(b_u) + Σ_{v>u} PRG(s_uv) − Σ_{v<u} PRG(s_uv)``. Design notes: docs/decisions.md#secure-aggregation.
"""

from __future__ import annotations

import os

import msgpack
import numpy as np
import numpy.typing as npt

from fedge.privacy.secagg.config import SecAggConfig, Step, check_round
from fedge.privacy.secagg.errors import SecAggError
from fedge.privacy.secagg.graph import MaskGraph
from fedge.privacy.secagg.keys import (
    Entropy,
    KeyPair,
    agree,
    decrypt_share,
    encrypt_share,
    pair_mask_seed,
    share_key,
)
from fedge.privacy.secagg.messages import (
    SHARE_BYTES,
    Advertise,
    Forward,
    KeyList,
    MaskedInput,
    Shares,
    UnmaskRequest,
    UnmaskResponse,
)
from fedge.privacy.secagg.prg import SEED_BYTES, prg
from fedge.privacy.secagg.shamir import split

__all__ = ["ClientState"]


class ClientState:
    """Client ``cid``'s secrets and progress in one round.

    Args:
        cid: this client's id (a node of ``graph``).
        round: the FL round; bound into every key derivation and ciphertext.
        config: the public round parameters (threshold, K, fixed point).
        graph: the public mask graph; u only deals with ``graph.neighbors(cid)``.
        entropy: randomness for keys, b_u, Shamir coefficients and nonces. Leave it as
            ``os.urandom``; a fixed stream is for tests only (never the public run seed).
    """

    def __init__(
        self,
        cid: int,
        *,
        round: int,
        config: SecAggConfig,
        graph: MaskGraph,
        entropy: Entropy = os.urandom,
    ) -> None:
        self._bind(cid, round, config, graph, entropy)
        self._step = Step.ADVERTISE
        self._c = KeyPair.generate(entropy)  # encrypts shares
        self._s = KeyPair.generate(entropy)  # agrees pair masks; shared, so a separate key
        self._peers: dict[int, tuple[bytes, bytes]] = {}  # v -> (c_pk_v, s_pk_v), after round 0
        self._blobs: dict[int, bytes] = {}  # v -> encrypted shares v sent to u, after round 1
        self._k: dict[int, bytes] = {}  # v -> k_uv, the AES-GCM key for shares with v
        self._b = b""  # self-mask seed b_u
        self._own_b_share = b""  # u's own Shamir share of b_u

    def to_bytes(self) -> bytes:
        """This client's secrets and progress, to carry between the round's protocol steps
        (e.g. across worker processes). It holds private keys: keep it in memory for the
        round only, never in a checkpoint or on the wire."""
        return msgpack.packb(
            [
                self.cid,
                self.round,
                int(self._step),
                self._c.private_bytes(),
                self._s.private_bytes(),
                {v: list(pk) for v, pk in self._peers.items()},
                self._blobs,
                self._k,
                self._b,
                self._own_b_share,
            ],
            use_bin_type=True,
            strict_types=False,
        )

    @classmethod
    def from_bytes(
        cls, data: bytes, *, config: SecAggConfig, graph: MaskGraph, entropy: Entropy = os.urandom
    ) -> ClientState:
        """Restore a state written by :meth:`to_bytes` (``config`` and ``graph`` are the round's
        public parameters, rebuilt by the caller)."""
        try:
            cid, rnd, step, c_sk, s_sk, peers, blobs, k, b, own = msgpack.unpackb(
                data, raw=False, strict_map_key=False
            )
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise SecAggError(f"corrupt secure-aggregation client state: {e}") from None
        state = cls.__new__(cls)
        state._bind(cid, rnd, config, graph, entropy)
        state._step = Step(step)
        state._c, state._s = KeyPair.from_private_bytes(c_sk), KeyPair.from_private_bytes(s_sk)
        state._peers = {int(v): (bytes(pk[0]), bytes(pk[1])) for v, pk in peers.items()}
        state._blobs = {int(v): bytes(x) for v, x in blobs.items()}
        state._k = {int(v): bytes(x) for v, x in k.items()}
        state._b, state._own_b_share = bytes(b), bytes(own)
        return state

    def _bind(
        self, cid: int, round: int, config: SecAggConfig, graph: MaskGraph, entropy: Entropy
    ) -> None:
        """The public part of the state: who u is in which round, and its graph neighbours."""
        check_round(round)
        if cid not in graph:
            raise SecAggError(f"client {cid} is not in this round's mask graph")
        self.cid, self.round, self.config, self._entropy = cid, round, config, entropy
        self._neighbors = graph.neighbors(cid)
        self._n_clients = len(graph)

    def _require(self, expected: Step) -> None:
        if self._step != expected:
            raise SecAggError(
                f"client {self.cid}: protocol step {expected.name} called at step "
                f"{self._step.name}; each step runs once, in order"
            )

    def _advance(self, expected: Step) -> None:
        self._require(expected)
        self._step = Step(expected + 1)

    def _check_header(self, round: int, party: int, what: str) -> None:
        if round != self.round or party != self.cid:
            raise SecAggError(
                f"client {self.cid} (round {self.round}) got a {what} for client {party} in round {round}"
            )

    # ---- round 0 ----------------------------------------------------------------------------
    def advertise_keys(self) -> bytes:
        """Advertise (c_pk_u, s_pk_u)."""
        self._advance(Step.ADVERTISE)
        return Advertise(self.round, self.cid, self._c.public, self._s.public).to_bytes()

    # ---- round 1 ----------------------------------------------------------------------------
    def share_keys(self, key_list: bytes) -> bytes:
        """Shamir-share s_sk_u and a fresh b_u among u and the neighbours in ``key_list``
        (threshold t), keep u's own shares, and encrypt each neighbour's pair of shares to it."""
        self._advance(Step.SHARE_KEYS)
        msg = KeyList.from_bytes(key_list)
        self._check_header(msg.round, msg.party, "key list")
        peers = msg.keys
        if not set(peers) <= self._neighbors:
            raise SecAggError(
                f"client {self.cid}: key list names non-neighbours {sorted(set(peers) - self._neighbors)}"
            )
        pks = [k for pair in peers.values() for k in pair] + [self._c.public, self._s.public]
        if len(set(pks)) != len(pks):
            raise SecAggError(f"client {self.cid}: key list repeats a public key")
        t = self.config.threshold
        if len(peers) + 1 < t:
            raise SecAggError(
                f"client {self.cid}: only {len(peers)} neighbours advertised keys; with itself "
                f"that is fewer than the threshold t={t}; the round aborts"
            )
        self._peers = dict(peers)
        self._b = self._entropy(SEED_BYTES)
        xs = [v + 1 for v in sorted([*peers, self.cid])]  # x = id + 1: never 0
        sh_s = split(self._s.private_bytes(), xs, threshold=t, entropy=self._entropy)
        sh_b = split(self._b, xs, threshold=t, entropy=self._entropy)
        self._own_b_share = sh_b[self.cid + 1].to_bytes()  # u's own share of s_sk_u is unused
        blobs = {}
        for v in sorted(peers):
            k = share_key(agree(self._c.private, peers[v][0]), round=self.round, u=self.cid, v=v)
            self._k[v] = k  # reused to decrypt v's shares in round 3
            pt = sh_s[v + 1].to_bytes() + sh_b[v + 1].to_bytes()
            blobs[v] = encrypt_share(
                k, pt, round=self.round, sender=self.cid, recipient=v, entropy=self._entropy
            )
        return Shares(self.round, self.cid, blobs).to_bytes()

    # ---- round 2 ----------------------------------------------------------------------------
    def masked_input(self, forward: bytes, x: npt.ArrayLike) -> bytes:
        """y_u = encode(x) + PRG(b_u) ± Σ PRG(s_uv) over the neighbours whose shares arrived.

        ``x`` must have K = ``config.length`` values (any shape, flattened in C order); it is
        encoded for a sum over all clients of the round (fixedpoint.py range bound). A bad
        ``x`` raises before any mask is used, so the call may be retried with a fixed ``x``.
        """
        fp, K = self.config.fixed_point, self.config.length
        self._require(Step.MASKED_INPUT)
        xv = np.asarray(x, dtype=np.float64).reshape(-1)
        if xv.size != K:
            raise SecAggError(f"client {self.cid}: input has {xv.size} values, expected K={K}")
        xq = fp.encode(xv, n_summands=self._n_clients)
        self._advance(Step.MASKED_INPUT)
        msg = Forward.from_bytes(forward)
        self._check_header(msg.round, msg.party, "share forward")
        if not set(msg.blobs) <= set(self._peers):
            raise SecAggError(
                f"client {self.cid}: forwarded shares from clients "
                f"{sorted(set(msg.blobs) - set(self._peers))} that were not in its key list"
            )
        t = self.config.threshold
        if len(msg.blobs) + 1 < t:
            raise SecAggError(
                f"client {self.cid}: only {len(msg.blobs)} neighbours sent shares; with itself "
                f"that is fewer than the threshold t={t}; the round aborts"
            )
        self._blobs = dict(msg.blobs)
        plus = xq + prg(self._b, K, bits=fp.bits)
        minus = np.zeros(K, dtype=np.uint64)
        for v in sorted(self._blobs):
            seed = pair_mask_seed(
                agree(self._s.private, self._peers[v][1]), round=self.round, u=self.cid, v=v
            )
            acc = plus if v > self.cid else minus
            np.add(acc, prg(seed, K, bits=fp.bits), out=acc)  # wraps mod 2^64
        y = fp.sub(plus, minus)
        return MaskedInput(self.round, self.cid, fp.to_bytes(y)).to_bytes()

    # ---- round 3 ----------------------------------------------------------------------------
    def unmask(self, request: bytes) -> bytes:
        """Reveal the share of b_v for u itself and each surviving mask neighbour v, and the
        share of s_sk_v for each dropped one — never both for one v."""
        self._advance(Step.UNMASK)
        msg = UnmaskRequest.from_bytes(request)
        self._check_header(msg.round, msg.party, "unmask request")
        alive, dropped = set(msg.alive), set(msg.dropped)
        if alive & dropped or alive | dropped != set(self._blobs):
            raise SecAggError(
                f"client {self.cid}: the unmask request must split its {len(self._blobs)} mask "
                f"neighbours into alive and dropped, each once; got alive={sorted(alive)}, "
                f"dropped={sorted(dropped)}"
            )
        t = self.config.threshold
        if len(alive) + 1 < t:
            raise SecAggError(
                f"client {self.cid}: only {len(alive)} of its mask neighbours survived; with "
                f"itself that is fewer than the threshold t={t}; it refuses to unmask and the "
                f"round aborts"
            )
        b_shares, s_shares = {self.cid: self._own_b_share}, {}
        for v in sorted(alive | dropped):
            pt = decrypt_share(
                self._k[v], self._blobs[v], round=self.round, sender=v, recipient=self.cid
            )
            if len(pt) != 2 * SHARE_BYTES:
                raise SecAggError(f"client {self.cid}: share from client {v} has the wrong size")
            if v in alive:
                b_shares[v] = pt[SHARE_BYTES:]
            else:
                s_shares[v] = pt[:SHARE_BYTES]
        return UnmaskResponse(self.round, self.cid, b_shares, s_shares).to_bytes()
