"""Activity perturbation (fedge.estimators.activity) against autograd: the estimate converges to
the autograd weight gradient as K grows (error like 1/sqrt(K)), is exact in expectation for a
single linear layer, equals its formula written out with the same draws, forms the weight gradient
by each layer's own linear map, and meters the FLOPs it runs; the models it cannot serve are
refused with the fix."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedge.core.errors import ConfigError
from fedge.core.rng import generator
from fedge.estimators.activity import (
    _activity_grad,
    _cell_head,
    _local_map,
    activity_gradient,
    activity_layers,
    per_example_cross_entropy,
)
from fedge.estimators.local_objective import local_objective_gradient


def _fill(model: nn.Module, seed: int, scale: float = 0.7) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _mlp() -> nn.Sequential:
    return _fill(
        nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.GroupNorm(1, 5, affine=False), nn.Tanh(),
                      nn.Linear(5, 3)),
        1,
    ).double()  # fmt: skip


def _cnn() -> nn.Sequential:
    return _fill(
        nn.Sequential(
            nn.Conv2d(1, 3, 3, padding=1),
            nn.Hardswish(),
            nn.Conv2d(3, 4, 3, stride=2, groups=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(4 * 2 * 2, 3),
        ),
        2,
        scale=0.5,
    ).double()


def _batch(shape: tuple[int, ...], n: int = 8, classes: int = 3):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, *shape, generator=g, dtype=torch.float64), torch.randint(
        0, classes, (n,), generator=g
    )


def _autograd(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    loss = F.cross_entropy(model(batch[0]), batch[1])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    return dict(zip(names, grads, strict=True))


def _flat(g: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in g.values()])


@pytest.mark.parametrize("net, shape", [(_mlp, (6,)), (_cnn, (1, 5, 5))])
def test_the_estimate_converges_to_the_autograd_gradient_as_k_grows(net, shape):
    """The relative error ‖ĝ − ∇L‖/‖∇L‖ (float64, central differences at σ = 1e-5, so the finite
    difference adds ~1e-10) falls like 1/sqrt(K): 16x the perturbations, about 1/4 the error, over
    4 seeds; at K = 4096 the cosine with autograd's gradient is above 0.98."""
    model, batch = net(), _batch(shape)
    true = _flat(_autograd(model, batch))

    def error(k: int) -> float:
        errs = []
        for seed in range(4):
            est = _flat(
                activity_gradient(model, batch, k=k, sigma=1e-5, scheme="central", seed=seed)
            )
            errs.append(float((est - true).norm() / true.norm()))
        return sum(errs) / len(errs)

    e16, e256, e4096 = error(16), error(256), error(4096)
    assert 2.5 < e16 / e256 < 6.4 and 2.5 < e256 / e4096 < 6.4, (e16, e256, e4096)
    est = _flat(activity_gradient(model, batch, k=4096, sigma=1e-5, scheme="central", seed=9))
    assert float(F.cosine_similarity(est, true, dim=0)) > 0.98


def _linear_loss(a: torch.Tensor):
    """ℓ_n = a · z_n: linear in the activations, so every finite difference is exact."""
    return lambda logits, y: (logits.to(torch.float64) * a).sum(-1)


def test_exact_for_a_single_linear_layer_in_expectation():
    """One linear layer under a loss linear in its output: ĝ_{z_n} = 1/K Σ_k (a·u_k) u_k, whose
    mean is a exactly (E[u uᵀ] = I), so ĝ_W = 1/B Σ_n ĝ_{z_n} x_nᵀ averages to the autograd
    gradient a·(1/B Σ x_n)ᵀ. At K = 40,000 each coordinate of ĝ_{z_n} has standard deviation
    sqrt((a_i² + ‖a‖²)/K); the weight estimate lies within 5 of its standard errors of autograd's."""
    model = _fill(nn.Sequential(nn.Linear(4, 3)), 4).double()
    a = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    x = _batch((4,), n=2)[0]
    y = torch.zeros(2, dtype=torch.long)
    k = 40_000
    loss_fn = _linear_loss(a)
    got = activity_gradient(
        model, (x, y), k=k, sigma=0.3, scheme="forward", seed=0, loss_fn=loss_fn
    )
    loss = loss_fn(model(x), y).mean()
    gw, gb = torch.autograd.grad(loss, [model[0].weight, model[0].bias])
    # per-sample u's are independent: Var(ĝ_W[i, j]) = (a_i² + ‖a‖²)/K · (1/B²) Σ_n x_nj²
    var_z = (a**2 + (a**2).sum()) / k  # (3,)
    se_w = (var_z[:, None] * (x**2).sum(0)[None, :] / x.shape[0] ** 2).sqrt()
    se_b = (var_z * x.shape[0] / x.shape[0] ** 2).sqrt()
    assert ((got["0.weight"] - gw).abs() < 5 * se_w).all()
    assert ((got["0.bias"] - gb).abs() < 5 * se_b).all()
    assert ((got["0.weight"] - gw).abs() > 0).any()  # an estimate, not the gradient itself


