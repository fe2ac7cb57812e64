"""What a client program sees: its data, state, randomness, meter and links."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fedge.core.messages import Message
from fedge.core.protocols import SideParty
from fedge.core.meter import Meter

__all__ = ["ClientContext", "ClientData", "Link"]


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

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This client's (x, y), materialized."""
        return self.x[self.indices], self.y[self.indices]

    def batches(
        self, batch_size: int, *, generator: torch.Generator | None = None, drop_last: bool = False
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Mini-batches in an order shuffled by ``generator`` (in index order if None)."""
        n = self.num_samples
        order = self.indices if generator is None else self.indices[torch.randperm(n, generator=generator)]
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            yield self.x[idx], self.y[idx]


class Link:
    """A client's channel to a side party. Every call really serializes both messages and
    counts their bytes (down: party → client, up: client → party) into the client's meter."""

    def __init__(self, name: str, party: SideParty, meter: Meter) -> None:
        self.name, self.party, self.meter = name, party, meter

    def call(self, message: Message) -> Message:
        up = message.to_bytes()
        self.meter.stats.side_bytes_up += len(up)
        reply = self.party.handle(Message.from_bytes(up)).to_bytes()
        self.meter.stats.side_bytes_down += len(reply)
        return Message.from_bytes(reply)


@dataclass
class ClientContext:
    """Everything a :class:`~fedge.core.protocols.ClientProgram` may use in one round.

    ``state`` persists across the rounds this client takes part in (and is checkpointed);
    ``generator`` is derived from (run seed, "client", round, client id), so a client's
    draws do not depend on which other clients ran or in what order.
    """

    cid: int
    rnd: int
    data: ClientData
    generator: torch.Generator
    meter: Meter
    state: dict[str, Any] = field(default_factory=dict)
    phase: int = 0
    parties: dict[str, Callable[[int], SideParty]] = field(default_factory=dict)
    _links: dict[str, Link] = field(default_factory=dict)

    def link(self, name: str) -> Link:
        """The link to side party ``name`` (created on first use for this client)."""
        if name not in self._links:
            if name not in self.parties:
                raise KeyError(f"client {self.cid} has no side party {name!r}; known: {sorted(self.parties)}")
            self._links[name] = Link(name, self.parties[name](self.cid), self.meter)
        return self._links[name]
