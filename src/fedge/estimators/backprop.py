"""The backpropagation oracle: the exact gradient BAFFLE's estimate is compared against.

It is the BP baseline of the paper's tables and the oracle of the zeroth-order tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from fedge.estimators.perturbation import select

__all__ = ["backprop_gradient"]


def backprop_gradient(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    batch: tuple[Tensor, Tensor],
    *,
    params: Sequence[str] | None = None,
) -> dict[str, Tensor]:
    """∇_W L(W; batch) by autograd for the selected parameters.

    Args:
        model: the network, in the mode (train/eval) the loss should be computed in.
        loss_fn: ``loss_fn(logits, y) -> scalar`` mean loss.
        batch: ``(x, y)``.
        params: parameter names; None = every ``requires_grad`` parameter (as the
            zeroth-order estimators select).

    Returns:
        name -> gradient (zeros for a parameter the loss does not depend on). The model's
        ``.grad`` fields are left untouched.
    """
    sel = select(model, params)
    x, y = batch
    with torch.enable_grad():
        loss = loss_fn(model(x), y)
        grads = torch.autograd.grad(loss, list(sel.params.values()), allow_unused=True)
    return {
        n: torch.zeros_like(p) if g is None else g.detach()
        for (n, p), g in zip(sel.params.items(), grads)
    }