@pytest.mark.parametrize("scheme", ["forward", "central"])
def test_the_estimate_is_its_formula_with_the_seeded_draws(scheme):
    """Oracle written out: u_{k,n} from generator(seed, "activity", layer, k), the loss difference
    of each sample, 1/(c·K·σ·B) Σ_k Δℓ_{k,n} u_{k,n}, then g_zᵀ x; for a one-layer model with a
    linear loss, ĝ_z = 1/(K·B) Σ_k (a·u_k) u_k whatever σ and chunking."""
    model = _fill(nn.Sequential(nn.Linear(4, 3)), 4).double()
    a = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    x, y = _batch((4,), n=5)[0], torch.zeros(5, dtype=torch.long)
    k = 7
    u = torch.stack(
        [torch.randn((5, 3), generator=generator(11, "activity", 0, i), dtype=torch.float64)
         for i in range(k)]
    )  # fmt: skip
    g_z = torch.einsum("kn,knd->nd", u @ a, u) / (k * 5)
    for chunk in (None, 2):
        got = activity_gradient(
            model, (x, y), k=k, sigma=0.1, scheme=scheme, seed=11, loss_fn=_linear_loss(a),
            chunk=chunk,
        )  # fmt: skip
        torch.testing.assert_close(got["0.weight"], g_z.T @ x)
        torch.testing.assert_close(got["0.bias"], g_z.sum(0))


@pytest.mark.parametrize(
    "layer, x_shape",
    [
        (nn.Linear(5, 4), (3, 5)),
        (nn.Linear(5, 4), (3, 2, 5)),  # a sequence of vectors per sample
        (nn.Conv2d(2, 4, 3, stride=2, padding=1), (3, 2, 7, 7)),
        (nn.Conv2d(4, 6, 3, groups=2, dilation=2, bias=False), (2, 4, 9, 9)),
        (nn.Conv1d(2, 3, 3, padding=2), (3, 2, 8)),
    ],
)
def test_the_local_map_is_the_layers_own_weight_gradient(layer, x_shape):
    """Oracle: autograd of Σ z ⊙ g_z through that layer alone gives ∂/∂W and ∂/∂b."""
    layer = _fill(layer, 6).double()
    x = torch.randn(x_shape, dtype=torch.float64)
    z = layer(x)
    g_z = torch.randn(z.shape, dtype=torch.float64)
    params = [p for p in (layer.weight, layer.bias) if p is not None]
    want = torch.autograd.grad((z * g_z).sum(), params)
    gw, gb = _local_map(layer, x.detach(), g_z)
    torch.testing.assert_close(gw, want[0])
    if layer.bias is not None:
        torch.testing.assert_close(gb, want[1])
    else:
        assert gb is None


def test_selection_masks_and_frozen_layers():
    """Only selected parameters are estimated (frozen ones skipped, the prefix run once), and a
    mask zeroes the estimate off it."""
    model = _mlp()
    model[1].requires_grad_(False)
    batch = _batch((6,))
    mask = torch.rand(3, 5, generator=torch.Generator().manual_seed(0)) < 0.5
    got = activity_gradient(
        model, batch, k=4, sigma=1e-4, scheme="forward", seed=0, masks={"4.weight": mask}
    )
    assert list(got) == ["4.weight", "4.bias"]
    assert (got["4.weight"][~mask] == 0).all() and (got["4.weight"][mask] != 0).all()
    only = activity_gradient(
        model, batch, k=4, sigma=1e-4, scheme="forward", seed=0, params=["4.bias"]
    )
    assert list(only) == ["4.bias"]
    torch.testing.assert_close(only["4.bias"], got["4.bias"])


