"""What an honest-but-curious server observes: :class:`Observer` wraps a method's outermost
strategy and records every exchange of every round (the message sent to each client, and its
reply as it arrives, before aggregation); :func:`server_views` reads each client's upload out of
those records as a server that knows the public protocol would (plain arrays; a secure
aggregation masked input decoded as the plaintext; a sealed ciphertext read as float32), with
nothing special-cased; :func:`observe_parties` records what a side party (an edge server)
receives. See docs/privacy/attacks.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedge.core.context import PartyContext, PartySpec
from fedge.core.messages import Message
from fedge.core.protocols import Exchange, Round, Strategy, StrategyWrapper

__all__ = ["Observed", "Observer", "PartyObserved", "ServerView", "observe_parties", "server_views"]


def _copy(m: Message) -> Message:
    return Message(
        {k: v.detach().clone() for k, v in m.arrays.items()},
        config=dict(m.config),
        metrics=dict(m.metrics),
    )


@dataclass(frozen=True)
class Observed:
    """One client's part of one exchange: what the server sent and what came back."""

    rnd: int
    step: int  # index of the exchange within the round
    cid: int
    sent: Message
    reply: Message


class Observer(StrategyWrapper):
    """Records every exchange's outgoing messages and replies (copies, taken on arrival)."""

    def __init__(self, inner: Strategy) -> None:
        super().__init__(inner)
        self.records: list[Observed] = []

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        gen = self.inner.round(rnd, client_ids)
        step = 0
        try:
            item = next(gen)
            while True:
                answer = yield item
                if isinstance(item, Exchange):
                    for cid, reply in answer.items():
                        self.records.append(
                            Observed(rnd, step, cid, _copy(item.messages[cid]), _copy(reply))
                        )
                    step += 1
                item = gen.send(answer)
        except StopIteration as stop:
            return stop.value


@dataclass(frozen=True)
class PartyObserved:
    """One message a side party received: from client ``key`` (None: a shared party's
    caller) in round ``rnd``."""

    party: str
    rnd: int
    key: int | None
    message: Message


class _RecordingParty:
    def __init__(self, inner: Any, name: str, records: list[PartyObserved]) -> None:
        self.inner, self.name, self.records = inner, name, records

    def handle(self, message: Message, ctx: PartyContext) -> Message:
        self.records.append(PartyObserved(self.name, ctx.rnd, ctx.key, _copy(message)))
        reply: Message = self.inner.handle(message, ctx)
        return reply


@dataclass(frozen=True)
class _RecordingFactory:
    inner: Any
    name: str
    records: list[PartyObserved]

    def __call__(self) -> _RecordingParty:
        return _RecordingParty(self.inner(), self.name, self.records)


def observe_parties(
    parties: Mapping[str, PartySpec], names: list[str], records: list[PartyObserved]
) -> dict[str, PartySpec]:
    """``parties`` with those named ``names`` recording every message they receive into
    ``records`` (in this process: the run needs ``clients.workers: 0``)."""
    unknown = sorted(set(names) - set(parties))
    if unknown:
        from fedge.core.errors import ConfigError  # noqa: PLC0415

        raise ConfigError(f"no side party {unknown} to observe; this method has {sorted(parties)}")
    return {
        n: PartySpec(n, _RecordingFactory(p.factory, n, records), p.scope) if n in names else p
        for n, p in parties.items()
    }


@dataclass
class ServerView:
    """One client's upload in one round, as the server can interpret it.

    ``model`` and ``config`` are what the server broadcast with the payload exchange (the
    global model's arrays; BAFFLE's seed). ``upload`` is name -> tensor: the reply's arrays
    for a plain upload, or the masked vector laid out as the plaintext would be
    (``masked`` True)."""

    rnd: int
    cid: int
    model: dict[str, torch.Tensor]
    config: dict[str, Any]
    upload: dict[str, torch.Tensor]
    masked: bool = False
    reply_bytes: int = field(default=0)
    sealed: bool = False  # the upload is a ciphertext read as if it were float32 plaintext


