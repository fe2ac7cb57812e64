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
    patches: int = 1,
    params: Sequence[str] | None = None,
) -> dict[str, Tensor]:
    """Autograd's gradient of Σ_b L_b + CE(tail(sg(h_last)), y), sg a stop-gradient at each
    block's input, for the heads keyed by flat-layer index of their block's end (as
    ``activity_gradient`` takes them). With one group and one patch, L_b = CE(head_b(h_b), y).
    With ``groups`` G (each head's last layer a Linear of G classifiers) and ``patches`` P (a
    head pooling globally; P x P patches of the block output), L_b = (1/G) Σ_g [Σ_p CE(sg(W_g)
    f_{g,p} + sg(b_g), y) + CE(W_g sg(f̄) + b_g, y)], f_{g,p} the pooled features with only group
    g's share of patch p moving, sg(f̄) + m_g (f_p − sg(f_p)) / P² (f_p the patch's mean
    features; one patch: f̄): the block follows its cells' losses, each classifier its group's.
    The block's last linear or convolutional layer takes its gradient with its output z mixed
    the same way, sg(z) + M_{g,p} (z − sg(z)), where its channels reach the head unmixed and its
    positions map onto the block output's by a whole stride (as the estimate weights that
    layer's elements by their own cell's loss): the paths between cells through a norm's shared
    statistics stopped.

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
    area, mixed_layers = patches * patches, set()

    def cell_mask(z: Tensor, out: Tensor, g: int, p: int) -> Tensor | None:
        """M_{g,p} on z's grid, or None where z's channels or positions do not map."""
        channels = z.shape[1]
        if out.shape[1] != channels or channels % groups:
            return None
        mask = torch.zeros(channels, dtype=z.dtype, device=z.device)
        mask[g * channels // groups : (g + 1) * channels // groups] = 1
        mask = mask.view(1, -1, *[1] * (z.dim() - 2))
        if area == 1:
            return mask
        if z.dim() != 4 or z.shape[2] % out.shape[2] or z.shape[3] % out.shape[3]:
            return None
        grid = torch.zeros(patches * patches, dtype=z.dtype, device=z.device)
        grid[p] = 1  # patch p on the P x P grid, then blown up to the output's, then to z's
        grid = grid.view(patches, patches)
        for dim, size in ((0, out.shape[2]), (1, out.shape[3])):
            grid = grid.repeat_interleave(size // patches, dim)
        for dim, (a, b) in ((0, (z.shape[2], out.shape[2])), (1, (z.shape[3], out.shape[3]))):
            grid = grid.repeat_interleave(a // b, dim)
        return mask * grid

    def head_loss(e: int, z: Tensor, out: Tensor, mix_z: bool) -> Tensor:
        if groups == patches == 1:
            return F.cross_entropy(heads[str(e)](out), y)
        *pre, linear = flat_layers(heads[str(e)]) or []
        assert isinstance(linear, nn.Linear)
        losses, channels, per = [], out.shape[1], linear.out_features // groups
        features = _run(pre, out).detach()  # the classifiers' input, for their own losses
        for g in range(groups):
            own = torch.zeros(channels, dtype=out.dtype, device=out.device)
            own[g * channels // groups : (g + 1) * channels // groups] = 1
            for p in range(area):
                h, mask = out, cell_mask(z, out, g, p) if mix_z else None
                if mask is not None:
                    mixed_layers.add(last[e])
                    h = z.detach() + mask * (z - z.detach())
                    for m in layers[last[e] + 1 : e + 1]:
                        h = m(h)
                mean = _run(pre, h)
                if area == 1:  # the features: channel-major, pooled to head_pool per side
                    spread = own.repeat_interleave(mean.shape[1] // channels)
                    f = mean.detach() + spread * (mean - mean.detach())
                else:
                    q = F.adaptive_avg_pool2d(h, patches).flatten(2)[:, :, p]
                    f = mean.detach() + own * (q - q.detach()) / area
                rows = slice(g * per, (g + 1) * per)
                w, b = linear.weight[rows], linear.bias[rows]
                losses.append(F.cross_entropy(f @ w.detach().T + b.detach(), y))
            # the classifier's own loss: its group's (every cell's equals it, in value and in
            # the classifier's gradient)
            w, b = linear.weight[g * per : (g + 1) * per], linear.bias[g * per : (g + 1) * per]
            losses.append(F.cross_entropy(features @ w.T + b, y))
        return torch.stack(losses).sum() / groups

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
    if groups == patches == 1:
        return features
    channels = gradient(True)
    own = {id(p) for i in mixed_layers for p in layers[i].parameters()}
    return {n: channels[n] if id(p) in own else features[n] for n, p in named.items()}


def _run(chain: Sequence[nn.Module], h: Tensor) -> Tensor:
    for m in chain:
        h = m(h)
    return h