@pytest.mark.parametrize("scheme", ["forward", "central"])
def test_flops_are_metered_as_executed(scheme):
    """torch's counter sees the clean forward once, (K + 1) or 2K suffix forwards per estimated
    layer (each layer's suffix: the layers after it), each layer's local map (2·B·in·out) and the
    accumulation of Σ_k Δℓ u (2·B·K·out): MLP d-h-C, B samples."""
    b, d, h, c, k = 5, 12, 7, 3, 9
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, h), nn.ReLU(), nn.Linear(h, c))
    batch = (torch.randn(b, d), torch.randint(0, c, (b,)))
    counter = FlopCounterMode(display=False)
    with counter:
        activity_gradient(model, batch, k=k, sigma=1e-3, scheme=scheme, seed=0)
    forward = 2 * b * (d * h + h * c)
    passes = k + 1 if scheme == "forward" else 2 * k
    suffix = passes * 2 * b * h * c  # after fc1: the output layer; after it: nothing
    local = 2 * b * (h * d + c * h)
    accumulate = 2 * b * k * (h + c)
    assert counter.get_total_flops() == forward + suffix + local + accumulate


def test_models_it_cannot_serve_are_refused_with_the_fix():
    bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).train()
    with pytest.raises(ConfigError, match=r"'1.weight' \(in BatchNorm1d\) is trainable"):
        activity_layers(bn)
    bn[1].requires_grad_(False)
    with pytest.raises(ConfigError, match="BatchNorm1d in training mode mixes samples; use Group"):
        activity_layers(bn)
    assert activity_layers(bn.eval()) == [0, 2]  # eval-mode statistics: per sample
    affine = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"'1.weight' \(in LayerNorm\) is trainable; freeze it"):
        activity_layers(affine)
    affine[1].requires_grad_(False)
    assert activity_layers(affine) == [0, 2]
    drop = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)).train()
    with pytest.raises(ConfigError, match="Dropout in training mode draws randomness"):
        activity_layers(drop)

    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc(x)

    with pytest.raises(ConfigError, match="needs an nn.Sequential model"):
        activity_layers(Residual())
    with pytest.raises(ConfigError, match=r"'0.fc.weight' \(in Residual\)"):
        activity_layers(nn.Sequential(Residual()))
    with pytest.raises(ConfigError, match="padding='same'"):
        activity_layers(nn.Sequential(nn.Conv2d(1, 2, 3, padding="same")))


def test_the_variance_falls_with_the_activation_size_not_the_weight_count():
    """The point of perturbing activations (Ren et al. 2023, Section 3): a layer of 784·32 weights
    with 32 outputs is estimated as well, at a given K, as its 32-dimensional output is; its error
    at K = 64 is near sqrt((d_z + 1)/K) ≈ 0.73, far below weight perturbation's sqrt(n/K) ≈ 20."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 32), nn.Tanh(), nn.Linear(32, 10)).double()
    batch = (torch.randn(1, 784, dtype=torch.float64), torch.tensor([3]))
    true = _autograd(model, batch)["0.weight"]
    errs = []
    for seed in range(8):
        est = activity_gradient(
            model, batch, k=64, sigma=1e-5, scheme="central", seed=seed, params=["0.weight"]
        )["0.weight"]
        errs.append(float((est - true).norm() / true.norm()))
    assert sum(errs) / len(errs) < 1.5 * math.sqrt(33 / 64)


def _cnn_heads() -> nn.ModuleDict:
    """A local head closing the _cnn's first block (conv, Hardswish: flat layers 0-1)."""
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 3))
    return nn.ModuleDict({"1": _fill(head, 5)}).double()


def _local_objective(model: nn.Sequential, heads: nn.ModuleDict, batch) -> dict[str, torch.Tensor]:
    """Autograd's gradient of Ren et al.'s local objective on _cnn with a head after layer 1:
    CE(head(block(x))) + CE(tail(sg(h))), sg the stop-gradient at the second block's input."""
    x, y = batch
    h = model[1](model[0](x))
    tail = h.detach()
    for m in list(model)[2:]:
        tail = m(tail)
    loss = F.cross_entropy(heads["1"](h), y) + F.cross_entropy(tail, y)
    named = {
        **dict(model.named_parameters()),
        **{f"local_heads.{n}": p for n, p in heads.named_parameters()},
    }
    return dict(zip(named, torch.autograd.grad(loss, list(named.values())), strict=True))


