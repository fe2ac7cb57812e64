"""BAFFLE's reference zeroth-order loop, kept as the oracle and baseline of ``fedge bench zo``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["reference_gradient"]


def reference_gradient(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    batch: tuple[Tensor, Tensor],
    *,
    k: int,
    sigma: float,
    scheme: str,
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """BAFFLE Eq. (6) computed as the reference code does: in-place perturbation, K loops.

    For each k: ``z ~ N(0, I)`` drawn per parameter from ``generator``, ``W += σz`` in place,
    ``L+`` from a forward; central: ``W -= 2σz``, ``L-`` from a forward, ``W += σz``; forward
    scheme: ``W -= σz`` and ``L-`` is the one baseline loss ``L(W)``; then ``g += ΔL·z``.
    Returns ``g / (c·K·σ)`` (c = 2 central, 1 forward). The weights are restored by the
    inverse additions, so they drift by rounding, a few ulps per k (fedge's modes never write
    them).
    """
    if scheme not in ("central", "forward"):
        raise ValueError(f"scheme must be 'central' or 'forward', got {scheme!r}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = [torch.zeros_like(p) for _, p in named]
    x, y = batch
    with torch.no_grad():
        base = float(loss_fn(model(x), y)) if scheme == "forward" else 0.0
        for _ in range(k):
            zs = [torch.randn(p.shape, generator=generator) for _, p in named]
            for (_, p), z in zip(named, zs):
                p.add_(z, alpha=sigma)
            plus = float(loss_fn(model(x), y))
            if scheme == "central":
                for (_, p), z in zip(named, zs):
                    p.sub_(z, alpha=2 * sigma)
                minus = float(loss_fn(model(x), y))
                for (_, p), z in zip(named, zs):
                    p.add_(z, alpha=sigma)
            else:
                minus = base
                for (_, p), z in zip(named, zs):
                    p.sub_(z, alpha=sigma)
            for g, z in zip(grads, zs):
                g.add_(z, alpha=plus - minus)
    c = 2.0 if scheme == "central" else 1.0
    return {n: g.div_(c * k * sigma) for (n, _), g in zip(named, grads)}
