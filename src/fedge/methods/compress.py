"""Uplink compression for any method whose clients upload a dense vector (a model delta or a
gradient): ``method.compress``, applied by the composer (:mod:`fedge.methods.compose`) around
the method, never by the method's own build.

- **Client** (:class:`CompressingClient`): the method's reply arrays, flattened in name order
  into x ∈ R^d (the vector secure aggregation would mask), are encoded by a codec of
  :mod:`fedge.core.compress` (top-k, random-k, QSGD, scaled sign, 4/8-bit quantization) and
  only the encoded arrays travel: ``bytes_up`` is their real serialized size. With error
  feedback (Stich et al., NeurIPS 2018; Karimireddy et al., ICML 2019, Algorithm 2) the client
  sends C(x + e) and keeps e ← x + e − C(x + e), its residual, in its persistent state
  (``ctx.state``): checkpointed, so a resumed run equals an uninterrupted one.
- **Server** (:class:`Decompression`): each reply is decoded back to the method's arrays
  (their names, shapes and dtypes from :meth:`~fedge.methods.secure.Summable.summands`)
  before the method — or DP — sees it.

Draws (randk's indices, QSGD's and quantization's stochastic rounding) come from a generator
of the run's ``draws`` kind seeded by (run seed, "compress", round, client); randk sends that
seed (8 bytes) and the server redraws the indices from it.

Composition: with DP the client clips first and compresses the clipped contribution; the
server decodes, then re-clips to C and adds the noise (:mod:`fedge.methods.private`), so the
sensitivity the accountant assumes holds whatever the codec or the residual does. Secure
aggregation is refused: its masks make each client's vector dense in a fixed-point ring shared
by all, and a compressed message (per-client indices, per-client scales, packed bits) is not
additive there; masking the decoded vector would send as many bytes as no compression.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from pydantic import Field, model_validator

from fedge.core.compress import CODECS, Codec, CompressSpec, decode, encode
from fedge.core.context import ClientContext
from fedge.core.errors import ConfigError, MessageError
from fedge.core.messages import Message
from fedge.core.protocols import ClientProgram, Exchange, Round, Strategy, StrategyWrapper
from fedge.core.rng import Draws, check_draws, derive_seed, make_generator
from fedge.methods.base import MethodConfigBase

__all__ = [
    "CompressConfig",
    "CompressOptions",
    "CompressingClient",
    "Decompression",
    "RESIDUAL",
    "ReplyLayout",
    "compressed",
]

#: the client's error-feedback residual e in its persistent state
RESIDUAL = "compress.residual"
#: the reply config keys the wrapper adds: the codec's name, randk's seed
_KEYS = ("compress", "compress.seed")

#: which codecs read each parameter key
_APPLIES: dict[str, tuple[Codec, ...]] = {
    "ratio": ("topk", "randk"),
    "levels": ("qsgd",),
    "bits": ("quantize",),
    "bucket": ("qsgd", "sign", "quantize"),
}
#: each codec's defaults (error feedback on for the biased ones)
_DEFAULTS: dict[Codec, dict[str, Any]] = {
    "topk": {"ratio": 0.01, "error_feedback": True},
    "randk": {"ratio": 0.01, "error_feedback": False},
    "qsgd": {"levels": 7, "bucket": 512, "error_feedback": False},
    "sign": {"error_feedback": True},
    "quantize": {"bits": 8, "bucket": 512, "error_feedback": False},
}


class CompressConfig(MethodConfigBase):
    """``method.compress``: the codec of the clients' uploads and its parameters; a key the
    codec does not read is an error, an unset one takes the codec's default."""

    name: Codec = Field(
        description="topk | randk (unbiased, scaled d/k) | qsgd (Alistarh et al. 2017, unbiased) | "
        "sign (scaled sign, Karimireddy et al. 2019) | quantize (b-bit uniform, stochastic rounding)",
    )
    ratio: float | None = Field(
        None,
        gt=0,
        le=1,
        description="topk, randk: fraction of coordinates sent, k = max(1, round(ratio·d)) (default 0.01)",
    )
    levels: int | None = Field(
        None,
        ge=1,
        le=2**15,
        description="qsgd: s, levels of |x_i|/‖x‖₂ (default 7: 4 bits a coordinate with its sign)",
    )
    bits: Literal[4, 8] | None = Field(None, description="quantize: bits a coordinate (default 8)")
    bucket: int | None = Field(
        None,
        ge=1,
        description="qsgd, sign, quantize: coordinates sharing one scale (default 512 for qsgd and "
        "quantize; null for sign: one scale ‖x‖₁/d for the whole vector, as the paper)",
    )
    error_feedback: bool | None = Field(
        None,
        description="send C(x + e), keep e ← x + e − C(x + e) per client across rounds (checkpointed); "
        "default true for the biased topk and sign, false for the unbiased randk, qsgd, quantize",
    )

    @model_validator(mode="after")
    def _keys_of_the_codec(self) -> CompressConfig:
        for key, codecs in _APPLIES.items():
            value = getattr(self, key)
            if value is not None and self.name not in codecs:
                raise ValueError(
                    f"compress.{key}={value} applies to {' and '.join(codecs)}, not to "
                    f"name={self.name}; remove compress.{key}"
                )
        for key, value in _DEFAULTS[self.name].items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        return self

    def spec(self) -> CompressSpec:
        """The codec as :mod:`fedge.core.compress` takes it."""
        return CompressSpec(
            self.name, ratio=self.ratio, levels=self.levels, bits=self.bits, bucket=self.bucket
        )