def _converges(run, true: torch.Tensor) -> dict[str, torch.Tensor]:
    """``run(k, seed)``'s error against ``true`` falls like 1/sqrt(K) (16 -> 256, 4 seeds each)
    and its K = 4096 estimate has cosine above 0.98 with it; that estimate."""
    errs = {
        k: sum(float((_flat(run(k, s)) - true).norm() / true.norm()) for s in range(4)) / 4
        for k in (16, 256)
    }
    assert 2.5 < errs[16] / errs[256] < 6.4, errs
    est = run(4096, 9)
    assert float(F.cosine_similarity(_flat(est), true, dim=0)) > 0.98
    return est


def test_local_heads_converge_to_the_local_objectives_gradient():
    """With a head closing the first block, the estimate (model and head parameters) converges to
    autograd's gradient of the local objective (each block fits its own head, stop-gradients
    between blocks), not the global loss's: error falls like 1/sqrt(K); at K = 4096 the cosine
    with the local gradient is above 0.98, and the first conv's estimate is far from the
    global loss's gradient (the bias local losses trade for shorter suffixes)."""
    model, heads, batch = _cnn(), _cnn_heads(), _batch((1, 5, 5))
    local = _local_objective(model, heads, batch)
    true = _flat(local)

    def run(k: int, seed: int) -> dict[str, torch.Tensor]:
        return activity_gradient(
            model, batch, k=k, sigma=1e-5, scheme="central", seed=seed, heads=heads
        )

    assert list(run(2, 0)) == list(local)  # the model's parameters, then the head's
    est = _converges(run, true)
    glob = _autograd(model, batch)["0.weight"].reshape(-1)
    assert float(F.cosine_similarity(est["0.weight"].reshape(-1), glob, dim=0)) < 0.9


def test_layers_after_the_last_head_keep_the_global_estimate():
    """A layer past every head is scored by the network's loss through the same suffix with the
    same draws: its estimate is the head-free one, bit for bit."""
    model, batch = _cnn(), _batch((1, 5, 5))
    plain = activity_gradient(model, batch, k=8, sigma=1e-4, scheme="forward", seed=3)
    headed = activity_gradient(
        model, batch, k=8, sigma=1e-4, scheme="forward", seed=3, heads=_cnn_heads()
    )
    for name in ("2.weight", "2.bias", "5.weight", "5.bias"):
        assert torch.equal(plain[name], headed[name])
    assert not torch.equal(plain["0.weight"], headed["0.weight"])


def test_a_head_cuts_the_suffix_its_block_runs():
    """torch's counter with a head (Linear h->c) after the first hidden layer's ReLU of MLP
    d-h-h-c: fc1's (K + 1) perturbed forwards run the head only, not fc2 and fc3; the head's own
    estimate costs its forward, its K + 1 loss evaluations (no layer after it) and its local map."""
    b, d, h, c, k = 4, 10, 6, 3, 5
    model = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, c))
    heads = nn.ModuleDict({"1": nn.Sequential(nn.Linear(h, c))})
    batch = (torch.randn(b, d), torch.randint(0, c, (b,)))
    counter = FlopCounterMode(display=False)
    with counter:
        activity_gradient(model, batch, k=k, sigma=1e-3, scheme="forward", seed=0, heads=heads)
    forward = 2 * b * (d * h + h * h + h * c)
    suffix = (k + 1) * 2 * b * (h * c + h * c)  # fc1: the head; fc2: fc3
    head = 2 * b * h * c  # the head's clean forward; its suffix is the loss alone
    local = 2 * b * (h * d + h * h + c * h + c * h)  # fc1, fc2, fc3, the head
    accumulate = 2 * b * k * (h + h + c + c)
    assert counter.get_total_flops() == forward + suffix + head + local + accumulate


def test_bad_head_keys_are_refused():
    model, batch = _cnn(), _batch((1, 5, 5))
    for key in ("5", "x", "-1"):
        head = nn.ModuleDict({key: nn.Sequential(nn.Flatten(), nn.Linear(48, 3))}).double()
        with pytest.raises(ConfigError, match="local head"):
            activity_gradient(model, batch, k=2, sigma=1e-4, scheme="forward", seed=0, heads=head)


