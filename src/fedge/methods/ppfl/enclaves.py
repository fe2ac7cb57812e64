"""PPFL's two enclaves (seed 001, Algorithm 1), as side parties: a client enclave per client
(``tee``, scope "client"), which trains the stage's layer and head on the REE's features and seals
its upload, and the server enclave (``server_tee``, shared, called by the strategy with
``PartyCall``), which attests the clients, averages at least ``method.min_cohort`` sealed uploads
and releases a stage's layers; with :class:`EnclaveSpec`, the code and configuration their
attestation measures. Each holds plaintext only while it handles a call and seals the state the
engine keeps under its device key. One module on purpose: it is the enclaves' measured code
(:meth:`EnclaveSpec.measurement` hashes it). What each enclave lets out, and the limits:
``docs/methods/ppfl.md``, "The enclaves".
"""

from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedge.core import messages as messages_mod
from fedge.core import rng as rng_mod
from fedge.core.context import PartyContext
from fedge.core.errors import MessageError
from fedge.core.messages import Message
from fedge.core.rng import GlobalStream
from fedge.methods.ppfl import stages as stages_mod
from fedge.methods.ppfl.stages import Stage, StageNet, stage_net
from fedge.privacy import tee
from fedge.privacy.secagg import keys as keys_mod
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
)

__all__ = ["ClientEnclave", "EnclaveSpec", "ServerEnclave", "open_eval_blob", "SERVER_HELLO_NONCE"]

SERVER_HELLO_NONCE = b"\x00" * 16
"""The challenge the server enclave's report answers: a constant, so that report is not fresh
and can be replayed (getting a fresh one would cost each client a round trip before ``hello``).
What a replay can do is bounded: the report binds the server enclave's X25519 public key to its
measurement, and a client's session key is agreed between that key and a *fresh* key the client
enclave draws at ``attest`` (HKDF of X25519), so only whoever holds the reported key's private
half — the server enclave, sealed under the platform's keys — can open what the client seals
or seal what it will accept. A replayed report helps only an attacker who extracted that
private key (e.g. from a compromised platform), which a fresh report would not stop either
until the key changes. The client reports are fresh: each answers a challenge the server
enclave drew for that client (``hello``) and refuses when none is pending (``register``)."""


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
        """SHA-256 over the code the enclaves run and their configuration (``self.config``:
        the method's config, so lr, momentum and ``min_cohort`` the enclaves apply). The code:
        this module, the stages, the channel, memory accounting, attestation, the key
        agreement, the message encoding the enclaves parse, the derived randomness (the stage
        heads' initialisation, the dropout stream) and the model's code (the module building it
        and those defining its layers)."""
        import fedge.methods.ppfl.enclaves as me

        return measure(
            [
                me,
                stages_mod,
                tee.channel,
                tee.memory,
                tee.attest,
                keys_mod,
                messages_mod,
                rng_mod,
                *self.model_modules(),
            ],
            {"role": role, **self.config},
        )

    def model_modules(self) -> list[ModuleType]:
        """The modules of the model's code: where ``model_fn`` is defined and where each of the
        model's layer classes is (fedge's own; torch's are the platform's), sorted by name."""
        fn = self.model_fn.func if isinstance(self.model_fn, partial) else self.model_fn
        found = {inspect.getmodule(fn)} | {
            inspect.getmodule(type(m)) for m in self.template().modules()
        }
        mods = {m for m in found if m is not None and m.__name__.split(".")[0] != "torch"}
        return sorted(mods, key=lambda m: m.__name__)

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
        raise MessageError(
            f"message config {key!r} is {type(v).__name__}; expected {kind.__name__}"
        )
    return v


def _pack(
    arrays: dict[str, torch.Tensor],
    config: dict[str, Any] | None = None,
    metrics: dict[str, float | int] | None = None,
) -> bytes:
    return Message(
        {k: v.detach().clone() for k, v in arrays.items()}, dict(config or {}), dict(metrics or {})
    ).to_bytes()


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


def _client_label(ctx: PartyContext) -> bytes:
    return f"client-{ctx.key}".encode()


def _seal_session(ctx: PartyContext, ch: SealedChannel, budget: int | None = None) -> None:
    """The client enclave's sealed session record: its session key, the channel's counters
    and (once a ``begin`` fixed it) its memory budget; every other field of its state goes."""
    record: dict[str, Any] = {"key": ch.key, "send": ch.send_ctr, "recv": ch.recv_ctr}
    if budget is not None:
        record["budget"] = budget
    _store_sealed(ctx, _client_label(ctx), Message(config=record))


