"""The parties of a method and the shape of one round: a :class:`Strategy` on the server whose
round is a generator of :class:`Exchange` steps, a :class:`ClientProgram` on the device, and
:class:`SideParty` participants (DESIGN.md, "The shape of one round"). Design notes: docs/decisions.md#core.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from fedge.core.context import ClientContext, PartyContext, PartySpec
from fedge.core.messages import Message

__all__ = [
    "OPTIONAL_HOOKS",
    "ClientProgram",
    "ClientSelection",
    "Exchange",
    "HasGlobalModel",
    "PartialReplies",
    "PartyCall",
    "PartySpec",
    "ResumeCheck",
    "Round",
    "RoundAccounting",
    "Savepoint",
    "SideEvaluation",
    "SideParty",
    "Stopping",
    "Strategy",
    "StrategyWrapper",
]


@dataclass
class Exchange:
    """One server → clients → server exchange within a round.

    The engine sends ``messages`` (to any subset of the round's sampled clients: the others
    sit this exchange out), runs those clients' programs, and sends the decoded replies back
    into the round generator. When the strategy takes :attr:`Strategy.partial_replies`, a
    client that failed (``clients.dropout``, a Flower node that did not answer) is simply
    absent from the replies, and from every later exchange of the round. Returning the *same* Message object for several clients marks
    a broadcast: it is serialized once (every client is still charged its bytes)."""

    messages: dict[int, Message]


@dataclass
class PartyCall:
    """A call from the server to a server-side party (e.g. PPFL's server enclave); the
    engine meters it on the party's account and counts ``server->NAME`` / ``NAME->server``
    bytes. The round generator receives the party's reply Message."""

    party: str
    message: Message
    key: int | None = None  # which instance of a per-client party (None: a shared party)


@dataclass
class Savepoint:
    """A point inside a round from which the round can be continued: a long phase of a round
    (NTK-Ori's ``total`` pruning rounds, the first exchanges of round 1) yields one after each of
    its steps, ``done`` of ``total`` of its ``phase`` finished. The engine checkpoints there, so
    an interrupt keeps the phase's finished steps, tells the run's progress, and sends None back.

    What a strategy that yields it promises: its :meth:`Strategy.state_dict` now holds how far
    the round got, and ``round(rnd, client_ids)`` on a strategy loaded from that state goes on
    from here, to the same result. Every wrapper around it passes it through and changes no state
    of its own before its inner round returns; no client holds a round state (``ctx.round_state``
    never goes to disk)."""

    phase: str
    done: int
    total: int


Round = Generator[Exchange | PartyCall | Savepoint, Any, dict[str, float]]


class Strategy:
    """Server side of a method. Subclass it and write either ``round`` (several exchanges)
    or ``configure_round`` + ``aggregate_round`` (one exchange), ``eval_model``, and
    ``state_dict``/``load_state_dict`` when it has state; the optional hooks
    (:data:`OPTIONAL_HOOKS`) have defaults here, to override where the method needs them."""

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        """One message per sampled client (the default :meth:`round`'s only exchange)."""
        raise NotImplementedError(f"{type(self).__name__} must define round() or configure_round()")

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        """Fold the clients' replies into the global state; return round metrics."""
        raise NotImplementedError(f"{type(self).__name__} must define round() or aggregate_round()")

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        """The round as a generator of exchanges; returns the round's metrics."""
        replies = yield Exchange(self.configure_round(rnd, client_ids))
        return self.aggregate_round(rnd, replies)

    @property
    def global_model(self) -> Any:
        """The :class:`~fedge.methods.base.GlobalModel` this strategy trains (its model, masks
        and optimizer), or None for a strategy without one."""
        return None

    @property
    def partial_replies(self) -> bool:
        """Whether a round can go on when some addressed clients do not reply (a device that
        drops out, a Flower node that fails): the exchange then hands the round only the
        replies that arrived. Only then does ``clients.min_replies`` apply; otherwise a
        missing reply fails the round. Default: no (the strategy needs every reply)."""
        return False

    def eligible(self, profile: Mapping[str, Any]) -> bool:
        """Whether a client with this device profile (``clients.profiles`` in the config:
        memory, enclave size, bandwidth, ...) may be sampled. Default: every client."""
        return True

    @property
    def profile_fields(self) -> frozenset[str]:
        """The ``clients.profiles`` fields :meth:`eligible` reads beyond those the engine reads
        itself (the time model's, ``memory_mb``): a profile giving a field nothing reads is
        refused. Default: none."""
        return frozenset()

    def eligible_client(self, cid: int, profile: Mapping[str, Any]) -> bool:
        """:meth:`eligible` for client ``cid`` (what the engine asks); override it when the
        answer or the strategy's bookkeeping needs the id. Default: ``eligible(profile)``."""
        return self.eligible(profile)

    def select_clients(self, rnd: int, num_clients: int, per_round: int) -> list[int] | None:
        """The clients of round ``rnd`` when the method needs its own draw (e.g. DP's Poisson
        sampling); None: the engine's uniform fixed-size draw among the eligible."""
        return None

    def stop_reason(self, rnd: int) -> str | None:
        """A reason not to run round ``rnd`` (e.g. a privacy budget reached), or None to go on."""
        return None

    def round_metrics(self, line: Mapping[str, Any]) -> dict[str, Any]:
        """Metrics derived from what the engine measured this round (``line`` holds
        ``client_flops``, bytes, ...); called once per round, after evaluation."""
        return {}

    def round_skipped(self, rnd: int) -> None:
        """Round ``rnd`` could not complete (under ``clients.min_replies``) and the engine has
        put this strategy back with :meth:`load_state_dict` as it was before the round. Redo
        here what must outlive that restore: privacy spent in the round (clients that released
        noised data before the round failed spent budget; a restore puts the model back, not
        the budget). Default: nothing."""
        return None

    def aggregated_clients(self) -> list[int] | None:
        """The clients whose replies the last completed round folded into the global model, when
        that is not simply every client that replied to the round's last exchange (secure
        aggregation's survivors, PPFL's uploads that opened, EPPFL's uploads that were not
        lost); None: those. Read after each completed round by whoever must know whose data
        trained the model (membership inference draws its members from those clients only)."""
        return None

    def eval_model(self) -> torch.nn.Module:
        """The model to evaluate on the test set now (e.g. the EMA of the global model)."""
        raise NotImplementedError

    def side_eval_models(self) -> dict[str, torch.nn.Module]:
        """Models evaluated beside :meth:`eval_model` each evaluation round, by name; the engine
        logs each one's figures under ``<name>_`` (``raw_test_accuracy``, ``raw_val_accuracy``,
        ...). E.g. the EMA wrapper's raw global model, whose figures are the same run's
        "without EMA" row. Default: none."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume after the last aggregated round (tensors, numbers, str)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def check_resume(self, state: dict[str, Any], rounds: int) -> None:
        """Raise :class:`~fedge.core.errors.ResumeError` if the checkpointed ``state`` (what
        :meth:`state_dict` returned) cannot go on here to ``rounds`` rounds in all (e.g. state
        sealed on another machine); called before a resume writes anything. Default: it can."""
        return None


#: the optional hooks of a :class:`Strategy` (each with a default there), which a
#: :class:`StrategyWrapper` forwards to the strategy it wraps unless it overrides them
OPTIONAL_HOOKS = (
    "global_model",
    "partial_replies",
    "eligible",
    "profile_fields",
    "eligible_client",
    "select_clients",
    "stop_reason",
    "round_metrics",
    "round_skipped",
    "aggregated_clients",
    "side_eval_models",
)


@runtime_checkable
class HasGlobalModel(Protocol):
    """A strategy that trains one global model (EMA evaluation needs it)."""

    @property
    def global_model(self) -> Any: ...


@runtime_checkable
class PartialReplies(Protocol):
    """Whether a round can go on with the replies that arrived (``clients.min_replies``)."""

    @property
    def partial_replies(self) -> bool: ...


@runtime_checkable
class ClientSelection(Protocol):
    """Which clients a round may sample (device profiles) or does sample (DP's own draws)."""

    def eligible_client(self, cid: int, profile: Mapping[str, Any]) -> bool: ...

    def select_clients(self, rnd: int, num_clients: int, per_round: int) -> list[int] | None: ...


@runtime_checkable
class Stopping(Protocol):
    """A reason to stop before a round (a privacy budget reached)."""

    def stop_reason(self, rnd: int) -> str | None: ...


@runtime_checkable
class RoundAccounting(Protocol):
    """What a round adds to the metrics line, redoes after a skipped round, and aggregated."""

    def round_metrics(self, line: Mapping[str, Any]) -> dict[str, Any]: ...

    def round_skipped(self, rnd: int) -> None: ...

    def aggregated_clients(self) -> list[int] | None: ...


@runtime_checkable
class SideEvaluation(Protocol):
    """Models evaluated beside :meth:`Strategy.eval_model` (the EMA wrapper's raw model)."""

    def side_eval_models(self) -> dict[str, torch.nn.Module]: ...


@runtime_checkable
class ResumeCheck(Protocol):
    """Whether a checkpointed state can go on here."""

    def check_resume(self, state: dict[str, Any], rounds: int) -> None: ...


class _Forwarded:
    """An optional hook a wrapper does not change: the wrapped strategy's own."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.inner, self.name)


class StrategyWrapper(Strategy):
    """A strategy that adds behaviour around ``inner``: it forwards the required core (the
    round, the evaluated model) and every optional hook (:data:`OPTIONAL_HOOKS`) to ``inner``,
    and nests ``inner``'s state under ``"inner"``. A subclass overrides only what it changes.
    The wrapped strategy's global model is reachable as :attr:`global_model` through any depth."""

    def __init__(self, inner: Strategy) -> None:
        self.inner = inner

    @property
    def model(self) -> torch.nn.Module:
        """The global model being trained (the innermost strategy's)."""
        return self.global_model.model

    def configure_round(self, rnd: int, client_ids: list[int]) -> dict[int, Message]:
        return self.inner.configure_round(rnd, client_ids)

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        return self.inner.aggregate_round(rnd, replies)

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        return (yield from self.inner.round(rnd, client_ids))

    def eval_model(self) -> torch.nn.Module:
        return self.inner.eval_model()

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])

    def check_resume(self, state: dict[str, Any], rounds: int) -> None:
        self.inner.check_resume(state["inner"], rounds)


for _hook in OPTIONAL_HOOKS:  # forwarded unless a subclass defines its own
    _forward = _Forwarded()
    _forward.__set_name__(StrategyWrapper, _hook)
    setattr(StrategyWrapper, _hook, _forward)


@runtime_checkable
class ClientProgram(Protocol):
    """Device side of a method. Must not keep per-client state on ``self``: use
    ``ctx.state`` (persists across rounds, checkpointed) or ``ctx.round_state`` (this
    round's exchanges only, never written to disk)."""

    def run(self, message: Message, ctx: ClientContext) -> Message: ...


@runtime_checkable
class SideParty(Protocol):
    """A party other than server and client (EPPFL's edge server, PPFL's enclave). It sees
    only the messages it is sent and keeps its state in ``ctx.state``."""

    def handle(self, message: Message, ctx: PartyContext) -> Message: ...
