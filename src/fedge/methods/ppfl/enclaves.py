"""PPFL's two enclaves, as side parties: a client enclave per client (``tee``, scope "client")
and the server enclave (``server_tee``, shared, called by the strategy with ``PartyCall``).

Each keeps its plaintext (keys, channel counters, the layer under training and its head)
only while it handles a call; what it hands the engine to keep between calls is sealed
under its device key (:func:`fedge.privacy.tee.hardware_key`), so the engine's stored party
states — REE memory — hold ciphertext only. Every message leaving an enclave for the other
is sealed on the attested channel (:class:`fedge.privacy.tee.SealedChannel`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedge.core.context import PartyContext
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.methods.ppfl import stages as stages_mod
from fedge.methods.ppfl.stages import Stage, StageNet, stage_net
from fedge.privacy import tee
from fedge.privacy.tee import (
    DOWN,
    UP,
    AttestationError,
    EnclaveMemory,
    KeyPair,
    Report,
    SealedChannel,
    SealError,
    hardware_key,
    measure,
    open_blob,
    seal_blob,
    session_key,
    sign_report,
    tensor_bytes,
    verify_report,
)  # fmt: skip

__all__ = ["ClientEnclave", "EnclaveSpec", "ServerEnclave", "open_eval_blob", "SERVER_HELLO_NONCE"]

SERVER_HELLO_NONCE = b"\x00" * 16


@dataclass
class EnclaveSpec:
    """The enclaves' code and configuration (what the measurement covers), shared by both."""

    model_fn: Any
    stages: list[Stage]
    seed: int
    init_arrays: dict[str, torch.Tensor]
    config: dict[str, Any]
    server_mb: float
    _template: nn.Module | None = field(default=None, repr=False)

    def template(self) -> nn.Module:
        if self._template is None:
            m = self.model_fn()
            m.load_state_dict(self.init_arrays)
            self._template = m
        return self._template

    def measurement(self, role: str) -> bytes:
        import fedge.methods.ppfl.enclaves as me

        return measure([me, stages_mod, tee.channel, tee.memory], {"role": role, **self.config})

    def net(self, stage: int, arrays: dict[str, torch.Tensor] | None = None) -> StageNet:
        net = stage_net(self.template(), self.stages, stage, seed=self.seed)
        if arrays is not None:
            net.load_state_dict(arrays)
        return net

    def to_model_keys(self, stage: int, arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A stage net's ``layers.i.rest`` arrays under the full model's names (head dropped)."""
        prefixes = self.stages[stage].prefixes
        out = {}
        for k, v in arrays.items():
            if k.startswith("layers."):
                _, i, rest = k.split(".", 2)
                out[f"{prefixes[int(i)]}.{rest}"] = v
        return out



def _cv(c: Any, key: str, kind: type) -> Any:
    """A config value of ``kind`` (int also from float, float also from int), or a MessageError."""
    v = c.get(key)
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if kind is int and isinstance(v, float) and v.is_integer():
        return int(v)
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise MessageError(f"message config {key!r} is {type(v).__name__}; expected {kind.__name__}")
    return v

def _pack(arrays: dict[str, torch.Tensor], config: dict[str, Any] | None = None) -> bytes:
    return Message({k: v.detach().clone() for k, v in arrays.items()}, dict(config or {})).to_bytes()


def _unpack(data: bytes) -> Message:
    return Message.from_bytes(data)


def _load_sealed(ctx: PartyContext, label: bytes) -> Message:
    blob = ctx.state.get("sealed")
    if blob is None:
        return Message()
    return _unpack(open_blob(hardware_key(label.decode()), blob, label=label))


def _store_sealed(ctx: PartyContext, label: bytes, msg: Message) -> None:
    ctx.state.clear()
    ctx.state["sealed"] = seal_blob(hardware_key(label.decode()), msg.to_bytes(), label=label)


def open_eval_blob(blob: bytes) -> dict[str, torch.Tensor]:
    """Inside the server enclave (an ECALL for evaluation): the stage model's arrays."""
    return _unpack(open_blob(hardware_key("server"), blob, label=b"eval")).arrays


@dataclass
class _Training:
    net: StageNet
    opt: torch.optim.Optimizer
    memory: EnclaveMemory
    channel: SealedChannel
    rnd: int
    stage: int
    samples: int = 0
    loss_sum: float = 0.0
    seal_s: float = 0.0


class ClientEnclave:
    """A client's enclave. Ops: ``attest``, ``begin`` (open the global stage model),
    ``batch`` (one SGD step on frozen-layer features the REE computed), ``end`` (seal the
    trained layer + head for the server enclave)."""

    def __init__(self, spec: EnclaveSpec) -> None:
        self.spec = spec
        self._live: _Training | None = None  # only within one client step (the enclave's RAM)

    def handle(self, msg: Message, ctx: PartyContext) -> Message:
        label = f"client-{ctx.key}".encode()
        op = msg.config.get("op")
        if op == "attest":
            c = msg.config
            server = Report(_cv(c, "server_measurement", bytes), _cv(c, "server_pk", bytes), SERVER_HELLO_NONCE,
                            _cv(c, "server_signature", bytes))
            verify_report(server, expected=self.spec.measurement("server"), nonce=SERVER_HELLO_NONCE)
            keys = KeyPair.generate()
            key = session_key(keys, server.public_key, client=int(ctx.key))  # type: ignore[arg-type]
            _store_sealed(ctx, label, Message(config={"key": key, "send": 0, "recv": -1}))
            r = sign_report(self.spec.measurement("client"), keys.public, _cv(c, "challenge", bytes))
            return Message(config={"measurement": r.measurement, "pk": r.public_key, "signature": r.signature})
        if op == "begin":
            saved = _load_sealed(ctx, label).config
            if "key" not in saved:
                raise MessageError(f"client enclave {ctx.key}: no attested session; attest first")
            ch = SealedChannel(saved["key"], int(ctx.key), UP, _cv(saved, "send", int), _cv(saved, "recv", int))  # type: ignore[arg-type]
            c = msg.config
            rnd, stage = _cv(c, "rnd", int), _cv(c, "stage", int)
            arrays = _unpack(ch.open(_cv(c, "blob", bytes), rnd=rnd, stage=stage)).arrays
            mem = EnclaveMemory(_cv(c, "budget", int), who=f"client {ctx.key}'s enclave")
            net = self.spec.net(stage, arrays).train()
            params = [p for p in net.parameters()]
            mem.alloc_tensors("layer+head", params)
            mem.alloc_tensors("buffers", list(net.buffers()))
            mem.alloc_tensors("gradients", params)
            momentum = _cv(c, "momentum", float)
            if momentum > 0:
                mem.alloc_tensors("optimizer", params)
            opt = torch.optim.SGD(params, lr=_cv(c, "lr", float), momentum=momentum)
            self._live = _Training(net, opt, mem, ch, rnd, stage)
            return Message(metrics={"ok": 1})
        if op == "batch":
            t = self._require()
            x, y = msg.arrays["x"], msg.arrays["y"]
            t.memory.alloc_tensors("batch", [x, y])
            acts = 0

            def hook(_m, _i, out):
                nonlocal acts
                acts += tensor_bytes([out])

            hs = [m.register_forward_hook(hook) for m in t.net.modules() if not list(m.children())]
            try:
                logits = t.net(x)
            finally:
                for h in hs:
                    h.remove()
            t.memory.alloc("activations", 2 * acts)  # outputs kept for backward, and their gradients
            loss = F.cross_entropy(logits, y)
            t.opt.zero_grad()
            loss.backward()
            t.opt.step()
            t.memory.free("activations")
            t.memory.free("batch")
            t.samples += len(y)
            lv = float(loss.detach())
            t.loss_sum += lv * len(y)
            return Message(metrics={"loss": lv})
        if op == "end":
            t = self._require()
            t0 = time.perf_counter()
            blob = t.channel.seal(_pack(t.net.state_dict()), rnd=t.rnd, stage=t.stage)
            t.seal_s += time.perf_counter() - t0
            _store_sealed(ctx, label, Message(config={"key": t.channel.key, "send": t.channel.send_ctr, "recv": t.channel.recv_ctr}))
            self._live = None
            return Message(config={"upload": blob},
                           metrics={"peak": t.memory.peak, "samples": t.samples, "seal_s": t.seal_s,
                                    "loss": t.loss_sum / max(1, t.samples)})  # fmt: skip
        raise MessageError(f"client enclave: unknown op {op!r}")

    def _require(self) -> _Training:
        if self._live is None:
            raise MessageError("client enclave: no stage model open; send 'begin' first")
        return self._live


class ServerEnclave:
    """The server's enclave. Ops: ``hello`` (its report and a challenge per new client),
    ``register`` (verify client reports, agree session keys), ``broadcast`` (seal the stage
    model to each client), ``aggregate`` (open uploads, reject bad ones, FedAvg), ``release``
    (hand the REE the stage's trained layers when the stage ends)."""

    def __init__(self, spec: EnclaveSpec) -> None:
        self.spec = spec

    def handle(self, msg: Message, ctx: PartyContext) -> Message:
        saved = _load_sealed(ctx, b"server")
        conf, model = dict(saved.config), dict(saved.arrays)
        op = msg.config.get("op")
        out = self._op(op, msg, conf, model)
        _store_sealed(ctx, b"server", Message(model, conf))
        return out

    def _channel(self, conf: dict[str, Any], cid: int) -> SealedChannel:
        if f"k/{cid}" not in conf:
            raise MessageError(f"server enclave: client {cid} has no attested session")
        return SealedChannel(conf[f"k/{cid}"], cid, DOWN, int(conf[f"s/{cid}"]), int(conf[f"r/{cid}"]))

    @staticmethod
    def _keep(conf: dict[str, Any], ch: SealedChannel) -> None:
        conf[f"s/{ch.client}"], conf[f"r/{ch.client}"] = ch.send_ctr, ch.recv_ctr

    def _op(self, op: Any, msg: Message, conf: dict[str, Any], model: dict[str, torch.Tensor]) -> Message:
        c = msg.config
        if op == "hello":
            if "sk" not in conf:
                conf["sk"] = KeyPair.generate().private_bytes()
            keys = KeyPair.from_private_bytes(conf["sk"])
            r = sign_report(self.spec.measurement("server"), keys.public, SERVER_HELLO_NONCE)
            reply: dict[str, Any] = {"server_measurement": r.measurement, "server_pk": r.public_key,
                                     "server_signature": r.signature}  # fmt: skip
            for cid in _ids(_cv(c, "ids", str)):
                conf[f"ch/{cid}"] = reply[f"challenge/{cid}"] = os.urandom(16)
            return Message(config=reply)
        if op == "register":
            keys = KeyPair.from_private_bytes(conf["sk"])
            refused = []
            for cid in _ids(_cv(c, "ids", str)):
                r = Report(_cv(c, f"measurement/{cid}", bytes), _cv(c, f"pk/{cid}", bytes), conf.pop(f"ch/{cid}", b""),
                           _cv(c, f"signature/{cid}", bytes))
                try:
                    verify_report(r, expected=self.spec.measurement("client"), nonce=r.nonce)
                except AttestationError:
                    refused.append(cid)
                    continue
                conf[f"k/{cid}"], conf[f"s/{cid}"], conf[f"r/{cid}"] = session_key(keys, r.public_key, client=cid), 0, -1
            return Message(config={"refused": _str(refused)})
        if op == "broadcast":
            stage, rnd = _cv(c, "stage", int), _cv(c, "rnd", int)
            if conf.get("stage") != stage or not model:
                model.clear()
                model.update(self.spec.net(stage).state_dict())
                conf["stage"] = stage
            payload = _pack(model)
            reply = {}
            for cid in _ids(_cv(c, "ids", str)):
                ch = self._channel(conf, cid)
                reply[f"c/{cid}"] = ch.seal(payload, rnd=rnd, stage=stage)
                self._keep(conf, ch)
            return Message(config=reply)
        if op == "aggregate":
            stage, rnd = _cv(c, "stage", int), _cv(c, "rnd", int)
            mem = EnclaveMemory(int(self.spec.server_mb * tee.MiB), who="server enclave")
            mem.alloc_tensors("global", list(model.values()))
            total: dict[str, torch.Tensor] = {}
            weight, rejected = 0.0, []
            for cid in _ids(_cv(c, "ids", str)):
                ch = self._channel(conf, cid)
                try:
                    arrays = _unpack(ch.open(_cv(c, f"u/{cid}", bytes), rnd=rnd, stage=stage)).arrays
                    if set(arrays) != set(model):
                        raise SealError(f"client {cid}'s upload has other tensors than the stage model")
                except (SealError, MessageError):
                    rejected.append(cid)
                    continue
                self._keep(conf, ch)
                n = _cv(c, f"n/{cid}", float)
                mem.alloc_tensors("upload", list(arrays.values()))
                for k, v in arrays.items():
                    if v.is_floating_point():
                        total[k] = total[k] + n * v if k in total else n * v
                    else:
                        total.setdefault(k, v)
                mem.alloc_tensors("sum", list(total.values()))
                weight += n
            if weight > 0:
                for k, v in total.items():
                    model[k] = (v / weight).to(model[k].dtype) if v.is_floating_point() else v
            blob = seal_blob(hardware_key("server"), _pack(model), label=b"eval")
            return Message(config={"rejected": _str(rejected), "eval": blob}, metrics={"server_tee_peak": mem.peak})
        if op == "release":
            stage = _cv(c, "stage", int)
            if conf.get("stage") != stage:
                raise MessageError(f"server enclave: stage {stage} is not the one it holds ({conf.get('stage')})")
            arrays = self.spec.to_model_keys(stage, model)
            model.clear()
            conf.pop("stage", None)
            return Message(arrays)
        raise MessageError(f"server enclave: unknown op {op!r}")


def _ids(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _str(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids)
