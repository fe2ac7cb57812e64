"""A model's parameter blocks, and which tensors a freeze spec selects (FedPT, seed 002, Sec. 3.1:
partially trainable networks; normalization layers are never frozen). Design notes: docs/decisions.md#models.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatch
from typing import NamedTuple

from torch import nn

from fedge.core.errors import ConfigError

__all__ = [
    "NORM_TYPES",
    "Block",
    "format_blocks",
    "freeze_",
    "model_blocks",
    "norm_parameter_names",
    "resolve_freeze",
]

NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.GroupNorm,
    nn.LayerNorm,
)


class Block(NamedTuple):
    """One parameter block: its module name, its parameter count, what it holds
    (``conv``, ``linear``, ``norm`` or several joined by ``+``), and how many of its
    parameters can be frozen (all but normalization parameters)."""

    name: str
    params: int
    kind: str
    freezable: int


def _kind(module: nn.Module) -> str:
    kinds = set()
    for m in module.modules():
        if not any(True for _ in m.parameters(recurse=False)):
            continue
        if isinstance(m, NORM_TYPES):
            kinds.add("norm")
        elif isinstance(m, nn.modules.conv._ConvNd):
            kinds.add("conv")
        elif isinstance(m, nn.Linear):
            kinds.add("linear")
        else:
            kinds.add(type(m).__name__.lower())
    return "+".join(sorted(kinds))


def norm_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters owned by normalization layers (always trainable in FedPT)."""
    out: set[str] = set()
    for name, m in model.named_modules():
        if isinstance(m, NORM_TYPES):
            out.update(f"{name}.{p}" if name else p for p, _ in m.named_parameters(recurse=False))
    return out


def _block_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    features, classifier = getattr(model, "features", None), getattr(model, "classifier", None)
    if isinstance(features, nn.Sequential) and isinstance(classifier, nn.Sequential):
        parts: list[tuple[str, nn.Module]] = [("features", features), ("classifier", classifier)]
    else:
        parts = [("", model)]
    out: list[tuple[str, nn.Module]] = []
    for prefix, parent in parts:
        for name, child in parent.named_children():
            full = f"{prefix}.{name}" if prefix else name
            if not prefix and isinstance(child, nn.Sequential):  # a bare Sequential at the root
                out.extend((f"{full}.{n}", c) for n, c in child.named_children())
            else:
                out.append((full, child))
    return [(n, m) for n, m in out if any(True for _ in m.parameters())]


def model_blocks(model: nn.Module) -> list[Block]:
    """The model's parameter blocks in forward order: ``[Block(name, params, kind, freezable)]``.

    Example:
        >>> from fedge.models import build_model
        >>> net = build_model("cnn-fedpt", input_shape=(1, 28, 28), num_classes=10, seed=0)
        >>> [(b.name, b.params) for b in model_blocks(net)]
        [('features.conv1', 320), ('features.conv2', 18496), ('classifier.fc1', 1179776), ('classifier.out', 1290)]
    """
    norms = norm_parameter_names(model)
    blocks = []
    for name, m in _block_modules(model):
        named = [(f"{name}.{p}", t) for p, t in m.named_parameters()]
        total = sum(t.numel() for _, t in named)
        freezable = sum(t.numel() for n, t in named if n not in norms)
        blocks.append(Block(name, total, _kind(m), freezable))
    return blocks


def format_blocks(blocks: Sequence[Block]) -> str:
    """The blocks as aligned text lines, for error messages."""
    total = sum(b.params for b in blocks) or 1
    return "; ".join(
        f"{b.name} ({b.kind}, {b.params:,} params, {100 * b.params / total:.1f}%)" for b in blocks
    )


def _parse_rule(spec: str) -> int | None:
    """``largest`` -> 1, ``largest:N`` -> N, anything else -> None (a pattern)."""
    if spec == "largest":
        return 1
    if spec.startswith("largest:"):
        n = spec.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise ConfigError(
                f"method.freeze={spec!r}: expected largest:N with N a whole number >= 1, e.g. largest:2"
            )
        return int(n)
    return None


def _matches(name: str, pattern: str) -> bool:
    """fnmatch on the full dotted name, or on a dotted suffix of it (``fc1`` matches ``classifier.fc1``)."""
    return fnmatch(name, pattern) or fnmatch(name, "*." + pattern)


def freeze_(model: nn.Module, frozen: Sequence[str]) -> nn.Module:
    """Set ``requires_grad=False`` on the ``frozen`` parameters (in place); returns ``model``.

    ``frozen`` is a list of parameter names, e.g. from :func:`resolve_freeze` (FedPT's frozen
    part of the network, or ``method.freeze`` composed with any method)."""
    named = dict(model.named_parameters())
    for name in frozen:
        named[name].requires_grad_(False)
    return model


def resolve_freeze(model: nn.Module, freeze: str | Sequence[str]) -> list[str]:
    """Names of the parameters to freeze, in ``named_parameters`` order.

    Args:
        model: the network.
        freeze: ``"largest"`` (the block with the most freezable parameters: FedPT's
            principle 1), ``"largest:N"`` (the N largest), or module/parameter-name
            patterns (fnmatch; a pattern may also match a dotted suffix, so ``"fc1"``
            names ``classifier.fc1`` and ``"features.*"`` every feature block).
            A matched module freezes all its parameters except normalization ones.
            ``[]`` freezes nothing.

    Raises:
        ConfigError: a pattern matching no module or parameter (the message lists the
            model's blocks), one matching only normalization layers, or a freeze that
            would leave nothing to train.
    """
    blocks = model_blocks(model)
    norms = norm_parameter_names(model)
    params = [n for n, _ in model.named_parameters()]
    patterns = [freeze] if isinstance(freeze, str) else list(freeze)
    if any(not isinstance(p, str) or not p for p in patterns):
        raise ConfigError(
            f"method.freeze={freeze!r}: expected 'largest', 'largest:N' or a list of module-name patterns"
        )
    prefixes: list[str] = []
    for pattern in patterns:
        n = _parse_rule(pattern)
        if n is not None:
            ranked = sorted((b for b in blocks if b.freezable), key=lambda b: -b.freezable)
            if n > len(ranked):
                raise ConfigError(
                    f"method.freeze={pattern!r}: the model has only {len(ranked)} freezable blocks: {format_blocks(blocks)}"
                )
            prefixes += [b.name for b in ranked[:n]]
            continue
        names = [m for m, _ in model.named_modules() if m and _matches(m, pattern)]
        names += [p for p in params if _matches(p, pattern)]
        if not names:
            raise ConfigError(
                f"method.freeze pattern {pattern!r} matches no module or parameter of the model; "
                f"its blocks are: {format_blocks(blocks)}"
            )
        hit = [p for p in params if any(p == m or p.startswith(m + ".") for m in names)]
        if not [p for p in hit if p not in norms]:
            raise ConfigError(
                f"method.freeze pattern {pattern!r} matches only normalization layers or parameter-free modules "
                f"({', '.join(names[:5])}); normalization layers are always trained (FedPT Sec. 3.1); "
                f"choose among: {format_blocks(blocks)}"
            )
        prefixes += names
    frozen = [
        p
        for p in params
        if p not in norms and any(p == m or p.startswith(m + ".") for m in prefixes)
    ]
    if frozen and len(frozen) == len(params):
        raise ConfigError(
            f"method.freeze={freeze!r} freezes every parameter of the model: nothing would be trained; "
            f"leave at least one block trainable: {format_blocks(blocks)}"
        )
    return frozen