class CompressOptions(MethodConfigBase):
    """The ``method.compress`` key, spelled the same for every method that takes it."""

    compress: CompressConfig | None = Field(
        None,
        description=f"uplink compression of the clients' dense uploads (null: none); codecs {list(CODECS)}",
    )


@runtime_checkable
class ReplyLayout(Protocol):
    """A strategy that says what a client's reply carries (every :class:`~fedge.methods.secure.
    Summable` does, and FedNova's, whose aggregate is no plain mean)."""

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """Name -> (shape, dtype) of every array a client's reply carries."""
        ...


def _seed(seed: int, rnd: int, cid: int) -> int:
    return derive_seed(seed, "compress", rnd, cid)


class CompressingClient:
    """Client side: the wrapped program's reply, sent encoded; its error-feedback residual in
    ``ctx.state[RESIDUAL]`` (restarted at zero if the reply's length changed, as when a model
    is pruned).

    Args:
        inner: the method's client program (its reply's arrays are floating point).
        spec: the codec.
        error_feedback: keep and add the residual.
        seed, draws: the run's seed and kind of generator.
    """

    def __init__(
        self,
        inner: ClientProgram,
        spec: CompressSpec,
        *,
        error_feedback: bool,
        seed: int,
        draws: Draws = "torch",
    ) -> None:
        self.inner, self.spec, self.error_feedback = inner, spec, error_feedback
        self.seed, self.draws = seed, check_draws(draws)

    def run(self, message: Message, ctx: ClientContext) -> Message:
        reply = self.inner.run(message, ctx)
        if not reply.arrays:
            return reply
        names = sorted(reply.arrays)
        ints = [n for n in names if not reply.arrays[n].is_floating_point()]
        if ints:
            raise MessageError(
                f"round {ctx.rnd}, client {ctx.cid}: method.compress encodes floating-point "
                f"uploads, but the reply's arrays {ints[:5]} are not"
            )
        # the codecs run on the CPU, where the upload travels from (a method moves it off its device)
        x = torch.cat(
            [reply.arrays[n].detach().to("cpu", torch.float32).reshape(-1) for n in names]
        )
        residual = ctx.state.get(RESIDUAL)
        if self.error_feedback and isinstance(residual, torch.Tensor) and residual.shape == x.shape:
            x = x + residual
        seed = _seed(self.seed, ctx.rnd, ctx.cid)
        arrays = encode(self.spec, x, make_generator(self.draws, seed, "compress"), seed=seed)
        if self.error_feedback:
            sent = decode(
                self.spec, arrays, x.numel(), gen=make_generator(self.draws, seed, "compress")
            )
            ctx.state[RESIDUAL] = x - sent
        config = {**reply.config, "compress": self.spec.name}
        if self.spec.name == "randk":
            config["compress.seed"] = seed
        return Message(arrays, config=config, metrics=reply.metrics)


