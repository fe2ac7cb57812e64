"""fedge on Flower: a ClientApp that runs any fedge ClientProgram on its node, a ServerApp
wrapper, and what travels between them (fedge's own message bytes in a ``ConfigRecord``).
Design notes: docs/decisions.md#runtime-and-engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import message_to_proto
from flwr.serverapp import Grid, ServerApp

from fedge.core.context import ClientData, PartySpec
from fedge.core.errors import ConfigError, MessageError
from fedge.core.meter import StepStats
from fedge.core.protocols import ClientProgram
from fedge.runtime.executor import ClientTask, execute_client
from fedge.runtime.rngprobe import rng_probe

__all__ = ["client_app", "server_app"]

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
    device: torch.device | None = None,
    rebuilt: Mapping[str, str] | None = None,
) -> ClientApp:
    """A Flower ClientApp running ``program`` for the client ``node_config["partition-id"]``
    with its data ``data_of(cid)`` (arguments as :func:`~fedge.runtime.executor.execute_client`);
    ``rebuilt``: the digests of what this node's build derived itself from the config
    (``MethodBuild.rebuilt``), reported in the handshake."""
    app = ClientApp()
    parties = dict(parties)
    rebuilt_text = json.dumps(dict(rebuilt or {}), sort_keys=True)

    @app.query()
    def hello(msg: Message, context: Context) -> Message:
        """The handshake: which fedge client this node is, what its seeded draws give
        (:func:`~fedge.runtime.rngprobe.rng_probe` of both kinds of draws, with its fedge, torch and
        numpy versions) and the digests of what its build derived from the config."""
        return Message(
            RecordDict(
                {
                    RECORD: ConfigRecord(
                        {
                            "cid": _node_cid(context),
                            "rng_probe": rng_probe(),
                            "rng_probe_portable": rng_probe("portable"),
                            "rebuilt": rebuilt_text,
                            **_versions(),
                        }
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
        task = ClientTask(
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
            device=device,
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
    :func:`~fedge.runtime.flower.executor.flower_simulation` on ``grid`` and runs it."""
    app = ServerApp()
    app.main()(main)
    return app


def _flower_size(msg: Message) -> int:
    return message_to_proto(msg).ByteSize()
