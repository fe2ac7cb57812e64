"""fedge on Flower: a ServerApp that drives any fedge Strategy through Flower's Grid, and a
ClientApp that runs any fedge ClientProgram.

Server side. :class:`FlowerSimulation` is the engine's :class:`~fedge.runtime.engine.Simulation`
with one thing replaced: how a batch of client steps runs (``_run_clients``). Sampling, the
strategy's round generator (every ``Exchange`` of a multi-exchange round such as secure
aggregation's four), server-side party calls, evaluation, and the metrics line are the
engine's own code, so the numbers are the same by construction. Each client step is one
Flower ``Message`` (type ``train``) to the client's node, sent with ``grid.send_and_receive``.

Client side. :func:`client_app` runs the step with the engine's
:func:`~fedge.runtime.engine.execute_client` on the node: the client id is the node's
``node_config["partition-id"]``; its persistent state (``ctx.state``) and its round scratch
state (``ctx.round_state``, valid for the round it was written in) live in Flower's
``Context.state`` on that node, never on the server.

What travels. fedge's own serialized messages travel as ``bytes`` inside a Flower
``ConfigRecord`` named ``fedge``, so ``bytes_down``/``bytes_up`` count exactly what the built-in
engine counts. Next to them, ``flower_bytes_down``/``flower_bytes_up`` estimate Flower's bytes:
each message encoded as one protobuf (``message_to_proto(msg).ByteSize()``, metadata included).
Flower 1.41 sends otherwise (a message and its content objects pushed separately, objects the
SuperLink holds skipped), and the downlink is measured before the message id is assigned.

Side parties. All run co-located with the ClientApp (in its process, on the client's node),
metered on their own account as in the engine (``flops.edge``, ``bytes.client->edge``, ...).
Their state is the server's: the strategy may call a party itself (``PartyCall``, e.g. EPPFL's
S_a sending M_s to each edge server), which runs next to the ServerApp, so a party's state
travels down with each client message (``party.NAME`` in the ``fedge`` record) and back with the
reply, and is kept (and checkpointed) by the server as in the engine. That traffic is in
``flower_bytes_*`` (and alone in ``flower_party_state_bytes``), not in ``bytes_*`` (the engine
does not count party state as traffic either).
- per-client parties (``scope="client"``: EPPFL's edge server, PPFL's enclave): one state per
  client, as in the engine.
- shared parties (``scope="shared"``: a third-party randomness server): clients run
  concurrently on Flower, so, as with the engine's worker processes, a shared party may not
  change its state during a client step (ConfigError otherwise).
Running a party as its own Flower node would need node-to-node messages, which Flower's
Message API routes only through the ServerApp; not built.

Failed nodes. A node that does not reply (within ``timeout``) or answers with an error (a
ClientApp exception; a SuperLink's reply for a node it found offline) is a failed client to the
engine: with ``clients.min_replies`` set and a strategy that takes partial replies, the round
goes on with the replies that arrived (secure aggregation recovers the failed clients' masks
from their neighbours' shares); otherwise the round stops, naming each failed client. A node
whose reply was lost may still have run the step and updated its own state, so the checkpoint
after the round asks every failed node for its state too: a resumed run continues from what
the node holds, as an uninterrupted one does. Under ``clients.min_replies`` a node that does not
answer that fetch either (it is down) keeps its state of the last fetch in the checkpoint, with
a warning naming it; without ``min_replies`` the fetch failing stops the run. On connecting, a
node that fails the handshake (e.g. one the SuperLink answers for as offline) is skipped; it is an error only if a client is left without a
node. The handshake also compares each node's seeded draws with the server's
(:mod:`fedge.runtime.rngprobe`): a node drawing other numbers (another torch or numpy build)
is refused by name. Nodes are matched to clients once, on connecting: a SuperNode restarted during a run
registers under a new node id and is addressed again only when the run is resumed.

Late replies. Replies are matched to the message they answer (``reply_to_message_id``), and
Flower's grids hand back only replies to the messages of the ``send_and_receive`` call that
pulls them, so a reply that comes after its exchange stopped waiting is never taken for a later
one. But its node may still be running that message: Flower's simulation engine runs a node's
messages on as many workers as are free, each on a copy of the node's Context that it writes
back when the step returns, so a second message to the node would run beside the first and one
of their states would be lost. So a client whose message got no reply is sent nothing more
until the grid has its reply (pulled by its message id before the client's next message): the
client fails the exchanges it is addressed in meanwhile ("still busy"), like any failed
client; a node that never answers is busy until the SuperLink answers for it with an error
(it went offline, or the message's TTL ran out: 12 h, Flower's default). The late reply itself is not used (a warning names it); the node keeps the state that
step left, fetched at the next checkpoint. A message the SuperLink refused (no message id back
from ``push_messages``) is answered by the SuperLink with an error when pulled, which ends the
wait for it; its client has failed the exchange.

Checkpoints and resuming. A client's persistent state lives on its node; a reply says when the
node holds one (``has_state``), and when the engine checkpoints (:meth:`FlowerSimulation.state_dict`,
after every round) the server fetches the states changed since the last checkpoint with a
``query`` message (action ``fedge_state_get``), so the checkpoint holds every client's state as
the engine's does. On resume (:meth:`FlowerSimulation.load_state_dict`) they are sent back to the
nodes (``fedge_state_set``) before the first round. These messages are checkpoint traffic, not
counted in ``bytes_*`` or ``flower_bytes_*``.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.serde import message_to_proto
from flwr.serverapp import Grid, ServerApp

from fedge.core.context import ClientData, PartySpec
from fedge.core.errors import ConfigError, MessageError
from fedge.core.meter import StepStats
from fedge.core.protocols import ClientProgram
from fedge.runtime.engine import RoundRecord, Simulation, _Result, _Task, execute_client
from fedge.runtime.flower.grid import LocalGrid
from fedge.runtime.rngprobe import rng_probe, same_draws

__all__ = ["FlowerSimulation", "client_app", "server_app"]

RECORD = "fedge"  # the ConfigRecord carrying fedge's bytes, in messages and in Context.state
STATE_GET, STATE_SET = (
    "fedge_state_get",
    "fedge_state_set",
)  # query actions: a node's client state, to/from a checkpoint


def _int(rec: Any, key: str) -> int:
    """A Flower ConfigRecord value that must be an int."""
    v = rec[key]
    if not isinstance(v, int):
        raise MessageError(f"Flower record key {key!r} is {type(v).__name__}; expected int")
    return v


def _bytes(v: Any, key: str) -> bytes:
    if not isinstance(v, bytes):
        raise MessageError(f"Flower record key {key!r} is {type(v).__name__}; expected bytes")
    return v


def _opt_bytes(v: Any, key: str) -> bytes | None:
    return None if v is None else _bytes(v, key)


def _stats_to_bytes(s: StepStats) -> bytes:
    return json.dumps(asdict(s)).encode()


def _stats_from(d: dict[str, Any]) -> StepStats:
    parties = {k: _stats_from(v) for k, v in d.pop("parties", {}).items()}
    return StepStats(**d, parties=parties)


def _node_cid(context: Context) -> int:
    try:
        return int(context.node_config["partition-id"])
    except (KeyError, ValueError, TypeError):
        raise ConfigError(
            f"node {context.node_id} has node_config {dict(context.node_config)!r}; a fedge SuperNode needs "
            "an integer 'partition-id' (start it with --node-config \"partition-id=I num-partitions=N\")"
        ) from None


def client_app(
    program: ClientProgram,
    data_of: Callable[[int], ClientData],
    *,
    seed: int,
    measure_flops: bool,
    measure_memory: bool,
    parties: Mapping[str, PartySpec],
) -> ClientApp:
    """A Flower ClientApp running ``program`` for the client ``node_config["partition-id"]``
    with its data ``data_of(cid)`` (arguments as :func:`~fedge.runtime.engine.execute_client`)."""
    app = ClientApp()
    parties = dict(parties)

    @app.query()
    def hello(msg: Message, context: Context) -> Message:
        """The handshake: which fedge client this node is, and what its seeded draws give
        (:func:`~fedge.runtime.rngprobe.rng_probe`, with its fedge, torch and numpy versions)."""
        return Message(
            RecordDict(
                {
                    RECORD: ConfigRecord(
                        {"cid": _node_cid(context), "rng_probe": rng_probe(), **_versions()}
                    )
                }
            ),
            reply_to=msg,
        )

    @app.query(STATE_GET)
    def get_state(msg: Message, context: Context) -> Message:
        """Checkpointing: the node's persistent client state (``ctx.state``), to the server."""
        node = context.state.config_records.get(RECORD) or ConfigRecord()
        out: dict[str, Any] = {"cid": _node_cid(context)}
        if node.get("state") is not None:
            out["state"] = node["state"]
        return Message(RecordDict({RECORD: ConfigRecord(out)}), reply_to=msg)

    @app.query(STATE_SET)
    def set_state(msg: Message, context: Context) -> Message:
        """Resuming: the node's persistent client state, from the server's checkpoint."""
        cid = _node_cid(context)
        rec = msg.content.config_records[RECORD]
        if _int(rec, "cid") != cid:
            raise MessageError(
                f"node {context.node_id} is client {cid} but got client {rec['cid']!r}'s state"
            )
        state = _opt_bytes(rec.get("state"), "state")
        context.state[RECORD] = ConfigRecord({} if state is None else {"state": state})
        return Message(RecordDict({RECORD: ConfigRecord({"cid": cid})}), reply_to=msg)

    @app.train()
    def step(msg: Message, context: Context) -> Message:
        cid = _node_cid(context)
        rec = msg.content.config_records[RECORD]
        if _int(rec, "cid") != cid:
            raise MessageError(
                f"node {context.node_id} is client {cid} but got client {rec['cid']!r}'s message"
            )
        rnd, phase = _int(rec, "rnd"), _int(rec, "phase")
        node = context.state.config_records.get(RECORD) or ConfigRecord()
        round_state = (
            _opt_bytes(node.get("round_state"), "round_state")
            if node.get("round_state_rnd") == rnd
            else None
        )
        party_states = {
            name: _opt_bytes(rec.get(f"party.{name}"), f"party.{name}") for name in parties
        }
        task = _Task(
            cid,
            rnd,
            phase,
            _bytes(rec["message"], "message"),
            _opt_bytes(node.get("state"), "state"),
            round_state,
            party_states,
        )
        result = execute_client(
            program,
            data_of(cid),
            task,
            seed=seed,
            measure_flops=measure_flops,
            measure_memory=measure_memory,
            parties=parties,
        )
        kept: dict[str, Any] = {}
        if result.state is not None:
            kept["state"] = result.state
        if result.round_state is not None:
            kept.update(round_state=result.round_state, round_state_rnd=rnd)
        out: dict[str, Any] = {"reply": result.reply, "stats": _stats_to_bytes(result.stats)}
        if result.state is not None:
            out["has_state"] = 1  # the server fetches it when it checkpoints (STATE_GET)
        out.update({f"party.{name}": v for name, v in result.party_states.items() if v is not None})
        context.state[RECORD] = ConfigRecord(kept)
        return Message(RecordDict({RECORD: ConfigRecord(out)}), reply_to=msg)

    return app