class Decompression(StrategyWrapper):
    """Server side: every reply of the wrapped round decoded to the method's arrays before the
    wrapped strategy (the method, or DP over it) receives it.

    Args:
        inner: a :class:`ReplyLayout` (its ``summands()`` name the arrays, shapes and dtypes
            a reply carries).
        spec: the codec.
        draws: the run's kind of generator (randk's indices are redrawn from the sent seed).
    """

    def __init__(self, inner: Strategy, spec: CompressSpec, *, draws: Draws = "torch") -> None:
        if not isinstance(inner, ReplyLayout):
            raise ConfigError(
                f"method.compress needs a strategy that says what its replies carry (summands()); "
                f"{type(inner).__name__} does not: implement it, or remove method.compress"
            )
        super().__init__(inner)
        self.layout: ReplyLayout = inner
        self.spec, self.draws = spec, check_draws(draws)

    def summands(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        return self.layout.summands()

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        """The wrapped round, its exchanges' replies decoded on their way in."""
        steps = self.inner.round(rnd, client_ids)
        try:
            step = next(steps)
            while True:
                replies = yield step
                if isinstance(step, Exchange):
                    replies = self.decode_replies(rnd, replies)
                step = steps.send(replies)
        except StopIteration as stop:
            return stop.value
        finally:
            steps.close()  # a round the engine closes (skipped under min_replies) closes inner's

    def aggregate_round(self, rnd: int, replies: Mapping[int, Message]) -> dict[str, float]:
        return self.inner.aggregate_round(rnd, self.decode_replies(rnd, replies))

    def decode_replies(self, rnd: int, replies: Mapping[int, Message]) -> dict[int, Message]:
        """Each reply with arrays decoded (a reply without arrays, e.g. a protocol step, as is)."""
        return {cid: self._decode(rnd, cid, r) for cid, r in replies.items()}

    def _decode(self, rnd: int, cid: int, reply: Message) -> Message:
        who = f"round {rnd}, client {cid}"
        codec = reply.config.get("compress")
        if not reply.arrays and codec is None:
            return reply
        if codec != self.spec.name:
            raise MessageError(
                f"{who}: expected a reply compressed by {self.spec.name} (method.compress), "
                f"got compress={codec!r}"
            )
        summands = self.layout.summands()
        names = sorted(summands)
        d = sum(math.prod(summands[n][0]) for n in names)
        gen = None
        if self.spec.name == "randk":
            seed = reply.config.get("compress.seed")
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise MessageError(f"{who}: randk reply without its int compress.seed")
            gen = make_generator(self.draws, seed, "compress")
        try:
            flat = decode(self.spec, dict(reply.arrays), d, gen=gen)
        except MessageError as exc:
            raise MessageError(f"{who}: {exc}") from None
        arrays, start = {}, 0
        for n in names:
            shape, dtype = summands[n]
            size = math.prod(shape)
            arrays[n] = flat[start : start + size].reshape(shape).to(dtype)
            start += size
        config = {k: v for k, v in reply.config.items() if k not in _KEYS}
        return Message(arrays, config=config, metrics=reply.metrics)


def compressed(
    strategy: Strategy,
    program: ClientProgram,
    options: CompressConfig | None,
    *,
    seed: int,
    draws: Draws = "torch",
) -> tuple[Strategy, ClientProgram]:
    """Both sides wrapped when ``options`` names a codec; unchanged when it is None."""
    if options is None:
        return strategy, program
    spec = options.spec()
    client = CompressingClient(
        program, spec, error_feedback=bool(options.error_feedback), seed=seed, draws=draws
    )
    return Decompression(strategy, spec, draws=draws), client
