"""Client executors: what runs an exchange's client steps, from message bytes to reply bytes,
behind one interface (:class:`ClientExecutor`): in this process (:class:`InProcessExecutor`),
in forked workers (:class:`WorkerExecutor`) or on Flower nodes. Design notes: docs/decisions.md#runtime-and-engine.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from fedge.core.context import ClientContext, ClientData, Link, decode_state, encode_state
from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.meter import Meter, StepStats
from fedge.core.protocols import ClientProgram, PartySpec
from fedge.core.rng import generator

__all__ = [
    "SHARED",
    "ClientExecutor",
    "ClientResult",
    "ClientStates",
    "ClientTask",
    "Concurrent",
    "ExchangeOutcome",
    "InProcessExecutor",
    "StepSettings",
    "WorkerExecutor",
    "execute_client",
]

SHARED = -1  # the state key of a shared party's single instance

T = TypeVar("T")

#: called as an exchange's clients finish: (clients done, clients in the exchange)
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ClientTask:
    """One client step: the message it answers and the states it starts from."""

    cid: int
    rnd: int
    phase: int
    message: bytes
    state: bytes | None
    round_state: bytes | None
    party_states: dict[str, bytes | None]


@dataclass
class ClientResult:
    """What one client step gave back: its reply, its states after the step, its cost."""

    reply: bytes
    state: bytes | None
    round_state: bytes | None
    party_states: dict[str, bytes | None]
    stats: StepStats


@dataclass(frozen=True)
class StepSettings:
    """What every client step of a run is given besides its task."""

    seed: int
    measure_flops: bool = True
    measure_memory: bool = False
    parties: Mapping[str, PartySpec] = field(default_factory=dict)
    device: torch.device | None = None  # where a step's batches go (None: where the data is)

    def kwargs(self) -> dict[str, Any]:
        """As :func:`execute_client`'s keyword arguments."""
        return dict(
            seed=self.seed,
            measure_flops=self.measure_flops,
            measure_memory=self.measure_memory,
            parties=self.parties,
            device=self.device,
        )


class Concurrent(NamedTuple):
    """Where an executor runs client steps side by side, and how to let a shared party's state
    change there (where the change would be lost)."""

    where: str
    fix: str


@dataclass
class ExchangeOutcome:
    """An executor's answer for one exchange: the results by client id, why each client that
    gave none failed, and the executor's own traffic counters
    (:attr:`ClientExecutor.metric_keys`)."""

    results: dict[int, ClientResult]
    failed: dict[int, str] = field(default_factory=dict)
    transport: dict[str, int] = field(default_factory=dict)


def execute_client(
    program: ClientProgram,
    data: ClientData,
    task: ClientTask,
    *,
    seed: int,
    measure_flops: bool,
    measure_memory: bool,
    parties: Mapping[str, PartySpec],
    device: torch.device | None = None,
) -> ClientResult:
    """Run one client step from message bytes to reply bytes (the unit every executor runs):
    on ``device`` (None: where the client's data is), its data moved there
    (:meth:`ClientData.to`), its peak memory on a CUDA device from the CUDA allocator."""
    meter = Meter(flops=measure_flops, memory=measure_memory, device=device)
    if device is not None:
        data = data.to(device)
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
    return ClientResult(
        reply.to_bytes(),
        encode_state(ctx.state) if ctx.state else None,
        encode_state(ctx.round_state) if ctx.round_state else None,
        {name: link.state_bytes for name, link in links.items()},
        meter.stats,
    )


