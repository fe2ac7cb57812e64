"""Seeded Gaussian perturbations ``δ_k ~ N(0, σ² I)`` over a selection of named parameters, one
generator per (k, parameter), shared by server and clients (BAFFLE Algorithm 1, lines 8 and 11);
:func:`portable_normal_chunk` draws them portably instead: direction k of parameter ``name`` is
row k of the stream ``stream_key(seed, "zo", name)`` (:func:`fedge.core.portable.normal_rows`).
Design notes: docs/decisions.md#estimators.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from fedge.core import portable
from fedge.core.errors import ConfigError, UnknownNameError
from fedge.core.rng import Draws, check_draws, generator, seed_family

__all__ = [
    "DrawMany",
    "Selection",
    "check_masks",
    "normal_chunk",
    "perturb",
    "perturbation",
    "portable_normal_chunk",
    "portable_normal_many",
    "select",
    "standard_normal",
    "standard_normal_chunk",
]

_PURPOSE = "zo"
#: ``draw_many(seed, k, [(name, shape), ...])``: direction k of several parameters in one call.
DrawMany = Callable[[int, int, Sequence[tuple[str, Sequence[int]]]], list[Tensor]]


def standard_normal(seed: int, k: int, name: str, shape: Sequence[int]) -> Tensor:
    """``z_{k,name}``: the standard-normal draw behind ``δ_k`` for one parameter (float32, CPU)."""
    return torch.randn(tuple(shape), generator=generator(seed, _PURPOSE, int(k), name))


def standard_normal_chunk(seed: int, ks: Sequence[int], name: str, shape: Sequence[int]) -> Tensor:
    """``z_{k,name}`` for every ``k`` in ``ks``, stacked: shape ``(len(ks), *shape)``."""
    out = torch.empty((len(ks), *shape))
    seeds, gen = seed_family(seed, _PURPOSE), torch.Generator()  # generator(seed, "zo", k, name)
    for i, k in enumerate(ks):
        torch.randn(tuple(shape), generator=gen.manual_seed(seeds(int(k), name)), out=out[i])
    return out


def portable_normal_chunk(
    seed: int,
    ks: Sequence[int],
    name: str,
    shape: Sequence[int],
    *,
    device: torch.device | str = "cpu",
) -> Tensor:
    """The portable ``z_{k,name}`` for every ``k`` in ``ks``, stacked: ``(len(ks), *shape)``,
    row k of ``stream_key(seed, "zo", name)`` (:func:`fedge.core.portable.normal_rows`), made
    on ``device`` by the same exact transform (the same bits as on the CPU)."""
    key = portable.stream_key(int(seed), _PURPOSE, name)
    return portable.normal_rows(key, ks, tuple(shape), device=device)


def portable_normal_many(
    seed: int, k: int, items: Sequence[tuple[str, Sequence[int]]]
) -> list[Tensor]:
    """Direction ``k`` of several parameters, ``(name, shape)`` each, in one call: the tensors
    ``portable_normal_chunk(seed, [k], name, shape)[0]`` (the same bits) by
    :func:`fedge.core.portable.normal_row_many`; views of one buffer, not to be written."""
    return portable.normal_row_many(
        [
            (portable.stream_key(int(seed), _PURPOSE, name), int(k), tuple(shape))
            for name, shape in items
        ]
    )


def normal_chunk(
    draws: Draws = "torch",
) -> Callable[[int, Sequence[int], str, Sequence[int]], Tensor]:
    """The Gaussian direction source of ``draws``: :func:`standard_normal_chunk` (``"torch"``)
    or :func:`portable_normal_chunk` (``"portable"``)."""
    return portable_normal_chunk if check_draws(draws) == "portable" else standard_normal_chunk


def perturbation(
    seed: int, k: int, name: str, shape: Sequence[int], *, sigma: float, mask: Tensor | None = None
) -> Tensor:
    """``δ_k`` restricted to one parameter: ``σ · z_{k,name} ⊙ mask`` (float32, CPU).

    Example:
        >>> d = perturbation(0, 3, "0.weight", (6, 1, 5, 5), sigma=1e-4)
    """
    d = standard_normal(seed, k, name, shape) * sigma
    return d * mask if mask is not None else d


def perturb(w: Tensor, z: Tensor, scale: float, mask: Tensor | None) -> Tensor:
    """``W + scale · z ⊙ mask`` computed as lean and fast modes both do, for bit-equal weights.

    ``z`` may carry leading chunk dimensions (broadcast against ``w``). The order is fixed:
    round ``z · scale`` once in ``w``'s dtype, zero the masked-out coordinates, then add, so
    a masked coordinate is exactly ``w`` and every mode forms the same perturbed weights.
    """
    d = z.to(device=w.device, dtype=w.dtype) * scale
    if mask is not None:
        d = d * mask
    return w + d


@dataclass(frozen=True)
class Selection:
    """The coordinates a zeroth-order estimate perturbs.

    Attributes:
        params: name -> parameter, in ``model.named_parameters()`` order.
        masks: name -> boolean mask of the parameter's shape (True = perturbed); absent = all.
        draw: ``draw(seed, ks, name, shape) -> (len(ks), *shape)``: the directions z_k
            (default BAFFLE's Gaussian; see :mod:`fedge.estimators.directions`).
        draw_many: optional ``draw_many(seed, k, [(name, shape), ...])``: ``z_k`` of several
            parameters in one call, the very tensors ``draw(seed, [k], name, shape)[0]`` gives
            one by one (not to be written into); None when the directions have no such call.
    """

    params: dict[str, nn.Parameter]
    masks: dict[str, Tensor]
    draw: Callable[[int, Sequence[int], str, Sequence[int]], Tensor] = field(
        default=standard_normal_chunk
    )
    draw_many: DrawMany | None = None

    @property
    def numel(self) -> int:
        """n: the number of perturbed coordinates (the ``n`` of BAFFLE Theorem 3.2)."""
        return sum(
            int(self.masks[n].sum()) if n in self.masks else p.numel()
            for n, p in self.params.items()
        )


def check_masks(
    shapes: Mapping[str, torch.Size], masks: Mapping[str, Tensor] | None
) -> dict[str, Tensor]:
    """Validate ``masks`` against parameter ``shapes``; return them as a plain dict."""
    if not masks:
        return {}
    out: dict[str, Tensor] = {}
    for name, mask in masks.items():
        if name not in shapes:
            raise ConfigError(
                f"mask given for {name!r}, which is not a selected parameter; "
                f"selected: {', '.join(shapes)}; add it to `params` or drop its mask"
            )
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise ConfigError(
                f"mask for {name!r} must be a torch.bool tensor (True = perturbed), got {got}; "
                "convert with `mask.bool()`"
            )
        if tuple(mask.shape) != tuple(shapes[name]):
            raise ConfigError(
                f"mask for {name!r} has shape {tuple(mask.shape)}, expected the parameter's shape {tuple(shapes[name])}"
            )
        out[name] = mask
    return out


def select(
    model: nn.Module,
    params: Sequence[str] | None = None,
    masks: Mapping[str, Tensor] | None = None,
) -> Selection:
    """Resolve which parameters (and coordinates) of ``model`` are perturbed.

    Args:
        model: the network.
        params: parameter names as in ``model.named_parameters()``; ``None`` selects every
            parameter with ``requires_grad=True`` (frozen ones are the paper's "frozen
            parameters", excluded from n). Buffers are never selected.
        masks: optional name -> boolean mask (True = perturbed), e.g. from pruning.

    Raises:
        UnknownNameError: a name in ``params`` is not a parameter of ``model``.
        ConfigError: duplicate or empty selection, or a malformed mask.
    """
    named = dict(model.named_parameters())
    if params is None:
        chosen = [n for n, p in named.items() if p.requires_grad]
        if not chosen:
            raise ConfigError(
                "the model has no parameter with requires_grad=True to perturb; "
                "pass `params=[...]` to name the ones to estimate"
            )
    else:
        if isinstance(params, str):
            raise ConfigError(f"params must be a list of names, got the string {params!r}")
        chosen = list(params)
        if not chosen:
            raise ConfigError("params is empty; pass None to select every trainable parameter")
        if len(set(chosen)) != len(chosen):
            dup = sorted({n for n in chosen if chosen.count(n) > 1})
            raise ConfigError(f"params names {dup} more than once; list each parameter once")
        for n in chosen:
            if n not in named:
                raise UnknownNameError("parameter", n, list(named))
    order = [n for n in named if n in set(chosen)]
    sel = {n: named[n] for n in order}
    checked = check_masks({n: p.shape for n, p in sel.items()}, masks)
    return Selection(params=sel, masks={n: m.to(sel[n].device) for n, m in checked.items()})