def _two_conv_block() -> tuple[nn.Sequential, nn.ModuleDict]:
    """A network whose first block (flat layers 0-3) has two convs, closed by a head of 2 loss
    groups over its 4 channels (2 classifiers of 3 classes)."""
    model = _fill(
        nn.Sequential(
            nn.Conv2d(1, 2, 3, padding=1),
            nn.Hardswish(),
            nn.Conv2d(2, 4, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(4, 4, 3, stride=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(4 * 2 * 2, 3),
        ),
        4,
        scale=0.5,
    ).double()
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2 * 3))
    return model, nn.ModuleDict({"3": _fill(head, 6)}).double()


def test_group_losses_converge_to_the_group_objectives_gradient():
    """With 2 loss groups (Ren et al.'s channel-group-wise local losses) the estimate of every
    parameter, the head's 2 classifiers included, converges to autograd's gradient of the group
    objective (each classifier's loss moved by its own group's features only): error like
    1/sqrt(K), cosine above 0.98 at K = 4096 and above 0.99 parameter by parameter (without the
    stop-gradient between groups the block's convs would have cosine 0.73 and 0.64 with it); it
    is not the one-loss head's estimate."""
    model, heads = _two_conv_block()
    batch = _batch((1, 5, 5))
    exact = local_objective_gradient(model, heads, batch, groups=2)
    true = _flat(exact)

    def run(k: int, seed: int, groups: int = 2) -> dict[str, torch.Tensor]:
        return activity_gradient(
            model, batch, k=k, sigma=1e-5, scheme="central", seed=seed, heads=heads,
            head_groups=groups,
        )  # fmt: skip

    est = _converges(run, true)
    for name in exact:  # each one: the block's convs follow their groups' own paths only
        cos = F.cosine_similarity(est[name].reshape(-1), exact[name].reshape(-1), dim=0)
        assert float(cos) > 0.99, name
    one_loss = _flat(run(4096, 9, groups=1))  # the same head read as one 6-class classifier
    assert float(F.cosine_similarity(one_loss, true, dim=0)) < 0.98


def _pooled_block(norm: bool) -> nn.Sequential:
    """A block of two convs, [GroupNorm(2)], ReLU and 2x2 max pooling on 8x8 inputs (flat layers
    0-4 or 0-5: a 4x4 output of 4 channels), then a strided conv and a classifier."""
    block = [nn.Conv2d(1, 2, 3, padding=1), nn.Hardswish(), nn.Conv2d(2, 4, 3, padding=1)]
    block += [nn.GroupNorm(2, 4, affine=False)] if norm else []
    tail = [nn.Conv2d(4, 4, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(4, 3)]
    return _fill(nn.Sequential(*block, nn.ReLU(), nn.MaxPool2d(2), *tail), 9, scale=0.5).double()


def _global_head(end: int, groups: int) -> nn.ModuleDict:
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, groups * 3))
    return nn.ModuleDict({str(end): _fill(head, 6)}).double()


@pytest.mark.parametrize(("norm", "groups", "patches"), [(False, 2, 2), (True, 4, 2), (True, 1, 4)])
def test_patch_losses_converge_to_the_cell_objectives_gradient(norm, groups, patches):
    """Ren et al.'s patch-wise losses on a 2x2-pooled block's 4x4 output, alone or with channel
    groups, with or without a GroupNorm: every parameter's estimate converges to autograd's
    gradient of the cell objective (fedge.estimators.local_objective), the block's convs included.
    Without a norm that objective is the group objective (patches change the variance only);
    under GroupNorm its paths between patches are stopped, so the last conv's gradient differs."""
    model, batch = _pooled_block(norm), _batch((1, 8, 8))
    end = 5 if norm else 4
    heads = _global_head(end, groups)
    exact = local_objective_gradient(model, heads, batch, groups=groups, patches=patches)

    def run(k: int, seed: int) -> dict[str, torch.Tensor]:
        return activity_gradient(
            model, batch, k=k, sigma=1e-5, scheme="central", seed=seed, heads=heads,
            head_groups=groups, head_patches=patches,
        )  # fmt: skip

    est = _converges(run, _flat(exact))
    for name in exact:
        cos = F.cosine_similarity(est[name].reshape(-1), exact[name].reshape(-1), dim=0)
        assert float(cos) > 0.98, name
    unpatched = local_objective_gradient(model, heads, batch, groups=groups)
    if not norm:  # no norm couples the patches: the patch shares add up to the group objective
        assert all(torch.allclose(exact[n], unpatched[n], atol=1e-12) for n in exact)
    else:  # the norm's paths between patches are stopped: the block's last conv differs
        assert not torch.allclose(exact["2.weight"], unpatched["2.weight"], atol=1e-6)


