"""Pruning masks (seed 004, Eq. 2): which weights are prunable (conv and linear weights), density,
applying masks, and masks on the wire (bitmap or index list, whichever is smaller).
Design notes: docs/decisions.md#pruning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from fedge.core.errors import ConfigError, MessageError

__all__ = [
    "MaskBytes",
    "apply_masks_",
    "check_masks",
    "decode_masks",
    "density",
    "dense_masks",
    "encode_masks",
    "mask_bytes",
    "prunable_parameters",
]

_KEPT, _PRUNED = ":kept", ":pruned"
_PRUNABLE_TYPES = (nn.Linear, nn.modules.conv._ConvNd)


def prunable_parameters(model: nn.Module) -> list[str]:
    """Names of the prunable weights of ``model`` (conv and linear ``weight``), in
    ``model.named_parameters()`` order.

    Example:
        >>> from fedge.models import build_model
        >>> prunable_parameters(build_model("lenet", input_shape=(1, 28, 28), num_classes=10))
        ['features.conv1.conv.weight', 'features.conv2.conv.weight', 'classifier.out.weight']
    """
    owned = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, _PRUNABLE_TYPES) and isinstance(getattr(m, "weight", None), nn.Parameter)
    }
    return [n for n, p in model.named_parameters() if id(p) in owned]


def dense_masks(model: nn.Module) -> dict[str, Tensor]:
    """All-True masks over the prunable weights (the starting point of Algorithm 1)."""
    params = dict(model.named_parameters())
    names = prunable_parameters(model)
    if not names:
        raise ConfigError(
            f"{type(model).__name__} has no prunable weight (no nn.Linear or nn.Conv*d); pruning needs at least one"
        )
    return {n: torch.ones_like(params[n], dtype=torch.bool) for n in names}


def check_masks(model: nn.Module, masks: Mapping[str, Tensor] | None) -> dict[str, Tensor]:
    """Validate ``masks`` against ``model``; return a full dict (absent prunable names = all True).

    Raises:
        ConfigError: a name that is not a prunable weight, a non-bool mask, or a wrong shape.
    """
    full = dense_masks(model)
    for name, mask in (masks or {}).items():
        if name not in full:
            raise ConfigError(
                f"mask given for {name!r}, which is not a prunable weight; prunable: "
                f"{', '.join(full)} (conv and linear weights; biases and norms are never pruned)"
            )
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise ConfigError(f"mask for {name!r} must be a torch.bool tensor, got {got}")
        if mask.shape != full[name].shape:
            raise ConfigError(
                f"mask for {name!r} has shape {tuple(mask.shape)}, "
                f"expected the weight's shape {tuple(full[name].shape)}"
            )
        full[name] = mask.to(full[name].device)
    return full


def density(masks: Mapping[str, Tensor] | None, model: nn.Module) -> float:
    """Kept fraction of the prunable weights: ``‖m‖₀ / n`` (seed 004, Eq. 2)."""
    full = check_masks(model, masks)
    total = sum(m.numel() for m in full.values())
    return sum(int(m.sum()) for m in full.values()) / total


@torch.no_grad()
def apply_masks_(model: nn.Module, masks: Mapping[str, Tensor]) -> nn.Module:
    """Zero the pruned weights of ``model`` in place (``W ← W ⊙ m``); returns ``model``."""
    params = dict(model.named_parameters())
    for name, mask in check_masks(model, masks).items():
        params[name].mul_(mask.to(params[name].dtype))
    return model


def rescale_(model: nn.Module, masks: Mapping[str, Tensor]) -> nn.Module:
    """Scale each pruned weight tensor's kept entries by ``1/sqrt(density)`` of its mask, in place.

    Pruning a fraction 1 − d of a layer's weights at a variance-preserving initialisation
    shrinks that layer's output variance by d, so after several 90%-pruned layers the logits
    of a freshly pruned network are nearly constant. Backprop recovers quickly; zeroth-order
    training sits on a long plateau, because its loss differences are as small as the signal.
    Rescaling restores each layer's initial output variance (the signal-propagation argument
    of Lee et al., "A Signal Propagation Perspective for Pruning Neural Networks at
    Initialization", ICLR 2020). Not part of seed 004's algorithm: an option of the method.
    """
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, mask in check_masks(model, masks).items():
            d = float(mask.float().mean())
            if 0 < d < 1:
                params[name].mul_(d**-0.5)
    return model


@dataclass(frozen=True)
class MaskBytes:
    """Wire size of a set of masks, payload bytes.

    Attributes:
        bitmap: every tensor as a packed bitmap, ``Σ ceil(n / 8)``.
        index: every tensor as its shorter int32 index list, ``Σ 4 · min(kept, pruned)``.
        smaller: which of the two totals is smaller (``"bitmap"`` on a tie).
        encoded: what :func:`encode_masks` sends: the smaller encoding per tensor.
    """

    bitmap: int
    index: int
    smaller: Literal["bitmap", "index"]
    encoded: int


def _sizes(mask: Tensor) -> tuple[int, int]:
    n, kept = mask.numel(), int(mask.sum())
    return math.ceil(n / 8), 4 * min(kept, n - kept)


def mask_bytes(masks: Mapping[str, Tensor]) -> MaskBytes:
    """Bytes to send ``masks`` as bitmaps vs as index lists; see the module docstring."""
    sizes = [_sizes(_as_bool(n, m)) for n, m in masks.items()]
    bitmap = sum(b for b, _ in sizes)
    index = sum(i for _, i in sizes)
    return MaskBytes(
        bitmap=bitmap,
        index=index,
        smaller="bitmap" if bitmap <= index else "index",
        encoded=sum(min(b, i) for b, i in sizes),
    )


def encode_masks(masks: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Masks as Message arrays, the smaller encoding per tensor (uint8 bitmap or int32 indices).

    Round trip: ``decode_masks(encode_masks(m), {n: t.shape for n, t in m.items()}) == m``.
    """
    out: dict[str, Tensor] = {}
    for name, mask in masks.items():
        if name.endswith((_KEPT, _PRUNED)):
            raise ConfigError(
                f"mask name {name!r} ends with a reserved suffix {_KEPT!r}/{_PRUNED!r}"
            )
        flat = _as_bool(name, mask).detach().cpu().reshape(-1)
        if flat.numel() >= 2**31:
            raise ConfigError(
                f"mask {name!r} has {flat.numel()} coordinates; int32 indices need < 2**31"
            )
        bitmap, index = _sizes(flat)
        if bitmap <= index:
            out[name] = torch.from_numpy(np.packbits(flat.numpy()))
        else:
            kept = int(flat.sum())
            keep_list = kept <= flat.numel() - kept
            idx = torch.nonzero(flat if keep_list else ~flat).reshape(-1)
            out[name + (_KEPT if keep_list else _PRUNED)] = idx.to(torch.int32)
    return out


