"""Sparse trainable coordinates chosen without client data (``method.train_mask``): before
training, the server scores the trainable prunable weights (conv and linear ``weight`` tensors
that are not frozen) of the initial model by a data-free rule and keeps exactly
``round(density · n)`` of them, one global threshold. Only kept coordinates are then perturbed
(zeroth-order clients) or stepped (backprop clients) and updated; every other weight keeps its
initial value for the whole run (unlike pruning, which zeroes it). Biases and norm parameters
stay trainable. FedAvg takes the same mask, so backprop can be compared on the same trainable
set.

Rules: ``magnitude`` (|W0|), ``random`` (uniform scores from the run's seeded generator) and
``ntk`` (NTK-Rand's saliency, :func:`fedge.pruning.ntk_saliency`, on Gaussian inputs drawn on the
server: no client data). Every draw comes from ``make_generator(draws, seed, "train-mask")``.

Every party chooses the mask itself, from the run's config and seed. ``magnitude`` and ``random``
follow from portable draws alone (the same bits on every machine); ``ntk`` also from float32
forwards, which round differently on another CPU and can rank a near-tie the other way, so the
composed build reports the mask's digest (:func:`masks_digest`, ``MethodBuild.rebuilt``) and
the Flower handshake refuses a node whose mask differs from the server's.

Exactness: the mask goes to the zeroth-order estimator (perturbation and estimate exactly zero
off the mask), to backprop's gradients, and after every local optimizer step the coordinates off
the mask are set back to the round's global values (an optimizer's weight decay would otherwise
move them); the server restores them after every round (:class:`KeepOffMask`), so DP noise or a
server's weight decay cannot move them either.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import Field

from fedge.core.errors import ConfigError
from fedge.core.protocols import Round, StrategyWrapper
from fedge.core.rng import AnyGenerator, make_generator
from fedge.methods.base import MethodConfigBase, MethodEnv
from fedge.pruning import DEFAULT_EPS, SCORERS, ScoreContext, dense_masks, prunable_parameters

__all__ = [
    "KeepOffMask",
    "TrainMaskConfig",
    "TrainMaskOption",
    "choose_train_masks",
    "masks_digest",
    "combine_masks",
]

Masks = Mapping[str, torch.Tensor]


class TrainMaskConfig(MethodConfigBase):
    """The rule and density of a data-free trainable-coordinate mask."""

    rule: Literal["magnitude", "random", "ntk"] = Field(
        "magnitude",
        description="score of a weight at initialisation: |W0|, seeded uniform, or NTK-Rand's saliency "
        "on Gaussian inputs drawn on the server",
    )
    density: float = Field(
        ..., gt=0, le=1, description="kept fraction of the trainable conv/linear weights"
    )
    inputs: int = Field(256, ge=1, description="rule=ntk: Gaussian inputs drawn on the server")


class TrainMaskOption(MethodConfigBase):
    """``method.train_mask``: train only a data-free chosen fraction of the weights
    (:mod:`fedge.methods.sparse`)."""

    train_mask: TrainMaskConfig | None = Field(
        None,
        description="{rule, density}: perturb and update only the kept coordinates of the trainable "
        "conv/linear weights (chosen on the server without client data); null: every coordinate",
    )

    def masked_env(self, env: MethodEnv) -> MethodEnv:
        """``env`` carrying the chosen masks (``env.train_masks``), from its initial model."""
        if self.train_mask is None:
            return env
        m = self.train_mask
        masks = choose_train_masks(
            env.model_fn(),
            rule=m.rule,
            density=m.density,
            generator=make_generator(env.draws, env.seed, "train-mask"),
            input_shape=tuple(env.input_shape),
            num_inputs=m.inputs,
        )
        return dataclasses.replace(env, train_masks=masks)


def choose_train_masks(
    model: torch.nn.Module,
    *,
    rule: str,
    density: float,
    generator: AnyGenerator,
    input_shape: tuple[int, ...],
    num_inputs: int = 256,
) -> dict[str, torch.Tensor]:
    """name -> bool mask (True = trained) over ``model``'s trainable prunable weights: exactly
    ``max(1, round(density · n))`` of their n coordinates kept, those of the highest ``rule``
    score (one global ranking; ties go to the earlier coordinate in parameter order)."""
    if not 0 < density <= 1:
        raise ConfigError(f"train_mask.density must be in (0, 1], got {density!r}")
    if rule not in ("magnitude", "random", "ntk"):
        raise ConfigError(
            f"train_mask.rule must be magnitude, random or ntk (data-free), got {rule!r}"
        )
    params = dict(model.named_parameters())
    names = [n for n in prunable_parameters(model) if params[n].requires_grad]
    if not names:
        raise ConfigError(
            "method.train_mask: the model has no trainable conv or linear weight to mask "
            "(every one is frozen); drop method.train_mask or freeze less"
        )
    ctx = ScoreContext(
        generator=generator,
        inputs=None,
        input_shape=input_shape,
        num_inputs=num_inputs,
        batch=None,
        eps=DEFAULT_EPS,
        samples=1,
    )
    scores = SCORERS[rule](model, dense_masks(model), ctx)
    flat = torch.cat([scores[n].detach().reshape(-1).to(torch.float64) for n in names])
    keep = max(1, round(density * flat.numel()))
    # stable descending sort: equal scores keep their parameter order, so the mask is deterministic
    order = torch.sort(flat, descending=True, stable=True).indices[:keep]
    kept = torch.zeros(flat.numel(), dtype=torch.bool)
    kept[order] = True
    out, start = {}, 0
    for n in names:
        size = params[n].numel()
        out[n] = kept[start : start + size].view(params[n].shape).to(params[n].device)
        start += size
    return out


def masks_digest(masks: Mapping[str, torch.Tensor]) -> str:
    """sha256 of the masks: their names, shapes and kept coordinates, in name order."""
    h = hashlib.sha256()
    for name in sorted(masks):
        m = masks[name].detach().to("cpu", torch.bool).contiguous()
        h.update(f"{name}:{tuple(m.shape)};".encode())
        h.update(m.numpy().tobytes())
    return h.hexdigest()


def combine_masks(a: Masks | None, b: Masks | None) -> dict[str, torch.Tensor] | None:
    """The coordinates both mask sets keep (a name in one set only keeps that set's mask)."""
    if not a and not b:
        return None
    out = dict(a or {})
    for n, m in (b or {}).items():
        out[n] = out[n] & m.to(out[n].device) if n in out else m
    return out


class KeepOffMask(StrategyWrapper):
    """Server side of ``method.train_mask``: after every round, the global model's coordinates
    off the mask are set back to their initial values (bit for bit), whatever the aggregate,
    DP noise or the server optimizer did to them."""

    def __init__(self, inner: Any, masks: Masks, initial: Mapping[str, torch.Tensor]) -> None:
        super().__init__(inner)
        self.masks = {n: m.clone() for n, m in masks.items()}
        self.initial = {n: initial[n].detach().clone() for n in masks}

    def restore(self) -> None:
        state = self.global_model.model.state_dict()
        with torch.no_grad():
            for n, m in self.masks.items():
                state[n].copy_(torch.where(m.to(state[n].device), state[n], self.initial[n]))

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        out = yield from self.inner.round(rnd, client_ids)
        self.restore()
        return out