@pytest.mark.parametrize(("groups", "patches"), [(2, 1), (2, 2)])
def test_own_cell_weighting_is_the_same_gradient_with_less_noise(groups, patches):
    """On the block's last conv, weighting each element by its own cell's loss difference (what
    the estimator does there) and by the cells' mean (what it does for earlier layers, and for
    the last conv of a norm-free block an unbiased estimate of the same gradient) agree in
    expectation; the own-cell weighting errs less, draw by draw."""
    model, batch = _pooled_block(norm=False), _batch((1, 8, 8))
    heads = _global_head(4, groups)
    true = local_objective_gradient(model, heads, batch, groups=groups, patches=patches)
    layers, (x, y) = list(model), batch
    with torch.no_grad():
        h = layers[1](layers[0](x))
        z = layers[2](h)
        score = _cell_head(layers[3:5], list(heads["4"]), y, per_example_cross_entropy, groups,
                           patches, weigh_cells=True)  # fmt: skip
        losses, weigh = score(z)
        assert weigh is not None
        errs: dict[str, list[float]] = {"own": [], "mean": []}
        for seed in range(6):
            for label, weighting in (("own", weigh), ("mean", None)):
                g_z = _activity_grad(z, losses, weighting, 32, 1e-5, "central", seed, ("t",), None)
                g_z = g_z / (2 * 32 * 1e-5 * z.shape[0])
                est, _ = _local_map(layers[2], h, g_z)
                errs[label].append(float((est - true["2.weight"]).norm() / true["2.weight"].norm()))
    assert all(a < b for a, b in zip(errs["own"], errs["mean"], strict=True)), errs


def test_group_losses_stop_the_paths_a_norm_opens_between_groups():
    """A block conv -> GroupNorm(2 groups) -> Hardswish closed by a head of 4 loss groups: the
    conv's estimate converges to the gradient with the paths between loss groups through the
    norm's shared statistics stopped (what weighting a channel by its own group's loss gives);
    with 2 loss groups, the norm's own, there is no such path and the same oracle holds."""
    model = _fill(
        nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.GroupNorm(2, 4, affine=False),
            nn.Hardswish(),
            nn.Flatten(),
            nn.Linear(4 * 5 * 5, 3),
        ),
        7,
        scale=0.5,
    ).double()
    batch = _batch((1, 5, 5))
    for groups in (4, 2):
        head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, groups * 3))
        heads = nn.ModuleDict({"2": _fill(head, 8)}).double()
        exact = local_objective_gradient(model, heads, batch, groups=groups)
        est = activity_gradient(model, batch, k=4096, sigma=1e-5, scheme="central", seed=2,
                                heads=heads, head_groups=groups)  # fmt: skip
        for name in ("0.weight", "0.bias"):
            cos = F.cosine_similarity(est[name].reshape(-1), exact[name].reshape(-1), dim=0)
            assert float(cos) > 0.99, (groups, name)


def test_patch_heads_that_cannot_serve_are_refused():
    model, batch = _pooled_block(norm=False), _batch((1, 8, 8))
    with pytest.raises(ConfigError, match="equal patches, but it is \\(4, 4, 4\\)"):
        activity_gradient(model, batch, k=2, sigma=1e-4, scheme="forward", seed=0,
                          heads=_global_head(4, 1), head_patches=3)  # fmt: skip
    pooled2 = nn.ModuleDict(
        {"4": nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 3))}
    ).double()
    with pytest.raises(ConfigError, match="pools globally"):
        activity_gradient(model, batch, k=2, sigma=1e-4, scheme="forward", seed=0,
                          heads=pooled2, head_patches=2)  # fmt: skip


def test_group_heads_that_cannot_serve_are_refused():
    model, heads = _two_conv_block()
    batch = _batch((1, 5, 5))
    with pytest.raises(ConfigError, match="multiple of 4 outputs"):
        activity_gradient(model, batch, k=2, sigma=1e-4, scheme="forward", seed=0, heads=heads,
                          head_groups=4)  # fmt: skip
    two = nn.ModuleDict({"3": nn.Sequential(nn.Flatten(), nn.Linear(100, 6), nn.Linear(6, 6))})
    with pytest.raises(ConfigError, match="must be its last"):
        activity_gradient(model, batch, k=2, sigma=1e-4, scheme="forward", seed=0,
                          heads=two.double(), head_groups=2)  # fmt: skip
