"""Batch-level BAFFLE with secure aggregation of the loss differences
(seed 000, Algorithm 1 lines 9, 13, 15; Eq. 7).

One FL round is four engine phases, each a real message exchange whose bytes are counted
(:class:`~fedge.core.protocols.NextPhase`), driving :mod:`fedge.privacy.secagg`:

    phase 0  server → clients: participant ids          clients → server: public keys
    phase 1  server → clients: key list                 clients → server: encrypted shares
    phase 2  server → clients: model, seed s_t, shares  clients → server: masked [N_c·ΔL_c, N_c]
    phase 3  server → clients: unmasking request        clients → server: shares of secrets

Each client masks ``x_c = [N_c·ΔL_c, N_c]`` (K + 1 values). The server learns only the sums
Σ N_c·ΔL_c and Σ N_c over the clients whose masked input arrived, so it forms Eq. (7)'s
weighted mean Σ (N_c/N) ΔL_c without seeing any client's ΔL_c or N_c, and with the
survivors' own N renormalizing it after dropouts.

Dropouts are simulated as the protocol sees them: ``secagg_dropout`` of the clients (a
seeded choice per round) are never sent the phase-2 message, i.e. they vanish after key
agreement; their pair masks are removed from the Shamir shares of their neighbours' copies
of their key. Too many dropouts abort the round with :class:`SecAggError`.

Fixed point: 64-bit ring with 32 fractional bits (resolution 2.3e-10 on N_c·ΔL_c, whose
magnitudes here are about 1e-6 to 1e3; the range check allows |x| up to 2^31/n).
A client's secagg secrets (key pairs, self-mask seed) live only in its process memory for
the round, as on a real device, so this mode runs clients in the engine's process
(``clients.workers: 0``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.protocols import NextPhase
from fedge.core.rng import generator
from fedge.estimators import estimate_gradient
from fedge.methods.base import MethodEnv
from fedge.privacy.secagg import (
    ClientState,
    FixedPoint,
    MaskGraph,
    SecAggConfig,
    ServerState,
    recommended_neighbors,
)
from fedge.core.context import ClientContext

__all__ = ["SecureBaffleClient", "SecureBaffleStrategy", "build_secure"]

FIXED_POINT = FixedPoint(bits=64, frac_bits=32)
_PHASES = ("ids", "keys", "forward", "unmask")


def _secagg_config(cfg: Any, graph: MaskGraph) -> SecAggConfig:
    holders = graph.min_degree + 1
    threshold = max(1, min(holders, math.ceil(cfg.secagg_threshold * holders)))
    return SecAggConfig(threshold=threshold, length=cfg.k + 1, fixed_point=FIXED_POINT)


def _graph(cfg: Any, ids: list[int], *, seed: int, rnd: int) -> MaskGraph:
    k = cfg.secagg_neighbors if cfg.secagg_neighbors is not None else recommended_neighbors(len(ids))
    if k is not None and k >= len(ids) - 1:
        k = None
    return MaskGraph.build(ids, k, seed=seed, round=rnd)


def _ids_array(ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int32)


class SecureBaffleClient:
    """Client side: the batch-level client's loss differences, sent only masked."""

    def __init__(self, batch_client: Any, cfg: Any, *, seed: int) -> None:
        self.batch, self.cfg, self.seed = batch_client, cfg, seed
        self._sessions: dict[tuple[int, int], ClientState] = {}

    def run(self, message: Message, ctx: ClientContext) -> Message:
        key = (ctx.rnd, ctx.cid)
        step = message.config.get("secagg_step")
        if step == "ids":
            ids = message.arrays.get("ids")
            if ids is None:
                raise MessageError(f"round {ctx.rnd}, client {ctx.cid}: no participant list")
            id_list = [int(v) for v in ids.tolist()]
            graph = _graph(self.cfg, id_list, seed=self.seed, rnd=ctx.rnd)
            state = ClientState(ctx.cid, round=ctx.rnd, config=_secagg_config(self.cfg, graph), graph=graph)
            self._sessions = {k: v for k, v in self._sessions.items() if k[0] == ctx.rnd}  # forget old rounds
            self._sessions[key] = state
            return Message(config={"secagg": state.advertise_keys()})
        state = self._sessions.get(key)
        if state is None:
            raise MessageError(f"round {ctx.rnd}, client {ctx.cid}: secagg step {step!r} without a key agreement")
        blob = message.config.get("secagg")
        if not isinstance(blob, bytes):
            raise MessageError(f"round {ctx.rnd}, client {ctx.cid}: secagg step {step!r} carries no secagg bytes")
        if step == "keys":
            return Message(config={"secagg": state.share_keys(blob)})
        if step == "forward":
            diffs = self.batch.loss_differences(message, ctx).to(torch.float64)
            n = ctx.data.num_samples
            x = np.concatenate([n * diffs.numpy(), [float(n)]])
            return Message(config={"secagg": state.masked_input(blob, x)})
        if step == "unmask":
            del self._sessions[key]
            return Message(config={"secagg": state.unmask(blob)})
        raise MessageError(f"round {ctx.rnd}, client {ctx.cid}: unknown secagg step {step!r}; expected one of {_PHASES}")


