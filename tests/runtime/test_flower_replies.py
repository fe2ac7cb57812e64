"""Replies that come late and messages the SuperLink refuses, on Flower's own grids and engine.

Ray's path: Flower's simulation engine (``flwr.server.superlink.fleet.vce.vce_api.run_api``: its
LinkState, message queue and worker threads; the ServerApp side its ``InMemoryGrid``) with Ray
replaced by a backend that runs the ClientApp in the worker thread, on a copy of the node's
Context that the engine writes back when the step returns, as Ray's actors do. A deployment's
path: Flower's ``HttpGrid`` calling the SuperLink's runtime API handlers
(``flwr.superlink.servicer.runtime.runtime_handlers``) in this process instead of over HTTP.
Nothing here starts Ray or opens a socket.
"""

from __future__ import annotations

import copy
import re
import secrets
import threading
import time
import warnings
from collections import Counter
from contextlib import contextmanager

import pytest

pytest.importorskip("flwr", reason="flwr is not installed (pip install 'fedge[flower]')")

import torch  # noqa: E402
from flwr.app import Message, RecordDict  # noqa: E402
from flwr.common.constant import NOOP_FLWR_AID, SUPERLINK_NODE_ID, ErrorCode  # noqa: E402
from flwr.proto.task_pb2 import Task  # noqa: E402
from flwr.server.superlink.fleet.vce import vce_api  # noqa: E402
from flwr.server.superlink.fleet.vce.backend.backend import Backend  # noqa: E402
from flwr.server.superlink.fleet.vce.metrics import VceMetrics  # noqa: E402
from flwr.server.superlink.linkstate import LinkStateFactory  # noqa: E402
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord  # noqa: E402
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID  # noqa: E402
from flwr.supercore.object_store import ObjectStoreFactory  # noqa: E402
from flwr.supercore.run import Run  # noqa: E402
from flwr.superlink.federation import NoOpFederationManager  # noqa: E402
from flwr.superlink.grid import HttpGrid, InMemoryGrid  # noqa: E402
from flwr.superlink.servicer.runtime import runtime_handlers  # noqa: E402

import fedge.runtime.engine as engine  # noqa: E402
from fedge.core.errors import MessageError  # noqa: E402
from fedge.core.messages import Message as FedgeMessage  # noqa: E402
from fedge.runtime.engine import EngineConfig, decode_state  # noqa: E402
from fedge.runtime.flower import client_app, flower_simulation  # noqa: E402
from fedge.runtime.flower.adapter import RECORD  # noqa: E402
from fedge.runtime.flower.grid import server_identity  # noqa: E402
from tests.runtime.test_engine import EchoStrategy, _clients  # noqa: E402


class _ThreadBackend(Backend):
    """Flower's simulation backend without Ray: ``workers`` ClientApps at a time, each on a copy
    of the node's Context (Ray pickles it to an actor and returns the actor's copy)."""

    def __init__(self, workers: int) -> None:
        self.workers, self.app = workers, None

    def build(self, app_fn):
        self.app = app_fn()

    @property
    def num_workers(self) -> int:
        return self.workers

    def is_worker_idle(self) -> bool:
        return True

    def terminate(self) -> None:
        pass

    def process_message(self, message, context):
        context = copy.deepcopy(context)
        return self.app(message, context), context


def _link_state():
    """A SuperLink's in-memory LinkState holding one run (as ``flwr.simulation.run_simulation``
    makes it), the run, and the ServerApp's task in it."""
    state_factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    run = Run.create_empty(run_id=secrets.randbits(63))
    run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
    state = state_factory.state()
    state.run_ids[run.run_id] = RunRecord(run=run)
    task = state.task_store[1] = Task(task_id=1, run_id=run.run_id)
    server_identity(run.run_id)
    return state_factory, run, task


