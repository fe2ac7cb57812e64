"""Model inversion of the activations EPPFL releases to its edge server (He, Zhang, Lee,
ACSAC 2019, "Model inversion attacks against collaborative inference", white-box rMLE):
:func:`invert_activations` optimizes a dummy input x, kept inside the pixel box, so that the
device's pipeline applied to x (M_c, the kept positions θ_a, the per-sample L1 clip) matches
the released values in least squares, min_x ‖clip_C(gather_pos(M_c(x))) − a_released‖²;
:func:`activation_inversion` runs it on every device of an observed run's round 1, as its edge
server received them (:mod:`fedge.attacks.edge_view`), scored like the reconstruction attacks.
See docs/privacy/attacks.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fedge.attacks.edge_view import device_as_run, edge_view
from fedge.attacks.harness import ObservedRun
from fedge.attacks.images import baseline_mse, match_images, mean_image, mid_gray, pixel_box
from fedge.core.rng import generator
from fedge.privacy.dp.laplace import clip_l1

__all__ = ["ActivationInversion", "activation_inversion", "invert_activations"]


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
            harness passes :func:`fedge.attacks.edge_view.device_as_run`: BatchNorm on batch
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


def activation_inversion(
    run: ObservedRun,
    *,
    iterations: int = 300,
    samples: int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """EPPFL: invert each device's first released activations of round 1, as its edge server
    received them (``observe_run(..., parties=("edge",))``), with the round's global M_c
    (what S_a broadcast in round 1, in the clear then; see :mod:`fedge.attacks.inversion`).
    Scored like :func:`~fedge.attacks.reconstruct_run.reconstruction_attack`: pixel MSE to the closest image of the
    client's local set, beside the mean-image and mid-gray baselines."""
    from fedge.methods.eppfl.split import activation_positions  # noqa: PLC0415

    built = run.built
    mcfg = built.method_config
    steps, split = edge_view(run, "activation inversion")
    ds = built.dataset
    shape = tuple(ds.input_shape)
    bounds = pixel_box(ds)
    clip = mcfg.dp.clip if mcfg.dp is not None else None
    mean_img = mean_image(built)
    gray = mid_gray(ds, mean_img)
    cids = sorted(steps)[: samples or None]
    mse: list[float] = []
    base_mean, base_gray, clients, truths, recs = [], [], [], [], []
    for i, cid in enumerate(cids):
        msg = steps[cid]
        a = msg.arrays["a"]
        full = tuple(int(v) for v in str(msg.config["shape"]).split(","))
        b, c = full[0], full[1] if len(full) > 2 else 1
        n = math.prod(full[1:]) // c
        seed_pos = msg.config_int("seed", -1)
        pos = activation_positions(seed_pos, (b, c, n), a.shape[-1]) if seed_pos >= 0 else None
        rec = invert_activations(
            device_as_run(split.device),
            a,
            input_shape=shape,
            positions=pos,
            clip=clip,
            bounds=bounds,
            iterations=iterations,
            generator=generator(seed, "attack", "eppfl-inversion", cid),
        )
        data = built.clients[cid]
        x_true = data.x[data.indices]
        per = match_images(rec.x, x_true, ds)
        mse += [p[0] for p in per]
        base_mean += baseline_mse(mean_img, b, x_true, ds)
        base_gray += baseline_mse(gray, b, x_true, ds)
        clients.append(
            {
                "cid": cid,
                "mse": [p[0] for p in per],
                "match_loss": rec.loss,
                "released": list(a.shape),
            }
        )
        truths.append(torch.stack([x_true[p[1]] for p in per]))
        recs.append(rec.x)
        if progress is not None:
            progress(i + 1, len(cids))
    med = statistics.median(mse)
    eps = mcfg.dp.epsilon if mcfg.dp is not None else None
    return {
        "method": built.config.method.name,
        "attack": "activation inversion at the edge server (white-box M_c, Adam, pixel box)",
        "epsilon": eps,
        "clip": clip,
        "theta_a": mcfg.theta_a,
        "clients_attacked": len(cids),
        "iterations": iterations,
        "baseline_mean_image_mse": statistics.median(base_mean),
        "baseline_mid_gray_mse": statistics.median(base_gray),
        "attacks": {
            "eppfl-inversion": {
                "median_mse": med,
                "mean_mse": statistics.fmean(mse),
                "median_psnr_db": 10 * math.log10(1 / med) if med > 0 else float("inf"),
                "clients": clients,
            }
        },
        "_images": {"eppfl-inversion": (torch.cat(truths), torch.cat(recs))},
    }