class SecureBaffleStrategy:
    """Server side: drives the four phases, then applies BAFFLE's update from the unmasked sums.

    Args:
        inner: a :class:`~fedge.methods.baffle.BaffleBatchStrategy` (model, seeds, optimizer).
    """

    def __init__(self, inner: Any, cfg: Any, *, seed: int) -> None:
        self.inner, self.cfg, self.seed = inner, cfg, seed
        self.model = inner.model
        self.server = inner.server
        self._server: ServerState | None = None
        self._phase = 0
        self._dropped = 0

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        graph = _graph(self.cfg, client_ids, seed=self.seed, rnd=rnd)
        self._server = ServerState(round=rnd, config=_secagg_config(self.cfg, graph), graph=graph)
        self._phase = 0
        return dict.fromkeys(client_ids, Message({"ids": _ids_array(client_ids)}, config={"secagg_step": "ids"}))

    def _receive(self, rnd: int, replies: Mapping[int, Message], receive: Any) -> None:
        for cid, reply in replies.items():
            blob = reply.config.get("secagg")
            if not isinstance(blob, bytes):
                raise MessageError(f"round {rnd}, client {cid}: reply carries no secagg bytes")
            receive(blob)

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float] | NextPhase:
        server = self._server
        assert server is not None, "configure_round was not called"
        phase = self._phase
        self._phase += 1
        if phase == 0:
            self._receive(rnd, replies, server.receive_advertise)
            return NextPhase(
                {c: Message(config={"secagg_step": "keys", "secagg": b}) for c, b in server.broadcast_keys().items()}
            )
        if phase == 1:
            self._receive(rnd, replies, server.receive_shares)
            forwards = server.forward_shares()
            drop = self._dropouts(rnd, sorted(forwards))
            self._dropped = len(drop)
            arrays = self.inner.server.arrays()
            seed = self.inner.round_seed(rnd)
            return NextPhase(
                {
                    c: Message(arrays, config={"secagg_step": "forward", "seed": seed, "secagg": b})
                    for c, b in forwards.items()
                    if c not in drop
                }
            )
        if phase == 2:
            self._receive(rnd, replies, server.receive_masked_input)
            return NextPhase(
                {c: Message(config={"secagg_step": "unmask", "secagg": b}) for c, b in server.unmask_requests().items()}
            )
        self._receive(rnd, replies, server.receive_unmask)
        total = FIXED_POINT.decode(server.finalize())  # (K + 1,) float64
        weight = float(total[-1])
        if not weight > 0:
            raise MessageError(f"round {rnd}: secure aggregation summed a total weight of {weight}; expected > 0")
        combined = torch.from_numpy(total[:-1] / weight).to(torch.float32)
        cfg = self.cfg
        g = estimate_gradient(
            self.inner.params(), combined, sigma=cfg.sigma, seed=self.inner.round_seed(rnd), scheme=cfg.scheme,
            masks=self.inner.server.masks,
        )
        self.inner.apply(g)
        self._server = None
        return {
            "secagg_survivors": len(server.survivors),
            "secagg_dropped": self._dropped,
            "estimate_inf_norm": max(float(v.abs().max()) for v in g.values()),
        }

    def _dropouts(self, rnd: int, ids: list[int]) -> set[int]:
        count = int(self.cfg.secagg_dropout * len(ids))
        if count == 0:
            return set()
        perm = torch.randperm(len(ids), generator=generator(self.seed, "secagg-dropout", rnd))
        return {ids[i] for i in perm[:count].tolist()}

    def eval_model(self) -> torch.nn.Module:
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def build_secure(
    cfg: Any, env: MethodEnv, *, masks: dict[str, torch.Tensor] | None = None
) -> tuple[SecureBaffleStrategy, SecureBaffleClient]:
    from fedge.methods.baffle import BaffleBatchClient, BaffleBatchStrategy

    if env.workers:
        raise ConfigError(
            f"method.secure_aggregation=true keeps each client's secrets in its process for the round; "
            f"set clients.workers=0 (got {env.workers})"
        )
    strategy = SecureBaffleStrategy(BaffleBatchStrategy(env.model_fn(), cfg, seed=env.seed, masks=masks), cfg, seed=env.seed)
    return strategy, SecureBaffleClient(BaffleBatchClient(env.model_fn, cfg), cfg, seed=env.seed)
