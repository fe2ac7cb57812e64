"""The Flower executor: the engine's client steps sent as Flower messages through a Grid
(:class:`FlowerExecutor`), with failed and late nodes, and client state kept on the nodes and
fetched at checkpoints. Design notes: docs/decisions.md#runtime-and-engine.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid

from fedge.core.context import ClientData
from fedge.core.errors import ConfigError, MessageError
from fedge.core.protocols import ClientProgram
from fedge.core.rng import Draws, check_draws
from fedge.runtime.engine import Simulation
from fedge.runtime.executor import (
    ClientExecutor,
    ClientResult,
    ClientStates,
    Concurrent,
    ExchangeOutcome,
    Progress,
    StepSettings,
)
from fedge.runtime.flower.adapter import (
    RECORD,
    STATE_GET,
    STATE_SET,
    _bytes,
    _flower_size,
    _int,
    _opt_bytes,
    _stats_from,
    _versions,
    client_app,
    server_app,
)
from fedge.runtime.flower.grid import LocalGrid
from fedge.runtime.rngprobe import PORTABLE_PROBE_SHA256, probe_sha256, rng_probe, same_draws
from fedge.runtime.spec import check_backend

__all__ = ["FlowerExecutor", "flower_simulation"]

T = TypeVar("T")


def _rebuilt(text: Any) -> dict[str, str] | None:
    """A node's reported digests (the handshake's ``rebuilt``), or None when it sent none."""
    if not isinstance(text, str):
        return None
    try:
        got = json.loads(text)
    except ValueError:
        return None
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else None


class FlowerExecutor(ClientExecutor):
    """Client steps sent as Flower messages through ``grid``, one node per client.

    Args:
        program, clients, settings: the run's client program, its clients' data, and what
            every step is given (for the nodes :meth:`host` starts; a deployment's nodes
            build their own).
        grid: the Flower Grid (inside a ServerApp's main). None: :meth:`host` starts an
            in-process grid (:class:`~fedge.runtime.flower.grid.LocalGrid`) with one node per
            client running :func:`~fedge.runtime.flower.adapter.client_app`, and runs the
            rounds in a :func:`~fedge.runtime.flower.adapter.server_app` on it.
        timeout: seconds ``send_and_receive`` waits for replies (None: no limit).
        wait_nodes_s: on connecting, how long to wait for every client's SuperNode to join.
        backend: with ``grid=None``, what runs the nodes: ``"local"`` (fedge's in-process
            :class:`~fedge.runtime.flower.grid.LocalGrid`, sequential) or ``"ray"`` (Flower's
            simulation engine, :mod:`fedge.runtime.flower.simulation`).
        node_app: the ClientApp the nodes run (default: :func:`client_app` of ``program`` and
            ``clients``). With ``backend="ray"`` it is pickled to Ray's actors with every
            message: give a small one (:func:`fedge.experiment.build.configured_client_app`).
        cpus: with ``backend="ray"``, how many ClientApp actors (one CPU each; default: the cores).
        draws: the run's seeded draws, whose probe every node must match.
        rebuilt: the digests of what the server's build derived itself from the config
            (``MethodBuild.rebuilt``); every node must report the same.
    """

    concurrent = Concurrent(
        "on a Flower node (clients step concurrently on Flower)",
        "keep that state per client (scope='client'), or run on the engine (--runtime engine) with clients.workers=0",
    )

    def __init__(
        self,
        program: ClientProgram,
        clients: Sequence[ClientData],
        settings: StepSettings,
        *,
        grid: Grid | None = None,
        timeout: float | None = None,
        wait_nodes_s: float = 60.0,
        backend: str = "local",
        node_app: ClientApp | None = None,
        cpus: int | None = None,
        draws: Draws = "torch",
        rebuilt: Mapping[str, str] | None = None,
    ) -> None:
        self.backend = check_backend(backend)
        self.draws = check_draws(draws)
        self.rebuilt = dict(rebuilt or {})
        self.program, self.clients, self.settings = program, clients, settings
        self.grid, self.timeout, self.wait_nodes_s = grid, timeout, wait_nodes_s
        self.node_app, self.cpus = node_app, cpus
        self.metric_keys = ("flower_bytes_down", "flower_bytes_up") + (
            ("flower_party_state_bytes",) if settings.parties else ()
        )
        self.nodes: dict[int, int] = {}  # cid -> node id
        # clients whose node state changed since the last checkpoint
        self._changed: set[int] = set()
        # cid -> (message id, what it was, a step?) of a message left without a reply: its node
        # may still run it
        self._late: dict[int, tuple[str, str, bool]] = {}
        # states to put on the nodes before the first round (resume)
        self._restore: dict[int, bytes] = {}

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
        self.nodes, failed, other_rng, other_build = {}, {}, {}, {}
        probe = rng_probe(self.draws)
        if self.draws == "portable" and probe_sha256(probe) != PORTABLE_PROBE_SHA256:
            raise ConfigError(
                "draws=portable: this server's portable probe differs from fedge's known answer "
                f"(sha256 {probe_sha256(probe)}, expected {PORTABLE_PROBE_SHA256}), so its seeded draws "
                "are not the portable ones; reinstall fedge and numpy, or run with draws=torch"
            )
        field = "rng_probe_portable" if self.draws == "portable" else "rng_probe"
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
            if not same_draws(probe, rec.get(field), draws=self.draws):
                other_rng[node] = (
                    cid,
                    {k: str(rec[k]) for k in ("fedge", "torch", "numpy") if k in rec},
                )
            elif ((theirs := _rebuilt(rec.get("rebuilt"))) or {}) != self.rebuilt:
                other_build[node] = (cid, theirs)
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
        if other_build:
            self._other_build(other_build)
        self._push_restore()

    def _other_build(self, nodes: Mapping[int, tuple[int, dict[str, str] | None]]) -> None:
        """Refuse nodes whose build derived something else from the config than this server's
        (``MethodBuild.rebuilt``; its seeded draws matched): e.g. ``method.train_mask.rule=ntk``,
        whose mask follows from float32 forwards that round differently on another CPU."""

        def what(theirs: dict[str, str] | None) -> str:
            if theirs is None:
                return "a fedge that does not report what it derived"
            keys = sorted(
                k for k in set(theirs) | set(self.rebuilt) if theirs.get(k) != self.rebuilt.get(k)
            )
            return "another " + ", ".join(keys)

        listed = "; ".join(
            f"node {nid} (client {cid}: {what(theirs)})"
            for nid, (cid, theirs) in sorted(nodes.items())[:5]
        )
        more = f"; and {len(nodes) - 5} more" if len(nodes) > 5 else ""
        fix = "install this server's fedge on those SuperNodes"
        if any(theirs is not None and "train_mask" in theirs for _, theirs in nodes.values()):
            fix = (
                "method.train_mask.rule=ntk scores weights by float32 forwards, which round "
                "differently on another CPU; use rule magnitude or random (portable draws "
                "alone), or run those clients on machines like this server"
            )
        raise ConfigError(
            f"{len(nodes)} node(s) derived other values from the run's config than this server: "
            f"{listed}{more}. Their clients would train other coordinates than the server "
            f"updates, without any error; {fix}"
        )

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
    def collect_states(self, states: ClientStates, rnd: int, *, strict: bool) -> None:
        """Fetch into ``states`` the client states changed on the nodes since the last
        checkpoint (see "Checkpoints and resuming" in the module doc)."""
        if self._changed and self.grid is not None:
            asked = sorted(self._changed)
            got = self._query(STATE_GET, dict.fromkeys(asked, {}), strict=strict)
            for cid, rec in got.items():
                state = _opt_bytes(rec.get("state"), "state")
                if state is None:
                    states.client.pop(cid, None)
                else:
                    states.client[cid] = state
            unfetched = [cid for cid in asked if cid not in got]
            if unfetched:
                warnings.warn(
                    f"checkpoint after round {rnd}: the node(s) of client(s) {unfetched} did not answer "
                    "the state fetch; the checkpoint keeps their states as last fetched, so a run resumed from it "
                    "hands them those (older) states, where this run goes on with what the nodes hold",
                    RuntimeWarning,
                    stacklevel=3,
                )
            # still busy: asked again at the next checkpoint
            self._changed = set(unfetched) & set(self._late)

    def restore_states(self, states: ClientStates) -> None:
        """Put the checkpoint's client states on the nodes: now if connected, else on connecting."""
        self._restore, self._changed = dict(states.client), set()
        if self.grid is not None and self.nodes:
            self._push_restore()

    # -- client steps -------------------------------------------------------------------
    def run(
        self,
        rnd: int,
        phase: int,
        messages: Sequence[tuple[int, bytes]],
        states: ClientStates,
        progress: Progress | None = None,
    ) -> ExchangeOutcome:
        """One ``train`` message per client through the grid: the replies' results, why each
        node that gave none failed, and the Flower bytes the exchange moved."""
        if self.grid is None:
            raise RuntimeError(
                "FlowerExecutor is not connected to a grid; run the simulation, or connect(grid)"
            )
        wire = dict.fromkeys(self.metric_keys, 0)
        out, sizes = [], {}  # sizes: Flower bytes down, party-state bytes carried down, by client
        for cid, b in messages:
            content: dict[str, Any] = {"cid": cid, "rnd": rnd, "phase": phase, "message": b}
            carried = {
                f"party.{k}": v for k, v in states.party_states_for(cid).items() if v is not None
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
        party_bytes = 0
        for cid in cids:
            if cid not in busy:  # sent
                wire["flower_bytes_down"] += sizes[cid][0]
                party_bytes += sizes[cid][1]
        failed = {cid: f"node {self.nodes[cid]}: {why}" for cid, why in busy.items()}
        failed.update(self._failures([cid for cid in cids if cid not in busy], by_cid))
        # a node whose reply was lost may have run the step: fetch its state too
        self._changed.update(failed)
        results = {}
        for i, cid in enumerate(c for c in cids if c not in failed):
            reply = by_cid[cid]
            wire["flower_bytes_up"] += _flower_size(reply)
            rec = reply.content.config_records[RECORD]
            party = {
                name: _opt_bytes(rec.get(f"party.{name}"), f"party.{name}")
                for name in states.parties
            }
            party_bytes += sum(len(v) for v in party.values() if v is not None)
            # The node holds the client's state: fetched from it at the next checkpoint, the last
            # fetched bytes kept till then (a node that misses the fetch keeps them).
            held = states.client.get(cid) if rec.get("has_state") else None
            result = ClientResult(
                _bytes(rec["reply"], "reply"),
                held,
                None,
                party,
                _stats_from(json.loads(_bytes(rec["stats"], "stats"))),
            )
            # a shared party's state may not change (see the adapter's module doc)
            states.keep(cid, result, self.concurrent)
            if rec.get("has_state"):
                self._changed.add(cid)
            results[cid] = result
            if progress is not None:
                progress(i + 1, len(messages))
        if "flower_party_state_bytes" in wire:
            wire["flower_party_state_bytes"] = party_bytes
        return ExchangeOutcome(results, failed, wire)

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

    # -- where the rounds run ------------------------------------------------------------
    def host(self, rounds: Callable[[], T]) -> T:
        """Run ``rounds`` on the grid (connecting first); without one, in a ServerApp on an
        in-process grid or on Flower's Ray simulation engine (``backend``)."""
        if self.grid is not None:
            if not self.nodes:
                self.connect(self.grid)
            return rounds()
        app = self.node_app or client_app(
            self.program, self.clients.__getitem__, **self.settings.kwargs(), rebuilt=self.rebuilt
        )
        n = len(self.clients)
        done: list[T] = []

        def main(g: Grid, context: Context) -> None:
            self.connect(g)
            try:
                done.append(rounds())
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


def flower_simulation(
    *,
    grid: Grid | None = None,
    timeout: float | None = None,
    wait_nodes_s: float = 60.0,
    backend: str = "local",
    node_app: ClientApp | None = None,
    cpus: int | None = None,
    rebuilt: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Simulation:
    """The engine (:class:`~fedge.runtime.engine.Simulation`, ``kwargs``) with its client steps
    run by a :class:`FlowerExecutor` (the other arguments); the executor is ``.executor``."""
    settings = kwargs["config"].step_settings(kwargs.get("parties") or {})
    executor = FlowerExecutor(
        kwargs["program"],
        kwargs["clients"],
        settings,
        grid=grid,
        timeout=timeout,
        wait_nodes_s=wait_nodes_s,
        backend=backend,
        node_app=node_app,
        cpus=cpus,
        draws=kwargs["config"].draws,
        rebuilt=rebuilt,
    )
    return Simulation(executor=executor, **kwargs)
