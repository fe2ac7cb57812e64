"""The two roles every method plays (DESIGN.md, "The shape of one round").

- A :class:`Strategy` runs on the server: it turns the global state into one message per
  sampled client, and the clients' replies back into a new global state.
- A :class:`ClientProgram` runs on the device: ``run(message, ctx) -> message``. ``ctx``
  (:class:`fedge.core.context.ClientContext`) gives the client's data, its persistent
  state, a derived generator, a meter and links to side parties (edge server, enclave).

The shape mirrors Flower's Message API (configure/aggregate on the server, a handler on
the client) on purpose, so the Flower adapter can wrap both unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from fedge.core.messages import Message

if TYPE_CHECKING:
    from fedge.core.context import ClientContext

__all__ = ["ClientProgram", "NextPhase", "SideParty", "Strategy"]


@dataclass
class NextPhase:
    """Returned by ``aggregate_round`` when the round needs another exchange with clients
    (e.g. the four steps of secure aggregation). The engine sends ``messages`` (to any
    subset of the round's clients: the others are treated as dropped for this phase),
    runs their programs with ``ctx.phase`` incremented, and calls ``aggregate_round``
    again with the new replies. Bytes and FLOPs of every phase count toward the round."""

    messages: dict[int, Message]


@runtime_checkable
class Strategy(Protocol):
    """Server side of a method."""

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        """One message per sampled client. Returning the *same* object for several clients
        marks a broadcast: it is serialized once (every client is still charged its bytes)."""
        ...

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float] | NextPhase:
        """Fold the clients' replies into the global state; return round metrics
        (or :class:`NextPhase` to exchange more messages within the round)."""
        ...

    def eval_model(self) -> torch.nn.Module:
        """The model to evaluate on the test set now (e.g. the EMA of the global model)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume after the last aggregated round (tensors, numbers, str)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class ClientProgram(Protocol):
    """Device side of a method. Must not keep per-client state on ``self``: use ``ctx.state``."""

    def run(self, message: Message, ctx: ClientContext) -> Message: ...


@runtime_checkable
class SideParty(Protocol):
    """A party other than server and client that a client talks to over a link
    (EPPFL's edge server, PPFL's enclave). It sees only the messages it is sent."""

    def handle(self, message: Message) -> Message: ...
