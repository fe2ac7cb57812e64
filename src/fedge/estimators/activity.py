"""Activity-perturbed gradient estimate (Ren, Kornblith, Liao and Hinton, "Scaling Forward Gradient
With Local Losses", ICLR 2023, arXiv:2210.03310v3, Section 3): instead of the weights, the client
perturbs the output activations z = W x + b of one linear or convolutional layer at a time, reads
each sample's directional derivative of the loss along the perturbation from forward passes
(finite differences, no backward pass), and forms the layer's weight gradient from its own input by
the layer's local linear map. The estimate is for a client that applies its own update (BAFFLE's
epoch mode): its directions live in the client's activations, which no server can regenerate.
By default every layer is scored by the global loss: unbiased up to the finite difference's error.
With ``heads`` (the paper's local losses, Section 4), a layer is scored by the loss of the local head
closing its block instead: its perturbed forwards stop there (shorter suffixes), and the estimate is
of a greedy per-block objective's gradient (stop-gradients between blocks), a bias the global loss
does not have. The heads' own linear layers are estimated the same way, from their own loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn import grad as layer_grad

from fedge.core.config import check_positive_int
from fedge.core.errors import ConfigError
from fedge.core.rng import seed_family
from fedge.estimators.perturbation import select
from fedge.estimators.spec import Scheme, check_scheme, check_sigma
from fedge.estimators.zeroth_order import flat_layers

__all__ = ["HEAD_PREFIX", "ExampleLossFn", "activity_gradient", "activity_layers"]

#: the key prefix of a local head's parameter in an estimate (then the ``heads`` dict's own name)
HEAD_PREFIX = "local_heads."

#: ``loss(logits, y) -> (B,)``: each sample's loss; the estimate is of their mean's gradient. With
#: a head's cell losses (``head_groups``, ``head_patches``) it is called in F.cross_entropy's
#: K-dimensional form, logits (N, classes, cells) and y (N, cells) -> (N, cells).
ExampleLossFn = Callable[[Tensor, Tensor], Tensor]
_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d)
# Perturbed rows per batched suffix pass, bounded by this many activation elements of z (4 MiB in
# float32): the K perturbed copies of a batch run as one larger batch through the suffix.
_MAX_PASS_ELEMENTS = 1 << 20


def per_example_cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    """Each sample's cross-entropy, in float64 (the differences are taken there)."""
    return F.cross_entropy(logits.to(torch.float64), y, reduction="none")


def activity_layers(model: nn.Module, params: Sequence[str] | None = None) -> list[int]:
    """The indices, in :func:`~fedge.estimators.zeroth_order.flat_layers` order, of the layers of
    ``model`` whose outputs an activity estimate perturbs: those owning a selected parameter
    (``params``; None: every ``requires_grad`` one). Refuses, naming the fix, a model that is not
    a plain ``nn.Sequential``, a selected parameter outside a linear or convolutional layer, and
    layers that mix samples or draw randomness (train-mode batch norm, active dropout), under which
    one sample's perturbation would move another's loss."""
    layers = flat_layers(model)
    if layers is None:
        raise ConfigError(
            f"activity perturbation needs an nn.Sequential model running Sequential.forward (it "
            f"runs the layers one by one), got {type(model).__name__}; every model of the registry "
            "is one, or use method.estimator=fast"
        )
    sel = select(model, params)
    owner = {id(p): i for i, m in enumerate(layers) for p in m.parameters(recurse=True)}
    names = {id(p): n for n, p in sel.params.items()}
    out: set[int] = set()
    for p in sel.params.values():
        i = owner.get(id(p))
        if i is None or not isinstance(layers[i], _LAYERS):
            kind = "no layer" if i is None else type(layers[i]).__name__
            raise ConfigError(
                f"activity perturbation estimates linear and convolutional layers' weights and "
                f"biases only, but {names[id(p)]!r} (in {kind}) is trainable; freeze it "
                "(method.freeze) or leave it out of method.perturb (e.g. "
                "method.perturb=['*.conv.*', 'classifier.*']); for norm layers, "
                "model.norm_affine=false"
            )
        layer = layers[i]
        if isinstance(layer, nn.modules.conv._ConvNd) and (
            isinstance(layer.padding, str) or layer.padding_mode != "zeros"
        ):
            raise ConfigError(
                f"activity perturbation supports zero-padded convolutions with integer padding, "
                f"got padding={layer.padding!r}, padding_mode={layer.padding_mode!r} in "
                f"{names[id(p)]!r}; use method.estimator=fast for this model"
            )
        out.add(i)
    first = min(out)
    for m in layers[first:]:
        for s in m.modules():
            mixing = isinstance(s, nn.modules.batchnorm._BatchNorm) and s.training
            random = isinstance(s, nn.modules.dropout._DropoutNd) and s.training and s.p > 0
            if mixing or random:
                raise ConfigError(
                    f"activity perturbation reads each sample's loss change from its own "
                    f"perturbation, but {type(s).__name__} in training mode "
                    f"{'mixes samples' if mixing else 'draws randomness'}; use GroupNorm or "
                    "model.norm=none, call model.eval(), or use method.estimator=fast"
                )
    return sorted(out)