def _masked_vector(blob: bytes) -> np.ndarray:
    """The masked input y_u of a secure-aggregation reply, decoded as the plaintext would be."""
    from fedge.methods.secure import FIXED_POINT  # noqa: PLC0415
    from fedge.privacy.secagg.messages import MaskedInput  # noqa: PLC0415

    y = FIXED_POINT.from_bytes(MaskedInput.from_bytes(blob).y)
    return np.asarray(FIXED_POINT.decode(y), dtype=np.float64)


def _lay_out(
    flat: torch.Tensor, layout: Mapping[str, torch.Size], *, pad: bool = False
) -> dict[str, torch.Tensor]:
    """``flat`` cut into ``layout``'s arrays in sorted-name order (zero-padded if ``pad``)."""
    total = sum(math.prod(s) for s in layout.values())
    if pad and flat.numel() < total:
        flat = torch.cat([flat, torch.zeros(total - flat.numel(), dtype=flat.dtype)])
    out, start = {}, 0
    for name in sorted(layout):
        n = math.prod(layout[name])
        out[name] = flat[start : start + n].reshape(layout[name])
        start += n
    return out


def _ciphertext(m: Message) -> bytes | None:
    """The sealed payload of a reply that carries nothing else of size (PPFL's ``upload``)."""
    blobs = [v for k, v in m.config.items() if isinstance(v, bytes) and k != "secagg"]
    return max(blobs, key=len) if not m.arrays and blobs and "secagg" not in m.config else None


def server_views(
    records: list[Observed],
    layout: Mapping[str, torch.Size] | None = None,
    sealed_layout: Mapping[str, torch.Size] | None = None,
) -> list[ServerView]:
    """Each client's upload per round: the reply to the message that carried the model.

    Args:
        records: :attr:`Observer.records`.
        layout: name -> shape of a reply's arrays, in the order secure aggregation flattens
            them (sorted names); needed only to lay out masked vectors.
        sealed_layout: name -> shape over which a sealed ciphertext's bytes are laid out (the
            model's parameters); None: sealed replies are not read.
    """
    views = []
    for r in records:
        blob = _ciphertext(r.reply) if sealed_layout is not None else None
        if (
            blob is not None and sealed_layout is not None and len(blob) > 1024
        ):  # a payload, not a handshake
            with np.errstate(invalid="ignore", over="ignore"):
                vals = np.frombuffer(blob[: len(blob) // 4 * 4], dtype="<f4").astype(np.float64)
            flat = torch.from_numpy(np.nan_to_num(vals, nan=0.0, posinf=0.0, neginf=0.0)).to(
                torch.float32
            )
            public: dict[str, Any] = {
                k: v for k, v in r.sent.config.items() if not isinstance(v, bytes)
            }
            views.append(
                ServerView(
                    r.rnd,
                    r.cid,
                    dict(r.sent.arrays),
                    public,
                    _lay_out(flat, sealed_layout, pad=True),
                    True,
                    r.reply.nbytes,
                    sealed=True,
                )
            )
            continue
        if r.sent.config.get("secagg_step", "forward") != "forward":  # key agreement, unmasking
            continue
        if not r.sent.arrays and not (r.reply.arrays and "sync_to" in r.sent.config):
            continue  # a handshake; a seeds downlink (sync_to) may send nothing and get scalars
        if r.reply.arrays:
            upload, masked = dict(r.reply.arrays), False
        elif isinstance(r.reply.config.get("secagg"), bytes) and layout is not None:
            y = _masked_vector(r.reply.config["secagg"])  # type: ignore[arg-type]
            w = y[-1] if y[-1] != 0 else 1.0
            upload, masked = _lay_out(torch.from_numpy(y[:-1] / w).to(torch.float32), layout), True
        else:
            continue
        config = {k: v for k, v in r.sent.config.items() if k not in ("secagg", "secagg_step")}
        views.append(
            ServerView(r.rnd, r.cid, dict(r.sent.arrays), config, upload, masked, r.reply.nbytes)
        )
    return views