def decode_masks(
    arrays: Mapping[str, Tensor], shapes: Mapping[str, torch.Size | tuple[int, ...]]
) -> dict[str, Tensor]:
    """Inverse of :func:`encode_masks`: ``shapes`` (name -> shape) says which masks to expect.

    Raises:
        MessageError: a mask missing or sent twice, an unexpected array, a wrong dtype or
            length, or indices out of range, unsorted or repeated.
    """
    by_name: dict[str, tuple[str, Tensor]] = {}
    for key, arr in arrays.items():
        base, kind = key, "bitmap"
        for suffix in (_KEPT, _PRUNED):
            if key.endswith(suffix):
                base, kind = key[: -len(suffix)], suffix[1:]
        if base not in shapes:
            raise MessageError(
                f"unexpected mask array {key!r}; expected masks for {sorted(shapes)}"
            )
        if base in by_name:
            raise MessageError(f"mask {base!r} is encoded twice (as {by_name[base][0]} and {kind})")
        by_name[base] = (kind, arr)
    out: dict[str, Tensor] = {}
    for name, shape in shapes.items():
        if name not in by_name:
            raise MessageError(f"mask {name!r} is missing from the message")
        kind, arr = by_name[name]
        n = math.prod(shape)
        if kind == "bitmap":
            if arr.dtype != torch.uint8 or arr.dim() != 1 or arr.numel() != math.ceil(n / 8):
                raise MessageError(
                    f"bitmap for {name!r} must be uint8 of {math.ceil(n / 8)} bytes, "
                    f"got {arr.dtype} of shape {tuple(arr.shape)}"
                )
            flat = torch.from_numpy(np.unpackbits(arr.cpu().numpy(), count=n).astype(np.bool_))
        else:
            if arr.dtype != torch.int32 or arr.dim() != 1:
                raise MessageError(
                    f"{kind} indices for {name!r} must be 1-D int32, got {arr.dtype}"
                )
            idx = arr.cpu().to(torch.int64)
            if idx.numel() and (
                int(idx.min()) < 0 or int(idx.max()) >= n or bool((idx[1:] <= idx[:-1]).any())
            ):
                raise MessageError(
                    f"{kind} indices for {name!r} must be strictly increasing in [0, {n})"
                )
            flat = (
                torch.zeros(n, dtype=torch.bool)
                if kind == "kept"
                else torch.ones(n, dtype=torch.bool)
            )
            flat[idx] = kind == "kept"
        out[name] = flat.reshape(tuple(shape))
    return out


def _as_bool(name: str, mask: Tensor) -> Tensor:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ConfigError(f"mask for {name!r} must be a torch.bool tensor, got {got}")
    return mask
