"""The server side of secure aggregation (Bonawitz et al., CCS 2017, Fig. 4; sparse graph after
Bell et al., CCS 2020): it relays messages and learns only ``Σ_{u ∈ U3} x_u mod 2^b`` and which
clients dropped. Design notes: docs/decisions.md#secure-aggregation.
"""

from __future__ import annotations

import warnings
from collections.abc import Container

import numpy as np

from fedge.privacy.secagg.config import SecAggConfig, Step, check_round
from fedge.privacy.secagg.errors import SecAggError, TooFewClientsError
from fedge.privacy.secagg.fixedpoint import RingArray
from fedge.privacy.secagg.graph import MaskGraph, connected_components
from fedge.privacy.secagg.keys import KeyPair, agree, pair_mask_seed
from fedge.privacy.secagg.messages import (
    Advertise,
    Forward,
    KeyList,
    MaskedInput,
    Shares,
    UnmaskRequest,
    UnmaskResponse,
)
from fedge.privacy.secagg.prg import SEED_BYTES, prg
from fedge.privacy.secagg.shamir import Share, combine

__all__ = ["ServerState"]


class ServerState:
    """The server's view of one round; feed it client messages, send what it returns.

    Args:
        round: the FL round (checked against every message header).
        config: public round parameters; ``config.threshold`` is checked against ``graph``.
        graph: the public mask graph over the round's sampled clients.
    """

    def __init__(self, *, round: int, config: SecAggConfig, graph: MaskGraph) -> None:
        check_round(round)
        config.check_graph(graph)
        self.round, self.config, self.graph = round, config, graph
        self._stage = Step.ADVERTISE
        self._keys: dict[int, tuple[bytes, bytes]] = {}  # U1: u -> (c_pk_u, s_pk_u)
        self._blobs: dict[int, dict[int, bytes]] = {}  # U2: sender -> {recipient: blob}
        self._mask_nbrs: dict[int, frozenset[int]] = {}  # M(u) for u in U2
        self._y: dict[int, RingArray] = {}  # U3: u -> y_u
        self._responses: dict[int, UnmaskResponse] = {}  # U4

    # ---- bookkeeping ------------------------------------------------------------------------
    def _accept(
        self,
        stage: Step,
        round: int,
        party: int,
        allowed: Container[int],
        what: str,
        sender: int | None,
    ) -> None:
        if sender is not None and party != sender:
            # Bonawitz et al. assume authenticated client-server channels: a message names the
            # client it arrived from, or one client could advertise keys (or answer) for another.
            raise SecAggError(
                f"{what} claims to be from client {party} but arrived from client {sender}; refused"
            )
        if self._stage != stage:
            raise SecAggError(
                f"{what} from client {party} arrived at stage {self._stage.name}, after its "
                f"step closed; late messages are dropped by the caller, not fed to the server"
            )
        if round != self.round:
            raise SecAggError(f"{what} from client {party} is for round {round}, not {self.round}")
        if party not in allowed:
            raise SecAggError(f"{what} from client {party}, who is not expected at this step")

    def _close(self, stage: Step, received: int, what: str) -> None:
        self._stage = Step(stage + 1)
        if received < self.config.threshold:
            raise TooFewClientsError(
                f"only {received} clients sent {what}; at least the threshold t="
                f"{self.config.threshold} are needed, the round aborts"
            )

    @property
    def survivors(self) -> frozenset[int]:
        """U3: the clients whose inputs are in the sum."""
        return frozenset(self._y)

    @property
    def dropped(self) -> frozenset[int]:
        """U2 ∖ U3: clients that shared keys but sent no masked input."""
        return frozenset(self._blobs) - frozenset(self._y)

    # ---- round 0 ----------------------------------------------------------------------------
    def receive_advertise(self, msg: bytes, *, sender: int | None = None) -> None:
        m = Advertise.from_bytes(msg)
        self._accept(Step.ADVERTISE, m.round, m.party, self.graph.adjacency, "Advertise", sender)
        if m.party in self._keys:
            raise SecAggError(f"client {m.party} advertised keys twice")
        self._keys[m.party] = (m.c_pk, m.s_pk)

    def broadcast_keys(self) -> dict[int, bytes]:
        """For each u in U1: the keys of its neighbours in U1."""
        self._close(Step.ADVERTISE, len(self._keys), "keys")
        out = {}
        for u in sorted(self._keys):
            keys = {v: self._keys[v] for v in self.graph.neighbors(u) if v in self._keys}
            out[u] = KeyList(self.round, u, keys).to_bytes()
        return out

    # ---- round 1 ----------------------------------------------------------------------------
    def receive_shares(self, msg: bytes, *, sender: int | None = None) -> None:
        m = Shares.from_bytes(msg)
        self._accept(Step.SHARE_KEYS, m.round, m.party, self._keys, "Shares", sender)
        if m.party in self._blobs:
            raise SecAggError(f"client {m.party} sent shares twice")
        expected = {v for v in self.graph.neighbors(m.party) if v in self._keys}
        if set(m.blobs) != expected:
            raise SecAggError(
                f"client {m.party} sent shares to {sorted(m.blobs)}, expected its neighbours in U1 {sorted(expected)}"
            )
        self._blobs[m.party] = m.blobs

    def forward_shares(self) -> dict[int, bytes]:
        """For each u in U2: the encrypted shares addressed to u by other members of U2."""
        self._close(Step.SHARE_KEYS, len(self._blobs), "shares")
        inbox: dict[int, dict[int, bytes]] = {u: {} for u in self._blobs}
        for v, blobs in self._blobs.items():
            for u, blob in blobs.items():
                if u in inbox:
                    inbox[u][v] = blob
        self._mask_nbrs = {u: frozenset(box) for u, box in inbox.items()}
        return {u: Forward(self.round, u, box).to_bytes() for u, box in sorted(inbox.items())}

    # ---- round 2 ----------------------------------------------------------------------------
    def receive_masked_input(self, msg: bytes, *, sender: int | None = None) -> None:
        m = MaskedInput.from_bytes(msg)
        self._accept(Step.MASKED_INPUT, m.round, m.party, self._blobs, "MaskedInput", sender)
        if m.party in self._y:
            raise SecAggError(f"client {m.party} sent its masked input twice")
        fp, K = self.config.fixed_point, self.config.length
        if len(m.y) != K * fp.nbytes:
            raise SecAggError(
                f"masked input of client {m.party} has {len(m.y)} bytes, expected K·b/8 = {K * fp.nbytes}"
            )
        self._y[m.party] = fp.from_bytes(m.y)

    def unmask_requests(self) -> dict[int, bytes]:
        """For each u in U3: its mask neighbours split into survivors and dropouts."""
        self._close(Step.MASKED_INPUT, len(self._y), "masked inputs")
        out = {}
        for u in sorted(self._y):
            alive = tuple(sorted(v for v in self._mask_nbrs[u] if v in self._y))
            dropped = tuple(sorted(v for v in self._mask_nbrs[u] if v not in self._y))
            out[u] = UnmaskRequest(self.round, u, alive, dropped).to_bytes()
        comps = connected_components(self._y, self._mask_nbrs)
        if len(comps) > 1:
            warnings.warn(
                f"the surviving clients' mask graph has {len(comps)} connected components "
                f"(sizes {sorted(len(c) for c in comps)}): the server can learn each "
                f"component's sum, not only the total; use more neighbors",
                UserWarning,
                stacklevel=2,
            )
        return out

    # ---- round 3 ----------------------------------------------------------------------------
    def receive_unmask(self, msg: bytes, *, sender: int | None = None) -> None:
        m = UnmaskResponse.from_bytes(msg)
        self._accept(Step.UNMASK, m.round, m.party, self._y, "UnmaskResponse", sender)
        if m.party in self._responses:
            raise SecAggError(f"client {m.party} answered the unmask request twice")
        nbrs = self._mask_nbrs[m.party]
        want_b = {v for v in nbrs if v in self._y}
        if set(m.self_mask_shares) != want_b | {m.party} or set(m.key_shares) != nbrs - want_b:
            raise SecAggError(f"client {m.party} answered with shares other than requested")
        self._responses[m.party] = m

    def _reconstruct(self, owner: int, secret: str) -> bytes:
        shares = []
        for w in sorted(self._mask_nbrs[owner] | {owner}):  # owner's own share: b only
            r = self._responses.get(w)
            table = None if r is None else r.self_mask_shares if secret == "b" else r.key_shares
            if table is not None and owner in table:
                shares.append(Share.from_bytes(w + 1, table[owner]))
        t = self.config.threshold
        if len(shares) < t:
            what = "self-mask seed b_u" if secret == "b" else "mask key s_sk"
            raise TooFewClientsError(
                f"cannot unmask: only {len(shares)} of the threshold t={t} shares of client "
                f"{owner}'s {what} arrived; the round aborts"
            )
        return combine(shares[:t], nbytes=SEED_BYTES)

    def finalize(self) -> RingArray:
        """Σ_{u ∈ U3} x_u mod 2^b (shape (K,), ``uint64``); decode with the config's codec."""
        if self._stage != Step.UNMASK:
            raise SecAggError(f"finalize called at stage {self._stage.name}, expected UNMASK")
        self._stage = Step.DONE
        fp, K, rnd = self.config.fixed_point, self.config.length, self.round
        total = fp.ring_sum(self._y[u] for u in sorted(self._y))
        minus = np.zeros(K, dtype=np.uint64)
        for u in sorted(self._y):
            np.add(minus, prg(self._reconstruct(u, "b"), K, bits=fp.bits), out=minus)
        for v in sorted(self.dropped):
            alive_nbrs = sorted(u for u in self._mask_nbrs[v] if u in self._y)
            if not alive_nbrs:
                continue  # v's pair masks entered no surviving input
            sk = KeyPair.from_private_bytes(self._reconstruct(v, "s"))
            if sk.public != self._keys[v][1]:
                raise SecAggError(
                    f"the mask key rebuilt for dropped client {v} does not match its advertised "
                    f"public key: inconsistent shares; the round aborts"
                )
            for u in alive_nbrs:
                s_uv = pair_mask_seed(agree(sk.private, self._keys[u][1]), round=rnd, u=u, v=v)
                mask = prg(s_uv, K, bits=fp.bits)
                if v > u:  # u added +PRG(s_uv): take it away
                    np.add(minus, mask, out=minus)
                else:  # u added -PRG(s_uv): give it back
                    np.subtract(minus, mask, out=minus)
        return fp.sub(total, minus)
