"""NTK saliency (seed 004, Eq. 13-15) against closed forms and finite-difference oracles;
the data-based zeroth-order protocol against the exact gradient; SNIP, magnitude, random."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedge.core import portable
from fedge.core.errors import ConfigError
from fedge.core.rng import PortableGenerator
from fedge.estimators import ZerothOrderSpec, combine_loss_differences, estimate_gradient
from fedge.models import build_model
from fedge.pruning import (
    dense_masks,
    gaussian_inputs,
    magnitude_saliency,
    ntk_forward_statistic,
    ntk_saliency,
    ntk_saliency_from_differences,
    ntk_saliency_zeroth_order,
    ntk_statistic_differences,
    prunable_parameters,
    random_saliency,
    snip_saliency,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mlp(dtype: torch.dtype = torch.float32) -> nn.Module:
    """A smooth (Hardswish, C^1) 4 -> 6 -> 3 MLP: 42 prunable weights."""
    net = build_model(
        "mlp", input_shape=(1, 2, 2), num_classes=3, hidden=(6,), activation="hardswish", seed=0
    )
    return net.to(dtype)


def _some_pruned(net: nn.Module) -> dict[str, torch.Tensor]:
    masks = dense_masks(net)
    g = _gen(5)
    return {n: torch.rand(m.shape, generator=g) > 0.3 for n, m in masks.items()}


def _noise(net: nn.Module, eps: float, samples: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """ΔW draws replicated from the documented contract (sample-major, prunable order)."""
    g, params = _gen(seed), dict(net.named_parameters())
    return [
        {
            n: torch.randn(params[n].shape, generator=g).to(params[n].dtype) * math.sqrt(eps)
            for n in prunable_parameters(net)
        }
        for _ in range(samples)
    ]


def _oracle_statistic(net: nn.Module, m: dict, x: torch.Tensor, noise: list[dict]) -> torch.Tensor:
    """I(m) by plain forwards of copies whose weights are set to W0 ⊙ m and (W0 + ΔW) ⊙ m."""
    w0 = {n: p.detach().clone() for n, p in net.named_parameters()}
    clean, pert = copy.deepcopy(net).eval(), copy.deepcopy(net).eval()
    total = torch.zeros((), dtype=x.dtype)
    with torch.no_grad():
        for n, p in clean.named_parameters():
            if n in m:
                p.copy_(w0[n] * m[n])
        fa = clean(x)
        for dw in noise:
            for n, p in pert.named_parameters():
                if n in m:
                    p.copy_((w0[n] + dw[n]) * m[n])
            total += ((fa - pert(x)) ** 2).sum(1).mean()
    return total / len(noise)


def test_statistic_closed_form_for_a_linear_model() -> None:
    """f(x) = Wx + b: f(W⊙m) − f((W+ΔW)⊙m) = −(ΔW⊙m)x, so E‖·‖² = ε Σ_{o,j} m_oj x_j² (mean over x)."""
    net = build_model("logreg", input_shape=(1, 1, 5), num_classes=3, seed=0)
    x = torch.randn(4, 1, 1, 5, generator=_gen(1))
    w = "classifier.out.weight"
    m = {w: torch.rand(3, 5, generator=_gen(2)) > 0.4}
    eps = 1e-4
    expected = eps * (m[w].double() * x.reshape(4, 1, 5).double() ** 2).sum((1, 2)).mean()
    stat = ntk_forward_statistic(net, m, x, eps=eps, samples=4000, generator=_gen(3))
    assert stat.num_inputs == 4
    assert stat.value == pytest.approx(float(expected), rel=0.04)
    # dense mask: ε · out_dim · mean Σ_j x_j²
    dense = ntk_forward_statistic(net, None, x, eps=eps, samples=4000, generator=_gen(3))
    assert dense.value == pytest.approx(eps * 3 * float((x**2).sum((1, 2, 3)).mean()), rel=0.04)


def test_statistic_equals_direct_computation_with_the_same_draws() -> None:
    net = _mlp()
    masks = _some_pruned(net)
    x = gaussian_inputs((1, 2, 2), 7, generator=_gen(1))
    stat = ntk_forward_statistic(net, masks, x, eps=1e-3, samples=3, generator=_gen(9))
    oracle = _oracle_statistic(net, masks, x, _noise(net, 1e-3, 3, 9))
    assert stat.value == pytest.approx(float(oracle), rel=1e-5)


def _portable_noise(net: nn.Module, eps: float, samples: int, seed: int) -> list[dict]:
    """The contract's ΔW draws from PortableGenerator(seed, "ntk"): call i reads the key
    (seed, "ntk", "seq", i); the inputs, if drawn first, take call 0."""
    params, calls = dict(net.named_parameters()), iter(range(1, 10_000))
    out = []
    for _ in range(samples):
        draw = {}
        for n in prunable_parameters(net):
            key = portable.stream_key(seed, "ntk", "seq", next(calls))
            draw[n] = portable.normal(key, params[n].shape) * math.sqrt(eps)
        out.append(draw)
    return out


def test_portable_generator_draws_inputs_then_noise_in_the_contracts_order() -> None:
    net = _mlp()
    masks = _some_pruned(net)
    gen = PortableGenerator(4, "ntk")
    x = gaussian_inputs((1, 2, 2), 7, generator=gen)
    assert torch.equal(x, portable.normal(portable.stream_key(4, "ntk", "seq", 0), (7, 1, 2, 2)))
    stat = ntk_forward_statistic(net, masks, x, eps=1e-3, samples=3, generator=gen)
    oracle = _oracle_statistic(net, masks, x, _portable_noise(net, 1e-3, 3, 4))
    assert stat.value == pytest.approx(float(oracle), rel=1e-5)
    torch_stat = ntk_forward_statistic(net, masks, x, eps=1e-3, samples=3, generator=_gen(4))
    assert stat.value != torch_stat.value
    # the server's scores from the same generator state: the same ΔW (a fresh generator whose
    # first call is spent on the inputs)
    again = PortableGenerator(4, "ntk")
    gaussian_inputs((1, 2, 2), 7, generator=again)
    net64 = _mlp(torch.float64)
    scores = ntk_saliency(net64, masks, x.double(), eps=1e-3, samples=3, generator=again)
    exact = _exact_gradient(net64, masks, x, _portable_noise(net, 1e-3, 3, 4))
    torch.testing.assert_close(_live(scores, masks), exact.abs(), rtol=1e-4, atol=1e-9)


def test_portable_zeroth_order_saliency_rebuilds_the_devices_directions() -> None:
    # NTK-Ori with portable ΔW and directions: the server's one-call estimate is the devices'
    # differences rebuilt with the same spec; torch directions give other differences.
    net = _mlp()
    masks = _some_pruned(net)
    x = gaussian_inputs((1, 2, 2), 5, generator=PortableGenerator(1, "x"))
    spec = ZerothOrderSpec(k=40, sigma=1e-2, scheme="central", draws="portable")
    kw = dict(eps=1e-3, samples=2, seed=3)
    diffs = ntk_statistic_differences(
        net, masks, x, spec, generator=PortableGenerator(7, "ntk"), **kw
    )
    both = ntk_saliency_zeroth_order(
        net, masks, x, spec, generator=PortableGenerator(7, "ntk"), **kw
    )
    shapes = {n: m.shape for n, m in masks.items()}
    g = estimate_gradient(shapes, diffs, spec, seed=3, masks=masks)
    for n in masks:
        torch.testing.assert_close(both[n], g[n].abs() * masks[n])
    torch_spec = dataclasses.replace(spec, draws="torch")
    other = ntk_statistic_differences(
        net, masks, x, torch_spec, generator=PortableGenerator(7, "ntk"), **kw
    )
    assert not torch.allclose(diffs, other)


def test_statistic_is_forward_only_and_leaves_the_model_alone() -> None:
    net = build_model("lenet", input_shape=(1, 8, 8), num_classes=10, seed=0)
    net.train()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(1) or t, lambda t: t):
        ntk_forward_statistic(net, None, torch.randn(2, 1, 8, 8), samples=2, generator=_gen(0))
        spec = ZerothOrderSpec(k=2, sigma=1e-2, scheme="central")
        ntk_statistic_differences(
            net, None, torch.randn(2, 1, 8, 8), spec, generator=_gen(0), seed=0
        )
    assert saved == []  # nothing kept for a backward pass: no autograd memory on the device
    assert all(p.grad is None for p in net.parameters())
    assert net.training and all(torch.equal(v, state[k]) for k, v in net.state_dict().items())


@pytest.mark.parametrize("pruned", [False, True])
def test_ntk_saliency_equals_finite_differences_of_I_in_m(pruned: bool) -> None:
    """S_j = |∂I/∂m_j| (Eq. 14) with the same ΔW draws, checked coordinate by coordinate."""
    net = _mlp(torch.float64)
    masks = _some_pruned(net) if pruned else dense_masks(net)
    x = gaussian_inputs((1, 2, 2), 5, generator=_gen(1)).double()
    eps, samples, h = 1e-2, 2, 1e-6
    scores = ntk_saliency(net, masks, x, eps=eps, samples=samples, generator=_gen(4))
    noise = _noise(net, eps, samples, 4)
    m = {n: v.double() for n, v in masks.items()}
    for name, mask in masks.items():
        assert scores[name].shape == mask.shape and scores[name].dtype == torch.float64
        for j in range(mask.numel()):
            up = {n: v.clone() for n, v in m.items()}
            down = {n: v.clone() for n, v in m.items()}
            up[name].view(-1)[j] += h
            down[name].view(-1)[j] -= h
            fd = (_oracle_statistic(net, up, x, noise) - _oracle_statistic(net, down, x, noise)) / (
                2 * h
            )
            got = float(scores[name].view(-1)[j])
            if mask.view(-1)[j]:
                assert got == pytest.approx(abs(float(fd)), rel=1e-5, abs=1e-12)
            else:
                assert got == 0.0  # pruned coordinates score exactly 0
    assert any(float(s.max()) > 0 for s in scores.values())


def test_ntk_saliency_of_a_linear_model_is_the_trace_derivative() -> None:
    """For f = Wx, I = ‖(ΔW⊙m)x‖², so ∂I/∂m_oj = 2 m_oj ΔW_oj x_j (ΔW x)_o: nonzero, unlike the
    ∂I/∂W0 ⊙ W0 reading with ΔW ungated (which is 0 for every weight of a linear model)."""
    net = build_model("logreg", input_shape=(1, 1, 4), num_classes=2, seed=0)
    x = torch.randn(1, 1, 1, 4, generator=_gen(1))
    s = ntk_saliency(net, None, x, eps=1e-2, samples=1, generator=_gen(2))["classifier.out.weight"]
    dw = _noise(net, 1e-2, 1, 2)[0]["classifier.out.weight"]
    xv = x.reshape(4)
    expected = (2 * dw * xv * (dw @ xv)[:, None]).abs()
    torch.testing.assert_close(s, expected, rtol=1e-4, atol=1e-10)


def _exact_gradient(
    net: nn.Module, masks: dict, x: torch.Tensor, noise: list[dict]
) -> torch.Tensor:
    """Signed ∂I/∂m on the live coordinates, by central differences of the float64 oracle."""
    net64 = copy.deepcopy(net).double()
    x64, noise64 = x.double(), [{n: v.double() for n, v in d.items()} for d in noise]
    m = {n: v.double() for n, v in masks.items()}
    out = []
    for name, mask in masks.items():
        for j in torch.nonzero(mask.reshape(-1)).reshape(-1).tolist():
            up = {n: v.clone() for n, v in m.items()}
            down = {n: v.clone() for n, v in m.items()}
            up[name].view(-1)[j] += 1e-6
            down[name].view(-1)[j] -= 1e-6
            out.append(
                (
                    _oracle_statistic(net64, up, x64, noise64)
                    - _oracle_statistic(net64, down, x64, noise64)
                )
                / 2e-6
            )
    return torch.stack(out)


def _live(g: dict[str, torch.Tensor], masks: dict) -> torch.Tensor:
    return torch.cat([g[n].reshape(-1)[masks[n].reshape(-1)] for n in masks]).double()


def test_zeroth_order_saliency_converges_to_the_exact_gradient() -> None:
    """Devices send K differences of I (forwards only); the server's Stein estimate of ∂I/∂m
    aligns with the exact gradient, better with more K. Fixed seeds: deterministic."""
    net = _mlp()
    masks = _some_pruned(net)  # 30 live coordinates or so
    x = gaussian_inputs((1, 2, 2), 6, generator=_gen(1))
    eps, samples, sigma = 1e-3, 2, 1e-2
    exact = _exact_gradient(net, masks, x, _noise(net, eps, samples, 7))
    shapes = {n: m.shape for n, m in masks.items()}

    def cosine(k: int, seed: int) -> float:
        spec = ZerothOrderSpec(k=k, sigma=sigma, scheme="central")
        diffs = ntk_statistic_differences(
            net, masks, x, spec, eps=eps, samples=samples, generator=_gen(7), seed=seed
        )
        assert diffs.shape == (k,) and diffs.dtype == torch.float32  # the K scalars sent up
        est = _live(estimate_gradient(shapes, diffs, spec, seed=seed, masks=masks), masks)
        return float(F.cosine_similarity(est, exact, dim=0))

    few, many = cosine(20, 0), cosine(1500, 0)
    assert many > 0.95
    assert many > few

    # the one-call form is |Stein estimate| ⊙ m, zero at pruned coordinates
    spec = ZerothOrderSpec(k=50, sigma=sigma, scheme="central")
    diffs = ntk_statistic_differences(
        net, masks, x, spec, eps=eps, samples=samples, generator=_gen(7), seed=3
    )
    both = ntk_saliency_zeroth_order(
        net, masks, x, spec, eps=eps, samples=samples, generator=_gen(7), seed=3
    )
    g = estimate_gradient(shapes, diffs, sigma=sigma, seed=3, scheme="central", masks=masks)
    for n in masks:
        torch.testing.assert_close(both[n], g[n].abs() * masks[n])


def test_zeroth_order_combines_devices_like_eq_15() -> None:
    """I = 1/N Σ_i N_i I_i, so the server combines devices' differences with weights N_i."""
    net = _mlp()
    masks = dense_masks(net)
    xs = [gaussian_inputs((1, 2, 2), n, generator=_gen(10 + n)) for n in (2, 6)]
    spec = ZerothOrderSpec(k=30, sigma=1e-2, scheme="central")
    kw = dict(eps=1e-3, samples=1, seed=11)
    diffs = [ntk_statistic_differences(net, masks, x, spec, generator=_gen(0), **kw) for x in xs]
    combined = combine_loss_differences(diffs, [2, 6])
    scores = ntk_saliency_from_differences(net, masks, combined, spec, seed=11)
    pooled = ntk_statistic_differences(net, masks, torch.cat(xs), spec, generator=_gen(0), **kw)
    torch.testing.assert_close(combined, pooled, rtol=1e-4, atol=1e-9)
    assert set(scores) == set(masks)


