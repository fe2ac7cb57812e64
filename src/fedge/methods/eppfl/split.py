"""EPPFL's model split and its two selections (seed 003, Sec. 2.3): :func:`split_model` cuts a chain
of ``nn.Sequential``s into M_c (device) and M_s (edge server), by default after the first
convolution and its activation; activation selection keeps a seeded random θ_a of each sample's
channel positions (:func:`activation_positions`); gradient selection keeps, per sample and channel,
the fraction θ_g of the released values' gradients dA'_b largest in magnitude. Exact rules, byte
counts and where this follows the paper's text rather than its code: ``docs/methods/eppfl.md``, "The
split and the two selections".
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from fedge.core.errors import ConfigError

__all__ = [
    "Split",
    "activation_positions",
    "default_cut",
    "gradient_positions",
    "kept",
    "position_dtype",
    "scatter",
    "split_model",
]

_ACTIVATIONS = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Hardtanh,
    nn.Softplus,
    nn.Mish,
)
_NORMS = (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm2d)


def _leaves(module: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    out: list[tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        q = f"{prefix}{name}"
        if isinstance(child, nn.Sequential):
            out.extend(_leaves(child, q + "."))
        else:
            out.append((q, child))
    return out


def _chain_names(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], dict[str, int]]:
    """Leaves, and every cuttable name (leaf or Sequential) -> index of its last leaf."""
    leaves = _leaves(model)
    ends: dict[str, int] = {}
    for i, (q, _) in enumerate(leaves):
        ends[q] = i
        parts = q.split(".")
        for j in range(1, len(parts)):
            ends[".".join(parts[:j])] = (
                i  # a container ends at its last leaf (later leaves overwrite)
            )
    return leaves, ends


def default_cut(model: nn.Module) -> str:
    """The first Conv (or Linear) leaf, plus a norm and an activation right after it."""
    leaves, _ = _chain_names(model)
    for i, (_, m) in enumerate(leaves):
        if isinstance(m, (nn.Conv2d, nn.Conv1d, nn.Linear)):
            j = i
            if j + 1 < len(leaves) and isinstance(leaves[j + 1][1], _NORMS):
                j += 1
            if j + 1 < len(leaves) and isinstance(leaves[j + 1][1], _ACTIVATIONS):
                j += 1
            return leaves[j][0]
    raise ConfigError(
        f"{type(model).__name__} has no Conv or Linear layer to cut after; set method.cut to a module name"
    )


@dataclass
class Split:
    """M_c (``device``) and M_s (``edge``) as ``nn.Sequential``s of the model's own leaf
    modules (parameters shared with ``model``), and the map between the model's state-dict
    keys and each part's."""

    cut: str
    device: nn.Sequential
    edge: nn.Sequential
    device_keys: dict[str, str]  # model key -> device-part key
    edge_keys: dict[str, str]  # model key -> edge-part key


def split_model(model: nn.Module, cut: str | None) -> Split:
    """Cut ``model`` after the module ``cut`` (None: :func:`default_cut`)."""
    if not isinstance(model, nn.Sequential):
        raise ConfigError(
            f"EPPFL splits a chain of nn.Sequential modules; {type(model).__name__} is not one (use a zoo model)"
        )
    leaves, ends = _chain_names(model)
    name = default_cut(model) if cut is None else cut
    if name not in ends:
        known = [q for q, _ in leaves][:12]
        raise ConfigError(
            f"method.cut={name!r} is not a module of the model's sequential chain; expected one of {known} "
            "(or a Sequential containing them, e.g. 'features.conv1')"
        )
    end = ends[name]
    if end + 1 >= len(leaves):
        raise ConfigError(
            f"method.cut={name!r} leaves nothing for the edge server; cut before the last module"
        )

    def part(
        items: list[tuple[str, nn.Module]], offset: int
    ) -> tuple[nn.Sequential, dict[str, str]]:
        seq = nn.Sequential(OrderedDict((str(offset + i), m) for i, (_, m) in enumerate(items)))
        keys: dict[str, str] = {}
        for i, (q, m) in enumerate(items):
            for k in m.state_dict():
                keys[f"{q}.{k}"] = f"{offset + i}.{k}"
        return seq, keys

    device, dkeys = part(leaves[: end + 1], 0)
    edge, ekeys = part(leaves[end + 1 :], end + 1)
    return Split(name, device, edge, dkeys, ekeys)


def kept(n: int, theta: float) -> int:
    """max(1, round(θ·N_c)): how many of a channel's N_c entries travel."""
    return max(1, min(n, round(theta * n)))


def position_dtype(n: int) -> torch.dtype:
    return torch.int16 if n <= 32767 else torch.int32


def activation_positions(seed: int, shape: tuple[int, int, int], k: int) -> torch.Tensor:
    """(B, C, k) sorted random positions in [0, N_c) per sample and channel, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    order = torch.rand(shape, generator=g).argsort(dim=-1)
    return order[..., :k].sort(dim=-1).values


def gradient_positions(grad: torch.Tensor, k: int) -> torch.Tensor:
    """(B, C, k) positions of the k largest |grad| per row of ``grad`` (B, C, N_c), ties to
    the lowest index, returned in increasing order."""
    order = torch.sort(-grad.abs(), dim=-1, stable=True).indices
    return order[..., :k].sort(dim=-1).values


def scatter(values: torch.Tensor, positions: torch.Tensor, n: int) -> torch.Tensor:
    """Dense (B, C, n) tensor with ``values`` at ``positions`` and zeros elsewhere."""
    out = torch.zeros((*values.shape[:-1], n), dtype=values.dtype)
    return out.scatter(-1, positions.long(), values)
