"""Iterative global pruning, Algorithm 1 of seed 004: keep the top ``d_t = d^(t/T_p)`` of all
prunable weights under one global threshold, re-scoring each round. Design notes: docs/decisions.md#pruning.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from fedge.core.errors import ConfigError, UnknownNameError
from fedge.core.rng import AnyGenerator
from fedge.core.validation import check_positive_int
from fedge.pruning.masks import check_masks, dense_masks
from fedge.pruning.saliency import (
    DEFAULT_EPS,
    DEFAULT_SAMPLES,
    gaussian_inputs,
    magnitude_saliency,
    ntk_saliency,
    random_saliency,
    snip_saliency,
)

__all__ = [
    "SCORERS",
    "ScoreContext",
    "ScoreName",
    "Scorer",
    "density_schedule",
    "keep_counts",
    "prune",
    "prune_step",
    "pruning_rounds",
]

ScoreName = Literal["ntk", "magnitude", "random", "snip"]
DEFAULT_NUM_INPUTS = (
    256  # NTK-Rand inputs per pruning round: the paper's pruning batch size (Sec. 5.1)
)


@dataclass(frozen=True)
class ScoreContext:
    """What a scorer may use in one pruning round.

    Attributes:
        generator: the run's pruning generator (consumed in order, round after round).
        inputs: fixed inputs for ``"ntk"`` (NTK-Ori on server data); None = NTK-Rand.
        input_shape: one sample's shape, for NTK-Rand inputs.
        num_inputs: NTK-Rand inputs drawn per round.
        batch: a labelled batch ``(x, y)`` for ``"snip"``.
        eps: ε, the variance of ΔW (seed 004, Eq. 15).
        samples: ΔW draws per round.
    """

    generator: AnyGenerator
    inputs: Tensor | None
    input_shape: tuple[int, ...] | None
    num_inputs: int
    batch: tuple[Tensor, Tensor] | None
    eps: float
    samples: int


Scorer = Callable[[nn.Module, dict[str, Tensor], ScoreContext], dict[str, Tensor]]


def _ntk(model: nn.Module, masks: dict[str, Tensor], ctx: ScoreContext) -> dict[str, Tensor]:
    x = ctx.inputs
    if x is None:
        if ctx.input_shape is None:
            raise ConfigError(
                f"score='ntk' without inputs draws Gaussian inputs of the model's input shape, "
                f"but {type(model).__name__} has no .spec.input_shape; pass input_shape=(C, H, W)"
            )
        x = gaussian_inputs(ctx.input_shape, ctx.num_inputs, generator=ctx.generator)
        ref = next(model.parameters())
        x = x.to(ref.device, ref.dtype)
    return ntk_saliency(model, masks, x, eps=ctx.eps, samples=ctx.samples, generator=ctx.generator)


def _snip(model: nn.Module, masks: dict[str, Tensor], ctx: ScoreContext) -> dict[str, Tensor]:
    if ctx.batch is None:
        raise ConfigError(
            "score='snip' needs a labelled batch=(x, y): SNIP is data-based and uses backprop, "
            "so it runs on a server that holds data; use score='ntk' for data-free pruning"
        )
    return snip_saliency(model, masks, ctx.batch)


SCORERS: dict[str, Scorer] = {
    "magnitude": lambda model, masks, ctx: magnitude_saliency(model, masks),
    "ntk": _ntk,
    "random": lambda model, masks, ctx: random_saliency(model, masks, generator=ctx.generator),
    "snip": _snip,
}


def density_schedule(density: float, rounds: int) -> list[float]:
    """``d_t = d^(t / T_p)`` for t = 1..T_p (Algorithm 1, line 15); the last is ``d`` exactly."""
    _check_density(density)
    check_positive_int("rounds", rounds)
    return [density ** (t / rounds) for t in range(1, rounds + 1)]


def keep_counts(total: int, density: float, rounds: int) -> list[int]:
    """Weights kept after each round: ``round(d_t · total)``, non-increasing, last ``round(d · total)``.

    Raises:
        ConfigError: the target keeps no weight at all.
    """
    check_positive_int("total", total)
    counts = [round(d * total) for d in density_schedule(density, rounds)]
    if counts[-1] < 1:
        raise ConfigError(
            f"density {density} of {total} prunable weights keeps {counts[-1]}; "
            f"use a density of at least {0.5 / total:.3g}"
        )
    return counts


def prune_step(
    scores: Mapping[str, Tensor], masks: Mapping[str, Tensor], keep: int
) -> dict[str, Tensor]:
    """One global pruning step: keep the ``keep`` highest-scoring live weights, across all tensors.

    Pruned coordinates are never chosen (masks only shrink). Ties: earlier tensor (in ``masks``
    order), then lower flat index, is kept.

    Raises:
        ConfigError: ``keep`` is not in ``[1, live]``, scores are missing or have the wrong
            shape, or a live score is not finite.
    """
    names = list(masks)
    for n in names:
        if n not in scores or scores[n].shape != masks[n].shape:
            got = tuple(scores[n].shape) if n in scores else "nothing"
            raise ConfigError(
                f"scores for {n!r} must have the mask's shape {tuple(masks[n].shape)}, got {got}"
            )
    live = torch.cat([masks[n].detach().reshape(-1).cpu() for n in names])
    flat = torch.cat([scores[n].detach().reshape(-1).cpu().to(torch.float64) for n in names])
    n_live = int(live.sum())
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= n_live:
        raise ConfigError(f"keep must be an int in [1, {n_live}] (the live weights), got {keep!r}")
    bad = live & ~torch.isfinite(flat)
    if bool(bad.any()):
        raise ConfigError(
            f"{int(bad.sum())} live weights have a non-finite score (first at flat index "
            f"{int(bad.nonzero()[0, 0])}); the saliency overflowed: lower eps or check the model"
        )
    key = torch.where(live, flat, torch.full_like(flat, -math.inf))
    order = torch.argsort(key, descending=True, stable=True)  # ties keep the lower index first
    kept = torch.zeros_like(live)
    kept[order[:keep]] = True
    out, start = {}, 0
    for n in names:
        size = masks[n].numel()
        out[n] = kept[start : start + size].reshape(masks[n].shape).to(masks[n].device)
        start += size
    return out


def pruning_rounds(
    model: nn.Module,
    *,
    density: float,
    rounds: int,
    score: ScoreName | Scorer = "ntk",
    generator: AnyGenerator,
    inputs: Tensor | None = None,
    input_shape: tuple[int, ...] | None = None,
    num_inputs: int = DEFAULT_NUM_INPUTS,
    batch: tuple[Tensor, Tensor] | None = None,
    eps: float = DEFAULT_EPS,
    samples: int = DEFAULT_SAMPLES,
    masks: Mapping[str, Tensor] | None = None,
) -> Iterator[dict[str, Tensor]]:
    """Algorithm 1's pruning loop, yielding the masks after each of the ``rounds`` rounds.

    Same arguments as :func:`prune`; useful to log the density per round.
    """
    scorer = _scorer(score)
    check_positive_int("num_inputs", num_inputs)
    current = check_masks(model, masks) if masks is not None else dense_masks(model)
    total = sum(m.numel() for m in current.values())
    counts = keep_counts(total, density, rounds)
    live = sum(int(m.sum()) for m in current.values())
    if counts[0] > live:
        raise ConfigError(
            f"the starting masks keep {live} weights, fewer than round 1's target {counts[0]}; "
            "start from dense masks (masks=None) or lower the density"
        )
    if input_shape is None:
        spec = getattr(model, "spec", None)
        input_shape = tuple(spec.input_shape) if spec is not None else None
    ctx = ScoreContext(
        generator=generator,
        inputs=inputs,
        input_shape=input_shape,
        num_inputs=num_inputs,
        batch=batch,
        eps=eps,
        samples=samples,
    )
    for keep in counts:
        current = prune_step(scorer(model, current, ctx), current, keep)
        yield current


def prune(
    model: nn.Module,
    *,
    density: float,
    rounds: int,
    score: ScoreName | Scorer = "ntk",
    generator: AnyGenerator,
    inputs: Tensor | None = None,
    input_shape: tuple[int, ...] | None = None,
    num_inputs: int = DEFAULT_NUM_INPUTS,
    batch: tuple[Tensor, Tensor] | None = None,
    eps: float = DEFAULT_EPS,
    samples: int = DEFAULT_SAMPLES,
    masks: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Foresight pruning on the server (seed 004, Algorithm 1, NTK Foresight Pruning).

    Args:
        model: the network at initialisation (W0); never modified (see :func:`apply_masks_`).
        density: target kept fraction d in (0, 1]; exactly ``round(d · n)`` weights are kept.
        rounds: T_p (the paper: 50 for LeNet, 20 for ResNet-20).
        score: a name in :data:`SCORERS` or a callable ``(model, masks, ctx) -> scores``.
        generator: every random draw (inputs, ΔW, random scores) comes from it, in order: a
            ``torch.Generator`` (``fedge.core.rng.generator``) or, for a mask that is the same on
            every machine's draws, a :class:`fedge.core.rng.PortableGenerator`.
        inputs: fixed NTK inputs (NTK-Ori on server data); None = fresh N(0, I) each round.
        input_shape: one sample's shape for NTK-Rand; default ``model.spec.input_shape``.
        num_inputs: NTK-Rand inputs per round (default 256, the paper's pruning batch).
        batch: labelled ``(x, y)`` for ``"snip"``.
        eps: ε, the variance of ΔW (Eq. 15).
        samples: ΔW draws per round.
        masks: starting masks (default dense).

    Returns:
        prunable name -> bool mask (True = kept), on the weights' devices.

    Example:
        >>> from fedge.core.rng import generator
        >>> from fedge.models import build_model
        >>> net = build_model("lenet", input_shape=(1, 28, 28), num_classes=10, seed=0)
        >>> masks = prune(net, density=0.2, rounds=5, generator=generator(0, "prune"), num_inputs=8)
    """
    rounds_ = pruning_rounds(
        model,
        density=density,
        rounds=rounds,
        score=score,
        generator=generator,
        inputs=inputs,
        input_shape=input_shape,
        num_inputs=num_inputs,
        batch=batch,
        eps=eps,
        samples=samples,
        masks=masks,
    )
    return deque(rounds_, maxlen=1)[0]  # only the last round's masks are held


def _scorer(score: str | Scorer) -> Scorer:
    if callable(score):
        return score
    if score not in SCORERS:
        raise UnknownNameError("pruning score", str(score), list(SCORERS))
    return SCORERS[score]


def _check_density(density: object) -> None:
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density <= 1:
        raise ConfigError(
            f"density must be a number in (0, 1] (the kept fraction), got {density!r}"
        )
