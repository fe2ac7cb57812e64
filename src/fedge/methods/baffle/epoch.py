"""Epoch-level BAFFLE (``mode: epoch``, FedAvg; seed 000, Section 3.2): each client runs local steps
whose gradient is the zeroth-order estimate of Eq. (6) on the current mini-batch (a fresh
perturbation seed per step), or with ``estimator: activity`` the activity-perturbed one
(:mod:`fedge.estimators.activity`), clipped to the configured inf-norm, and uploads its model
delta; the server averages the deltas with weights N_c/N. Details: ``docs/methods/baffle.md``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fedge.core.context import ClientContext
from fedge.core.rng import Draws
from fedge.estimators import ZerothOrderSpec, zeroth_order_gradient
from fedge.estimators.activity import HEAD_PREFIX, activity_gradient, activity_layers
from fedge.methods.baffle.config import (
    BaffleConfig,
    layer_scaled_spec,
    perturbation_threads,
    round_spec,
)
from fedge.methods.baffle.heads import HeadAveraging, block_ends, build_heads
from fedge.methods.base import MethodBuild, MethodEnv
from fedge.methods.fedavg import DeltaAveraging
from fedge.methods.local import LocalTraining
from fedge.methods.replay import clip_inf_norm, perturbed_masks, perturbed_params

__all__ = ["activity_gradient_fn", "build_epoch", "zeroth_order_gradient_fn"]


def zeroth_order_gradient_fn(
    cfg: BaffleConfig,
    threads: int = 1,
    draws: Draws = "torch",
    device: torch.device | None = None,
    rounds: int = 1,
) -> Any:
    """A :data:`~fedge.methods.local.GradientFn` computing BAFFLE's local estimate, its
    directions drawn by ``draws`` on ``device``, with the round's K and σ (:func:`round_spec`,
    of ``rounds``); with ``estimator: activity``, :func:`activity_gradient_fn`'s."""
    if cfg.estimator == "activity":
        return activity_gradient_fn(cfg, rounds)
    base = cfg.zo_spec(workers=threads, draws=draws, device=device)

    def gradient(
        model: torch.nn.Module,
        batch: tuple[torch.Tensor, torch.Tensor],
        ctx: ClientContext,
        masks: Any,
    ):
        spec = round_spec(base, cfg, ctx.rnd, rounds)
        seed = int(torch.randint(0, 2**62, (1,), generator=ctx.generator))
        params = perturbed_params(model, cfg.perturb)
        masks = perturbed_masks(masks, params)
        spec = layer_scaled_spec(spec, cfg, params, masks)
        g = zeroth_order_gradient(
            model, F.cross_entropy, batch, spec, seed=seed, params=list(params), masks=masks
        )
        return None, clip_inf_norm(g, cfg.clip)

    return gradient


def activity_gradient_fn(
    cfg: BaffleConfig, rounds: int = 1, heads: torch.nn.ModuleDict | None = None
) -> Any:
    """A :data:`~fedge.methods.local.GradientFn` computing the activity-perturbed estimate
    (:func:`~fedge.estimators.activity.activity_gradient`: K perturbations of each perturbed
    layer's output per sample, ``scheme``'s differences at σ, the round's K and σ of
    :func:`round_spec`; with ``heads``, each block scored by its local head, the heads'
    estimates included), clipped to the configured inf-norm; a fresh seed per step from the
    client's generator. Its directions never leave the client, so ``draws`` does not apply."""
    base = ZerothOrderSpec(k=cfg.k, sigma=cfg.sigma, scheme=cfg.scheme)  # for round_spec's K, σ

    def gradient(
        model: torch.nn.Module,
        batch: tuple[torch.Tensor, torch.Tensor],
        ctx: ClientContext,
        masks: Any,
    ):
        spec = round_spec(base, cfg, ctx.rnd, rounds)
        seed = int(torch.randint(0, 2**62, (1,), generator=ctx.generator))
        params = perturbed_params(model, cfg.perturb)
        g = activity_gradient(
            model,
            batch,
            k=spec.k,
            sigma=spec.sigma,
            scheme=cfg.scheme,
            seed=seed,
            params=list(params),
            masks=perturbed_masks(masks, params),
            chunk=cfg.chunk,
            heads=heads,
            head_groups=cfg.head_groups,
            head_patches=cfg.head_patches,
        )
        return None, clip_inf_norm(g, cfg.clip)

    return gradient


def build_epoch(
    cfg: BaffleConfig, env: MethodEnv, *, masks: dict[str, torch.Tensor] | None = None
) -> MethodBuild:
    """Epoch-level BAFFLE's bare strategy (FedAvg's delta averaging with the configured server
    optimizer) and client program (local training on the zeroth-order estimate)."""
    assert cfg.server_optimizer is not None
    if cfg.local_heads:
        return _build_with_heads(cfg, env, masks=masks)
    strategy = DeltaAveraging(
        env.model_fn(), cfg.server_optimizer.build(), replies_are_gradients=False, masks=masks
    )
    program = LocalTraining.from_config(
        env.model_fn,
        cfg,
        gradient_fn=zeroth_order_gradient_fn(
            cfg, perturbation_threads(cfg, env), env.draws, env.device, rounds=env.rounds
        ),
        train_masks=env.train_masks,
    )
    return MethodBuild(strategy, program)


def _build_with_heads(
    cfg: BaffleConfig, env: MethodEnv, *, masks: dict[str, torch.Tensor] | None
) -> MethodBuild:
    """Activity perturbation with local heads (:mod:`fedge.methods.baffle.heads`): the server
    keeps and averages the heads beside the model; each client trains its copy with the model."""
    assert cfg.server_optimizer is not None
    model = env.model_fn()
    estimated = activity_layers(model, list(perturbed_params(model, cfg.perturb)))
    ends = block_ends(model, cfg.local_heads, estimated)

    def heads() -> torch.nn.ModuleDict:
        return build_heads(
            model,
            ends,
            input_shape=env.input_shape,
            num_classes=env.num_classes,
            pool=cfg.head_pool,
            groups=cfg.head_groups,
            patches=cfg.head_patches,
            seed=env.seed,
            draws=env.draws,
        )

    strategy = HeadAveraging(
        env.model_fn(),
        cfg.server_optimizer.build(),
        heads(),
        cfg.server_optimizer.build(),
        masks=masks,
    )
    client_heads = heads()
    program = LocalTraining.from_config(
        env.model_fn,
        cfg,
        gradient_fn=activity_gradient_fn(cfg, env.rounds, heads=client_heads),
        train_masks=env.train_masks,
        companion=client_heads,
        companion_prefix=HEAD_PREFIX,
    )
    return MethodBuild(strategy, program)