def _versions() -> dict[str, str]:
    import numpy

    from fedge.core.version import __version__

    return {"fedge": __version__, "torch": torch.__version__, "numpy": numpy.__version__}


def server_app(main: Callable[[Grid, Context], None]) -> ServerApp:
    """A Flower ServerApp whose main is ``main(grid, context)``, e.g. one that builds a
    :class:`FlowerSimulation` on ``grid`` and runs it."""
    app = ServerApp()
    app.main()(main)
    return app


def _flower_size(msg: Message) -> int:
    return message_to_proto(msg).ByteSize()


class FlowerSimulation(Simulation):
    """The engine, with client steps sent as Flower messages through ``grid``.

    Args:
        grid: the Flower Grid (inside a ServerApp's main). None: :meth:`run` starts an
            in-process grid (:class:`~fedge.runtime.flower.grid.LocalGrid`) with one node per
            client running :func:`client_app`, and runs a :func:`server_app` on it.
        timeout: seconds ``send_and_receive`` waits for replies (None: no limit).
        wait_nodes_s: on connecting, how long to wait for every client's SuperNode to join.
        backend: with ``grid=None``, what runs the nodes: ``"local"`` (fedge's in-process
            :class:`~fedge.runtime.flower.grid.LocalGrid`, sequential) or ``"ray"`` (Flower's
            simulation engine, :mod:`fedge.runtime.flower.simulation`).
        node_app: the ClientApp the nodes run (default: :func:`client_app` of this simulation's
            program and clients). With ``backend="ray"`` it is pickled to Ray's actors with every
            message: give a small one (:func:`fedge.experiment.build.configured_client_app`).
        cpus: with ``backend="ray"``, how many ClientApp actors (one CPU each; default: the cores).
        **kwargs: as :class:`~fedge.runtime.engine.Simulation`.
    """

    _concurrent = (
        "on a Flower node (clients step concurrently on Flower)",
        "keep that state per client (scope='client'), or run on the engine (--runtime engine) with clients.workers=0",
    )

    def __init__(
        self,
        *,
        grid: Grid | None = None,
        timeout: float | None = None,
        wait_nodes_s: float = 60.0,
        backend: str = "local",
        node_app: ClientApp | None = None,
        cpus: int | None = None,
        **kwargs: Any,
    ) -> None:
        from fedge.runtime.flower.simulation import BACKENDS

        if backend not in BACKENDS:
            raise ConfigError(
                f"Flower simulation backend {backend!r} is not known; expected one of {list(BACKENDS)}"
            )
        super().__init__(**kwargs)
        self.grid, self.timeout, self.wait_nodes_s = grid, timeout, wait_nodes_s
        self.backend, self.node_app, self.cpus = backend, node_app, cpus
        self.nodes: dict[int, int] = {}  # cid -> node id
        self._changed: set[int] = (
            set()
        )  # clients whose node state changed since the last checkpoint
        # cid -> (message id, what it was, a step?) of a message left without a reply: its node may still run it
        self._late: dict[int, tuple[str, str, bool]] = {}
        self._restore: dict[
            int, bytes
        ] = {}  # states to put on the nodes before the first round (resume)
        self._wire = [
            0,
            0,
            0,
        ]  # Flower bytes down, up; party-state bytes carried (both ways) this round

    # -- connecting ------------------------------------------------------------------
    def connect(self, grid: Grid) -> None:
        """Ask every node of ``grid`` which client it is; every client needs a node."""
        self.grid = grid
        node_ids = list(grid.get_node_ids())
        deadline = time.monotonic() + self.wait_nodes_s
        while (
            len(node_ids) < len(self.clients) and time.monotonic() < deadline
        ):  # SuperNodes still joining
            time.sleep(0.5)
            node_ids = list(grid.get_node_ids())
        asks = [
            Message(
                RecordDict({RECORD: ConfigRecord({})}),
                dst_node_id=n,
                message_type="query",
                group_id="hello",
            )
            for n in node_ids
        ]
        replies = list(grid.send_and_receive(asks, timeout=self.timeout))
        asked = {m.metadata.message_id: m.metadata.dst_node_id for m in asks}
        self.nodes, failed, other_rng = {}, {}, {}
        probe = rng_probe()
        for reply in replies:
            # the node asked: a SuperLink answers for a node it found offline from its own node id
            node = asked.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if (
                reply.has_error()
            ):  # e.g. a SuperNode's registration from before it restarted: skipped
                failed[node] = reply.error.reason
                continue
            rec = reply.content.config_records[RECORD]
            cid = _int(rec, "cid")
            if cid in self.nodes:
                raise ConfigError(
                    f"nodes {self.nodes[cid]} and {node} both say partition-id={cid}; "
                    "give each SuperNode its own partition-id"
                )
            self.nodes[cid] = node
            if not same_draws(probe, rec.get("rng_probe")):
                other_rng[node] = (
                    cid,
                    {k: str(rec[k]) for k in ("fedge", "torch", "numpy") if k in rec},
                )
        missing = sorted(set(range(len(self.clients))) - set(self.nodes))
        if missing:
            n = len(self.clients)
            text = (
                f"{len(missing)} of {n} clients have no Flower node (partition-ids {missing[:10]})"
            )
            if failed:
                listed = "; ".join(f"node {nid}: {why}" for nid, why in sorted(failed.items())[:5])
                more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
                raise MessageError(
                    f"{text}; {len(failed)} node(s) failed the handshake ({listed}{more})"
                )
            raise ConfigError(f"{text}; start one SuperNode per partition-id 0..{n - 1}")
        if other_rng:
            self._other_rng(other_rng)
        self._push_restore()

    def _other_rng(self, nodes: Mapping[int, tuple[int, dict[str, str]]]) -> None:
        """Refuse nodes whose seeded draws differ from this server's (:mod:`fedge.runtime.rngprobe`):
        their clients would train on other shards than the run's partition, or against other
        perturbations, frozen weights or masks than the server rebuilds, without an error."""
        here = _versions()

        def versions(v: Mapping[str, str]) -> str:
            if "fedge" not in v:
                return "a fedge without the handshake's probe"
            return ", ".join(f"{k} {v.get(k, '?')}" for k in here)

        listed = "; ".join(
            f"node {nid} (client {cid}: {versions(v)})"
            for nid, (cid, v) in sorted(nodes.items())[:5]
        )
        more = f"; and {len(nodes) - 5} more" if len(nodes) > 5 else ""
        raise ConfigError(
            f"{len(nodes)} node(s) draw other numbers from the run's seeds than this server ({versions(here)}): "
            f"{listed}{more}. Their clients would train on other data shards than the run's partition, or against "
            "other perturbations, frozen weights or masks than the other parties rebuild, without any error; install "
            "this server's fedge, torch and numpy versions on those SuperNodes"
        )

    def _push_restore(self) -> None:
        if self._restore:
            self._query(STATE_SET, {cid: {"state": b} for cid, b in sorted(self._restore.items())})
            self._restore = {}

    def _query(
        self, action: str, content: Mapping[int, Mapping[str, Any]], *, strict: bool = True
    ) -> dict[int, Any]:
        """One ``query.ACTION`` message to each client's node; the replies' fedge records, by
        client. A node that does not answer (within the timeout) or answers with an error is an
        error naming it, or, not ``strict``, left out of the result."""
        assert self.grid is not None
        msgs = [
            Message(
                RecordDict({RECORD: ConfigRecord({"cid": cid, **c})}),
                dst_node_id=self.nodes[cid],
                message_type=f"query.{action}",
                group_id=action,
            )
            for cid, c in content.items()
        ]
        by_cid, failed = self._send(msgs, list(content), f"the {action} query", step=False)
        out = {}
        for cid in content:
            if cid in failed:  # its node is still busy
                continue
            reply = by_cid.get(cid)
            if reply is None or reply.has_error():
                failed[cid] = "no reply" if reply is None else str(reply.error.reason)
            else:
                out[cid] = reply.content.config_records[RECORD]
        if failed and strict:
            listed = "; ".join(
                f"client {cid} (node {self.nodes[cid]}): {why}"
                for cid, why in sorted(failed.items())[:5]
            )
            more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
            raise MessageError(
                f"{action}: {len(failed)} of {len(content)} nodes failed ({listed}{more})"
            )
        return out

    # -- checkpoints: client states live on the nodes --------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._changed and self.grid is not None:
            asked = sorted(self._changed)
            got = self._query(
                STATE_GET, dict.fromkeys(asked, {}), strict=self.cfg.min_replies is None
            )
            for cid, rec in got.items():
                state = _opt_bytes(rec.get("state"), "state")
                if state is None:
                    self.client_states.pop(cid, None)
                else:
                    self.client_states[cid] = state
            unfetched = [cid for cid in asked if cid not in got]
            if unfetched:
                warnings.warn(
                    f"checkpoint after round {self.record.round}: the node(s) of client(s) {unfetched} did not answer "
                    "the state fetch; the checkpoint keeps their states as last fetched, so a run resumed from it "
                    "hands them those (older) states, where this run goes on with what the nodes hold",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self._changed = set(unfetched) & set(
                self._late
            )  # still busy: asked again at the next checkpoint
        return super().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._restore, self._changed = dict(self.client_states), set()
        if self.grid is not None and self.nodes:  # connected already: now; else when connecting
            self._push_restore()

    # -- the one engine step replaced ------------------------------------------------------
    def _run_clients(
        self, rnd: int, phase: int, messages: list[tuple[int, bytes]]
    ) -> tuple[dict[int, _Result], dict[int, str]]:
        if self.grid is None:
            raise RuntimeError(
                "FlowerSimulation is not connected to a grid; call run() or connect(grid)"
            )
        out, sizes = [], {}  # sizes: Flower bytes down, party-state bytes carried down, by client
        for cid, b in messages:
            content: dict[str, Any] = {"cid": cid, "rnd": rnd, "phase": phase, "message": b}
            carried = {
                f"party.{k}": v for k, v in self._party_states_for(cid).items() if v is not None
            }
            content.update(carried)
            m = Message(
                RecordDict({RECORD: ConfigRecord(content)}),
                dst_node_id=self.nodes[cid],
                message_type="train",
                group_id=f"{rnd}.{phase}",
            )
            sizes[cid] = (_flower_size(m), sum(len(v) for v in carried.values()))
            out.append(m)
        cids = [cid for cid, _ in messages]
        by_cid, busy = self._send(out, cids, f"round {rnd}, exchange {phase + 1}", step=True)
        for cid in cids:
            if cid not in busy:  # sent
                self._wire[0] += sizes[cid][0]
                self._wire[2] += sizes[cid][1]
        failed = {cid: f"node {self.nodes[cid]}: {why}" for cid, why in busy.items()}
        failed.update(self._failures([cid for cid in cids if cid not in busy], by_cid))
        self._changed.update(
            failed
        )  # a node whose reply was lost may have run the step: fetch its state too
        results = {}
        for i, cid in enumerate(c for c in cids if c not in failed):
            reply = by_cid[cid]
            self._wire[1] += _flower_size(reply)
            rec = reply.content.config_records[RECORD]
            states = {
                name: _opt_bytes(rec.get(f"party.{name}"), f"party.{name}") for name in self.parties
            }
            self._wire[2] += sum(len(v) for v in states.values() if v is not None)
            # The node holds the client's state: fetched from it at the next checkpoint, the last
            # fetched bytes kept till then (a node that misses the fetch keeps them).
            held = self.client_states.get(cid) if rec.get("has_state") else None
            result = _Result(
                _bytes(rec["reply"], "reply"),
                held,
                None,
                states,
                _stats_from(json.loads(_bytes(rec["stats"], "stats"))),
            )
            self._keep(
                cid, result, parallel=True
            )  # a shared party's state may not change (see module doc)
            if rec.get("has_state"):
                self._changed.add(cid)
            results[cid] = result
            if self.on_progress is not None:
                self.on_progress(rnd, phase, i + 1, len(messages))
        return results, failed

    def _send(
        self, msgs: list[Message], cids: list[int], what: str, *, step: bool
    ) -> tuple[dict[int, Message], dict[int, str]]:
        """Send client ``cids[i]`` the message ``msgs[i]`` (``what``: for messages; ``step``: a
        client step, not a query), except to clients whose node has not answered an earlier
        message yet (see "Late replies" in the module doc): the replies by client, and why each
        client not sent its message failed."""
        assert self.grid is not None
        busy = self._settle(cids)
        sent = [(m, cid) for m, cid in zip(msgs, cids, strict=True) if cid not in busy]
        replies = (
            self.grid.send_and_receive([m for m, _ in sent], timeout=self.timeout) if sent else []
        )
        by_cid = self._by_client([m for m, _ in sent], [cid for _, cid in sent], replies)
        for m, cid in sent:
            if cid not in by_cid and m.metadata.message_id:  # its node may still be running it
                self._late[cid] = (m.metadata.message_id, what, step)
        return by_cid, busy

    def _settle(self, cids: Iterable[int]) -> dict[int, str]:
        """Pull the replies still owed to ``cids`` (by the message ids they answer): a client whose
        reply is in is free again, its reply not used (a warning says so when its node ran a
        step); the others are still busy, each with why."""
        assert self.grid is not None
        owed = {self._late[cid][0]: cid for cid in cids if cid in self._late}
        if owed:
            for reply in self.grid.pull_messages(list(owed)):
                cid = owed.get(reply.metadata.reply_to_message_id)
                if cid is None or cid not in self._late:
                    continue
                _, what, step = self._late.pop(cid)
                if reply.has_error() or not step:
                    continue  # the node failed that message, or answered a query: no step ran
                self._changed.add(
                    cid
                )  # the step ran on the node: its state is fetched at the next checkpoint
                within = (
                    f"the {self.timeout:g} s clients.reply_timeout"
                    if self.timeout is not None
                    else "its exchange"
                )
                warnings.warn(
                    f"client {cid} (node {self.nodes[cid]}) answered {what} after {within}; the reply "
                    "is not used (that exchange went on without it), the node keeps the state the step left",
                    RuntimeWarning,
                    stacklevel=4,
                )
        return {
            cid: f"still busy with {self._late[cid][1]}, which it has not answered; sent nothing more until it does"
            for cid in cids
            if cid in self._late
        }

    def _by_client(
        self, sent: list[Message], cids: list[int], replies: Iterable[Message]
    ) -> dict[int, Message]:
        """The replies by client, matched to the message they answer (a SuperLink answers for a
        node it found offline from its own node id, so the sender says nothing). A reply that
        answers none of ``sent`` (the SuperLink's error for a message it refused, which has no
        message id) is left out."""
        asked = {
            m.metadata.message_id: cid
            for m, cid in zip(sent, cids, strict=True)
            if m.metadata.message_id
        }
        out: dict[int, Message] = {}
        for r in replies:
            cid = asked.get(r.metadata.reply_to_message_id)
            if cid is not None:
                out[cid] = r
        return out

    def _failures(self, cids: list[int], by_cid: Mapping[int, Message]) -> dict[int, str]:
        """Why each addressed client gave no result: no reply (within the timeout), or an error
        reply (a SuperLink's for a node it found offline, or the ClientApp's exception). The
        engine then goes on without them, or stops the round (``Simulation._check_failures``).
        Without a timeout, Flower's grids return without a reply only for a message the
        SuperLink did not accept (``InMemoryGrid`` leaves its id out; ``HttpGrid`` gets the id
        ``""``, whose pull the SuperLink answers with an error that names no message)."""
        bad = {}
        for cid in cids:
            reply = by_cid.get(cid)
            if reply is None:
                why = (
                    f"within {self.timeout:g} s"
                    if self.timeout is not None
                    else "(its message was not accepted, e.g. the node is no longer registered)"
                )
                bad[cid] = f"node {self.nodes[cid]}: no reply {why}"
            elif reply.has_error():
                bad[cid] = f"node {self.nodes[cid]}: {reply.error.reason}"
        return bad

    def run_round(self, rnd: int) -> dict[str, Any]:
        self._wire = [0, 0, 0]
        line = super().run_round(rnd)
        wall = line.pop("wall_s")
        line.update(flower_bytes_down=self._wire[0], flower_bytes_up=self._wire[1])
        if self.parties:
            line["flower_party_state_bytes"] = self._wire[2]
        line["wall_s"] = wall
        return line

    def run(self, *, start_round: int | None = None) -> RoundRecord:
        if self.grid is not None:
            if not self.nodes:
                self.connect(self.grid)
            return super().run(start_round=start_round)
        app = self.node_app or client_app(self.program, self.clients.__getitem__, **self._kwargs())
        n = len(self.clients)
        done: list[RoundRecord] = []

        def main(g: Grid, context: Context) -> None:
            self.connect(g)
            try:
                done.append(super(FlowerSimulation, self).run(start_round=start_round))
            finally:
                self.grid = None

        if self.backend == "ray":
            from fedge.runtime.flower.simulation import run_on_ray

            run_on_ray(server_app(main), app, n, cpus=self.cpus)
            if (
                not done
            ):  # pragma: no cover - Flower returned without running the ServerApp to its end
                raise MessageError(
                    "Flower's simulation engine ended before the ServerApp finished its rounds"
                )
            return done[0]
        grid = LocalGrid(app, [{"partition-id": i, "num-partitions": n} for i in range(n)])
        server_app(main)(
            grid,
            Context(
                run_id=grid.run.run_id,
                node_id=SUPERLINK_NODE_ID,
                node_config={},
                state=RecordDict(),
                run_config={},
            ),
        )
        return done[0]
