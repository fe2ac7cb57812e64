"""Secure aggregation for any method whose server only needs a weighted sum of the clients'
replies (FedAvg deltas, FedSGD gradients, BAFFLE's K loss differences): one wrapper for the
server (:class:`SecureAggregation`) and one for the client program (:class:`SecureClient`),
driving :mod:`fedge.privacy.secagg` (Bonawitz et al., CCS 2017; sparse mask graphs after
Bell et al., CCS 2020). BAFFLE states it for its loss differences (seed 000, Algorithm 1
lines 9, 13, 15; Eq. 7); the same protocol serves every summing method.

A secure round is four exchanges, written top to bottom in :meth:`SecureAggregation.round`:

    1  server → clients: participant ids            clients → server: public keys
    2  server → clients: key list                   clients → server: encrypted shares
    3  server → clients: the method's message       clients → server: masked [w_c·v_c, w_c]
    4  server → clients: unmasking request          clients → server: shares of secrets

Each client runs the wrapped program on the method's message, flattens the reply's arrays in
name order into v_c, and masks ``x_c = [w_c·v_c, w_c]`` with w_c its sample count (or 1 for
uniform weighting). The server learns only Σ w_c·v_c and Σ w_c over the clients whose masked
input arrived, i.e. the weighted mean the plain method computes, without seeing any client's
v_c or w_c; after dropouts the survivors' own weights renormalize it.

Equality with the plain method: the plain server averages in float32, the secure one decodes
a 64-bit fixed-point sum with 32 fractional bits (:data:`FIXED_POINT`), so the means differ by
at most C·2^-33 / Σ w_c plus the plain mean's float32 rounding; the weights move by that times
the server optimizer's step (exactly that for SGD; Adam divides by sqrt(v), which magnifies it
on coordinates whose update is near zero).

Bytes: the engine counts every message of the four exchanges at its serialized length
(``bytes_down``, ``bytes_up``). A completed secure round also logs the method's share of them,
``payload_bytes_down`` (the messages the wrapped strategy configured for step 3, each serialized
alone, as the plain method sends it) and ``payload_bytes_up`` (the masked inputs, step 3's
replies: x_c's K + 1 values as 64-bit ring elements, 8(K + 1) bytes where the plain reply of K
float32 summands is 4K, plus the header and the message's framing), and the protocol's rest,
``secagg_bytes_down`` and ``secagg_bytes_up`` (steps 1, 2 and 4, and the shares forwarded with
step 3's message): payload + secagg = the total, both ways.

A client's secrets (key pairs, self-mask seed, shares) live in ``ctx.round_state``: carried
between the round's exchanges, across worker processes, and dropped when the round ends —
never in a checkpoint. Dropouts are simulated as the protocol sees them: ``secagg_dropout`` of
the clients (a seeded choice per round) vanish after key agreement (they are never sent step
3); their pair masks are removed with their neighbours' shares. Real failures — a client whose
reply to any of the four exchanges does not arrive (``clients.dropout``, a failed Flower node;
the engine hands the round only the replies that came, ``clients.min_replies``) — go the same
way: the server state works on whichever clients answered each step, so a client lost before
its masked input is left out of the sum, one lost after it is in the sum and unmasked from its
neighbours' shares (tested against the plain mean over exactly the clients whose inputs
arrived). ``secagg_dropped`` counts both kinds. Too many dropouts abort the round with
:class:`~fedge.privacy.secagg.SecAggError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from pydantic import Field, model_validator

from fedge.core import rundir_schema as schema
from fedge.core.context import ClientContext
from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.protocols import ClientProgram, Exchange, Round, Strategy, StrategyWrapper
from fedge.core.rng import Draws, check_draws, generator
from fedge.methods.base import MethodConfigBase
from fedge.privacy.secagg import (
    ClientState,
    FixedPoint,
    MaskGraph,
    SecAggConfig,
    ServerState,
    recommended_neighbors,
)

__all__ = [
    "FIXED_POINT",
    "SecureAggregation",
    "SecureAggregationOptions",
    "SecureClient",
    "Summable",
    "secure",
]

FIXED_POINT = FixedPoint(bits=64, frac_bits=32)
_STEPS = ("ids", "keys", "forward", "unmask")
_KEYS = ("secagg_step", "secagg")  # config keys the wrapper adds to the method's messages


class SecureAggregationOptions(MethodConfigBase):
    """The ``method.secure_aggregation`` keys, spelled the same for every method that takes them."""

    secure_aggregation: bool = Field(
        False, description="mask each client's reply; the server learns only the sum"
    )
    secagg_threshold: float = Field(
        0.6, gt=0, le=1, description="Shamir threshold as a fraction of each client's share holders"
    )
    secagg_dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="simulated fraction of clients dropping out after key agreement",
    )
    secagg_neighbors: int | None = Field(
        None,
        ge=2,
        description="mask-graph degree (null: complete graph up to 33 clients, else a 2·⌈3·log2 n⌉-regular graph, see fedge.privacy.secagg.graph)",
    )

    @model_validator(mode="after")
    def _dropout_needs_secagg(self) -> SecureAggregationOptions:
        if self.secagg_dropout and self.secure_aggregation is False:
            raise ValueError("secagg_dropout only applies with secure_aggregation=true")
        return self


@runtime_checkable
class Summable(Protocol):
    """A strategy whose aggregate is the weighted mean of its clients' reply arrays."""

    weighted: bool  # weights are sample counts (True) or 1 per client (False)

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """Name -> (shape, dtype) of every array a client's reply carries."""
        ...

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]: ...

    def apply_mean(
        self, rnd: int, mean: dict[str, torch.Tensor], *, weight: float, clients: Sequence[int] = ()
    ) -> dict[str, float]:
        """Update the global state from the weighted mean of the replies (``weight``: their
        total weight, the client count when unweighted; ``clients``: whose replies are in it);
        return metrics."""
        ...