def _open_session(ctx: PartyContext) -> tuple[SealedChannel, int | None]:
    """What :func:`_seal_session` stored: the channel and the memory budget (None: none fixed yet)."""
    saved = _load_sealed(ctx, _client_label(ctx)).config
    if "key" not in saved:
        raise MessageError(f"client enclave {ctx.key}: no attested session; attest first")
    ch = SealedChannel(
        saved["key"],  # type: ignore[arg-type]
        int(ctx.key),  # type: ignore[arg-type]
        UP,
        _cv(saved, "send", int),
        _cv(saved, "recv", int),
    )
    return ch, _cv(saved, "budget", int) if "budget" in saved else None


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
    budget: int
    dropout: GlobalStream  # the stream nn.Dropout draws from (see ClientEnclave)
    samples: int = 0
    loss_sum: float = 0.0
    seal_s: float = 0.0


class ClientEnclave:
    """A client's enclave. Ops: ``attest``, ``begin`` (open the global stage model),
    ``batch`` (one SGD step on frozen-layer features the REE computed), ``end`` (seal the
    trained layer + head for the server enclave).

    What the REE cannot steer or read (``docs/methods/ppfl.md``, "The enclaves"):

    - ``begin`` persists the channel's receive counter as soon as it opens the broadcast, so
      the same blob sent again is refused as a replay (before, the counter was kept only at
      ``end``, and the REE could open one stage model as often as it liked).
    - The learning rate and momentum are the measured config's (``spec.config``: the
      attestation covers them); a ``begin`` naming others is refused. The memory budget is
      the enclave's size, a property of the device (as SGX fixes an enclave's size when it is
      created): per-device sizes are not in the run config the measurement covers, so the
      first ``begin`` fixes it in the sealed state and a later one naming another is refused.
    - ``batch`` replies with nothing; ``end``'s reply carries the memory peak and the sealing
      time only. The sample count and the step's mean training loss (one scalar per client
      step, weighted into the round's ``train_loss`` by the server enclave) go inside the
      sealed upload.

    Random layers (vgg9's dropouts) draw from a :class:`~fedge.core.rng.GlobalStream` seeded
    from the enclave's own generator when ``begin`` opens the stage model and carried from one
    ``batch`` to the next, not from torch's global RNG, so a client step trains the same
    whatever ran before it in the process (another client, another run); as in
    :class:`fedge.methods.local.LocalTraining`. A model without random layers never reads it.
    """

    def __init__(self, spec: EnclaveSpec) -> None:
        self.spec = spec
        self._live: _Training | None = None  # only within one client step (the enclave's RAM)

    def handle(self, msg: Message, ctx: PartyContext) -> Message:
        op = msg.config.get("op")
        if op == "attest":
            c = msg.config
            server = Report(
                _cv(c, "server_measurement", bytes),
                _cv(c, "server_pk", bytes),
                SERVER_HELLO_NONCE,
                _cv(c, "server_signature", bytes),
            )
            verify_report(
                server, expected=self.spec.measurement("server"), nonce=SERVER_HELLO_NONCE
            )
            keys = KeyPair.generate()
            key = session_key(keys, server.public_key, client=int(ctx.key))  # type: ignore[arg-type]
            _seal_session(ctx, SealedChannel(key, int(ctx.key), UP))  # type: ignore[arg-type]
            r = sign_report(
                self.spec.measurement("client"), keys.public, _cv(c, "challenge", bytes)
            )
            return Message(
                config={"measurement": r.measurement, "pk": r.public_key, "signature": r.signature}
            )
        if op == "begin":
            ch, sealed_budget = _open_session(ctx)
            c = msg.config
            lr, momentum = float(self.spec.config["lr"]), float(self.spec.config["momentum"])
            for k, v in (("lr", lr), ("momentum", momentum)):
                if k in c and _cv(c, k, float) != v:
                    raise MessageError(
                        f"client enclave {ctx.key}: 'begin' asks for {k}={c[k]!r}, but the attested "
                        f"configuration says {v!r}; refused (the REE cannot change how the enclave trains)"
                    )
            budget = sealed_budget if sealed_budget is not None else _cv(c, "budget", int)
            if "budget" in c and _cv(c, "budget", int) != budget:
                raise MessageError(
                    f"client enclave {ctx.key}: 'begin' gives a memory budget of {c['budget']!r} bytes, "
                    f"but this enclave was created with {budget}; refused"
                )
            rnd, stage = _cv(c, "rnd", int), _cv(c, "stage", int)
            arrays = _unpack(ch.open(_cv(c, "blob", bytes), rnd=rnd, stage=stage)).arrays
            # the broadcast is consumed now: the same blob sent again is a replay
            _seal_session(ctx, ch, budget)
            mem = EnclaveMemory(budget, who=f"client {ctx.key}'s enclave")
            net = self.spec.net(stage, arrays).train()
            params = [p for p in net.parameters()]
            mem.alloc_tensors("layer+head", params)
            mem.alloc_tensors("buffers", list(net.buffers()))
            mem.alloc_tensors("gradients", params)
            if momentum > 0:
                mem.alloc_tensors("optimizer", params)
            opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
            self._live = _Training(
                net, opt, mem, ch, rnd, stage, budget, GlobalStream(ctx.generator)
            )
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
            with t.dropout.active():
                try:
                    logits = t.net(x)
                finally:
                    for h in hs:
                        h.remove()
            t.memory.alloc(
                "activations", 2 * acts
            )  # outputs kept for backward, and their gradients
            loss = F.cross_entropy(logits, y)
            t.opt.zero_grad()
            loss.backward()
            t.opt.step()
            t.memory.free("activations")
            t.memory.free("batch")
            t.samples += len(y)
            t.loss_sum += float(loss.detach()) * len(y)
            return Message()  # no loss: it would be a per-query oracle on the hidden model
        if op == "end":
            t = self._require()
            t0 = time.perf_counter()
            stats = {
                "samples": t.samples,
                "loss": t.loss_sum / max(1, t.samples),
            }  # for the server enclave only
            blob = t.channel.seal(
                _pack(t.net.state_dict(), metrics=stats), rnd=t.rnd, stage=t.stage
            )
            t.seal_s += time.perf_counter() - t0
            _seal_session(ctx, t.channel, t.budget)
            self._live = None
            return Message(
                config={"upload": blob}, metrics={"peak": t.memory.peak, "seal_s": t.seal_s}
            )
        raise MessageError(f"client enclave: unknown op {op!r}")

    def _require(self) -> _Training:
        if self._live is None:
            raise MessageError("client enclave: no stage model open; send 'begin' first")
        return self._live