def activity_gradient(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    *,
    k: int,
    sigma: float,
    scheme: Scheme,
    seed: int,
    params: Sequence[str] | None = None,
    masks: Mapping[str, Tensor] | None = None,
    loss_fn: ExampleLossFn = per_example_cross_entropy,
    chunk: int | None = None,
    heads: nn.ModuleDict | None = None,
    head_groups: int = 1,
    head_patches: int = 1,
) -> dict[str, Tensor]:
    """Activity-perturbed estimate of ∇_W L, L = (1/B) Σ_n ℓ_n the batch's mean loss, forwards
    only (Ren et al. 2023, Section 3, with finite differences for the forward-mode directional
    derivative). For each layer l owning a selected parameter, in forward order, with
    z_n = W x_n + b its output on sample n (x_n its input, both from one clean forward):

        ĝ_{z_n} = 1/(c·K·σ) · Σ_k [ℓ_n(z_n + σ u_{k,n}) − ℓ_n(z_n ∓ σ u_{k,n} or z_n)] · u_{k,n},
        ĝ_W = (1/B) Σ_n ĝ_{z_n} x_nᵀ,   ĝ_b = (1/B) Σ_n ĝ_{z_n}

    (for a convolution ĝ_W is the correlation of x with ĝ_z, the layer's own weight-gradient map;
    c = 2 for ``central``, 1 for ``forward``), u_{k,n} ~ N(0, I) drawn per sample from
    ``(seed, "activity", l, k)``. ℓ_n(z_n + σu) runs only the layers after l (the suffix), on the
    K perturbed copies of the batch stacked as one batch. E[ĝ_{z_n}] = ∇_{z_n} ℓ_n up to the
    finite difference's O(σ) (forward) or O(σ²) (central) error, so ĝ_W is unbiased for the
    gradient of the global loss in the limit σ → 0 (no local losses: the whole network's loss
    scores every layer), with variance set by the layer's activation size per sample, not by its
    number of weights. Layers before the first estimated one run once.

    Local losses (``heads``, Ren et al. 2023, Section 4): ``heads[str(e)]`` closes the block
    ending with layer e. A layer l ≤ e after the previous block's end is scored by that head's
    loss, ℓ_n = loss(head_e(layers_{l+1..e}(z_n))), not the network's; layers after the last
    head keep the global loss. The estimate is then of ∇ Σ_b loss(head_b(block_b(sg(h_{b−1}))))
    + loss(network tail(sg(h_last))), sg a stop-gradient at every block's input: each block fits
    its own head (a greedy objective, biased for the global loss), and its perturbed forwards
    stop at the head. Each head's linear and convolutional layers are estimated the same way
    from the block's clean output (draws ``(seed, "activity-head", e, j, k)``).

    Channel-group-wise local losses (``head_groups`` G > 1, Ren et al. 2023, Section 4): each head's
    linear layer holds G classifiers (G·classes outputs); the block output's channels split into G
    equal contiguous groups, and classifier g's loss ℓ_g sees every group's pooled features but
    only group g's move: ℓ_g = loss(W_g [sg(f_{-g}), f_g]), so its forward differences are taken
    with the other groups' features clean. A layer scored by the head follows the mean objective
    (1/G) Σ_g ℓ_g; the block's last linear or convolutional layer, when the layers after it keep
    its channels (norms, activations, pooling), weights each output channel's perturbation by its
    own group's loss difference alone: its perturbation noise in the other groups no longer enters
    its estimate (less variance at the same K and forwards), at the price of a stop-gradient on the
    paths between groups that a norm's shared statistics open (none when the groups are unions of
    GroupNorm's groups). The head's classifiers are estimated from their own groups' losses.

    Patch-wise local losses (``head_patches`` P > 1, Section 4, with a head that pools globally):
    the block output's positions split into P x P equal patches, a loss per patch and group (a
    cell): f̄ = mean_p f_p, the mean of the patches' pooled features, and cell (g, p)'s loss moves
    only with patch p's share of group g's, ℓ_{g,p} = loss(W_g [sg(f̄) + (f_p − sg(f_p))/P²]_g).
    The block follows (1/G) Σ_{g,p} ℓ_{g,p}, whose gradient is the group objective's where no
    norm couples the patches (the patches' shares add up to f̄'s); the head's classifiers follow
    their group losses. The block's last layer, when its positions map onto the block output's by
    a whole stride (2x2 pooling does), weights each element by its own cell's loss alone (less
    variance again); a norm's statistics that span patches are stopped between cells as between
    groups.

    Args:
        model: a plain ``nn.Sequential`` (nested ones flattened), left unchanged; its selected
            parameters must belong to ``nn.Linear``/``nn.Conv1d``/``nn.Conv2d`` layers
            (:func:`activity_layers`).
        batch: ``(x, y)``.
        k, sigma, scheme: K perturbations per sample and layer, σ, ``"forward"`` (K + 1 suffix
            forwards a layer) or ``"central"`` (2K).
        seed: the step's perturbation seed.
        params: names of the estimated parameters; None: every ``requires_grad`` one.
        masks: name -> bool mask; the estimate is zeroed off it.
        loss_fn: ``loss_fn(logits, y) -> (B,)`` each sample's loss.
        chunk: perturbations per batched suffix pass (None: up to 2²⁰ activation elements).
        heads: local heads keyed by the flat-layer index (a string) of the block's last layer,
            each a plain ``nn.Sequential`` whose parameters sit in linear/conv layers; None:
            every layer scored by the global loss.
        head_groups: G, the channel groups of every head (each head a plain ``nn.Sequential``
            whose only parameterized layer is its last, an ``nn.Linear`` with G·classes outputs);
            1: one loss a head.
        head_patches: P, patch losses on a P x P grid of every head block's 2-d output (its
            heads pooling globally); 1: none.

    Returns:
        name -> estimate, for the selected parameters (float32, on the parameters' device), and
        with ``heads`` for every head parameter, keyed ``HEAD_PREFIX`` + its name in ``heads``.

    Memory: besides inference of one batch, the layer being estimated's input x and output z,
    the accumulator ĝ_z (z's size), one pass of ``chunk`` perturbed copies of z through the
    suffix (inference activations of chunk·B samples), and the estimate (the selected
    parameters' size). No other layer's activations are kept (backprop keeps them all).
    """
    check_positive_int("k", k)
    check_sigma(sigma)
    check_scheme(scheme)
    if chunk is not None:
        check_positive_int("chunk", chunk)
    check_positive_int("head_groups", head_groups)
    check_positive_int("head_patches", head_patches)
    layers = flat_layers(model)
    estimated = set(activity_layers(model, params))
    assert layers is not None
    head_layers = _head_layers(heads, len(layers), head_groups, head_patches)
    ends = sorted(head_layers)
    # each block's last linear/conv layer: the one whose channels reach its head unmixed
    last_mixing = {
        e: max((j for j in range(e + 1) if isinstance(layers[j], _LAYERS)), default=-1)
        for e in ends
    }
    sel = select(model, params, masks)
    name_of = {id(p): n for n, p in sel.params.items()}
    head_names = {id(p): HEAD_PREFIX + n for n, p in (heads.named_parameters() if heads else ())}
    x, y = batch
    out: dict[str, Tensor] = {}

    def estimate(layer: nn.Module, h: Tensor, score: _Score, path: tuple) -> Tensor:
        """Estimate ``layer``'s parameters (those named) at input ``h``, its output scored by
        ``score(z)`` (per-sample losses of perturbed copies, and the loss groups' weighting);
        ``layer``'s clean output."""
        z = layer(h)  # (B, out) or (B, C, *spatial)
        losses, weigh = score(z)
        g_z = _activity_grad(z, losses, weigh, k, sigma, scheme, seed, path, chunk)
        g_z = g_z / ((2.0 if scheme == "central" else 1.0) * k * sigma * z.shape[0])
        gw, gb = _local_map(layer, h, g_z.to(z.dtype))
        for p, g in ((layer.weight, gw), (layer.bias, gb)):
            if p is None or g is None:
                continue
            if id(p) in name_of:
                mask = sel.masks.get(name_of[id(p)])
                out[name_of[id(p)]] = g * mask if mask is not None else g
            elif id(p) in head_names:
                out[head_names[id(p)]] = g
        return z

    def plain(suffix: Sequence[nn.Module]) -> _Score:
        return lambda z: (_suffix_losses(suffix, y, loss_fn), None)

    with torch.no_grad():
        h = x
        for i, layer in enumerate(layers):
            if i in estimated:
                end = next((e for e in ends if e >= i), None)
                if end is None:
                    score = plain(layers[i + 1 :])
                elif head_groups == head_patches == 1:
                    score = plain(layers[i + 1 : end + 1] + head_layers[end])
                else:
                    score = _cell_head(
                        layers[i + 1 : end + 1],
                        head_layers[end],
                        y,
                        loss_fn,
                        head_groups,
                        head_patches,
                        weigh_cells=i == last_mixing[end],
                    )
                h = estimate(layer, h, score, ("activity", i))
            else:
                h = layer(h)
            if i in head_layers:  # the block's head, from the block's clean output
                hh, chain = h, head_layers[i]
                for j, m in enumerate(chain):
                    if not isinstance(m, _LAYERS):
                        hh = m(hh)
                    elif head_groups == head_patches == 1:
                        hh = estimate(m, hh, plain(chain[j + 1 :]), ("activity-head", i, j))
                    else:  # the last layer: G classifiers, each scored by its own loss
                        score = _grouped_logits(y, loss_fn, head_groups)
                        hh = estimate(m, hh, score, ("activity-head", i, j))
    return {n: out[n] for n in [*sel.params, *head_names.values()]}


