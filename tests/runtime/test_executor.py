"""The client-executor seam: in-process and worker executors agree step for step; the states
store refuses a shared party's change where it would be lost; the engine's round runs on any
executor, a scripted one included (no client program runs)."""

import os
import signal

import pytest
import torch

from fedge.core.config import load_config
from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.meter import StepStats
from fedge.core.protocols import PartySpec
from fedge.experiment.build import build_run
from fedge.runtime.engine import EngineConfig, Simulation, decode_state
from fedge.runtime.executor import (
    SHARED,
    WORKER_DIED,
    ClientExecutor,
    ClientResult,
    ClientStates,
    Concurrent,
    ExchangeOutcome,
    InProcessExecutor,
    StepSettings,
    WorkerExecutor,
    local_executor,
)
from tests.runtime.test_engine import DrawClient, EchoStrategy, PartialEcho, _clients


def _messages(ids):
    return [(cid, Message({"x": torch.full((cid + 1,), float(cid))}).to_bytes()) for cid in ids]


class MatMulDraw:
    """FLOPs that depend on the client (a matmul of its own size), a draw, a state counter."""

    def run(self, message, ctx):
        n = int(message.arrays["x"].numel())
        y = torch.ones(n, 4) @ torch.ones(4, 3)
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1
        return Message({"v": y.sum(0) + torch.randn(3, generator=ctx.generator)})


class DiesOnClientTwo:
    """A client program whose step for client 2 ends its process at once, as the OS's
    out-of-memory killer would (no exception, no reply)."""

    def run(self, message, ctx):
        if ctx.cid == 2:
            os._exit(9)
        return Message({"v": torch.full((1,), float(ctx.cid))})


def test_a_worker_that_dies_fails_its_clients_instead_of_hanging():
    """Client 2's worker dies: the exchange returns (a pool that lost a task would wait for it
    forever; an alarm fails the test instead), client 2 and whatever else gave no result are
    failed with the reason, the results that came are kept, and the next exchange runs on a
    new pool."""
    clients, settings = _clients(5), StepSettings(seed=3)
    pool = WorkerExecutor(DiesOnClientTwo(), clients, settings, workers=2)
    signal.alarm(120)
    try:
        first = pool.run(1, 0, _messages(range(5)), ClientStates({}))
        second = pool.run(2, 0, _messages([0, 1, 3, 4]), ClientStates({}))
    finally:
        signal.alarm(0)
        pool.close()
    assert 2 in first.failed and set(first.failed.values()) == {WORKER_DIED}
    assert sorted([*first.results, *first.failed]) == list(range(5))
    for cid, result in first.results.items():
        assert Message.from_bytes(result.reply).arrays["v"].item() == cid
    assert sorted(second.results) == [0, 1, 3, 4] and not second.failed


def test_a_worker_that_died_while_idle_costs_no_client():
    """Between exchanges the OS kills a worker: the next exchange runs whole on a new pool."""
    clients, settings = _clients(4), StepSettings(seed=3)
    pool = WorkerExecutor(MatMulDraw(), clients, settings, workers=2)
    signal.alarm(120)
    try:
        pool.run(1, 0, _messages(range(4)), ClientStates({}))
        victim = next(iter(pool._pool._processes.values()))
        victim.kill()
        victim.join()
        again = pool.run(2, 0, _messages(range(4)), ClientStates({}))
    finally:
        signal.alarm(0)
        pool.close()
    assert sorted(again.results) == list(range(4)) and not again.failed


def test_a_run_whose_worker_dies_stops_naming_its_clients(tiny):
    """Through the engine (``clients.workers=2``, no ``clients.min_replies``): the round stops
    with a MessageError naming the failed clients and the worker's death."""
    cfg = load_config(tiny(**{"clients.workers": 2, "clients.num": 4, "clients.per_round": 4}))
    run = build_run(cfg)
    sim = run.simulation()
    sim.executor.program = DiesOnClientTwo()  # the program the pool's workers fork with
    signal.alarm(120)
    try:
        with pytest.raises(MessageError, match="worker process ended abruptly") as exc:
            sim.run_round(1)
    finally:
        signal.alarm(0)
        sim.close()
    assert "round 1, exchange 1:" in str(exc.value) and "client 2" in str(exc.value)


def test_in_process_and_worker_executors_give_the_same_replies_states_and_measurements():
    clients, settings = _clients(5), StepSettings(seed=3)
    states = [ClientStates({}), ClientStates({})]
    outcomes = [
        InProcessExecutor(MatMulDraw(), clients, settings).run(1, 0, _messages(range(5)), states[0])
    ]
    pool = WorkerExecutor(MatMulDraw(), clients, settings, workers=2)
    try:
        outcomes.append(pool.run(1, 0, _messages(range(5)), states[1]))
    finally:
        pool.close()
    alone, workers = outcomes
    assert sorted(alone.results) == sorted(workers.results) == list(range(5))
    assert not alone.failed and not workers.failed
    for cid in range(5):
        a, w = alone.results[cid], workers.results[cid]
        assert a.reply == w.reply and a.state == w.state
        assert a.stats.flops == w.stats.flops == 2 * (cid + 1) * 4 * 3  # the matmul's
    assert states[0].client == states[1].client
    assert {decode_state(b)["calls"] for b in states[0].client.values()} == {1}