class ServerEnclave:
    """The server's enclave. Ops: ``hello`` (its report and a challenge per new client),
    ``register`` (verify client reports, agree session keys), ``broadcast`` (seal the stage
    model to each client), ``aggregate`` (open uploads, reject bad ones, FedAvg), ``release``
    (hand the REE the stage's trained layers when the stage ends).

    The REE drives every op, so each guards what it lets out:

    - ``register`` accepts a client report only over the challenge ``hello`` drew for that
      client (one use; none pending: refused).
    - ``aggregate`` weights each upload by the sample count sealed inside it (the client
      enclave counted what it trained on), and updates the stage model only when at least
      ``min_cohort`` uploads open (``method.min_cohort``, in the measured config; default 2):
      with fewer it changes nothing and answers ``short``, which the strategy turns into a
      skipped round. So the stage model, and the evaluation blob, are a mean of at least that
      many clients' updates — never one client's, which the REE could otherwise get by passing
      a single upload.
    - ``release`` hands out a stage's layers only after it aggregated such a cohort at least
      once. It keeps what it released until the next stage's first aggregate and hands the
      same arrays out again if asked for that stage once more: a round skipped after the
      release (the strategy's state put back, this enclave's not) must not lose the layers.
    """

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
        return SealedChannel(
            conf[f"k/{cid}"], cid, DOWN, int(conf[f"s/{cid}"]), int(conf[f"r/{cid}"])
        )

    @staticmethod
    def _keep(conf: dict[str, Any], ch: SealedChannel) -> None:
        conf[f"s/{ch.client}"], conf[f"r/{ch.client}"] = ch.send_ctr, ch.recv_ctr

    def _op(
        self, op: Any, msg: Message, conf: dict[str, Any], model: dict[str, torch.Tensor]
    ) -> Message:
        c = msg.config
        if op == "hello":
            if "sk" not in conf:
                conf["sk"] = KeyPair.generate().private_bytes()
            keys = KeyPair.from_private_bytes(conf["sk"])
            r = sign_report(self.spec.measurement("server"), keys.public, SERVER_HELLO_NONCE)
            reply: dict[str, Any] = {
                "server_measurement": r.measurement,
                "server_pk": r.public_key,
                "server_signature": r.signature,
            }
            for cid in _ids(_cv(c, "ids", str)):
                conf[f"ch/{cid}"] = reply[f"challenge/{cid}"] = os.urandom(16)
            return Message(config=reply)
        if op == "register":
            keys = KeyPair.from_private_bytes(conf["sk"])
            refused = []
            for cid in _ids(_cv(c, "ids", str)):
                challenge = conf.pop(f"ch/{cid}", None)
                if (
                    challenge is None
                ):  # no hello for this client: a report over no challenge is not fresh
                    refused.append(cid)
                    continue
                r = Report(
                    _cv(c, f"measurement/{cid}", bytes),
                    _cv(c, f"pk/{cid}", bytes),
                    challenge,
                    _cv(c, f"signature/{cid}", bytes),
                )
                try:
                    verify_report(r, expected=self.spec.measurement("client"), nonce=r.nonce)
                except AttestationError:
                    refused.append(cid)
                    continue
                conf[f"k/{cid}"], conf[f"s/{cid}"], conf[f"r/{cid}"] = (
                    session_key(keys, r.public_key, client=cid),
                    0,
                    -1,
                )
            return Message(config={"refused": _str(refused)})
        if op == "broadcast":
            stage, rnd = _cv(c, "stage", int), _cv(c, "rnd", int)
            if conf.get("stage") != stage or not model:
                model.clear()
                model.update(self.spec.net(stage).state_dict())
                conf["stage"], conf["aggregated"] = stage, 0
            payload = _pack(model)
            reply = {}
            for cid in _ids(_cv(c, "ids", str)):
                ch = self._channel(conf, cid)
                reply[f"c/{cid}"] = ch.seal(payload, rnd=rnd, stage=stage)
                self._keep(conf, ch)
            return Message(config=reply)
        if op == "aggregate":
            stage, rnd = _cv(c, "stage", int), _cv(c, "rnd", int)
            if conf.get("stage") != stage or not model:
                raise MessageError(
                    f"server enclave: asked to aggregate stage {stage}, but it holds {conf.get('stage')}"
                )
            mem = EnclaveMemory(int(self.spec.server_mb * tee.MiB), who="server enclave")
            mem.alloc_tensors("global", list(model.values()))
            total: dict[str, torch.Tensor] = {}
            weight, loss, opened, rejected = 0.0, 0.0, 0, []
            for cid in _ids(_cv(c, "ids", str)):
                ch = self._channel(conf, cid)
                try:
                    up = _unpack(ch.open(_cv(c, f"u/{cid}", bytes), rnd=rnd, stage=stage))
                    if set(up.arrays) != set(model):
                        raise SealError(
                            f"client {cid}'s upload has other tensors than the stage model"
                        )
                    n = up.metrics.get("samples")
                    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                        raise SealError(
                            f"client {cid}'s upload gives {n!r} samples; expected a positive int"
                        )
                except (SealError, MessageError):
                    rejected.append(cid)
                    continue
                self._keep(conf, ch)  # its counter is spent whether or not the round aggregates
                opened += 1
                mem.alloc_tensors("upload", list(up.arrays.values()))
                for k, v in up.arrays.items():
                    if v.is_floating_point():
                        total[k] = total[k] + n * v if k in total else n * v
                    else:
                        total.setdefault(k, v)
                mem.alloc_tensors("sum", list(total.values()))
                weight += n
                loss += n * float(up.metrics.get("loss", 0.0))
            need = int(self.spec.config["min_cohort"])
            if (
                opened < need
            ):  # the stage model stays as it was: no mean of fewer than `need` clients goes out
                return Message(
                    config={
                        "rejected": _str(rejected),
                        "short": f"{opened} of the uploads opened, fewer than method.min_cohort={need}",
                    },
                    metrics={"server_tee_peak": mem.peak},
                )
            for k, v in total.items():
                model[k] = (v / weight).to(model[k].dtype) if v.is_floating_point() else v
            conf["aggregated"] = int(conf.get("aggregated", 0)) + 1
            conf.pop("released", None)  # the REE's state now holds the last release for good
            conf.pop("released_stage", None)
            blob = seal_blob(hardware_key("server"), _pack(model), label=b"eval")
            return Message(
                config={"rejected": _str(rejected), "eval": blob},
                metrics={"server_tee_peak": mem.peak, "train_loss": loss / weight},
            )
        if op == "release":
            stage = _cv(c, "stage", int)
            if (
                conf.get("released_stage") == stage
            ):  # released already; a skipped round lost it in the REE
                return Message(_unpack(_cv(conf, "released", bytes)).arrays)
            if conf.get("stage") != stage:
                raise MessageError(
                    f"server enclave: stage {stage} is not the one it holds ({conf.get('stage')})"
                )
            if not conf.get("aggregated"):
                raise MessageError(
                    f"server enclave: stage {stage} has not aggregated a cohort yet; its layers are "
                    "not released before they are a mean of method.min_cohort clients' updates"
                )
            arrays = self.spec.to_model_keys(stage, model)
            model.clear()
            conf.pop("stage", None)
            conf["aggregated"], conf["released_stage"], conf["released"] = 0, stage, _pack(arrays)
            return Message(arrays)
        raise MessageError(f"server enclave: unknown op {op!r}")


def _ids(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _str(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids)