def _graph(
    opts: SecureAggregationOptions, ids: list[int], *, seed: int, rnd: int, draws: Draws
) -> MaskGraph:
    k = (
        opts.secagg_neighbors
        if opts.secagg_neighbors is not None
        else recommended_neighbors(len(ids))
    )
    if k is not None and k >= len(ids) - 1:
        k = None
    return MaskGraph.build(ids, k, seed=seed, round=rnd, draws=draws)


def _config(opts: SecureAggregationOptions, graph: MaskGraph, length: int) -> SecAggConfig:
    holders = graph.min_degree + 1
    threshold = max(1, min(holders, math.ceil(opts.secagg_threshold * holders)))
    return SecAggConfig(threshold=threshold, length=length, fixed_point=FIXED_POINT)


class SecureClient:
    """Client side: the wrapped program's reply, sent only masked.

    Args:
        inner: the method's client program; its reply's arrays are the summands and its
            ``num_samples`` config the weight.
        options, seed: the run's secure-aggregation options and seed (the mask graph is
            derived from them and the round's participants, as on the server).
        weighted: multiply by the sample count (True) or weigh every client 1 (False).
    """

    def __init__(
        self,
        inner: ClientProgram,
        options: SecureAggregationOptions,
        *,
        seed: int,
        weighted: bool,
        draws: Draws = "torch",
    ) -> None:
        self.inner, self.opts, self.seed, self.weighted = inner, options, seed, weighted
        self.draws = check_draws(draws)

    def _session(self, ctx: ClientContext, length: int = 1) -> ClientState:
        """This round's protocol state, restored from ``ctx.round_state``. The vector length
        is the client's own (its reply's size; only the masking step uses it, and the server
        checks it on arrival)."""
        saved = ctx.round_state.get("secagg")
        ids = ctx.round_state.get("secagg_ids")
        if not isinstance(saved, bytes) or not isinstance(ids, torch.Tensor):
            raise MessageError(
                f"round {ctx.rnd}, client {ctx.cid}: secure-aggregation step without a key agreement"
            )
        graph = _graph(
            self.opts, [int(v) for v in ids.tolist()], seed=self.seed, rnd=ctx.rnd, draws=self.draws
        )
        return ClientState.from_bytes(saved, config=_config(self.opts, graph, length), graph=graph)

    def run(self, message: Message, ctx: ClientContext) -> Message:
        who = f"round {ctx.rnd}, client {ctx.cid}"
        step = message.config.get("secagg_step")
        if step == "ids":
            ids = message.arrays.get("ids")
            if ids is None:
                raise MessageError(f"{who}: no participant list")
            graph = _graph(
                self.opts,
                [int(v) for v in ids.tolist()],
                seed=self.seed,
                rnd=ctx.rnd,
                draws=self.draws,
            )
            state = ClientState(
                ctx.cid, round=ctx.rnd, config=_config(self.opts, graph, 1), graph=graph
            )
            reply = Message(config={"secagg": state.advertise_keys()})
            ctx.round_state.update(secagg=state.to_bytes(), secagg_ids=ids)
            return reply
        if step not in _STEPS:
            raise MessageError(
                f"{who}: unknown secure-aggregation step {step!r}; expected one of {_STEPS}"
            )
        blob = message.config.get("secagg")
        if not isinstance(blob, bytes):
            raise MessageError(f"{who}: secure-aggregation step {step!r} carries no secagg bytes")
        if step == "keys":
            state = self._session(ctx)
            out = state.share_keys(blob)
        elif step == "forward":
            inner_msg = Message(
                message.arrays, config={k: v for k, v in message.config.items() if k not in _KEYS}
            )
            reply = self.inner.run(inner_msg, ctx)
            n = reply.config.get("num_samples")
            if not isinstance(n, int) or n < 1:
                raise MessageError(
                    f"{who}: the method's reply has num_samples={n!r}; expected an int >= 1"
                )
            w = float(n) if self.weighted else 1.0
            parts = [
                reply.arrays[name].detach().to(torch.float64).reshape(-1).numpy()
                for name in sorted(reply.arrays)
            ]
            x = np.concatenate([w * np.concatenate(parts), [w]]) if parts else np.array([w])
            state = self._session(ctx, length=x.size)
            out = state.masked_input(blob, x)
        else:
            state = self._session(ctx)  # unmask: the last step; the secrets go with the round
            out = state.unmask(blob)
            ctx.round_state.clear()
            return Message(config={"secagg": out})
        ctx.round_state["secagg"] = state.to_bytes()
        return Message(config={"secagg": out})