class ClientStates:
    """The clients' states the engine keeps (and checkpoints): each client's persistent state,
    its scratch state for the current round (never checkpointed), and each side party's state
    (one per client for ``scope="client"``, one under :data:`SHARED` for a shared party)."""

    def __init__(self, parties: Mapping[str, PartySpec]) -> None:
        self.parties = dict(parties)
        self.client: dict[int, bytes] = {}
        self.round: dict[int, bytes] = {}
        self.party: dict[str, dict[int, bytes]] = {name: {} for name in self.parties}

    def party_states_for(self, cid: int) -> dict[str, bytes | None]:
        """The states of the side parties client ``cid`` reaches."""
        return {
            name: self.party[name].get(cid if spec.scope == "client" else SHARED)
            for name, spec in self.parties.items()
        }

    def task(self, cid: int, rnd: int, phase: int, message: bytes) -> ClientTask:
        """Client ``cid``'s step on ``message``, from the states it holds now."""
        return ClientTask(
            cid,
            rnd,
            phase,
            message,
            self.client.get(cid),
            self.round.get(cid),
            self.party_states_for(cid),
        )

    def keep(self, cid: int, result: ClientResult, concurrent: Concurrent | None = None) -> None:
        """Store what a client step changed: its state, its round state, its parties' states.
        ``concurrent``: the step ran beside others (there a shared party's state may not change)."""
        for store, value in ((self.client, result.state), (self.round, result.round_state)):
            if value is not None:
                store[cid] = value
            else:
                store.pop(cid, None)
        for name, value in result.party_states.items():
            key = cid if self.parties[name].scope == "client" else SHARED
            states = self.party[name]
            if concurrent is not None and key == SHARED and value != states.get(SHARED):
                raise ConfigError(
                    f"shared side party {name!r} changed its state {concurrent.where}, "
                    f"where the change would be lost; {concurrent.fix}"
                )
            if value is not None:
                states[key] = value
            else:
                states.pop(key, None)


class ClientExecutor(Protocol):
    """Runs an exchange's client steps for the engine. Only :meth:`run` is required; the other
    methods have defaults for an executor whose clients live in this process."""

    #: the traffic counters :meth:`run` reports, added to every metrics line (0 when none ran)
    metric_keys: tuple[str, ...] = ()

    def run(
        self,
        rnd: int,
        phase: int,
        messages: Sequence[tuple[int, bytes]],
        states: ClientStates,
        progress: Progress | None = None,
    ) -> ExchangeOutcome:
        """Run client ``cid``'s step on each ``(cid, message bytes)`` of exchange ``phase``
        (0-based) of round ``rnd``, from and into ``states``; call ``progress`` as they finish."""
        ...

    def host(self, rounds: Callable[[], T]) -> T:
        """Run the engine's ``rounds`` where this executor reaches its clients."""
        return rounds()

    def collect_states(self, states: ClientStates, rnd: int, *, strict: bool) -> None:
        """Before a checkpoint after round ``rnd``: bring into ``states`` the client states held
        elsewhere (``strict``: a client that cannot give its state is an error)."""
        return None

    def restore_states(self, states: ClientStates) -> None:
        """After the engine loaded a checkpoint into ``states``: hand the clients theirs."""
        return None

    def close(self) -> None:
        """Release what the executor holds (worker processes)."""
        return None


class InProcessExecutor(ClientExecutor):
    """Client steps one after another in this process: a shared party's state flows from
    client to client."""

    def __init__(
        self, program: ClientProgram, clients: Sequence[ClientData], settings: StepSettings
    ) -> None:
        self.program, self.clients, self.settings = program, clients, settings

    def run(
        self,
        rnd: int,
        phase: int,
        messages: Sequence[tuple[int, bytes]],
        states: ClientStates,
        progress: Progress | None = None,
    ) -> ExchangeOutcome:
        """Every step's result (a client's exception is a bug here, and propagates)."""
        kw = self.settings.kwargs()
        results = {}
        for i, (cid, m) in enumerate(messages):
            task = states.task(cid, rnd, phase, m)
            result = execute_client(self.program, self.clients[cid], task, **kw)
            states.keep(cid, result)
            results[cid] = result
            if progress is not None:
                progress(i + 1, len(messages))
        return ExchangeOutcome(results)


_WORKER: dict[str, Any] = {}


