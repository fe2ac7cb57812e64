"""Messages between server, clients and side parties (:class:`Message`), and their wire encoding
(MessagePack); a message's size is ``len(message.to_bytes())``, never an estimate. Design notes: docs/decisions.md#core.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgpack
import numpy as np
import torch

from fedge.core.errors import MessageError, NonFiniteError

__all__ = ["ConfigValue", "Message", "WIRE_VERSION", "decode", "encode"]

WIRE_VERSION = 1
ConfigValue = int | float | str | bytes | bool | None

# dtype <-> wire code. bfloat16 has no numpy twin: it travels as its raw 16-bit pattern.
_CODES: dict[torch.dtype, str] = {
    torch.float32: "f4",
    torch.float64: "f8",
    torch.float16: "f2",
    torch.bfloat16: "bf2",
    torch.int64: "i8",
    torch.int32: "i4",
    torch.int16: "i2",
    torch.int8: "i1",
    torch.uint8: "u1",
    torch.bool: "b1",
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}
_ITEMSIZE = {code: torch.empty((), dtype=dt).element_size() for code, dt in _DTYPES.items()}


@dataclass
class Message:
    """Named tensors plus config and metrics, as exchanged in one direction of one round.

    Args:
        arrays: name -> tensor (any shape, a dtype listed in ``_CODES``; moved to CPU).
        config: name -> int | float | str | bytes | bool | None (seeds, counts, flags).
        metrics: name -> number (losses, sample counts reported by a client).
    """

    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    config: dict[str, ConfigValue] = field(default_factory=dict)
    metrics: dict[str, float | int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """The message's wire encoding (see module docstring)."""
        return encode(self)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Message:
        """Decode bytes produced by :meth:`to_bytes`; raises :class:`MessageError` if malformed."""
        return decode(data)

    def config_int(self, key: str, default: int | None = None) -> int:
        """``config[key]`` (or ``default`` when absent and given) as an int; :class:`MessageError`
        if it is missing or not a number (a round, a count, a seed)."""
        value = self.config.get(key, default) if default is not None else self.config.get(key)
        if not isinstance(value, int | float):
            raise MessageError(f"message config {key!r} is {value!r}; expected a number")
        return int(value)

    def config_float(self, key: str) -> float:
        """``config[key]`` as a float; :class:`MessageError` if it is missing or not a number."""
        value = self.config.get(key)
        if not isinstance(value, int | float):
            raise MessageError(f"message config {key!r} is {value!r}; expected a number")
        return float(value)

    @property
    def nbytes(self) -> int:
        """Length of the serialized message in bytes."""
        return len(encode(self))

    def check_finite(self, *, who: str = "message", round: int | None = None) -> None:  # noqa: A002
        """Raise :class:`NonFiniteError` naming the first array or metric holding NaN or Inf
        (``round``: the round the message belongs to, carried by the error)."""
        for name, t in self.arrays.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise NonFiniteError(
                    f"{who}: array {name!r} holds non-finite values (NaN or Inf); "
                    "lower the learning rate, or bound the updates (method.clip where the method has it, privacy.clip otherwise)",
                    round=round,
                    cause=f"array {name!r} holds non-finite values (NaN or Inf) ({who})",
                )
        for name, v in self.metrics.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise NonFiniteError(
                    f"{who}: metric {name!r} is {v}; expected a finite number",
                    round=round,
                    cause=f"metric {name!r} is {v} ({who})",
                )


def _array_to_wire(name: str, t: torch.Tensor) -> list:
    if not isinstance(t, torch.Tensor):
        raise MessageError(f"array {name!r} is a {type(t).__name__}; expected a torch.Tensor")
    code = _CODES.get(t.dtype)
    if code is None:
        raise MessageError(
            f"array {name!r} has dtype {t.dtype}; expected one of {sorted(map(str, _CODES))}"
        )
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype == torch.bool:
        t = t.view(torch.uint8)
    raw = t.numpy().tobytes() if t.numel() else b""
    return [name, code, list(t.shape), raw]


def _array_from_wire(item: list) -> tuple[str, torch.Tensor]:
    try:
        name, code, shape, raw = item
        dtype = _DTYPES[code]
        numel = math.prod(shape)
    except (ValueError, TypeError, KeyError) as exc:
        raise MessageError(f"malformed array entry in message: {exc!r}") from exc
    if len(raw) != numel * _ITEMSIZE[code]:
        raise MessageError(
            f"array {name!r}: {len(raw)} bytes for shape {shape} of {code}; "
            f"expected {numel * _ITEMSIZE[code]} (truncated or corrupt message)"
        )
    if numel == 0:
        return name, torch.empty(shape, dtype=dtype)
    store = {"bf2": torch.int16, "b1": torch.uint8}.get(code, dtype)
    t = torch.frombuffer(bytearray(raw), dtype=store).reshape(shape)
    if store is not dtype:
        t = t.view(dtype)
    return name, t


def _check_config(config: Mapping[str, object]) -> None:
    for key, value in config.items():
        if not isinstance(key, str):
            raise MessageError(f"config key {key!r} is not a string")
        if value is not None and not isinstance(value, (int, float, str, bytes, bool)):
            raise MessageError(
                f"config value {key!r}={value!r} is a {type(value).__name__}; "
                "expected int, float, str, bytes, bool or None (send tensors as arrays)"
            )


def encode(message: Message) -> bytes:
    """Serialize ``message`` (MessagePack; see module docstring)."""
    _check_config(message.config)
    _check_config(message.metrics)
    arrays = [_array_to_wire(name, t) for name, t in message.arrays.items()]
    metrics = {
        k: (v.item() if isinstance(v, (np.generic, torch.Tensor)) else v)
        for k, v in message.metrics.items()
    }
    return msgpack.packb([WIRE_VERSION, arrays, message.config, metrics], use_bin_type=True)


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Inverse of :func:`encode`; every malformation becomes a :class:`MessageError`."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise MessageError(f"message does not decode ({len(data)} bytes): {exc}") from exc
    if not (isinstance(obj, list) and len(obj) == 4 and obj[0] == WIRE_VERSION):
        head = obj[0] if isinstance(obj, list) and obj else obj
        raise MessageError(f"not a fedge v{WIRE_VERSION} message (header {head!r})")
    _, arrays, config, metrics = obj
    if not (isinstance(arrays, list) and isinstance(config, dict) and isinstance(metrics, dict)):
        raise MessageError("malformed message body: expected [version, arrays, config, metrics]")
    return Message(dict(_array_from_wire(a) for a in arrays), config, metrics)