@contextmanager
def _flower_engine(app, num_nodes: int, *, workers: int = 2):
    """Flower's simulation engine (Ray swapped for :class:`_ThreadBackend`) running ``app`` on
    ``num_nodes`` nodes: yields the ServerApp's InMemoryGrid, the engine's node stores, and the
    SuperLink's LinkState."""
    state_factory, run, _ = _link_state()
    state = state_factory.state()
    grid = InMemoryGrid(state_factory=state_factory, pull_interval=0.02)
    grid.set_run(run)
    nodes = vce_api._register_nodes(num_nodes, state_factory)
    stores = vce_api._register_node_info_stores(nodes, run)
    stop = threading.Event()
    engine = threading.Thread(
        target=vce_api.run_api,
        args=(
            lambda: app,
            lambda: _ThreadBackend(workers),
            nodes,
            state_factory,
            stores,
            stop,
            VceMetrics(),
        ),
    )
    engine.start()
    try:
        yield grid, stores, state
    finally:
        stop.set()
        engine.join(30)


class _Tolerant(EchoStrategy):
    @property
    def partial_replies(self) -> bool:
        return True


class _Watched:
    """Counts its calls in ctx.state; client 1's step of round 1 waits for ``gate``; records how
    many steps each client had running at once, and how many it finished."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate, self.lock = gate, threading.Lock()
        self.running, self.most, self.done = Counter(), Counter(), Counter()

    def run(self, message, ctx):
        with self.lock:
            self.running[ctx.cid] += 1
            self.most[ctx.cid] = max(self.most[ctx.cid], self.running[ctx.cid])
        try:
            if (ctx.cid, ctx.rnd) == (1, 1):
                assert self.gate.wait(30)  # outlives the reply_timeout
            ctx.state["calls"] = ctx.state.get("calls", 0) + 1
            return FedgeMessage({"v": torch.zeros(3)}, config={"calls": ctx.state["calls"]})
        finally:
            with self.lock:
                self.running[ctx.cid] -= 1
                self.done[ctx.cid] += 1


def _node_calls(stores, node_id, run_id):
    rec = stores[node_id].retrieve_context(run_id).state.config_records.get(RECORD)
    return decode_state(bytes(rec["state"]))["calls"] if rec is not None and "state" in rec else 0


def test_a_node_whose_step_timed_out_is_sent_nothing_until_it_answers_and_its_late_reply_is_not_used(
    monkeypatch,
):
    """Client 1's step of round 1 outlives clients.reply_timeout; the round goes on without it
    (min_replies). Flower's engine still runs that step and writes the node's Context when it
    returns, from the copy the step started with: a second message to the node meanwhile would
    run beside it and one of the two states would be lost. So round 2 sends client 1 nothing
    (it fails: its node is busy), and round 3, once the late reply is in, warns that it is not
    used and addresses client 1 again: its node ran 2 steps and holds calls = 2."""
    gate = threading.Event()
    program = _Watched(gate)
    app = client_app(
        program,
        _clients(2).__getitem__,
        seed=0,
        measure_flops=False,
        measure_memory=False,
        parties={},
    )
    with _flower_engine(app, 2) as (grid, stores, state):
        sim = flower_simulation(
            strategy=_Tolerant(),
            program=program,
            clients=_clients(2),
            timeout=2.0,
            test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
            num_classes=2,
            config=EngineConfig(seed=0, rounds=3, per_round=2, measure_flops=False, min_replies=1),
        )
        sim.on_progress = lambda rnd, phase, i, n: (
            gate.set() if rnd == 2 else None
        )  # round 2's replies are in
        failed, check = [], engine.check_failures
        monkeypatch.setattr(
            engine,
            "check_failures",
            lambda rnd, phase, *counts, **kw: (
                failed.append(dict(counts[-1])),
                check(rnd, phase, *counts, **kw),
            ),
        )
        sim.executor.connect(grid)
        lines = [sim.run_round(1), sim.run_round(2)]
        gate.set()
        deadline = time.monotonic() + 30
        while (
            program.done[1] < 1 or not state.message_res_store
        ):  # the late reply reaches the SuperLink
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lines.append(sim.run_round(3))
        node_1 = sim.executor.nodes[1]
    assert program.most[1] == 1, "two steps of client 1 ran at once on its node"
    assert [x["clients_failed"] for x in lines] == [1, 1, 0]
    assert failed == [
        {1: f"node {node_1}: no reply within 2 s"},
        {
            1: f"node {node_1}: still busy with round 1, exchange 1, which it has not answered; sent nothing "
            "more until it does"
        },
    ]
    assert program.done == {0: 3, 1: 2}
    assert _node_calls(stores, node_1, grid.run.run_id) == 2  # no step's state lost
    (late,) = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert re.match(
        r"client 1 \(node \d+\) answered round 1, exchange 1 after the 2 s clients.reply_timeout; "
        r"the reply is not used",
        late,
    )


def test_flowers_inmemorygrid_hands_a_late_reply_only_to_a_pull_of_the_message_it_answers():
    """The guarantee fedge relies on (flwr 1.41): ``send_and_receive`` pulls only the ids it
    pushed, and the LinkState returns only replies to the ids pulled (``get_message_res``), so a
    reply that comes after its exchange stopped waiting is never handed to a later exchange; it
    waits in the LinkState for a pull of its own message's id."""
    state_factory, run, _ = _link_state()
    state = state_factory.state()
    (node,) = vce_api._register_nodes(1, state_factory)
    grid = InMemoryGrid(state_factory=state_factory, pull_interval=0.01)
    grid.set_run(run)
    first = Message(RecordDict(), dst_node_id=node, message_type="query")
    assert list(grid.send_and_receive([first], timeout=0.05)) == []  # the node has not answered yet
    (got,) = state.get_message_ins(node_id=node, limit=1)
    late = Message(RecordDict(), reply_to=got)
    late.metadata.__dict__["_message_id"] = "late"
    assert state.store_message_res(late) == "late"  # the node answers, after the timeout
    second = Message(RecordDict(), dst_node_id=node, message_type="query")
    assert (
        list(grid.send_and_receive([second], timeout=0.05)) == []
    )  # not the second message's reply
    (reply,) = grid.pull_messages([first.metadata.message_id])
    assert (reply.metadata.message_id, reply.metadata.reply_to_message_id) == (
        "late",
        first.metadata.message_id,
    )


