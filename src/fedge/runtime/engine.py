"""The in-process federated simulation engine.

One round (DESIGN.md):

    sample clients ─► strategy.round(rnd, ids) ──yield Exchange(messages)──► serialize ─►
        client programs (each with its links to side parties) ─► serialize ─► replies sent
        back into the round ─► ... (as many exchanges as the round yields) ─► metrics
        ─► evaluate ─► one metrics line, checkpoint

Every party is metered on its own account: the client's meter is paused while a side party
(edge server, enclave, third party) handles a call, and the party's FLOPs, time and memory
are logged per party kind (``flops.edge``), bytes per link (``bytes.client->edge``). Side
parties and clients keep persistent state (checkpointed); clients also get a per-round
scratch state carried between the round's exchanges and dropped when it ends.

Every message crosses a real serialization boundary in both directions, so ``bytes_down``
and ``bytes_up`` are lengths of real encoded messages and a client can never share tensors
with the server by accident. A message object returned for several clients (a broadcast)
is encoded once and charged to every client.

A client that fails to reply — dropped out (``dropout``: each client an exchange addresses
fails with that probability, a seeded draw per round, exchange and client, before it computes
anything; the message it was sent is still counted) or a Flower node that errs or times out —
is out for the rest of the round. A strategy that takes :attr:`Strategy.partial_replies`
goes on with the replies that arrived, as long as at least ``min_replies`` did. A round that
cannot complete under ``min_replies`` (fewer replies than that, or fewer than a protocol's
threshold: a :class:`~fedge.core.errors.ShortRoundError`) is skipped: the strategy's state
is put back as it was before the round (the global model unchanged; the clients' own states
keep what their steps did; :meth:`Strategy.round_skipped` then redoes what must outlive the
restore, such as privacy spent), the round is evaluated and logged with ``round_skipped``, and the
run goes on. Without ``min_replies`` any failure stops the run with one error naming every
client that did not deliver (the rounds before it are checkpointed). ``clients_failed``
counts the round's failed clients.

Clients run sequentially in this process by default, or in a pool of forked worker
processes (``workers > 0``; one torch thread each, since two torch threads per process
collapse under contention on small machines). Only bytes cross the process boundary.
Results do not depend on the number of workers, except through float summation order
if torch's own thread count differs between the two settings.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedge.core.context import (
    ClientContext,
    ClientData,
    Link,
    PartyContext,
    decode_state,
    encode_state,
)
from fedge.core.errors import ConfigError, MessageError, ShortRoundError
from fedge.core.messages import Message
from fedge.core.meter import Meter, StepStats
from fedge.core.protocols import ClientProgram, Exchange, PartyCall, PartySpec, Strategy
from fedge.core.rng import generator
from fedge.runtime.evaluate import evaluate

__all__ = [
    "EngineConfig",
    "Simulation",
    "decode_state",
    "drops_out",
    "encode_state",
    "sample_clients",
]

SHARED = -1  # the state key of a shared party's single instance


@dataclass(frozen=True)
class EngineConfig:
    seed: int
    rounds: int
    per_round: int
    eval_every: int = 1
    eval_batch_size: int = 1000
    workers: int = 0
    measure_flops: bool = True
    measure_memory: bool = False
    dropout: float = 0.0
    min_replies: int | None = None


def sample_clients(
    seed: int, rnd: int, num_clients: int, per_round: int, eligible: Sequence[int] | None = None
) -> list[int]:
    """The sorted ids of the ``per_round`` clients taking part in round ``rnd``, a uniformly
    random subset of ``eligible`` (default: every client) drawn from the generator
    (seed, "sample", round).

    Floyd's algorithm (Bentley & Floyd, "A sample of brilliance", CACM 1987): k draws give a
    uniform k-subset of n, so a round costs O(per_round) whatever the population (no
    permutation of a million ids): for j = n−k .. n−1, draw t uniform in [0, j] and take t,
    or j if t was already taken.
    """
    n = num_clients if eligible is None else len(eligible)
    if per_round >= n:
        return list(range(num_clients)) if eligible is None else sorted(eligible)
    u = torch.rand(
        per_round, generator=generator(seed, "sample", rnd), dtype=torch.float64
    ).tolist()
    chosen: set[int] = set()
    for j, uj in zip(range(n - per_round, n), u, strict=True):
        t = min(int(uj * (j + 1)), j)
        chosen.add(j if t in chosen else t)
    picked = chosen if eligible is None else {eligible[i] for i in chosen}
    return sorted(picked)


def drops_out(seed: int, p: float, rnd: int, phase: int, cid: int) -> bool:
    """Whether client ``cid`` drops out before replying to exchange ``phase`` (0-based) of round
    ``rnd`` under ``clients.dropout = p``: a uniform draw from the generator (seed, "dropout",
    round, exchange, client) below ``p``, so a run loses the same clients whatever the runtime."""
    if p <= 0:
        return False
    return (
        float(
            torch.rand(
                1, generator=generator(seed, "dropout", rnd, phase, cid), dtype=torch.float64
            )
        )
        < p
    )


# ------------------------------------------------------------------ client execution


@dataclass
class _Task:
    cid: int
    rnd: int
    phase: int
    message: bytes
    state: bytes | None
    round_state: bytes | None
    party_states: dict[str, bytes | None]


@dataclass
class _Result:
    reply: bytes
    state: bytes | None
    round_state: bytes | None
    party_states: dict[str, bytes | None]
    stats: StepStats


def execute_client(
    program: ClientProgram,
    data: ClientData,
    task: _Task,
    *,
    seed: int,
    measure_flops: bool,
    measure_memory: bool,
    parties: Mapping[str, PartySpec],
) -> _Result:
    """Run one client step from message bytes to reply bytes (the unit a worker executes)."""
    meter = Meter(flops=measure_flops, memory=measure_memory)
    links = {
        name: Link(
            spec,
            key=task.cid if spec.scope == "client" else None,
            rnd=task.rnd,
            phase=task.phase,
            seed=seed,
            state=task.party_states.get(name),
            client_meter=meter,
        )
        for name, spec in parties.items()
    }
    ctx = ClientContext(
        cid=task.cid,
        rnd=task.rnd,
        data=data,
        generator=generator(seed, "client", task.rnd, task.cid),
        meter=meter,
        state=decode_state(task.state),
        round_state=decode_state(task.round_state),
        phase=task.phase,
        links=links,
    )
    msg = Message.from_bytes(task.message)
    with meter.measure():
        reply = program.run(msg, ctx)
    if not isinstance(reply, Message):
        raise MessageError(f"client program returned {type(reply).__name__}; expected a Message")
    return _Result(
        reply.to_bytes(),
        encode_state(ctx.state) if ctx.state else None,
        encode_state(ctx.round_state) if ctx.round_state else None,
        {name: link.state_bytes for name, link in links.items()},
        meter.stats,
    )


_WORKER: dict[str, Any] = {}


def _worker_init(
    program: ClientProgram, clients: Sequence[ClientData], kwargs: dict[str, Any]
) -> None:
    torch.set_num_threads(1)
    _WORKER.update(program=program, clients=clients, kwargs=kwargs)


def _worker_task(task: _Task) -> _Result:
    w = _WORKER
    return execute_client(w["program"], w["clients"][task.cid], task, **w["kwargs"])


# ------------------------------------------------------------------ the simulation


@dataclass
class _RoundTotals:
    bytes_down: int = 0
    bytes_up: int = 0
    client: StepStats = field(default_factory=StepStats)  # summed over clients (peaks: max)
    parties: dict[str, StepStats] = field(default_factory=dict)
    links: dict[str, int] = field(default_factory=dict)

    def add(self, stats: StepStats) -> None:
        parties, links = stats.parties, stats.links
        self.client.merge(
            StepStats(
                stats.flops,
                stats.wall_s,
                stats.tensor_peak_bytes,
                stats.rss_peak_bytes,
                stats.side_bytes_down,
                stats.side_bytes_up,
            )
        )
        for name, cost in parties.items():
            self.add_party(name, cost)
        for k, v in links.items():
            self.links[k] = self.links.get(k, 0) + v

    def add_party(self, name: str, cost: StepStats) -> None:
        if name in self.parties:
            self.parties[name].merge(cost)
        else:
            self.parties[name] = cost.copy()


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


class Simulation:
    """Runs a Strategy, a ClientProgram and the side parties over a population of clients.

    Args:
        strategy: the server side.
        program: the client side (stateless; per-client state lives in the engine).
        clients: one :class:`ClientData` per client id.
        test: (x, y) test tensors for evaluation.
        validation: (x, y) held out from the training data, evaluated like the test set every
            evaluation round (``val_accuracy``, ``val_loss``); the record keeps the test
            accuracy at the round of best validation accuracy, the figure to report when
            choices were tuned on validation.
        config: :class:`EngineConfig`.
        parties: side parties by name (:class:`~fedge.core.protocols.PartySpec`).
        profiles: one device profile per client (``clients.profiles``), offered to
            ``strategy.eligible_client(cid, profile)`` before sampling; None: every client is eligible.
        on_round: called after each completed round with (metrics dict, engine); the run
            writer uses it to append metrics and checkpoint.
        on_progress: called as clients finish within a round with (round, exchange,
            clients done, clients in the exchange), for progress displays.
    """

    #: where concurrent client steps run, and how to let a shared party's state change there
    _concurrent = (
        "in a worker process",
        "set clients.workers=0, or keep that state per client (scope='client')",
    )

    def __init__(
        self,
        *,
        strategy: Strategy,
        program: ClientProgram,
        clients: Sequence[ClientData],
        test: tuple[torch.Tensor, torch.Tensor],
        num_classes: int,
        config: EngineConfig,
        parties: Mapping[str, PartySpec] | None = None,
        profiles: Sequence[Mapping[str, Any]] | None = None,
        validation: tuple[torch.Tensor, torch.Tensor] | None = None,
        on_round: Callable[[dict[str, Any], Simulation], None] | None = None,
        on_progress: Callable[[int, int, int, int], None] | None = None,
    ) -> None:
        self.strategy, self.program, self.clients = strategy, program, clients
        self.test, self.num_classes, self.cfg = test, num_classes, config
        self.parties = dict(parties or {})
        for name, spec in self.parties.items():
            if name != spec.name:
                raise ConfigError(
                    f"side party registered as {name!r} is named {spec.name!r}; use one name"
                )
        if profiles is not None and len(profiles) != len(clients):
            raise ConfigError(
                f"got {len(profiles)} device profiles for {len(clients)} clients; give one per client"
            )
        self.profiles = profiles
        self.validation = validation
        self.on_round, self.on_progress = on_round, on_progress
        self.client_states: dict[int, bytes] = {}
        self.party_states: dict[str, dict[int, bytes]] = {name: {} for name in self.parties}
        self.record = RoundRecord()
        self._round_states: dict[int, bytes] = {}
        self._failed: dict[int, str] = {}  # this round's clients that did not reply: why
        self._simulated: set[int] = set()  # those of them that dropped out by ``dropout``
        self._pool: Any = None

    # -- checkpointing -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "strategy": self.strategy.state_dict(),
            "client_states": dict(self.client_states),
            "party_states": {k: dict(v) for k, v in self.party_states.items()},
            "record": {
                "round": r.round,
                "cum_bytes_down": r.cum_bytes_down,
                "cum_bytes_up": r.cum_bytes_up,
                "cum_client_flops": r.cum_client_flops,
                "best_test_accuracy": r.best_test_accuracy,
                "last_test_accuracy": r.last_test_accuracy,
                "extra": dict(r.extra),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.strategy.load_state_dict(state["strategy"])
        self.client_states = dict(state["client_states"])
        saved = state.get("party_states", {})
        self.party_states = {name: dict(saved.get(name, {})) for name in self.parties}
        self.record = RoundRecord(**state["record"])

    # -- running -----------------------------------------------------------------
    def _kwargs(self) -> dict[str, Any]:
        c = self.cfg
        return dict(
            seed=c.seed,
            measure_flops=c.measure_flops,
            measure_memory=c.measure_memory,
            parties=self.parties,
        )

    def _party_states_for(self, cid: int) -> dict[str, bytes | None]:
        return {
            name: self.party_states[name].get(cid if spec.scope == "client" else SHARED)
            for name, spec in self.parties.items()
        }

    def _keep(self, cid: int, result: _Result, *, parallel: bool) -> None:
        """Store what a client step changed: its state, its round state, its parties' states."""
        for store, value in (
            (self.client_states, result.state),
            (self._round_states, result.round_state),
        ):
            if value is not None:
                store[cid] = value
            else:
                store.pop(cid, None)
        for name, value in result.party_states.items():
            key = cid if self.parties[name].scope == "client" else SHARED
            states = self.party_states[name]
            if parallel and key == SHARED and value != states.get(SHARED):
                where, fix = self._concurrent
                raise ConfigError(
                    f"shared side party {name!r} changed its state {where}, where the change would be lost; {fix}"
                )
            if value is not None:
                states[key] = value
            else:
                states.pop(key, None)

    def _task(self, cid: int, rnd: int, phase: int, message: bytes) -> _Task:
        return _Task(
            cid,
            rnd,
            phase,
            message,
            self.client_states.get(cid),
            self._round_states.get(cid),
            self._party_states_for(cid),
        )

    def _run_clients(
        self, rnd: int, phase: int, messages: list[tuple[int, bytes]]
    ) -> tuple[dict[int, _Result], dict[int, str]]:
        """Run the addressed clients: their results by client id, and why each client that gave
        none failed (always empty here, where a client's exception is a bug and propagates; a
        runtime with real devices reports them)."""
        total = len(messages)
        if self.cfg.workers > 0 and total > 1:
            if self._pool is None:
                ctx = mp.get_context("fork")
                self._pool = ctx.Pool(
                    self.cfg.workers, _worker_init, (self.program, self.clients, self._kwargs())
                )
            tasks = [self._task(cid, rnd, phase, m) for cid, m in messages]
            chunk = max(1, total // (4 * self.cfg.workers))
            results = {}
            for i, result in enumerate(self._pool.imap(_worker_task, tasks, chunksize=chunk)):
                self._keep(tasks[i].cid, result, parallel=True)
                results[tasks[i].cid] = result
                if self.on_progress is not None:
                    self.on_progress(rnd, phase, i + 1, total)
            return results, {}
        kw = self._kwargs()
        results = {}
        for i, (cid, m) in enumerate(
            messages
        ):  # sequential: a shared party's state flows client to client
            result = execute_client(
                self.program, self.clients[cid], self._task(cid, rnd, phase, m), **kw
            )
            self._keep(cid, result, parallel=False)
            results[cid] = result
            if self.on_progress is not None:
                self.on_progress(rnd, phase, i + 1, total)
        return results, {}

    def _drops_out(self, rnd: int, phase: int, cid: int) -> bool:
        return drops_out(self.cfg.seed, self.cfg.dropout, rnd, phase, cid)

    def _check_failures(
        self, rnd: int, phase: int, addressed: int, replied: int, failed: Mapping[int, str]
    ) -> None:
        """Let the round go on without the ``failed`` clients' replies; or, under
        ``min_replies``, with fewer replies than that, a :class:`ShortRoundError` (the round is
        skipped); otherwise stop the run with one error naming each failed client and the way on."""
        cfg = self.cfg
        need = cfg.min_replies
        tolerant = need is not None and self.strategy.partial_replies
        if tolerant and replied >= (need or 0):
            return
        listed = "; ".join(f"client {cid}: {why}" for cid, why in sorted(failed.items())[:5])
        more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
        head = f"round {rnd}, exchange {phase + 1}: {len(failed)} of {addressed} clients gave no result ({listed}{more})"
        if tolerant:
            raise ShortRoundError(
                f"{head}; only {replied} replied, fewer than clients.min_replies={need}"
            )
        if not self.strategy.partial_replies:
            why = (
                f"this method ({type(self.strategy).__name__}) needs every addressed client's reply, "
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

    def sample(self, rnd: int) -> list[int]:
        """The clients of round ``rnd``: the strategy's own draw if it makes one, else
        ``per_round`` of those it finds eligible."""
        own = self.strategy.select_clients(rnd, len(self.clients), self.cfg.per_round)
        if own is not None:
            return sorted(own)
        eligible = None
        if self.profiles is not None:
            eligible = [
                c for c, p in enumerate(self.profiles) if self.strategy.eligible_client(c, p)
            ]
            if not eligible:
                raise ConfigError(
                    f"round {rnd}: no client's device profile is eligible for this method; "
                    "check clients.profiles against the method's requirements"
                )
        return sample_clients(self.cfg.seed, rnd, len(self.clients), self.cfg.per_round, eligible)

    def run_round(self, rnd: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        cfg = self.cfg
        ids = self.sample(rnd)
        acc = _RoundTotals()
        exchanges = 0
        replied: list[int] = []  # the clients that replied to the round's last exchange
        self._round_states.clear()
        self._failed, self._simulated = {}, set()
        # a round too short to complete is skipped under min_replies: the strategy as before it
        before = copy.deepcopy(self.strategy.state_dict()) if cfg.min_replies is not None else None
        rounds = self.strategy.round(rnd, ids)
        try:
            step = next(rounds)
            while True:
                if isinstance(step, Exchange):
                    addressed = set(step.messages)
                    if exchanges == 0 and addressed != set(ids):
                        missing = sorted(set(ids) - addressed)
                        raise MessageError(
                            f"round {rnd}: strategy configured no message for clients {missing[:10]}"
                        )
                    if not addressed <= set(ids):
                        raise MessageError(
                            f"round {rnd}: exchange {exchanges + 1} addresses clients "
                            f"{sorted(addressed - set(ids))[:10]} not sampled this round"
                        )
                    replies = self._exchange(rnd, exchanges, step.messages, acc)
                    exchanges += 1
                    replied = sorted(replies)
                    step = rounds.send(replies)
                    del replies
                elif isinstance(step, PartyCall):
                    step = rounds.send(self._server_call(rnd, step, acc))
                else:
                    raise TypeError(
                        f"round {rnd}: a strategy's round yields Exchange or PartyCall, got {type(step).__name__}"
                    )
        except StopIteration as stop:
            agg: dict[str, Any] = dict(stop.value or {})
            self._record_aggregated(rnd, replied)
        except ShortRoundError as short:
            if before is None:
                raise
            rounds.close()
            self.strategy.load_state_dict(before)
            self.strategy.round_skipped(
                rnd
            )  # e.g. privacy the round spent, which the restore must not undo
            agg = {"round_skipped": 1}
            self.record.extra.setdefault("skipped_rounds", {})[str(rnd)] = str(short)
        finally:
            self._round_states.clear()  # round secrets never outlive the round
        client = acc.client
        bytes_down, bytes_up, flops = acc.bytes_down, acc.bytes_up, client.flops

        r = self.record
        r.round = rnd
        r.cum_bytes_down += bytes_down
        r.cum_bytes_up += bytes_up
        r.cum_client_flops += flops
        line: dict[str, Any] = {"round": rnd, "clients": len(ids)}
        if cfg.min_replies is not None:
            line["clients_failed"] = len(self._failed)
        if rnd % cfg.eval_every == 0 or rnd == cfg.rounds:
            ev = self._evaluate(rnd, self.strategy.eval_model(), line)
            r.last_test_accuracy = ev["test_accuracy"]
            r.best_test_accuracy = max(r.best_test_accuracy or 0.0, ev["test_accuracy"])
            for name, model in self.strategy.side_eval_models().items():
                self._evaluate(rnd, model, line, prefix=f"{name}_")
        else:
            line.update(test_accuracy=None, test_loss=None)
        line.update(
            bytes_down=bytes_down,
            bytes_up=bytes_up,
            client_flops=flops,
            cum_bytes_down=r.cum_bytes_down,
            cum_bytes_up=r.cum_bytes_up,
            cum_client_flops=r.cum_client_flops,
        )
        if exchanges > 1:
            line["phases"] = exchanges
        if self.parties:
            line.update(side_bytes_down=client.side_bytes_down, side_bytes_up=client.side_bytes_up)
            for link, n in sorted(acc.links.items()):
                line[f"bytes.{link}"] = n
            for name, cost in sorted(acc.parties.items()):
                line[f"flops.{name}"] = cost.flops
                line[f"wall_s.{name}"] = cost.wall_s
                if cfg.measure_memory:
                    line[f"tensor_peak_bytes.{name}"] = cost.tensor_peak_bytes
        if cfg.measure_memory:
            line.update(
                client_tensor_peak_bytes=client.tensor_peak_bytes,
                client_peak_bytes=client.rss_peak_bytes,
            )
        line.update({k: v for k, v in agg.items() if k not in line})
        line.update({k: v for k, v in self.strategy.round_metrics(line).items() if k not in line})
        line["client_wall_s"] = client.wall_s
        line["wall_s"] = time.perf_counter() - t0
        return line

    def _record_aggregated(self, rnd: int, replied: list[int]) -> None:
        """Note, for each client, the first completed round that aggregated its reply
        (``record.extra["first_aggregated"]``, client id -> round): the clients the strategy
        names (:meth:`~fedge.core.protocols.Strategy.aggregated_clients`: secure aggregation's
        survivors, PPFL's opened uploads, EPPFL's uploads not lost), else those that replied to
        the round's last exchange. A client never sampled, one that dropped out and every client
        of a skipped round are absent: the global model after round r trained on the samples of
        exactly the clients noted at a round <= r (membership inference draws its members there)."""
        own = self.strategy.aggregated_clients()
        first = self.record.extra.setdefault("first_aggregated", {})
        for cid in replied if own is None else own:
            first.setdefault(str(cid), rnd)  # str keys: the record is written as JSON

    def _evaluate(
        self, rnd: int, model: torch.nn.Module, line: dict[str, Any], *, prefix: str = ""
    ) -> dict[str, Any]:
        """``model``'s test figures (and validation figures, as ``val_*``) into ``line`` under
        ``prefix``; the record keeps, per prefix, the test accuracy at the round of best
        validation accuracy (``{prefix}test_at_best_val``, ``{prefix}best_val_accuracy``,
        ``{prefix}best_val_round`` in ``record.extra``). Returns the test figures."""
        cfg, r = self.cfg, self.record
        ev = evaluate(
            model, *self.test, batch_size=cfg.eval_batch_size, num_classes=self.num_classes
        )
        line.update({prefix + k: v for k, v in ev.items()})
        if self.validation is not None:
            val = evaluate(
                model,
                *self.validation,
                batch_size=cfg.eval_batch_size,
                num_classes=self.num_classes,
            )
            line.update({prefix + k.replace("test_", "val_"): v for k, v in val.items()})
            if val["test_accuracy"] > r.extra.get(f"{prefix}best_val_accuracy", -1.0):
                r.extra.update(
                    {
                        f"{prefix}best_val_accuracy": val["test_accuracy"],
                        f"{prefix}test_at_best_val": ev["test_accuracy"],
                        f"{prefix}best_val_round": rnd,
                    }
                )
        return ev

    def _server_call(self, rnd: int, call: PartyCall, acc: _RoundTotals) -> Message:
        """A strategy's call to a server-side party, metered on the party's account."""
        spec = self.parties.get(call.party)
        if spec is None:
            raise ConfigError(
                f"round {rnd}: the strategy called side party {call.party!r}; known: {sorted(self.parties)}"
            )
        key = SHARED if spec.scope == "shared" or call.key is None else call.key
        up = call.message.to_bytes()
        meter = Meter(flops=self.cfg.measure_flops, memory=self.cfg.measure_memory)
        ctx = PartyContext(
            spec.name,
            None if key == SHARED else key,
            rnd,
            decode_state(self.party_states[spec.name].get(key)),
            generator(self.cfg.seed, "party", spec.name, key, rnd, "server"),
            meter,
        )
        with meter.measure():
            reply = spec.factory().handle(Message.from_bytes(up), ctx)
        if not isinstance(reply, Message):
            raise MessageError(
                f"side party {spec.name!r} returned {type(reply).__name__}; expected a Message"
            )
        down = reply.to_bytes()
        if ctx.state:
            self.party_states[spec.name][key] = encode_state(ctx.state)
        else:
            self.party_states[spec.name].pop(key, None)
        acc.add_party(spec.name, meter.stats)
        for link, n in ((f"server->{spec.name}", len(up)), (f"{spec.name}->server", len(down))):
            acc.links[link] = acc.links.get(link, 0) + n
        return Message.from_bytes(down)

    def _exchange(
        self, rnd: int, phase: int, messages: dict[int, Message], acc: _RoundTotals
    ) -> dict[int, Message]:
        """Send ``messages``, run the addressed clients, return the decoded replies of those
        that delivered (all of them, unless the strategy takes partial replies)."""
        encoded: dict[int, bytes] = {}  # id(message) -> bytes: a broadcast is encoded once
        ids = sorted(messages)
        outgoing: list[tuple[int, bytes]] = []
        failed: dict[int, str] = {}
        for cid in ids:
            if cid in self._failed:  # failed earlier this round: nothing more is sent to it
                failed[cid] = f"failed earlier this round ({self._failed[cid]})"
                continue
            m = messages[cid]
            b = encoded.get(id(m))
            if b is None:
                b = encoded[id(m)] = m.to_bytes()
            acc.bytes_down += len(b)
            if self._drops_out(rnd, phase, cid):
                failed[cid] = f"dropped out (clients.dropout={self.cfg.dropout:g})"
                self._simulated.add(cid)
                continue
            outgoing.append((cid, b))
        del encoded
        results, lost = self._run_clients(rnd, phase, outgoing)
        failed.update(lost)
        if failed:
            self._failed.update(
                {cid: why for cid, why in failed.items() if cid not in self._failed}
            )
            self._check_failures(rnd, phase, len(ids), len(results), failed)
        replies: dict[int, Message] = {}
        for cid in sorted(results):
            result = results[cid]
            acc.bytes_up += len(result.reply)
            msg = Message.from_bytes(result.reply)
            msg.check_finite(who=f"round {rnd}, client {cid}")
            replies[cid] = msg
            acc.add(result.stats)
        return replies

    def run(self, *, start_round: int | None = None) -> RoundRecord:
        """Run rounds ``record.round + 1 .. rounds`` (after a restore, the remaining ones)."""
        first = start_round if start_round is not None else self.record.round + 1
        try:
            for rnd in range(first, self.cfg.rounds + 1):
                reason = self.strategy.stop_reason(rnd)
                if reason is not None:
                    self.record.extra["stopped"] = reason
                    break
                line = self.run_round(rnd)
                if self.on_round is not None:
                    self.on_round(line, self)
        finally:
            self.close()
        return self.record

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