class SecureAggregation(StrategyWrapper):
    """Server side: four exchanges per round, then the wrapped strategy's update from the
    unmasked weighted mean (:meth:`Summable.apply_mean`).

    Args:
        inner: a :class:`Summable` strategy (fedavg/fedsgd's ``DeltaAveraging``, batch-level
            BAFFLE's strategy).
        options, seed: as for :class:`SecureClient`.
    """

    def __init__(
        self,
        inner: Strategy,
        options: SecureAggregationOptions,
        *,
        seed: int,
        draws: Draws = "torch",
    ) -> None:
        if not isinstance(inner, Summable):
            raise ConfigError(
                f"secure aggregation needs a strategy whose server sums client replies; "
                f"{type(inner).__name__} does not (set method.secure_aggregation=false)"
            )
        super().__init__(inner)
        self.summable: Summable = inner
        self.opts, self.seed = options, seed
        self.draws = check_draws(draws)
        self._aggregated: list[int] | None = None  # the last completed round's survivors
        self._summands()

    def _summands(self) -> None:
        """What this round sums: asked each round, since a pruned model's kept coordinates can
        change (NTK-Ori prunes in round 1); the vector is their values plus the weight."""
        self.summands = self.summable.summands()
        self.length = sum(math.prod(shape) for shape, _ in self.summands.values()) + 1

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        self._summands()
        graph = _graph(self.opts, client_ids, seed=self.seed, rnd=rnd, draws=self.draws)
        server = ServerState(round=rnd, config=_config(self.opts, graph, self.length), graph=graph)
        ids = torch.tensor(client_ids, dtype=torch.int32)
        hello = Message({"ids": ids}, config={"secagg_step": "ids"})
        replies = yield Exchange(dict.fromkeys(client_ids, hello))
        self._receive(rnd, replies, server.receive_advertise)

        keys = server.broadcast_keys()
        replies = yield Exchange(
            {c: Message(config={"secagg_step": "keys", "secagg": b}) for c, b in keys.items()}
        )
        self._receive(rnd, replies, server.receive_shares)

        forwards = server.forward_shares()
        dropped = self._dropouts(rnd, sorted(forwards))
        senders = sorted(c for c in forwards if c not in dropped)
        method = self.summable.configure_round(rnd, senders) if senders else {}
        payload_down = _sizes([method[c] for c in senders])
        replies = yield Exchange(
            {
                c: Message(
                    method[c].arrays,
                    config={"secagg_step": "forward", **method[c].config, "secagg": forwards[c]},
                )
                for c in senders
            }
        )
        payload_up = _sizes(list(replies.values()))
        self._receive(rnd, replies, server.receive_masked_input)

        requests = server.unmask_requests()
        replies = yield Exchange(
            {c: Message(config={"secagg_step": "unmask", "secagg": b}) for c, b in requests.items()}
        )
        self._receive(rnd, replies, server.receive_unmask)

        total = FIXED_POINT.decode(server.finalize())  # (length,) float64: [Σ w_c·v_c, Σ w_c]
        weight = float(total[-1])
        if not weight > 0:
            raise MessageError(
                f"round {rnd}: secure aggregation summed a total weight of {weight}; expected > 0"
            )
        self._aggregated = sorted(server.survivors)
        metrics = self.summable.apply_mean(
            rnd, self._unflatten(total[:-1] / weight), weight=weight, clients=self._aggregated
        )
        return {
            **metrics,
            "secagg_survivors": len(server.survivors),
            "secagg_dropped": len(server.dropped),
            schema.PAYLOAD_BYTES_DOWN: payload_down,
            schema.PAYLOAD_BYTES_UP: payload_up,
        }

    def round_metrics(self, line: Mapping[str, Any]) -> dict[str, Any]:
        """The protocol's own bytes, both ways: the round's total (the engine's) less the
        method's payload (:meth:`round`'s); none on a round that did not complete."""
        out = dict(self.inner.round_metrics(line))
        if schema.PAYLOAD_BYTES_DOWN in line and schema.PAYLOAD_BYTES_UP in line:
            out[schema.SECAGG_BYTES_DOWN] = (
                line[schema.BYTES_DOWN] - line[schema.PAYLOAD_BYTES_DOWN]
            )
            out[schema.SECAGG_BYTES_UP] = line[schema.BYTES_UP] - line[schema.PAYLOAD_BYTES_UP]
        return out

    def aggregated_clients(self) -> list[int] | None:
        """U3, the survivors: the clients whose masked inputs are in the sum (a client that
        vanished after key agreement, ``secagg_dropout``, replied to the first exchanges only)."""
        return self._aggregated

    def _unflatten(self, flat: np.ndarray) -> dict[str, torch.Tensor]:
        out, start = {}, 0
        for name in sorted(self.summands):
            shape, dtype = self.summands[name]
            n = math.prod(shape)
            out[name] = torch.from_numpy(flat[start : start + n].copy()).to(dtype).reshape(shape)
            start += n
        return out

    @staticmethod
    def _receive(rnd: int, replies: Mapping[int, Message], receive: Any) -> None:
        for cid, reply in replies.items():
            blob = reply.config.get("secagg")
            if not isinstance(blob, bytes):
                raise MessageError(f"round {rnd}, client {cid}: reply carries no secagg bytes")
            receive(blob, sender=cid)

    def _dropouts(self, rnd: int, ids: list[int]) -> set[int]:
        count = int(self.opts.secagg_dropout * len(ids))
        if count == 0:
            return set()
        perm = torch.randperm(len(ids), generator=generator(self.seed, "secagg-dropout", rnd))
        return {ids[i] for i in perm[:count].tolist()}


def _sizes(messages: Sequence[Message]) -> int:
    """The bytes of ``messages`` serialized, a message sent to several clients (one object, a
    broadcast) encoded once and counted for each, as the engine counts it."""
    size: dict[int, int] = {}
    for m in messages:
        if id(m) not in size:
            size[id(m)] = len(m.to_bytes())
    return sum(size[id(m)] for m in messages)


def secure(
    strategy: Strategy,
    program: ClientProgram,
    options: SecureAggregationOptions,
    *,
    seed: int,
    weighted: bool,
    draws: Draws = "torch",
) -> tuple[Strategy, ClientProgram]:
    """Both sides wrapped when ``options.secure_aggregation`` is on; unchanged otherwise."""
    if not options.secure_aggregation:
        return strategy, program
    return SecureAggregation(strategy, options, seed=seed, draws=draws), SecureClient(
        program, options, seed=seed, weighted=weighted, draws=draws
    )
