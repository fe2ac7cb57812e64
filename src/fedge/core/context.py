"""What a party sees in one round: its data (clients), its persistent state, its derived
generator, its own meter and its :class:`Link` to other parties. Design notes: docs/decisions.md#core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from fedge.core.messages import Message
from fedge.core.meter import Meter
from fedge.core.rng import generator

__all__ = [
    "ClientContext",
    "ClientData",
    "Link",
    "PartyContext",
    "PartySpec",
    "decode_state",
    "encode_state",
]


@dataclass(frozen=True)
class PartySpec:
    """A side party of a method (see :class:`fedge.core.protocols.SideParty`).

    Args:
        name: the link name (``ctx.link(name)``) and the metrics' party kind
            (``flops.NAME``, ``bytes.client->NAME``).
        factory: builds the party object (stateless; its state lives in the engine).
        scope: ``"client"``: one instance (and one state) per client; ``"shared"``: one
            for all. A shared party that changes its state needs ``clients.workers: 0``
            (parallel clients would each change a copy).
    """

    name: str
    factory: Callable[[], Any]  # -> a fedge.core.protocols.SideParty
    scope: Literal["client", "shared"] = "client"


def encode_state(state: dict[str, Any]) -> bytes:
    """A party's state (tensors and scalars) as message bytes, to cross processes and checkpoints."""
    arrays = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    config = {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
    return Message(arrays, config).to_bytes()


def decode_state(data: bytes | None) -> dict[str, Any]:
    if not data:
        return {}
    msg = Message.from_bytes(data)
    return {**msg.config, **msg.arrays}


@dataclass(frozen=True)
class ClientData:
    """A client's share of the training set: indices into tensors shared by all clients
    (so simulated clients cost their index array, not a copy of the data)."""

    x: torch.Tensor  # (N, C, H, W), the whole training set
    y: torch.Tensor  # (N,)
    indices: torch.Tensor  # (n_c,) int64, this client's samples

    @property
    def num_samples(self) -> int:
        return int(self.indices.numel())

    def to(self, device: torch.device) -> ClientData:
        """This client's data with ``x`` and ``y`` on ``device`` (itself if they are there; the
        simulation moves the shared training set once, so this copies nothing per step). The
        indices stay on the CPU, where the client's generator shuffles them."""
        if self.x.device == device and self.y.device == device:
            return self
        return ClientData(self.x.to(device), self.y.to(device), self.indices)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This client's (x, y), materialized."""
        return self.x[self.indices], self.y[self.indices]

    def batches(
        self, batch_size: int, *, generator: torch.Generator | None = None, drop_last: bool = False
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Mini-batches in an order shuffled by ``generator`` (in index order if None)."""
        n = self.num_samples
        order = (
            self.indices
            if generator is None
            else self.indices[torch.randperm(n, generator=generator)]
        )
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            yield self.x[idx], self.y[idx]


@dataclass
class PartyContext:
    """What a :class:`~fedge.core.protocols.SideParty` may use while handling one message.

    ``key`` is the client the instance belongs to (``scope="client"``) or None (shared);
    ``state`` persists across rounds for that instance; ``generator`` is derived from
    (run seed, "party", name, key, round, phase) and continues across the calls made within
    one client step."""

    name: str
    key: int | None
    rnd: int
    state: dict[str, Any]
    generator: torch.Generator
    meter: Meter


class Link:
    """A client's channel to side party ``spec.name``. Each call serializes both messages,
    counts their bytes on the link, pauses the client's meter and runs the party under its
    own. The party's state is decoded on first use and handed back to the engine after the
    client step (:attr:`state_bytes`)."""

    def __init__(
        self,
        spec: PartySpec,
        *,
        key: int | None,
        rnd: int,
        phase: int,
        seed: int,
        state: bytes | None,
        client_meter: Meter,
    ) -> None:
        self.spec, self.key, self.rnd, self.phase, self.seed = spec, key, rnd, phase, seed
        self.client_meter = client_meter
        self._state_in = state
        self._ctx: PartyContext | None = None
        self._party: Any = None  # a fedge.core.protocols.SideParty, built by _context()

    @property
    def name(self) -> str:
        return self.spec.name

    def _context(self) -> PartyContext:
        if self._ctx is None:
            m = self.client_meter
            self._ctx = PartyContext(
                name=self.spec.name,
                key=self.key,
                rnd=self.rnd,
                state=decode_state(self._state_in),
                generator=generator(
                    self.seed,
                    "party",
                    self.spec.name,
                    -1 if self.key is None else self.key,
                    self.rnd,
                    self.phase,
                ),
                meter=Meter(flops=m.count_flops, memory=m.memory),
            )
            self._party = self.spec.factory()
        return self._ctx

    def call(self, message: Message) -> Message:
        """Send ``message`` to the party and return its reply (both really serialized)."""
        name, stats = self.spec.name, self.client_meter.stats
        up = message.to_bytes()
        stats.add_link(f"client->{name}", len(up))
        with self.client_meter.paused():
            ctx = self._context()
            party_stats = ctx.meter.stats
            before = party_stats.copy()
            with ctx.meter.measure():
                reply = self._party.handle(Message.from_bytes(up), ctx)
            if not isinstance(reply, Message):
                raise TypeError(
                    f"side party {name!r} returned {type(reply).__name__}; expected a Message"
                )
            down = reply.to_bytes()
        stats.add_party(name, party_stats.since(before))
        stats.add_link(f"{name}->client", len(down))
        return Message.from_bytes(down)

    @property
    def state_bytes(self) -> bytes | None:
        """The party's state after this client step (unchanged bytes if never called)."""
        if self._ctx is None:
            return self._state_in
        return encode_state(self._ctx.state) if self._ctx.state else None


@dataclass
class ClientContext:
    """Everything a :class:`~fedge.core.protocols.ClientProgram` may use in one exchange.

    ``state`` persists across the rounds this client takes part in (and is checkpointed);
    ``round_state`` lives for the exchanges of one round only (secrets such as secure
    aggregation keys: carried between exchanges, even across worker processes, and dropped
    when the round ends, never written to disk); ``generator`` is derived from
    (run seed, "client", round, client id); ``phase`` counts the exchanges of the round;
    ``global_arrays`` holds the round's global weights as this client received them, by name
    (set by the program that loads them before its local steps,
    :class:`~fedge.methods.local.LocalTraining`; None before): what a gradient hook that pulls
    towards the global model (FedProx's proximal term) reads.
    """

    cid: int
    rnd: int
    data: ClientData
    generator: torch.Generator
    meter: Meter
    state: dict[str, Any] = field(default_factory=dict)
    round_state: dict[str, Any] = field(default_factory=dict)
    phase: int = 0
    links: dict[str, Link] = field(default_factory=dict)
    global_arrays: dict[str, torch.Tensor] | None = None

    def link(self, name: str) -> Link:
        """The link to side party ``name``."""
        if name not in self.links:
            raise KeyError(
                f"client {self.cid} has no side party {name!r}; known: {sorted(self.links)}"
            )
        return self.links[name]