def test_the_worker_executor_runs_an_exchange_of_one_client_in_this_process():
    pool = WorkerExecutor(MatMulDraw(), _clients(2), StepSettings(seed=0), workers=2)
    outcome = pool.run(1, 0, _messages([1]), ClientStates({}))
    assert list(outcome.results) == [1] and pool._pool is None


def test_local_executor_follows_clients_workers():
    settings = StepSettings(seed=0)
    assert type(local_executor(DrawClient(), _clients(1), settings, 0)) is InProcessExecutor
    assert type(local_executor(DrawClient(), _clients(1), settings, 2)) is WorkerExecutor


def test_progress_counts_the_clients_done():
    seen = []
    InProcessExecutor(DrawClient(), _clients(3), StepSettings(seed=0)).run(
        1, 0, _messages(range(3)), ClientStates({}), lambda done, total: seen.append((done, total))
    )
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_states_keep_refuses_a_shared_party_change_only_where_it_would_be_lost():
    class Edge:
        def handle(self, message, ctx):
            return message

    states = ClientStates({"edge": PartySpec("edge", Edge, scope="shared")})
    states.party["edge"][SHARED] = b"old"
    changed = ClientResult(b"", None, None, {"edge": b"new"}, StepStats())
    with pytest.raises(ConfigError, match=r"changed its state on a bus, where .* lost; walk$"):
        states.keep(0, changed, Concurrent("on a bus", "walk"))
    assert states.party["edge"][SHARED] == b"old"
    states.keep(0, changed)  # sequential: the next client sees it
    assert states.party["edge"][SHARED] == b"new"
    assert states.task(4, 2, 1, b"m").party_states == {"edge": b"new"}


class Scripted(ClientExecutor):
    """Runs no client: each client replies ``{"v": [cid, 0, 0]}`` at 10·cid FLOPs, except the
    clients in ``unplugged``, which fail; counts its own traffic as ``wire``."""

    metric_keys = ("wire",)

    def __init__(self, unplugged=()):
        self.unplugged, self.calls = set(unplugged), []

    def run(self, rnd, phase, messages, states, progress=None):
        self.calls.append((rnd, phase, [cid for cid, _ in messages]))
        results = {
            cid: ClientResult(
                Message({"v": torch.tensor([float(cid), 0.0, 0.0])}).to_bytes(),
                None,
                None,
                {},
                StepStats(flops=10 * cid),
            )
            for cid, _ in messages
            if cid not in self.unplugged
        }
        failed = {cid: "unplugged" for cid, _ in messages if cid in self.unplugged}
        return ExchangeOutcome(results, failed, {"wire": 7 * len(messages)})


def _scripted_sim(executor, strategy=None, min_replies=None, dropout=0.0):
    return Simulation(
        strategy=strategy or PartialEcho(),
        program=DrawClient(),  # never run: the executor replies
        clients=_clients(4),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(
            seed=0,
            rounds=1,
            per_round=4,
            measure_flops=True,  # the line reports the executor's (scripted) FLOPs
            min_replies=min_replies,
            dropout=dropout,
        ),
        executor=executor,
    )


def test_the_round_runs_on_a_scripted_executor_without_running_a_client():
    executor = Scripted(unplugged=[2])
    sim = _scripted_sim(executor, min_replies=2)
    line = sim.run_round(1)
    assert executor.calls == [(1, 0, [0, 1, 2, 3])]
    assert sim.strategy.seen == [[0, 1, 3]] and sim.strategy.total == 0 + 1 + 3
    reply = len(Message({"v": torch.zeros(3)}).to_bytes())
    assert line["bytes_down"] == 4 * len(Message(config={"seed": 1}).to_bytes())
    assert line["bytes_up"] == 3 * reply and line["client_flops"] == 10 * (0 + 1 + 3)
    assert line["clients_failed"] == 1 and line["wire"] == 28
    assert list(line)[-2:] == ["wire", "wall_s"]  # the executor's counters close the line


def test_a_failure_the_executor_reports_stops_a_round_that_needs_every_reply():
    sim = _scripted_sim(Scripted(unplugged=[1, 3]), strategy=EchoStrategy())
    with pytest.raises(MessageError, match=r"2 of 4 clients gave no result \(client 1: unplugged"):
        sim.run_round(1)


def test_a_dropped_out_client_never_reaches_the_executor():
    from fedge.runtime.engine import drops_out

    executor = Scripted()
    sim = _scripted_sim(executor, min_replies=1, dropout=0.5)
    line = sim.run_round(1)
    kept = [c for c in range(4) if not drops_out(0, 0.5, 1, 0, c)]
    assert 0 < len(kept) < 4  # the seed drops some and keeps some
    assert executor.calls == [(1, 0, kept)] and line["clients_failed"] == 4 - len(kept)
