"""The objective an activity estimate with local heads follows, by autograd (Ren, Kornblith, Liao
and Hinton, "Scaling Forward Gradient With Local Losses", ICLR 2023, Section 4): the gradient that
:func:`~fedge.estimators.activity.activity_gradient` with ``heads`` (and ``head_groups``)
converges to as K grows. It is what to check such an estimate against, and what measures how far
local losses lead a block from the network's loss (``benchmarks/zo_frontier.py --quality``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedge.estimators.activity import HEAD_PREFIX
from fedge.estimators.zeroth_order import flat_layers

__all__ = ["local_objective_gradient"]

_MIXING = (nn.Linear, nn.Conv1d, nn.Conv2d)


def local_objective_gradient(
    model: nn.Sequential,
    heads: nn.ModuleDict,
    batch: tuple[Tensor, Tensor],
    *,
    groups: int = 1,
    params: Sequence[str] | None = None,
) -> dict[str, Tensor]:
    """Autograd's gradient of Σ_b L_b + CE(tail(sg(h_last)), y), sg a stop-gradient at each
    block's input, for the heads keyed by flat-layer index of their block's end (as
    ``activity_gradient`` takes them). With ``groups`` G = 1, L_b = CE(head_b(h_b), y). With G > 1
    (each head's last layer a Linear of G classifiers), L_b = (1/G) Σ_g CE(W_g f_g + b_g, y),
    f_g the head's features with every channel group but g's stopped, sg(f) + m_g (f − sg(f));
    the block's last linear or convolutional layer takes its gradient with its output mixed the
    same way (sg(z) + M_g (z − sg(z)): the paths between loss groups through a norm's shared
    statistics stopped, as the estimate's own-group weighting of that layer does).

    Returns:
        name -> gradient for ``params`` (None: every model parameter) and every head parameter,
        keyed ``HEAD_PREFIX`` + its name in ``heads``.
    """
    layers = flat_layers(model)
    if layers is None:
        raise ValueError(f"expected a plain nn.Sequential model, got {type(model).__name__}")
    x, y = batch
    ends = sorted(int(k) for k in heads)
    last = {e: max(j for j in range(e + 1) if isinstance(layers[j], _MIXING)) for e in ends}
    named = {
        **{n: p for n, p in model.named_parameters() if params is None or n in params},
        **{HEAD_PREFIX + n: p for n, p in heads.named_parameters()},
    }

    def head_loss(e: int, z: Tensor, out: Tensor, mix_z: bool) -> Tensor:
        if groups == 1:
            return F.cross_entropy(heads[str(e)](out), y)
        *pre, linear = flat_layers(heads[str(e)]) or []
        assert isinstance(linear, nn.Linear)
        losses, channels = [], z.shape[1]
        for g in range(groups):
            own = torch.zeros(channels, dtype=z.dtype, device=z.device)
            own[g * channels // groups : (g + 1) * channels // groups] = 1
            h = out
            if mix_z:
                h = z.detach() + own.view(1, -1, *[1] * (z.dim() - 2)) * (z - z.detach())
                for m in layers[last[e] + 1 : e + 1]:
                    h = m(h)
            for m in pre:
                h = m(h)
            f = h.detach() + own.repeat_interleave(h.shape[1] // channels) * (h - h.detach())
            rows = slice(g * linear.out_features // groups, (g + 1) * linear.out_features // groups)
            losses.append(F.cross_entropy(f @ linear.weight[rows].T + linear.bias[rows], y))
        return torch.stack(losses).mean()

    def gradient(mix_z: bool) -> dict[str, Tensor]:
        h, losses, outputs = x, [], {}
        for i, layer in enumerate(layers):
            h = outputs[i] = layer(h)
            if i in heads_at:
                losses.append(head_loss(i, outputs[last[i]], h, mix_z))
                h = h.detach()
        loss = torch.stack([*losses, F.cross_entropy(h, y)]).sum()
        return dict(zip(named, torch.autograd.grad(loss, list(named.values())), strict=True))

    heads_at = set(ends)
    features = gradient(False)
    if groups == 1:
        return features
    channels = gradient(True)
    own = {id(p) for e in ends for p in layers[last[e]].parameters()}
    return {n: channels[n] if id(p) in own else features[n] for n, p in named.items()}
