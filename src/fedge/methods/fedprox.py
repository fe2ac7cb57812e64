"""FedProx: FedAvg whose clients minimize a proximal objective (Li et al., MLSys 2020,
arXiv:1812.06127v5, Algorithm 2).

In round t each sampled client k starts from the global model w_t and runs its local steps on

    h_k(w; w_t) = F_k(w) + μ/2 ‖w − w_t‖²                                   (Eq. 2)

whose gradient is ∇F_k(w) + μ (w − w_t): the proximal term pulls the local model back towards
w_t, limiting client drift on heterogeneous data. It uploads its delta and the server averages
as FedAvg (:class:`~fedge.methods.fedavg.DeltaAveraging`); μ = 0 is FedAvg exactly. The round's
w_t comes to the gradient through the client's context (``ctx.global_arrays``), so the client is
FedAvg's :class:`~fedge.methods.local.LocalTraining` with another gradient function. The logged
``train_loss`` is F_k's, as the paper's figures report it. (The paper's variable local work,
γ-inexact solutions of stragglers, is not modelled: every client runs the configured steps.)

Secure aggregation, DP, freezing and EMA evaluation compose by configuration (its capabilities
are FedAvg's less ``method.train_mask`` and ``device: cuda``): ``method.secure_aggregation``,
``privacy.*``, ``method.freeze``, ``method.ema``.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from fedge.core.context import ClientContext
from fedge.methods.base import MethodBuild, MethodEnv
from fedge.methods.fedavg import CAPABILITIES, DeltaAveraging, FedAvgConfig
from fedge.methods.local import Batch, GradientFn, LocalTraining, Masks, backprop_gradient_fn
from fedge.methods.registry import declare_method

__all__ = ["FedProxConfig", "build", "proximal_gradient_fn"]


class FedProxConfig(FedAvgConfig):
    """FedAvg's keys (E, B, client and server optimizers, weighting) plus μ."""

    name: Literal["fedprox"] = "fedprox"  # type: ignore[assignment]
    mu: float = Field(
        0.01, ge=0, description="μ: weight of the proximal term μ/2·‖w − w_t‖² (0: FedAvg)"
    )


def proximal_gradient_fn(mu: float, base: GradientFn = backprop_gradient_fn) -> GradientFn:
    """The gradient of h_k(w; w_t) = F_k(w) + μ/2 ‖w − w_t‖² (FedProx Eq. 2): ``base``'s
    gradient of F_k plus μ (w − w_t), w_t the round's global weights (``ctx.global_arrays``);
    zero where a sparse model is masked out. With μ = 0 it is ``base`` itself.

    Args:
        mu: μ ≥ 0.
        base: the gradient of F_k (backprop's by default).
    """
    if mu == 0:
        return base

    def gradient(
        model: torch.nn.Module, batch: Batch, ctx: ClientContext, masks: Masks = None
    ) -> tuple[float | None, dict[str, torch.Tensor]]:
        loss, grads = base(model, batch, ctx, masks)
        w_t = ctx.global_arrays
        if w_t is None:
            raise RuntimeError(
                "FedProx's proximal term needs the round's global weights in ctx.global_arrays; "
                "run it inside LocalTraining.train, which sets them"
            )
        params = dict(model.named_parameters())
        for k, g in grads.items():
            prox = (params[k].detach() - w_t[k]).mul_(mu)
            if masks and k in masks:
                prox.mul_(masks[k])
            grads[k] = g + prox
        return loss, grads

    return gradient


@declare_method(
    "fedprox",
    "FedProx: FedAvg with the proximal term μ/2·‖w − w_t‖² in each client's objective",
    config=FedProxConfig,
    capabilities=CAPABILITIES,
    upload=lambda cfg: "delta",
)
def build(cfg: FedProxConfig, env: MethodEnv) -> MethodBuild:
    """Build FedProx: FedAvg's server and local training with the proximal gradient."""
    strategy = DeltaAveraging(
        env.model_fn(),
        cfg.server_optimizer.build(),
        replies_are_gradients=False,
        weighting=cfg.weighting,
    )
    program = LocalTraining.from_config(env.model_fn, cfg, gradient_fn=proximal_gradient_fn(cfg.mu))
    return MethodBuild(strategy, program)