def test_a_reply_is_matched_by_the_message_it_answers_never_by_the_node_it_comes_from():
    """A grid that handed back a reply to an earlier message of the same node (Flower's do not:
    above) would not have it taken for the reply to this one."""
    sim = flower_simulation(
        strategy=_Tolerant(),
        program=_Watched(threading.Event()),
        clients=_clients(1),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(seed=0, rounds=1, per_round=1),
    )
    sim.executor.nodes = {0: 1000}
    server_identity(1)
    earlier, now = (Message(RecordDict(), dst_node_id=1000, message_type="train") for _ in range(2))
    earlier.metadata.__dict__["_message_id"], now.metadata.__dict__["_message_id"] = (
        "earlier",
        "now",
    )
    stale = Message(RecordDict(), reply_to=earlier)  # from node 1000
    assert stale.metadata.src_node_id == 1000
    assert sim.executor._by_client([now], [0], [stale]) == {}
    assert sim.executor._by_client(
        [now], [0], [stale, fresh := Message(RecordDict(), reply_to=now)]
    ) == {0: fresh}


# ---- a message the SuperLink refuses ----------------------------------------------------------


class _RuntimeApi:
    """The SuperLink's runtime API, called in this process: what ``HttpGrid`` reaches over HTTP."""

    def __init__(self, state, task) -> None:
        self.state, self.task = state, task

    def __getattr__(
        self, rpc
    ):  # PushMessages -> runtime_handlers.push_messages(request, state, task)
        handler = getattr(
            runtime_handlers, "".join("_" + c.lower() if c.isupper() else c for c in rpc)[1:]
        )
        return lambda request: handler(request, self.state, self.task)


def _http_grid():
    """Flower's deployment Grid (``HttpGrid``) on a SuperLink with no node: every message to a
    node is one it refuses (as for a SuperNode no longer registered)."""
    state_factory, run, task = _link_state()
    grid = HttpGrid(token="t")
    grid._client = _RuntimeApi(state_factory.state(), task)
    grid.set_run(run)
    return grid