#: ``score(z) -> (losses, weigh)``: ``losses(zs, copies)``, the per-sample losses ``(copies, B)``
#: or per-sample cell losses ``(copies, B, G, P²)`` (G channel groups, P² patches) of perturbed
#: copies ``zs`` of z, the objective (1/G) Σ_{g,p} ℓ_{g,p}; ``weigh(diff, u)``: Σ over the copies
#: of u, each element weighted by its own cell's loss difference over G, ``(B, *z.shape[1:])``;
#: None: every element weighted by the objective's difference.
_Losses = Callable[[Tensor, int], Tensor]
_Weigh = Callable[[Tensor, Tensor], Tensor]
_Score = Callable[[Tensor], tuple[_Losses, _Weigh | None]]


def _run(chain: Sequence[nn.Module], h: Tensor) -> Tensor:
    for m in chain:
        h = m(h)
    return h


def _suffix_losses(suffix: Sequence[nn.Module], y: Tensor, loss_fn: ExampleLossFn) -> _Losses:
    """Each copy's per-sample loss after ``suffix``: ``(copies, B)``."""
    return lambda zs, copies: loss_fn(_run(suffix, zs), y.repeat(copies)).view(copies, -1)


def _cell_head(
    block: Sequence[nn.Module],
    chain: Sequence[nn.Module],
    y: Tensor,
    loss_fn: ExampleLossFn,
    groups: int,
    patches: int,
    *,
    weigh_cells: bool,
) -> _Score:
    """Score a block layer's output by the head's cell losses, a cell a channel group g and a
    patch p: the rest of the ``block`` and the head ``chain`` up to its linear layer give the
    features f (B, w), and cell (g, p)'s logits are W_g f₀ + b_g + W_g[:, own g] δ_{g,p}, f₀ the
    clean features and δ_{g,p} the move of group g's features from patch p alone (one patch:
    f − f₀; P×P patches under global pooling: the patch's mean over its positions, moved, over
    P²). ``weigh_cells``: the block's last linear/conv layer, each element weighted by its own
    cell's loss where the block keeps its channels (and with patches, maps its positions onto
    the block output's by a whole stride); otherwise by the objective's difference,
    (1/G) Σ_{g,p} Δℓ_{g,p}."""
    *pre, head = chain
    assert isinstance(head, nn.Linear)
    prefix, area = [*block, *pre], patches * patches

    def score(z: Tensor) -> tuple[_Losses, _Weigh | None]:
        out = _run(block, z)  # the block's clean output
        f0 = _run(pre, out).flatten(1)
        batch, width = f0.shape
        classes = head.out_features // groups
        w = head.weight.view(groups, classes, groups, width // groups)
        own = torch.stack([w[g, :, g, :] for g in range(groups)])  # (G, classes, w/G)
        base = head(f0).view(batch, groups, classes).transpose(1, 2).unsqueeze(3)  # (B, c, G, 1)
        labels = y.view(-1, 1).expand(-1, groups * area)
        if area > 1 and (out.dim() != 4 or out.shape[2] % patches or out.shape[3] % patches):
            raise ConfigError(
                f"patch losses split a block's output into {patches}x{patches} equal patches, but "
                f"it is {tuple(out.shape[1:])}; choose method.head_patches dividing its height and "
                "width"
            )
        q0 = F.adaptive_avg_pool2d(out, patches).flatten(2) if area > 1 else None  # (B, C, P²)

        def moved(zs: Tensor, copies: int) -> Tensor:  # δ: (copies·B, G, w/G, P²)
            if q0 is None:
                f = _run(prefix, zs).flatten(1).view(copies, batch, width)
                return (f - f0).view(copies * batch, groups, width // groups, 1)
            q = F.adaptive_avg_pool2d(_run(block, zs), patches).flatten(2)
            delta = (q.view(copies, batch, width, area) - q0) / area
            return delta.view(copies * batch, groups, width // groups, area)

        def losses(zs: Tensor, copies: int) -> Tensor:
            logits = base.repeat(copies, 1, 1, 1) + torch.einsum(
                "ngwp,gcw->ncgp", moved(zs, copies), own
            )  # (copies·B, classes, G, P²): the classes on dim 1, F.cross_entropy's K-d form
            cells = logits.reshape(copies * batch, classes, groups * area)
            per = loss_fn(cells, labels.repeat(copies, 1))
            return per.view(copies, batch, groups, area)

        if not weigh_cells or out.shape[1] != z.shape[1] or z.shape[1] % groups:
            return losses, None
        if area == 1:  # channel c: its group's difference
            return losses, _by_group(groups)
        if z.dim() != 4 or z.shape[2] % out.shape[2] or z.shape[3] % out.shape[3]:
            return losses, None  # z's positions do not map onto the output's by a whole stride
        return losses, _by_cell(groups, patches)

    return score


def _by_group(groups: int) -> _Weigh:
    """Σ_p (Δℓ_{p,n,g(c)} / G) u_{p,n,c,…}: channel c weighted by its group's difference."""

    def weigh(diff: Tensor, u: Tensor) -> Tensor:
        own = diff.flatten(2).repeat_interleave(u.shape[2] // groups, 2) / groups  # (p, B, C)
        return torch.einsum("pbc,pbc...->bc...", own, u)

    return weigh


def _by_cell(groups: int, patches: int) -> _Weigh:
    """Σ_p (Δℓ_{p,n,g,(r,s)} / G) u: a (C, H, W) output's element weighted by its cell, g its
    channel's group and (r, s) the patch of its position (z's grid split into P x P equal blocks,
    which a whole stride onto the block output's P x P patches gives), by views, no gather."""

    def weigh(diff: Tensor, u: Tensor) -> Tensor:
        p, b, c, h, w = u.shape
        cells = (diff / groups).view(p, b, groups, patches, patches)
        blocks = u.view(p, b, groups, c // groups, patches, h // patches, patches, w // patches)
        return torch.einsum("pbgrs,pbgcrxsy->bgcrxsy", cells, blocks).reshape(b, c, h, w)

    return weigh


def _grouped_logits(y: Tensor, loss_fn: ExampleLossFn, groups: int) -> _Score:
    """Score a head's G classifiers' logits (B, G·classes): each group's by its own loss (its
    cells' losses all equal it in value and in their gradient for the classifier)."""

    def score(z: Tensor) -> tuple[_Losses, _Weigh | None]:
        classes = z.shape[1] // groups
        labels = y.repeat_interleave(groups)

        def losses(zs: Tensor, copies: int) -> Tensor:
            per = loss_fn(zs.reshape(-1, classes), labels.repeat(copies))
            return per.view(copies, -1, groups, 1)

        return losses, _by_group(groups)

    return score


def _head_layers(
    heads: nn.ModuleDict | None, depth: int, groups: int = 1, patches: int = 1
) -> dict[int, list[nn.Module]]:
    """``heads`` as flat-layer index of the block's end -> the head's layers; refuses a key that
    is not a layer index before the network's last, a head that is not a plain Sequential, with
    ``groups`` > 1 one whose only parameterized layer is not a last Linear with a multiple of
    ``groups`` outputs, and with ``patches`` > 1 one that does not pool globally (a 2-d
    AdaptiveAvgPool to 1, a Flatten, the Linear)."""
    out: dict[int, list[nn.Module]] = {}
    for key, head in (heads or {}).items():
        if not key.isdigit() or not 0 <= int(key) < depth - 1:
            raise ConfigError(
                f"local head {key!r}: expected the index of a layer before the network's last "
                f"(0..{depth - 2}); the last layer's loss is the network's own"
            )
        chain = flat_layers(head)
        if chain is None:
            raise ConfigError(f"local head {key!r}: expected a plain nn.Sequential")
        if (groups > 1 or patches > 1) and (
            not isinstance(chain[-1], nn.Linear)
            or chain[-1].out_features % groups
            or any(isinstance(m, _LAYERS) for m in chain[:-1])
        ):
            raise ConfigError(
                f"local head {key!r}: with cell losses ({groups} groups, {patches}x{patches} "
                "patches) a head's one linear or convolutional layer must be its last, an "
                f"nn.Linear with a multiple of {groups} outputs (each group's classifier); "
                "fedge.methods.baffle.heads.build_heads makes them"
            )
        pooled = (
            len(chain) == 3
            and isinstance(chain[0], nn.AdaptiveAvgPool2d)
            and chain[0].output_size in (1, (1, 1))
            and isinstance(chain[1], nn.Flatten)
        )
        if patches > 1 and not pooled:
            raise ConfigError(
                f"local head {key!r}: patch losses ({patches}x{patches} patches) read a head that "
                "pools globally (AdaptiveAvgPool2d(1), Flatten, Linear: method.head_pool=1) on a "
                "2-d block output"
            )
        out[int(key)] = chain
    return out


def _activity_grad(
    z: Tensor,
    losses: _Losses,
    weigh: _Weigh | None,
    k: int,
    sigma: float,
    scheme: Scheme,
    seed: int,
    path: tuple,
    chunk: int | None,
) -> Tensor:
    """Σ_k Δℓ_{k,n} · u_{k,n}, float64 of z's shape: the un-normalized activity gradient. With
    cell losses ``(copies, B, G, P²)``: each element of z weighted by ``weigh`` (its own cell's
    Δℓ over G), or by the objective's difference (1/G) Σ_{g,p} Δℓ_{g,p} (None)."""
    batch = z.shape[0]
    per_pass = chunk or max(1, _MAX_PASS_ELEMENTS // max(1, z.numel()))
    base = losses(z, 1) if scheme == "forward" else None  # (1, B[, G])
    acc = torch.zeros(z.shape, dtype=torch.float64, device=z.device)
    seeds = seed_family(seed, *path)  # direction kk: generator(seed, *path, kk)'s draws
    gen = torch.Generator(device=z.device)
    for start in range(0, k, per_pass):
        ks = range(start, min(k, start + per_pass))
        u = torch.empty((len(ks), *z.shape), dtype=z.dtype, device=z.device)
        for j, kk in enumerate(ks):  # drawn in place: randn's values, without a copy
            u[j].normal_(generator=gen.manual_seed(seeds(kk)))
        zs = torch.mul(u, sigma).add_(z)  # z + σu, rounded as written, one buffer
        plus = losses(zs.flatten(0, 1), len(ks))
        if base is not None:
            diff = plus - base
        else:  # z − σu: the same buffer, negated (exact) then added
            diff = plus - losses(torch.mul(u, sigma).neg_().add_(z).flatten(0, 1), len(ks))
        if diff.dim() == 2:
            acc += torch.einsum("pb,pb...->b...", diff.to(u.dtype), u)  # in z's dtype: no copy of u
        elif weigh is None:  # the objective's difference, (1/G) Σ_{g,p} Δℓ, scores every element
            mean = diff.flatten(2).mean(2) * diff.shape[3]  # P² x the mean over G·P² cells
            acc += torch.einsum("pb,pb...->b...", mean.to(u.dtype), u)
        else:  # each element: its own cell's difference over G
            acc += weigh(diff.to(u.dtype), u)
        del u, zs
    assert acc.shape[0] == batch
    return acc


def _local_map(layer: nn.Module, x: Tensor, g_z: Tensor) -> tuple[Tensor, Tensor | None]:
    """The layer's weight and bias gradients from its input ``x`` and output gradient ``g_z``:
    g_zᵀ x (linear) or their correlation (convolution), and Σ g_z over samples (and positions)."""
    if isinstance(layer, nn.Linear):
        g2 = g_z.reshape(-1, g_z.shape[-1])  # (B·…, out)
        gw = g2.T @ x.reshape(-1, x.shape[-1])  # (out, in)
        gb = g2.sum(0) if layer.bias is not None else None
        return gw, gb
    assert isinstance(layer, (nn.Conv1d, nn.Conv2d))
    weight_map = (
        layer_grad.conv1d_weight if isinstance(layer, nn.Conv1d) else layer_grad.conv2d_weight
    )
    gw = weight_map(
        x,
        layer.weight.shape,
        g_z,
        stride=layer.stride,
        padding=layer.padding,
        dilation=layer.dilation,
        groups=layer.groups,
    )
    dims = [0, *range(2, g_z.dim())]
    return gw, (g_z.sum(dims) if layer.bias is not None else None)
