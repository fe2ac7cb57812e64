"""The local heads' objective (fedge.estimators.local_objective) against oracles written another
way: one loss a head, the block losses written out with the stop-gradients as detaches; with
loss groups and patches, vector-Jacobian products whose cotangents are masked to each cell (the
pooled patches' for every block layer, then the last conv's output for that conv); and the
activity estimate converging to it on a small LeNet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedge.estimators.activity import HEAD_PREFIX, activity_gradient, activity_layers
from fedge.estimators.local_objective import local_objective_gradient
from fedge.methods.baffle.heads import block_ends, build_heads
from fedge.models import build_model


def _filled(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return module.double()


def _net(norm: bool) -> nn.Sequential:
    """conv, Hardswish, conv, [GroupNorm(2)], ReLU, 2x2 max pool (the block, flat layers 0-4 or
    0-5: a 4x4 output of 4 channels from 8x8 inputs), then a strided conv and a classifier."""
    block = [nn.Conv2d(1, 2, 3, padding=1), nn.Hardswish(), nn.Conv2d(2, 4, 3, padding=1)]
    block += [nn.GroupNorm(2, 4, affine=False)] if norm else []
    block += [nn.ReLU(), nn.MaxPool2d(2)]
    tail = [nn.Conv2d(4, 4, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(4, 3)]
    return _filled(nn.Sequential(*block, *tail), 1)  # type: ignore[return-value]


def _head(end: int, groups: int) -> nn.ModuleDict:
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, groups * 3))
    return nn.ModuleDict({str(end): _filled(head, 2)})


def _batch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 1, 8, 8, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (8,), generator=g)


def _masked_vjps(model: nn.Sequential, heads: nn.ModuleDict, batch, groups: int, patches: int):
    """The oracle by masked cotangents: for each cell (g, p), dℓ_g/df̄ (ℓ_g the classifier's
    loss at the pooled features f̄, over G) goes to group g's channels of patch p of the P x P
    pooled output, over P², and is pulled back through the block to its parameters, except the
    last conv's, which get the cotangent at its output z masked to g's channels and to the
    positions of z that 2x2 pooling sends into patch p; each classifier's gradient is its own
    loss's, once; the tail after a detach."""
    (key,) = heads.keys()
    end, layers, (x, y) = int(key), list(model), batch
    last = 2  # the block's last conv in _net
    pool, flatten, linear = heads[key]
    z = layers[last](layers[1](layers[0](x)))
    out = z
    for m in layers[last + 1 : end + 1]:
        out = m(out)
    q = F.adaptive_avg_pool2d(out, patches)  # (B, C, P, P)
    mean = flatten(pool(out))
    tail = out.detach()
    for m in layers[end + 1 :]:
        tail = m(tail)
    block = [p for m in layers[:last] for p in m.parameters()]
    own = list(layers[last].parameters())
    rest = [p for m in layers[end + 1 :] for p in m.parameters()]
    grads = dict.fromkeys([*block, *own, linear.weight, linear.bias], 0.0)
    grads.update(zip(rest, torch.autograd.grad(F.cross_entropy(tail, y), rest), strict=True))
    per, channels, side = linear.out_features // groups, z.shape[1], z.shape[2] // patches
    for g in range(groups):
        rows = slice(g * per, (g + 1) * per)
        loss = F.cross_entropy(mean @ linear.weight[rows].T + linear.bias[rows], y) / groups
        head = (linear.weight, linear.bias)
        for p, d in zip(head, torch.autograd.grad(loss, head, retain_graph=True), strict=True):
            grads[p] = grads[p] + d
        dmean = torch.autograd.grad(loss, mean, retain_graph=True)[0]
        chan = slice(g * channels // groups, (g + 1) * channels // groups)
        for r in range(patches):
            for c in range(patches):
                dq = torch.zeros_like(q)
                dq[:, chan, r, c] = dmean[:, chan] / patches**2
                pulled = torch.autograd.grad(q, [*block, z], grad_outputs=dq, retain_graph=True)
                for p, d in zip(block, pulled[:-1], strict=True):
                    grads[p] = grads[p] + d
                dz = torch.zeros_like(z)
                cells = (slice(None), chan, slice(r * side, (r + 1) * side))
                dz[(*cells, slice(c * side, (c + 1) * side))] = 1
                dz = dz * pulled[-1]
                for p, d in zip(own, torch.autograd.grad(z, own, dz, retain_graph=True)):
                    grads[p] = grads[p] + d
    names = {id(p): n for n, p in model.named_parameters()}
    names |= {id(p): HEAD_PREFIX + n for n, p in heads.named_parameters()}
    return {names[id(p)]: d for p, d in grads.items()}


def test_one_loss_a_head_is_the_block_losses_written_out():
    model, batch = _net(norm=False), _batch()
    heads = _head(4, 1)
    x, y = batch
    h = x
    for m in list(model)[:5]:
        h = m(h)
    tail = h.detach()
    for m in list(model)[5:]:
        tail = m(tail)
    loss = F.cross_entropy(heads["4"](h), y) + F.cross_entropy(tail, y)
    params = [*model.parameters(), *heads.parameters()]
    want = torch.autograd.grad(loss, params)
    got = local_objective_gradient(model, heads, batch)
    assert list(got) == [n for n, _ in model.named_parameters()] + [
        HEAD_PREFIX + n for n, _ in heads.named_parameters()
    ]
    for g, w in zip(got.values(), want, strict=True):
        assert torch.allclose(g, w, atol=1e-12)


@pytest.mark.parametrize(
    ("norm", "groups", "patches"),
    [(False, 2, 1), (True, 2, 1), (True, 4, 1), (False, 1, 2), (True, 2, 2), (True, 4, 4)],
)
def test_cells_are_the_masked_vector_jacobian_products(norm, groups, patches):
    """With 2 or 4 loss groups and 1, 2x2 or 4x4 patches, without a norm and under GroupNorm(2)
    (whose statistics join channels of different loss groups at 4, and every patch): the same
    gradient as the masked pull-backs."""
    model, batch = _net(norm), _batch()
    heads = _head(5 if norm else 4, groups)
    want = _masked_vjps(model, heads, batch, groups, patches)
    got = local_objective_gradient(model, heads, batch, groups=groups, patches=patches)
    assert set(got) == set(want)
    for name, w in want.items():
        assert torch.allclose(got[name], w, atol=1e-12), name


def test_params_selects_the_model_parameters_returned():
    model, batch = _net(norm=False), _batch()
    got = local_objective_gradient(model, _head(4, 2), batch, groups=2, params=["0.weight"])
    assert list(got) == ["0.weight", f"{HEAD_PREFIX}4.2.weight", f"{HEAD_PREFIX}4.2.bias"]


def test_the_group_estimate_converges_to_it_on_a_small_lenet():
    """BAFFLE's LeNet (GroupNorm(2) over conv1's 16 channels) with a head of 16 loss groups after
    conv1's block: the activity estimate at large K agrees with the objective parameter by
    parameter (without the stops between groups conv1's would be far off)."""
    net = build_model("lenet", input_shape=(1, 12, 12), num_classes=10, seed=0).double().eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1, 12, 12, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (6,), generator=g)
    names = [n for n, _ in net.named_parameters()]
    ends = block_ends(net, ["features.conv1"], activity_layers(net, names))
    heads = build_heads(
        net, ends, input_shape=(1, 12, 12), num_classes=10, pool=1, seed=0, groups=16
    ).double()
    exact = local_objective_gradient(net, heads, (x, y), groups=16)
    est = activity_gradient(
        net, (x, y), k=3000, sigma=1e-6, scheme="central", seed=1, heads=heads, head_groups=16
    )
    for name, e in exact.items():
        cos = F.cosine_similarity(est[name].reshape(-1), e.reshape(-1), dim=0)
        assert float(cos) > 0.95, name