def _within(seconds, fn):
    """``fn()`` (its value, or its exception raised here), or a test failure if it has not
    returned after ``seconds`` (it waits forever)."""
    out: list = []

    def call():
        try:
            out.append((fn(), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            out.append((None, exc))

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"still waiting after {seconds} s for a reply that cannot come")
    value, exc = out[0]
    if exc is not None:
        raise exc
    return value


def test_httpgrid_does_not_wait_for_a_message_the_superlink_refused():
    """The guarantee fedge relies on (flwr 1.41): the SuperLink gives a refused message the id
    "" (``runtime_handlers.push_messages``), and answers a pull of "" at once with a
    MESSAGE_UNAVAILABLE error from itself whose ``reply_to_message_id`` is "" (the LinkState's
    ``verify_message_ids``), which ends ``send_and_receive``'s wait even with no timeout."""
    grid = _http_grid()
    assert list(
        grid.push_messages([Message(RecordDict(), dst_node_id=4242, message_type="query")])
    ) == [""]
    (reply,) = _within(
        20,
        lambda: list(
            grid.send_and_receive(
                [Message(RecordDict(), dst_node_id=4242, message_type="query")], timeout=None
            )
        ),
    )
    assert reply.has_error() and reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE
    assert (reply.metadata.reply_to_message_id, reply.metadata.src_node_id) == (
        "",
        SUPERLINK_NODE_ID,
    )


def test_on_httpgrid_a_refused_message_is_its_clients_failure_at_once_even_without_a_timeout():
    """Both clients' nodes are gone from the SuperLink (no clients.reply_timeout): the round stops
    at once naming each with why, as for any failed client (the SuperLink's error for a refused
    message names no message: it is no client's reply)."""
    sim = flower_simulation(
        strategy=_Tolerant(),
        program=_Watched(threading.Event()),
        clients=_clients(2),
        test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
        num_classes=2,
        config=EngineConfig(seed=0, rounds=1, per_round=2, measure_flops=False),
    )
    sim.executor.grid, sim.executor.nodes = (
        _http_grid(),
        {0: 4242, 1: 4343},
    )  # as connected before the nodes left
    with pytest.raises(
        MessageError,
        match=r"^round 1, exchange 1: 2 of 2 clients gave no result \(client 0: node "
        r"4242: no reply \(its message was not accepted, e.g. the node is no longer registered\); "
        r"client 1: node 4343: no reply",
    ):
        _within(20, lambda: sim.run_round(1))


def test_on_flowers_engine_a_refused_message_fails_its_client_and_the_round_goes_on(monkeypatch):
    """Client 1's SuperNode is unregistered after connecting; Ray's path (InMemoryGrid) leaves its
    refused message out of the ids it waits for. With clients.min_replies the rounds go on with
    client 0; client 1 fails each, naming why; no reply_timeout is needed."""
    program = _Watched(threading.Event())
    app = client_app(
        program,
        _clients(2).__getitem__,
        seed=0,
        measure_flops=False,
        measure_memory=False,
        parties={},
    )
    with _flower_engine(app, 2) as (grid, stores, state):
        sim = flower_simulation(
            strategy=_Tolerant(),
            program=program,
            clients=_clients(2),
            test=(torch.randn(4, 2), torch.zeros(4, dtype=torch.long)),
            num_classes=2,
            config=EngineConfig(seed=0, rounds=2, per_round=2, measure_flops=False, min_replies=1),
        )
        sim.executor.connect(grid)
        state.delete_node(NOOP_FLWR_AID, sim.executor.nodes[1])  # flwr supernode unregister
        failed = []
        monkeypatch.setattr(
            engine,
            "check_failures",
            lambda rnd, phase, addressed, replied, why, **kw: failed.append(dict(why)),
        )
        lines = _within(60, lambda: [sim.run_round(1), sim.run_round(2)])
    assert [x["clients_failed"] for x in lines] == [1, 1]
    assert program.done == {0: 2}
    assert [sorted(f) for f in failed] == [[1], [1]]
    assert "no reply (its message was not accepted" in failed[1][1]
