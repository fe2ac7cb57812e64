"""An in-process Flower Grid (:class:`LocalGrid`): Flower's ``Grid`` API with SuperNodes that are
ClientApps in this process, every message encoded with Flower's protobuf serde; no Ray needed.
Design notes: docs/decisions.md#runtime-and-engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any
from uuid import uuid4

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common.constant import SUPERLINK_NODE_ID  # noqa: E402
from flwr.common.serde import message_from_proto, message_to_proto  # noqa: E402
from flwr.proto.message_pb2 import Message as ProtoMessage  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.run import Run  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

__all__ = ["LocalGrid", "server_identity"]

CLIENT_ERROR = 1  # Error.code for an exception raised by the ClientApp (Flower: ClientAppException)


def server_identity(run_id: int) -> None:
    """Set the process's task identity the way Flower's ServerApp runtimes do
    (``flwr.server.compat.app``: task 1, the run, the SuperLink's node id), so that
    ``flwr.app.Message(...)`` can be built outside a Flower-started process."""
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID


def _wire(msg: Message) -> bytes:
    return message_to_proto(msg).SerializeToString()


def _unwire(b: bytes) -> Message:
    proto = ProtoMessage()
    proto.ParseFromString(b)
    return message_from_proto(proto)


class LocalGrid(Grid):
    """Flower's Grid over ``len(node_configs)`` in-process SuperNodes, each running ``app``.

    Args:
        app: the ClientApp every node runs.
        node_configs: one ``node_config`` per node (e.g. ``{"partition-id": i, "num-partitions": n}``).
        run_id: the Flower run id.
        run_config: the run's ``run_config`` (visible to every node's Context).
    """

    def __init__(
        self,
        app: ClientApp,
        node_configs: list[Mapping[str, Any]],
        *,
        run_id: int = 1,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.app = app
        self._run = Run.create_empty(run_id)
        self.node_ids = [1000 + i for i in range(len(node_configs))]  # SuperLink is node 1
        self.contexts = {
            nid: Context(
                run_id=run_id,
                node_id=nid,
                node_config=dict(nc),
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for nid, nc in zip(self.node_ids, node_configs, strict=True)
        }
        self._pending: dict[str, bytes] = {}  # message id -> encoded reply
        self.wire_bytes_down = 0
        self.wire_bytes_up = 0
        server_identity(run_id)

    # -- Grid API ------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            mid = str(uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            nid = msg.metadata.dst_node_id
            if nid not in self.contexts:
                raise ValueError(f"message addressed to node {nid}, which is not on this grid")
            down = _wire(msg)
            self.wire_bytes_down += len(down)
            self._pending[mid] = self._deliver(_unwire(down), self.contexts[nid])
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = []
        for mid in message_ids:
            up = self._pending.pop(mid, None)
            if up is not None:
                self.wire_bytes_up += len(up)
                out.append(_unwire(up))
        return out

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    # -- the "SuperNode" -----------------------------------------------------------
    def _deliver(self, msg: Message, context: Context) -> bytes:
        try:
            reply = self.app(msg, context)
        except Exception as exc:  # what Flower's SuperNode does: an error reply, not a crash
            reply = Message(
                Error(code=CLIENT_ERROR, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg
            )
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        return _wire(reply)
