"""Inverting EPPFL's released activations back to the input (issue 12; seed 003, the
model-inversion threat to M_c).

An EPPFL device sends its edge server S_e, for every batch, the output of its sub-model M_c
at the kept positions (θ_a, chosen by a seed sent with them), each sample's kept values
clipped to L1 norm C and perturbed with Laplace noise Lap(2C/ε) when DP is on
(:mod:`fedge.methods.eppfl.device`). An honest-but-curious S_e that also holds M_c (the
global M_c is broadcast to every device: one colluding device suffices) inverts them the
way model-inversion attacks on split learning do (He, Zhang, Lee 2019, "Model inversion
attacks against collaborative inference", white-box rMLE): it optimizes a dummy input x so
that the same pipeline applied to x — M_c, the kept positions, the clip — reproduces the
observed values in the least-squares sense,

    min_x  || clip_C( gather_pos( M_c(x) ) ) − a_released ||²,

with x kept inside the valid pixel box. Without noise the match is exact at the true input
up to what M_c (and the dropped positions) destroys; with noise, the least-squares solution
drifts by the noise projected onto the input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedge.privacy.dp.laplace import clip_l1

__all__ = ["ActivationInversion", "invert_activations"]


@dataclass
class ActivationInversion:
    x: torch.Tensor  # (B, *input_shape), the run's normalized input space
    loss: float  # final matching loss


def invert_activations(
    device: torch.nn.Module,
    released: torch.Tensor,
    *,
    input_shape: tuple[int, ...],
    positions: torch.Tensor | None = None,
    clip: float | None = None,
    bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    iterations: int = 300,
    lr: float = 0.1,
    generator: torch.Generator,
) -> ActivationInversion:
    """Find inputs whose released activations match ``released``.

    Args:
        device: M_c with the weights the device used, in the mode the device ran it (the
            harness passes :func:`fedge.attacks.harness.device_as_run`: BatchNorm on batch
            statistics, as in training); its parameters are frozen for the attack, its mode left.
        released: (B, C, k) observed values (k = N_c when every position travels).
        input_shape: (C, H, W) of one input.
        positions: (B, C, k) kept positions in each channel's N_c entries (None: all).
        clip: the per-sample L1 clip C of DP (None: no DP, nothing clipped).
        bounds: (low, high) of valid inputs, broadcastable to (B, *input_shape).
        iterations, lr: Adam steps and step size.
        generator: draws the dummy input's start.
    """
    b = released.shape[0]
    x = torch.randn((b, *input_shape), generator=generator).mul_(0.5).requires_grad_(True)
    target = released.detach().to(torch.float32)
    for p in device.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam([x], lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, iterations)

    def forward(z: torch.Tensor) -> torch.Tensor:
        a = device(z)
        c = a.shape[1] if a.dim() > 2 else 1
        flat = a.reshape(b, c, -1)
        if positions is not None:
            flat = flat.gather(-1, positions.long())
        return clip_l1(flat, clip) if clip is not None else flat

    loss = torch.zeros(())
    for _ in range(iterations):
        opt.zero_grad(set_to_none=True)
        loss = ((forward(x) - target) ** 2).sum() / b
        loss.backward()
        opt.step()
        sched.step()
        if bounds is not None:
            with torch.no_grad():
                x.copy_(torch.maximum(torch.minimum(x, bounds[1]), bounds[0]))
    for p in device.parameters():
        p.requires_grad_(True)
    return ActivationInversion(x.detach(), float(loss.detach()))
