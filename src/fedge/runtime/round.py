"""The pieces of one round, each on its own, called by the engine in this order: :func:`drive_round`
drives a strategy's round generator, :class:`RoundTotals` accounts each exchange's costs and
failed clients, :func:`check_failures` decides whether the round goes on without them, and
:func:`metrics_line` writes the round's metrics line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedge.core.errors import MessageError, ShortRoundError
from fedge.core.messages import Message
from fedge.core.meter import StepStats
from fedge.core.protocols import Exchange, PartyCall, Savepoint
from fedge.runtime.executor import ClientResult

__all__ = [
    "Driven",
    "RoundRecord",
    "RoundTotals",
    "check_failures",
    "decode_replies",
    "drive_round",
    "metrics_line",
]


@dataclass
class Driven:
    """A round driven to its end: what the strategy's round returned, and the clients that
    replied to its last exchange."""

    value: dict[str, Any]
    replied: list[int]


def drive_round(
    rnd: int,
    ids: Sequence[int],
    steps: Generator[Any, Any, Any],
    *,
    exchange: Callable[[int, dict[int, Message]], dict[int, Message]],
    call: Callable[[PartyCall], Message],
    savepoint: Callable[[Savepoint, int], None] | None = None,
    first: int = 0,
) -> Driven:
    """Drive the round generator ``steps`` of round ``rnd`` (sampled clients ``ids``): each
    ``Exchange`` goes to ``exchange(index, messages)`` (index 0-based) and its replies back into
    the round, each ``PartyCall`` to ``call``, each ``Savepoint`` to ``savepoint(point, index of
    the next exchange)`` (None: passed over) with None sent back. The first exchange must address
    every sampled client, and no exchange a client not sampled. ``first``: the index of the first
    exchange (a round continued from a savepoint starts at the savepoint's). Exceptions of
    ``exchange``, ``call`` and ``savepoint`` (such as a
    :class:`~fedge.core.errors.ShortRoundError`) propagate."""
    sampled = set(ids)
    index = first
    replied: list[int] = []
    try:
        step = next(steps)
        while True:
            if isinstance(step, Exchange):
                addressed = set(step.messages)
                if index == 0 and addressed != sampled:
                    missing = sorted(sampled - addressed)
                    raise MessageError(
                        f"round {rnd}: strategy configured no message for clients {missing[:10]}"
                    )
                if not addressed <= sampled:
                    raise MessageError(
                        f"round {rnd}: exchange {index + 1} addresses clients "
                        f"{sorted(addressed - sampled)[:10]} not sampled this round"
                    )
                replies = exchange(index, step.messages)
                index += 1
                replied = sorted(replies)
                step = steps.send(replies)
                del replies
            elif isinstance(step, PartyCall):
                step = steps.send(call(step))
            elif isinstance(step, Savepoint):
                if savepoint is not None:
                    savepoint(step, index)
                step = steps.send(None)
            else:
                raise TypeError(
                    f"round {rnd}: a strategy's round yields Exchange, PartyCall or Savepoint, got "
                    f"{type(step).__name__}"
                )
    except StopIteration as stop:
        return Driven(dict(stop.value or {}), replied)


@dataclass
class RoundTotals:
    """One round's counters, added to exchange by exchange."""

    bytes_down: int = 0
    bytes_up: int = 0
    client: StepStats = field(default_factory=StepStats)  # summed over clients (peaks: max)
    parties: dict[str, StepStats] = field(default_factory=dict)
    links: dict[str, int] = field(default_factory=dict)
    transport: dict[str, int] = field(default_factory=dict)  # an executor's own counters
    failed: dict[int, str] = field(default_factory=dict)  # client -> why, its first failure
    exchanges: int = 0  # completed

    def sent(self, nbytes: int) -> None:
        """A message of ``nbytes`` sent to a client (counted even if it then drops out)."""
        self.bytes_down += nbytes

    def add_transport(self, counters: Mapping[str, int]) -> None:
        for k, v in counters.items():
            self.transport[k] = self.transport.get(k, 0) + v

    def fail(self, failed: Mapping[int, str]) -> None:
        """Clients that gave no result in this exchange; a client keeps its first reason."""
        for cid, why in failed.items():
            self.failed.setdefault(cid, why)

    def received(self, results: Mapping[int, ClientResult]) -> None:
        """The replies that arrived: their bytes, and each step's cost (its own, its side
        parties' on their accounts, its bytes per link)."""
        for cid in sorted(results):
            result = results[cid]
            self.bytes_up += len(result.reply)
            self.add(result.stats)

    def add(self, stats: StepStats) -> None:
        """One client step's cost."""
        self.client.merge(
            StepStats(
                stats.flops,
                stats.wall_s,
                stats.tensor_peak_bytes,
                stats.rss_peak_bytes,
                stats.side_bytes_down,
                stats.side_bytes_up,
                device_peak_bytes=stats.device_peak_bytes,
            )
        )
        for name, cost in stats.parties.items():
            self.add_party(name, cost)
        for k, v in stats.links.items():
            self.add_link(k, v)

    def add_party(self, name: str, cost: StepStats) -> None:
        if name in self.parties:
            self.parties[name].merge(cost)
        else:
            self.parties[name] = cost.copy()

    def add_link(self, link: str, nbytes: int) -> None:
        self.links[link] = self.links.get(link, 0) + nbytes

    def state_dict(self) -> dict[str, Any]:
        """The counters as plain values (a checkpoint taken inside the round keeps them)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RoundTotals:
        """The counters :meth:`state_dict` gave."""
        return cls(
            **{
                **state,
                "client": _stats(state["client"]),
                "parties": {k: _stats(v) for k, v in state["parties"].items()},
                "links": dict(state["links"]),
                "transport": dict(state["transport"]),
                "failed": dict(state["failed"]),
            }
        )


def _stats(state: Mapping[str, Any]) -> StepStats:
    return StepStats(
        **{
            **state,
            "links": dict(state["links"]),
            "parties": {k: _stats(v) for k, v in state["parties"].items()},
        }
    )


@dataclass
class RoundRecord:
    """Counters carried across rounds (checkpointed with the strategy)."""

    round: int = 0
    cum_bytes_down: int = 0
    cum_bytes_up: int = 0
    cum_client_flops: int = 0
    best_test_accuracy: float | None = None
    last_test_accuracy: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, rnd: int, totals: RoundTotals) -> None:
        """Round ``rnd`` is done, with ``totals``."""
        self.round = rnd
        self.cum_bytes_down += totals.bytes_down
        self.cum_bytes_up += totals.bytes_up
        self.cum_client_flops += totals.client.flops


def check_failures(
    rnd: int,
    phase: int,
    addressed: int,
    replied: int,
    failed: Mapping[int, str],
    *,
    min_replies: int | None,
    partial_replies: bool,
    method: str,
) -> None:
    """Let the round go on without the ``failed`` clients' replies (a strategy that takes
    ``partial_replies``, under ``min_replies``, with at least that many replies); or, under
    ``min_replies``, with fewer replies than that, a :class:`ShortRoundError` (the round is
    skipped); otherwise stop the run with one error naming each failed client and the way on."""
    tolerant = min_replies is not None and partial_replies
    if tolerant and replied >= (min_replies or 0):
        return
    listed = "; ".join(f"client {cid}: {why}" for cid, why in sorted(failed.items())[:5])
    more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
    head = f"round {rnd}, exchange {phase + 1}: {len(failed)} of {addressed} clients gave no result ({listed}{more})"
    if tolerant:
        raise ShortRoundError(
            f"{head}; only {replied} replied, fewer than clients.min_replies={min_replies}"
        )
    if not partial_replies:
        why = (
            f"this method ({method}) needs every addressed client's reply, "
            "so this round is not completed. "
        )
    else:
        why = (
            "this round is not completed: set clients.min_replies (e.g. to half of clients.per_round) to let "
            "a round go on with the replies that arrive. "
        )
    fix = (
        (f"Rounds up to {rnd - 1} are kept: " if rnd > 1 else "")
        + "bring the node(s) back and continue with fedge run --resume RUN_DIR (with the same --runtime, or another)"
    )
    raise MessageError(f"{head}; {why}{fix}")


def decode_replies(rnd: int, results: Mapping[int, ClientResult]) -> dict[int, Message]:
    """The replies by client id, decoded; a non-finite one is a
    :class:`~fedge.core.errors.NonFiniteError` (a :class:`MessageError` and a divergence)."""
    replies: dict[int, Message] = {}
    for cid in sorted(results):
        msg = Message.from_bytes(results[cid].reply)
        msg.check_finite(who=f"round {rnd}, client {cid}", round=rnd)
        replies[cid] = msg
    return replies


def metrics_line(
    rnd: int,
    clients: int,
    totals: RoundTotals,
    record: RoundRecord,
    *,
    figures: Mapping[str, Any],
    aggregate: Mapping[str, Any],
    failed: int | None = None,
    parties: bool = False,
    memory: bool = False,
    flops: bool = True,
    more: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Round ``rnd``'s metrics line (all but ``wall_s``): ``clients`` sampled, ``failed`` of
    them (under ``clients.min_replies``; None: not written), the evaluation ``figures``, the
    round's ``totals`` and ``record``'s cumulative counters, the side parties' costs (with
    ``parties``), peak memory (with ``memory``), then what the round returned (``aggregate``)
    and ``more(line)`` (the strategy's round metrics), neither replacing a key already there."""
    client = totals.client
    line: dict[str, Any] = {"round": rnd, "clients": clients}
    if failed is not None:
        line["clients_failed"] = failed
    line.update(figures)
    line.update(bytes_down=totals.bytes_down, bytes_up=totals.bytes_up)
    if flops:  # FLOPs not counted are absent, never 0 (measure.flops=false)
        line["client_flops"] = client.flops
    line.update(cum_bytes_down=record.cum_bytes_down, cum_bytes_up=record.cum_bytes_up)
    if flops:
        line["cum_client_flops"] = record.cum_client_flops
    if totals.exchanges > 1:
        line["phases"] = totals.exchanges
    if parties:
        line.update(side_bytes_down=client.side_bytes_down, side_bytes_up=client.side_bytes_up)
        for link, n in sorted(totals.links.items()):
            line[f"bytes.{link}"] = n
        for name, cost in sorted(totals.parties.items()):
            if flops:
                line[f"flops.{name}"] = cost.flops
            line[f"wall_s.{name}"] = cost.wall_s
            if memory:
                line[f"tensor_peak_bytes.{name}"] = cost.tensor_peak_bytes
    if memory:
        # The per-round peak is the tensor-accounting peak (measured afresh each step). The RSS
        # figure is the growth of the process's high-water mark during the steps over the RSS
        # when each began: the allocator keeps what round 1 took, so later rounds grow little.
        # It is logged under its own name, never as the round's peak. On a CUDA device the
        # round's peak is the CUDA allocator's (StepStats.device_peak_bytes), which also sees
        # the cuDNN/cuBLAS workspaces; the tensor accounting stays logged beside it.
        device_peak = client.device_peak_bytes
        line.update(
            client_tensor_peak_bytes=client.tensor_peak_bytes,
            client_peak_bytes=client.tensor_peak_bytes if device_peak is None else device_peak,
            client_rss_growth_bytes=client.rss_peak_bytes,
        )
    line.update({k: v for k, v in aggregate.items() if k not in line})
    if more is not None:
        line.update({k: v for k, v in more(line).items() if k not in line})
    line["client_wall_s"] = client.wall_s
    line.update(totals.transport)
    return line