def test_snip_equals_gradient_times_weight_on_the_masked_model() -> None:
    net = _mlp()
    masks = _some_pruned(net)
    x, y = torch.randn(8, 1, 2, 2, generator=_gen(1)), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    scores = snip_saliency(net, masks, (x, y))
    oracle = copy.deepcopy(net).eval()
    with torch.no_grad():
        for n, p in oracle.named_parameters():
            if n in masks:
                p.mul_(masks[n])
    F.cross_entropy(oracle(x), y).backward()
    params = dict(net.named_parameters())
    for n, p in oracle.named_parameters():
        if n in masks:
            expected = (p.grad * params[n].detach()).abs() * masks[n]  # |∂L/∂W ⊙ W0| at W0 ⊙ m
            torch.testing.assert_close(scores[n], expected)
    with pytest.raises(ConfigError, match="labelled batch"):
        snip_saliency(net, masks, x)  # type: ignore[arg-type]


def test_magnitude_and_random_scores() -> None:
    net = _mlp()
    masks = _some_pruned(net)
    params = dict(net.named_parameters())
    mag = magnitude_saliency(net, masks)
    r1, r2 = (
        random_saliency(net, masks, generator=_gen(0)),
        random_saliency(net, masks, generator=_gen(0)),
    )
    for n, m in masks.items():
        torch.testing.assert_close(mag[n], params[n].detach().abs() * m)
        assert torch.equal(r1[n], r2[n]) and bool((r1[n][~m] == 0).all())


def test_bad_arguments_are_named() -> None:
    net = _mlp()
    x = torch.randn(2, 1, 2, 2)
    with pytest.raises(ConfigError, match="eps"):
        ntk_saliency(net, None, x, eps=0.0, generator=_gen(0))
    with pytest.raises(ConfigError, match="samples"):
        ntk_forward_statistic(net, None, x, samples=0, generator=_gen(0))
    with pytest.raises(ConfigError, match="non-empty batch"):
        ntk_forward_statistic(net, None, x[:0], generator=_gen(0))
