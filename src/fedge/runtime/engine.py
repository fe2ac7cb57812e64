"""The in-process federated simulation engine.

One round (DESIGN.md):

    sample clients ─► strategy.configure_round ─► serialize ─► client program (per client)
        ─► serialize ─► strategy.aggregate_round ─► evaluate ─► one metrics line, checkpoint

Every message crosses a real serialization boundary in both directions, so ``bytes_down``
and ``bytes_up`` are lengths of real encoded messages and a client can never share tensors
with the server by accident. A message object returned for several clients (a broadcast)
is encoded once and charged to every client.

Clients run sequentially in this process by default, or in a pool of forked worker
processes (``workers > 0``; one torch thread each, since two torch threads per process
collapse under contention on small machines). Only bytes cross the process boundary.
Results do not depend on the number of workers, except through float summation order
if torch's own thread count differs between the two settings.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.core.protocols import ClientProgram, NextPhase, SideParty, Strategy
from fedge.core.rng import generator
from fedge.core.context import ClientContext, ClientData
from fedge.runtime.evaluate import evaluate
from fedge.core.meter import Meter, StepStats

__all__ = ["EngineConfig", "Simulation", "decode_state", "encode_state", "sample_clients"]


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


def sample_clients(seed: int, rnd: int, num_clients: int, per_round: int) -> list[int]:
    """The sorted ids of the ``per_round`` clients taking part in round ``rnd`` (seeded)."""
    if per_round >= num_clients:
        return list(range(num_clients))
    perm = torch.randperm(num_clients, generator=generator(seed, "sample", rnd))
    return sorted(perm[:per_round].tolist())


def encode_state(state: Mapping[str, Any]) -> bytes:
    """Client state (tensors and scalars) as message bytes, to cross processes and checkpoints."""
    arrays = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    config = {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
    return Message(arrays, config).to_bytes()


def decode_state(data: bytes) -> dict[str, Any]:
    msg = Message.from_bytes(data)
    return {**msg.config, **msg.arrays}


# ------------------------------------------------------------------ client execution


def execute_client(
    program: ClientProgram,
    data: ClientData,
    *,
    cid: int,
    rnd: int,
    phase: int = 0,
    message: bytes,
    state: bytes | None,
    seed: int,
    measure_flops: bool,
    measure_memory: bool,
    parties: Mapping[str, Callable[[int], SideParty]],
) -> tuple[bytes, bytes | None, StepStats]:
    """Run one client step from message bytes to reply bytes (the unit a worker executes)."""
    meter = Meter(flops=measure_flops, memory=measure_memory)
    ctx = ClientContext(
        cid=cid,
        rnd=rnd,
        data=data,
        generator=generator(seed, "client", rnd, cid),
        meter=meter,
        state=decode_state(state) if state else {},
        phase=phase,
        parties=dict(parties),
    )
    msg = Message.from_bytes(message)
    with meter.measure():
        reply = program.run(msg, ctx)
    if not isinstance(reply, Message):
        raise MessageError(f"client program returned {type(reply).__name__}; expected a Message")
    new_state = encode_state(ctx.state) if ctx.state else None
    return reply.to_bytes(), new_state, meter.stats


_WORKER: dict[str, Any] = {}


def _worker_init(program: ClientProgram, clients: list[ClientData], kwargs: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    _WORKER.update(program=program, clients=clients, kwargs=kwargs)


_Task = tuple[int, int, int, bytes, bytes | None]  # cid, round, phase, message, state


def _worker_task(task: _Task) -> tuple[bytes, bytes | None, StepStats]:
    cid, rnd, phase, message, state = task
    w = _WORKER
    return execute_client(
        w["program"], w["clients"][cid], cid=cid, rnd=rnd, phase=phase, message=message, state=state, **w["kwargs"]
    )


# ------------------------------------------------------------------ the simulation


@dataclass
class _RoundTotals:
    bytes_down: int = 0
    bytes_up: int = 0
    flops: int = 0
    side_down: int = 0
    side_up: int = 0
    client_wall: float = 0.0
    peak_tensor: int | None = None
    peak_rss: int | None = None

    def add(self, stats: StepStats) -> None:
        self.flops += stats.flops
        self.client_wall += stats.wall_s
        self.side_down += stats.side_bytes_down
        self.side_up += stats.side_bytes_up
        if stats.tensor_peak_bytes is not None:
            self.peak_tensor = max(self.peak_tensor or 0, stats.tensor_peak_bytes)
        if stats.rss_peak_bytes is not None:
            self.peak_rss = max(self.peak_rss or 0, stats.rss_peak_bytes)


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
    """Runs a Strategy and a ClientProgram over a population of clients.

    Args:
        strategy: the server side.
        program: the client side (stateless; per-client state lives in the engine).
        clients: one :class:`ClientData` per client id.
        test: (x, y) test tensors for evaluation.
        config: :class:`EngineConfig`.
        parties: side-party factories by name: ``factory(cid) -> SideParty``.
        on_round: called after each completed round with (metrics dict, engine); the run
            writer uses it to append metrics and checkpoint.
    """

    def __init__(
        self,
        *,
        strategy: Strategy,
        program: ClientProgram,
        clients: list[ClientData],
        test: tuple[torch.Tensor, torch.Tensor],
        num_classes: int,
        config: EngineConfig,
        parties: Mapping[str, Callable[[int], SideParty]] | None = None,
        on_round: Callable[[dict[str, Any], Simulation], None] | None = None,
    ) -> None:
        self.strategy, self.program, self.clients = strategy, program, clients
        self.test, self.num_classes, self.cfg = test, num_classes, config
        self.parties = dict(parties or {})
        self.on_round = on_round
        self.client_states: dict[int, bytes] = {}
        self.record = RoundRecord()
        self._pool: Any = None

    # -- checkpointing -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "strategy": self.strategy.state_dict(),
            "client_states": dict(self.client_states),
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
        self.record = RoundRecord(**state["record"])

    # -- running -----------------------------------------------------------------
    def _kwargs(self) -> dict[str, Any]:
        c = self.cfg
        return dict(seed=c.seed, measure_flops=c.measure_flops, measure_memory=c.measure_memory, parties=self.parties)

    def _run_clients(self, tasks: list[_Task]) -> list[tuple[bytes, bytes | None, StepStats]]:
        if self.cfg.workers > 0 and len(tasks) > 1:
            if self._pool is None:
                ctx = mp.get_context("fork")
                self._pool = ctx.Pool(self.cfg.workers, _worker_init, (self.program, self.clients, self._kwargs()))
            chunk = max(1, len(tasks) // (4 * self.cfg.workers))
            return list(self._pool.imap(_worker_task, tasks, chunksize=chunk))
        kw = self._kwargs()
        return [
            execute_client(self.program, self.clients[cid], cid=cid, rnd=r, phase=ph, message=m, state=s, **kw)
            for cid, r, ph, m, s in tasks
        ]

    def run_round(self, rnd: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        cfg = self.cfg
        ids = sample_clients(cfg.seed, rnd, len(self.clients), cfg.per_round)
        messages = self.strategy.configure_round(rnd, ids)
        missing = set(ids) - set(messages)
        if missing:
            raise MessageError(f"round {rnd}: strategy configured no message for clients {sorted(missing)[:10]}")
        acc = _RoundTotals()
        phase = 0
        while True:
            replies = self._exchange(rnd, phase, messages, acc)
            agg = self.strategy.aggregate_round(rnd, replies)
            del replies
            if not isinstance(agg, NextPhase):
                break
            unknown = set(agg.messages) - set(ids)
            if unknown:
                raise MessageError(f"round {rnd}: next phase addresses clients {sorted(unknown)[:10]} not sampled this round")
            messages, phase = agg.messages, phase + 1
        bytes_down, bytes_up, flops = acc.bytes_down, acc.bytes_up, acc.flops

        r = self.record
        r.round = rnd
        r.cum_bytes_down += bytes_down
        r.cum_bytes_up += bytes_up
        r.cum_client_flops += flops
        line: dict[str, Any] = {"round": rnd, "clients": len(ids)}
        if rnd % cfg.eval_every == 0 or rnd == cfg.rounds:
            ev = evaluate(self.strategy.eval_model(), *self.test, batch_size=cfg.eval_batch_size, num_classes=self.num_classes)
            line.update(ev)
            r.last_test_accuracy = ev["test_accuracy"]
            r.best_test_accuracy = max(r.best_test_accuracy or 0.0, ev["test_accuracy"])
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
        if phase:
            line["phases"] = phase + 1
        if self.parties:
            line.update(side_bytes_down=acc.side_down, side_bytes_up=acc.side_up)
        if cfg.measure_memory:
            line.update(client_tensor_peak_bytes=acc.peak_tensor, client_peak_bytes=acc.peak_rss)
        if "effective_flops_ratio" in agg:  # dense kernels on a sparse model: also log non-zero FLOPs
            eff = round(flops * float(agg["effective_flops_ratio"]))
            r.extra["cum_client_flops_effective"] = r.extra.get("cum_client_flops_effective", 0) + eff
            line.update(client_flops_effective=eff, cum_client_flops_effective=r.extra["cum_client_flops_effective"])
        line.update({k: v for k, v in agg.items() if k not in line})
        line["client_wall_s"] = acc.client_wall
        line["wall_s"] = time.perf_counter() - t0
        return line

    def _exchange(self, rnd: int, phase: int, messages: dict[int, Message], acc: _RoundTotals) -> dict[int, Message]:
        """Send ``messages``, run the addressed clients, return their decoded replies."""
        encoded: dict[int, bytes] = {}  # id(message) -> bytes: a broadcast is encoded once
        ids = sorted(messages)
        tasks: list[_Task] = []
        for cid in ids:
            m = messages[cid]
            b = encoded.get(id(m))
            if b is None:
                b = encoded[id(m)] = m.to_bytes()
            acc.bytes_down += len(b)
            tasks.append((cid, rnd, phase, b, self.client_states.get(cid)))
        del encoded
        results = self._run_clients(tasks)
        replies: dict[int, Message] = {}
        for cid, (reply, state, stats) in zip(ids, results, strict=True):
            acc.bytes_up += len(reply)
            msg = Message.from_bytes(reply)
            msg.check_finite(who=f"round {rnd}, client {cid}")
            replies[cid] = msg
            if state is not None:
                self.client_states[cid] = state
            else:
                self.client_states.pop(cid, None)
            acc.add(stats)
        return replies

    def run(self, *, start_round: int | None = None) -> RoundRecord:
        """Run rounds ``record.round + 1 .. rounds`` (after a restore, the remaining ones)."""
        first = (start_round if start_round is not None else self.record.round + 1)
        try:
            for rnd in range(first, self.cfg.rounds + 1):
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