def _worker_init(
    program: ClientProgram, clients: Sequence[ClientData], kwargs: dict[str, Any]
) -> None:
    torch.set_num_threads(1)
    _WORKER.update(program=program, clients=clients, kwargs=kwargs)


def _worker_task(task: ClientTask) -> ClientResult:
    w = _WORKER
    return execute_client(w["program"], w["clients"][task.cid], task, **w["kwargs"])


#: why a client of a worker whose process ended gave no result (the exchange's ``failed``)
WORKER_DIED = (
    "its worker process ended abruptly (killed by a signal: out of memory?); lower "
    "clients.workers, or set it to 0 to run the clients in this process"
)


class WorkerExecutor(ClientExecutor):
    """Client steps in a pool of ``workers`` forked processes (started at the first exchange
    of more than one client; one torch thread each, since two torch threads per process
    collapse under contention on small machines); an exchange of one client runs in this
    process. Only bytes cross the process boundary. A worker that dies (the OS kills it) fails
    the clients of the exchange that gave no result yet (:data:`WORKER_DIED`), as a client that
    drops out does, and the next exchange starts a new pool."""

    concurrent = Concurrent(
        "in a worker process",
        "set clients.workers=0, or keep that state per client (scope='client')",
    )

    def __init__(
        self,
        program: ClientProgram,
        clients: Sequence[ClientData],
        settings: StepSettings,
        workers: int,
    ) -> None:
        self.program, self.clients, self.settings, self.workers = (
            program,
            clients,
            settings,
            workers,
        )
        self.alone = InProcessExecutor(program, clients, settings)
        self._pool: Any = None

    def run(
        self,
        rnd: int,
        phase: int,
        messages: Sequence[tuple[int, bytes]],
        states: ClientStates,
        progress: Progress | None = None,
    ) -> ExchangeOutcome:
        """Every step's result (a client's exception is a bug here, and propagates); the
        clients a dead worker left without one, failed."""
        total = len(messages)
        if total <= 1:
            return self.alone.run(rnd, phase, messages, states, progress)
        tasks = [states.task(cid, rnd, phase, m) for cid, m in messages]
        try:
            futures = [self._started().submit(_worker_task, t) for t in tasks]
        except BrokenProcessPool:  # a worker died just now: a new pool runs this exchange
            self.close()
            futures = [self._started().submit(_worker_task, t) for t in tasks]
        results, failed = {}, {}
        for i, (task, future) in enumerate(zip(tasks, futures, strict=True)):
            try:
                result = future.result()
            except BrokenProcessPool:
                failed[task.cid] = WORKER_DIED
                continue
            states.keep(task.cid, result, self.concurrent)
            results[task.cid] = result
            if progress is not None:
                progress(i + 1, total)
        if failed:
            self.close()  # the next exchange starts a new pool
        return ExchangeOutcome(results, failed)

    def _started(self) -> ProcessPoolExecutor:
        """The pool, new when there is none or one of its workers has died since it last ran."""
        processes = getattr(self._pool, "_processes", None) or {}
        if any(not p.is_alive() for p in list(processes.values())):
            self.close()
        if self._pool is None:
            # torch's FLOP counter imports torch._dynamo on first use (seconds): once here, so
            # the forked workers inherit it instead of each importing it on its first step
            importlib.import_module("torch._dynamo")
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=mp.get_context("fork"),
                initializer=_worker_init,
                initargs=(self.program, self.clients, self.settings.kwargs()),
            )
        return self._pool

    def close(self) -> None:
        """Stop the workers at once (a step still running is abandoned), then the pool."""
        if self._pool is not None:
            for process in list(getattr(self._pool, "_processes", {}).values()):
                process.terminate()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def local_executor(
    program: ClientProgram, clients: Sequence[ClientData], settings: StepSettings, workers: int
) -> ClientExecutor:
    """The executor of ``clients.workers = workers``: in this process (0) or in a worker pool."""
    if workers > 0:
        return WorkerExecutor(program, clients, settings, workers)
    return InProcessExecutor(program, clients, settings)
