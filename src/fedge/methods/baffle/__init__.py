"""BAFFLE, backpropagation-free federated learning (seed 000): clients run forward passes only and
the gradient is estimated from K loss differences by Stein's identity (Eq. (6)), in batch mode
(:mod:`~fedge.methods.baffle.batch`: K scalars up, summed by Eq. (7), Algorithm 1) or epoch mode
(:mod:`~fedge.methods.baffle.epoch`: model deltas up), with the keys in
:mod:`~fedge.methods.baffle.config` and batch mode's seeds-only downlink in
:mod:`~fedge.methods.replay`. This module registers the method. The algorithm, the EMA
schedule and the paper-vs-code choices: ``docs/methods/baffle.md``.
"""

from __future__ import annotations

import dataclasses

import torch

from fedge.core.errors import ConfigError
from fedge.core.protocols import Round, StrategyWrapper
from fedge.estimators.activity import activity_layers
from fedge.methods.baffle.batch import BaffleBatchClient, BaffleBatchStrategy, build_batch
from fedge.methods.baffle.config import (
    CAPABILITIES,
    DEFAULTS,
    BaffleConfig,
    advice,
    perturbation_threads,
    upload,
)
from fedge.methods.baffle.epoch import (
    activity_gradient_fn,
    build_epoch,
    zeroth_order_gradient_fn,
)
from fedge.methods.base import Layer, MethodBuild, MethodEnv, warn_scalars_unprotected
from fedge.methods.registry import declare_method
from fedge.methods.replay import (
    ClientReplica,
    DownlinkHistory,
    clip_inf_norm,
    perturbed_masks,
    perturbed_params,
    replay_step,
)

__all__ = [
    "CAPABILITIES",
    "DEFAULTS",
    "BaffleBatchClient",
    "BaffleBatchStrategy",
    "BaffleConfig",
    "ClientReplica",
    "DownlinkHistory",
    "ForwardModeLabel",
    "activity_gradient_fn",
    "advice",
    "build",
    "clip_inf_norm",
    "perturbation_threads",
    "perturbed_masks",
    "perturbed_params",
    "replay_step",
    "upload",
    "zeroth_order_gradient_fn",
]


class ForwardModeLabel(StrategyWrapper):
    """Marks every round of a run whose clients differentiate in forward mode
    (``estimator: jvp``) with ``forward_mode_ad = 1``, carried into the run's summary, so that
    tables keep such rows apart from the inference-only ones."""

    def round(self, rnd: int, client_ids: list[int]) -> Round:
        out = yield from self.inner.round(rnd, client_ids)
        return {**out, "forward_mode_ad": 1}


def _labelled(cfg: BaffleConfig, built: MethodBuild) -> MethodBuild:
    if cfg.estimator == "jvp":
        built.layers.append(Layer("outermost", ForwardModeLabel))
    return built


@declare_method(
    "baffle",
    "BAFFLE: forward-only zeroth-order estimates, K loss differences or model deltas uploaded",
    config=BaffleConfig,
    capabilities=dataclasses.replace(CAPABILITIES, coordinate_mask=True, accelerators=True),
    defaults=DEFAULTS,
    advice=advice,
    upload=upload,
    summary_keys=("forward_mode_ad",),
)
def build(
    cfg: BaffleConfig, env: MethodEnv, *, masks: dict[str, torch.Tensor] | None = None
) -> MethodBuild:
    """Build BAFFLE's bare strategy and client program (the composer adds secure aggregation,
    DP, EMA and freezing); ``masks`` (from pruning) make the global model sparse from the start."""
    assert cfg.server_optimizer is not None
    if (
        cfg.perturb is not None
    ):  # checked here, before a run directory is made, not in the first round
        try:
            perturbed_params(env.model_fn(), cfg.perturb)
        except ConfigError as exc:
            raise ConfigError(f"method.perturb={cfg.perturb}: {exc}") from None
    if cfg.estimator == "activity":  # the model's layers checked before a run directory is made
        model = env.model_fn().train()
        try:
            activity_layers(model, list(perturbed_params(model, cfg.perturb)))
        except ConfigError as exc:
            raise ConfigError(f"method.estimator=activity: {exc}") from None
    if env.train_masks is not None and cfg.downlink == "seeds":
        raise ConfigError(
            "method.train_mask with method.downlink=seeds: a client's replay of the server's steps "
            "does not take the mask; use method.downlink=model with method.train_mask"
        )
    if cfg.mode == "epoch":
        return _labelled(cfg, build_epoch(cfg, env, masks=masks))
    method = _labelled(cfg, build_batch(cfg, env, masks=masks))
    if not cfg.secure_aggregation:
        warn_scalars_unprotected(
            "K loss differences", relies=" (BAFFLE relies on secure aggregation, Eq. 7)"
        )
    return method
