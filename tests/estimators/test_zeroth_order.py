"""BAFFLE's Stein estimator against oracles: autograd, closed forms on linear and quadratic
losses, an independent float64 reference loop; unbiasedness, convergence, API."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedge.core.errors import ConfigError, DivergenceError, MessageError
from fedge.estimators import (
    PrecisionWarning,
    ZerothOrderWarning,
    backprop_gradient,
    combine_loss_differences,
    estimate_gradient,
    forward_budget,
    loss_differences,
    num_differences,
    zeroth_order_gradient,
)
from fedge.estimators.perturbation import standard_normal

SCHEMES = ["central", "forward"]


def _seeded(model: nn.Module, g: torch.Generator) -> nn.Module:
    """Overwrite every parameter from an explicit generator (no global RNG)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model


def _linear_problem(n: int = 12) -> tuple[nn.Module, tuple[torch.Tensor, ...], torch.Tensor]:
    """L(W) = W · mean(x): exactly linear in W, with gradient a = mean(x)."""
    g = torch.Generator().manual_seed(0)
    model = _seeded(nn.Linear(n, 1, bias=False).double(), g)
    x = torch.randn(16, n, generator=g, dtype=torch.float64) + 0.5
    return model, (x, torch.zeros(16)), x.mean(0)


def _mean_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return out.mean()


def _mlp_problem() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    model = _seeded(
        nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double(), g
    )  # n = 51
    x = torch.randn(32, 4, generator=g, dtype=torch.float64)
    return model, (x, torch.randint(0, 3, (32,), generator=g))


def _flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in d.values()])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_constants_exact_on_a_linear_loss(scheme: str) -> None:
    # On L = aᵀW both schemes give ĝ = (1/K) Σ_k z_k z_kᵀ a exactly (BAFFLE Eq. 13), for any σ.
    model, batch, a = _linear_problem()
    k, sigma = 20, 0.3
    diffs = loss_differences(model, _mean_loss, batch, k=k, sigma=sigma, seed=5, scheme=scheme)
    params = dict(model.named_parameters())
    got = estimate_gradient(params, diffs, sigma=sigma, seed=5, scheme=scheme)
    z = torch.stack([standard_normal(5, i, "weight", (1, 12)).reshape(-1) for i in range(k)])
    z = z.double()
    want = z.T @ (z @ a) / k
    torch.testing.assert_close(got["weight"].reshape(-1), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_unbiased_on_a_linear_loss(scheme: str) -> None:
    # Mean over seeds → a; relative error ≈ sqrt((n + 1) / (seeds · K)) ≈ 0.06 here, while a
    # wrong constant would be off by 0.5 (forward) or 1.0 (central).
    model, batch, a = _linear_problem()
    params = dict(model.named_parameters())
    total = torch.zeros(12, dtype=torch.float64)
    seeds = range(40)
    for s in seeds:
        kw = dict(sigma=1e-2, seed=s, scheme=scheme)
        d = loss_differences(model, _mean_loss, batch, k=100, mode="fast", **kw)
        total += estimate_gradient(params, d, **kw)["weight"].reshape(-1)
    err = float((total / len(seeds) - a).norm() / a.norm())
    assert err < 0.15


def test_mean_over_seeds_converges_to_autograd() -> None:
    model, batch = _mlp_problem()
    true = _flat(backprop_gradient(model, F.cross_entropy, batch))
    running, errs = torch.zeros_like(true), {}
    for s in range(64):
        g = zeroth_order_gradient(
            model, F.cross_entropy, batch, k=50, sigma=1e-5, seed=s, scheme="central", mode="fast"
        )
        running += _flat(g)
        if s + 1 in (4, 64):
            errs[s + 1] = float((running / (s + 1) - true).norm() / true.norm())
    # Expected ≈ sqrt(52 / (50 · seeds)): 0.51 at 4 seeds, 0.13 at 64.
    assert errs[64] < errs[4] / 2
    assert errs[64] < 0.3


def test_cosine_with_autograd_grows_like_sqrt_k_over_n() -> None:
    # E ĝ = g and E‖ĝ‖² = ‖g‖² (1 + (n + 1) / K), so cos ≈ (1 + (n + 1) / K)^(-1/2).
    model, batch = _mlp_problem()
    true = _flat(backprop_gradient(model, F.cross_entropy, batch))
    n = true.numel()
    cos = []
    for k in (8, 32, 128, 512):
        c = [
            float(
                F.cosine_similarity(
                    _flat(
                        zeroth_order_gradient(
                            model,
                            F.cross_entropy,
                            batch,
                            k=k,
                            sigma=1e-5,
                            seed=s,
                            scheme="forward",
                            mode="fast",
                            chunk=64,
                        )
                    ),
                    true,
                    dim=0,
                )
            )
            for s in range(4)
        ]
        cos.append(sum(c) / len(c))
        assert abs(cos[-1] - (1 + (n + 1) / k) ** -0.5) < 0.15
    assert cos == sorted(cos)


# --- independent oracles ----------------------------------------------------------------
# The perturbation stream z_{k,name} is the documented contract of fedge.estimators.perturbation
# (tested on its own in test_zo_perturbation.py); everything else below (perturbing the
# weights, the forwards, the differences, the constants of Eq. 6) is written here from the
# paper, in float64, without the estimator's code.


def _z(seed: int, k: int, name: str, shape: torch.Size) -> torch.Tensor:
    return standard_normal(seed, k, name, shape).double()


def _reference_loss_differences(
    model: nn.Module,
    loss_fn,
    batch,
    *,
    k: int,
    sigma: float,
    seed: int,
    scheme: str,
    params: list[str] | None = None,
    masks: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """BAFFLE Algorithm 1 lines 11-12 as a plain loop: ΔL_k = L(W + δ_k) − L(W ∓ ...)."""
    base = {n: p.detach().double() for n, p in model.named_parameters()}
    names = params if params is not None else list(base)
    masks = masks or {}
    x, y = batch

    def loss_at(sign: float, kk: int) -> float:
        weights = dict(base)
        for n in names:
            delta = sigma * _z(seed, kk, n, base[n].shape)
            if n in masks:
                delta = delta * masks[n].double()
            weights[n] = base[n] + sign * delta
        with torch.no_grad():
            out = torch.func.functional_call(model, weights, (x.double(),))
        return float(loss_fn(out, y))

    plain = loss_at(0.0, 0)
    diffs = []
    for kk in range(k):
        minus = loss_at(-1.0, kk) if scheme == "central" else plain
        diffs.append(loss_at(1.0, kk) - minus)
    return torch.tensor(diffs, dtype=torch.float64)


def _reference_estimate(
    shapes: dict[str, torch.Size],
    diffs: torch.Tensor,
    *,
    sigma: float,
    seed: int,
    scheme: str,
    masks: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """BAFFLE Eq. (6): ĝ = 1/(c·K·σ²) Σ_k ΔL_k δ_k, c = 2 (central) or 1 (forward)."""
    c = 2.0 if scheme == "central" else 1.0
    k = diffs.numel()
    out = {}
    for n, shape in shapes.items():
        acc = torch.zeros(shape, dtype=torch.float64)
        for kk in range(k):
            delta = sigma * _z(seed, kk, n, shape)
            if masks and n in masks:
                delta = delta * masks[n].double()
            acc += float(diffs[kk]) * delta
        out[n] = acc / (c * k * sigma**2)
    return out


@pytest.mark.parametrize("mode", ["lean", "fast"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_loss_differences_equal_a_float64_reference_loop(scheme: str, mode: str) -> None:
    model, batch = _mlp_problem()
    mask = torch.rand(6, 4, generator=torch.Generator().manual_seed(4)) > 0.5
    kw = dict(
        k=7,
        sigma=1e-3,
        seed=13,
        scheme=scheme,
        params=["0.weight", "2.bias"],
        masks={"0.weight": mask},
    )
    got = loss_differences(model, F.cross_entropy, batch, mode=mode, **kw)
    want = _reference_loss_differences(model, F.cross_entropy, batch, **kw)
    assert got.dtype == torch.float32 and got.shape == (7,)
    # float64 forwards on both sides; the only rounding is the float32 of the returned ΔL
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-12)
    assert float(want.abs().min()) > 1e-6  # the differences are not trivially zero


@pytest.mark.parametrize("scheme", SCHEMES)
def test_estimate_gradient_equals_the_reference_sum(scheme: str) -> None:
    shapes = {"a.weight": torch.Size([3, 5]), "b": torch.Size([4])}
    diffs = torch.randn(9, generator=torch.Generator().manual_seed(2))
    mask = torch.rand(3, 5, generator=torch.Generator().manual_seed(3)) > 0.4
    kw = dict(sigma=1e-2, seed=21, scheme=scheme, masks={"a.weight": mask})
    got = estimate_gradient(shapes, diffs, **kw)
    want = _reference_estimate(shapes, diffs.double(), **kw)
    for n in shapes:
        torch.testing.assert_close(got[n].double(), want[n], rtol=1e-5, atol=1e-9)
    assert bool((got["a.weight"][~mask] == 0).all())


def _quadratic_problem(
    n: int = 10,
) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
    """L(W) = ½·mean_i (x_iᵀW − y_i)²: gradient Xᵀ(XW − y)/N and Hessian XᵀX/N in closed form."""
    g = torch.Generator().manual_seed(7)
    model = _seeded(nn.Linear(n, 1, bias=False).double(), g)
    x = torch.randn(24, n, generator=g, dtype=torch.float64)
    y = torch.randn(24, generator=g, dtype=torch.float64)
    w = model.weight.detach().reshape(-1)
    grad = x.T @ (x @ w - y) / x.shape[0]
    hess = x.T @ x / x.shape[0]
    return model, (x, y), grad, hess


def _half_mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((out.reshape(-1) - y) ** 2).mean()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_closed_form_estimate_on_a_quadratic_loss(scheme: str) -> None:
    # Central: L(W+σz) − L(W−σz) = 2σ zᵀ∇L exactly, so ĝ = (1/K) Σ z zᵀ∇L for any σ.
    # Forward: L(W+σz) − L(W) = σ zᵀ∇L + ½σ² zᵀHz, so ĝ = (1/K) Σ z (zᵀ∇L + ½σ zᵀHz).
    # A large σ makes the forward scheme's second-order term visible: a wrong constant or a
    # wrong sign of δ in either half breaks the equality.
    model, batch, grad, hess = _quadratic_problem()
    autograd = torch.autograd.grad(_half_mse(model(batch[0]), batch[1]), model.weight)[0].reshape(
        -1
    )
    torch.testing.assert_close(autograd, grad)  # the closed form is the true gradient
    k, sigma, seed = 30, 0.5, 3
    got = zeroth_order_gradient(model, _half_mse, batch, k=k, sigma=sigma, seed=seed, scheme=scheme)
    z = torch.stack([_z(seed, i, "weight", torch.Size([1, 10])).reshape(-1) for i in range(k)])
    proj = z @ grad
    if scheme == "forward":
        proj = proj + 0.5 * sigma * torch.einsum("ki,ij,kj->k", z, hess, z)
    want = z.T @ proj / k
    torch.testing.assert_close(got["weight"].reshape(-1), want, rtol=1e-5, atol=1e-8)


def test_budget_helpers() -> None:
    assert forward_budget(100, "central") == 200
    assert forward_budget(100, "forward") == 101
    assert num_differences(200, "central") == 100
    assert num_differences(200, "forward") == 199  # twice-FD at central's cost (Fig. 3)
    with pytest.raises(ConfigError, match="buys no central"):
        num_differences(1, "central")


def test_combined_clients_equal_weighted_sum_of_estimates() -> None:
    # BAFFLE Eq. (7): shared perturbations make Σ_c w_c ĝ_c = ĝ(Σ_c w_c ΔL_c).
    model, _ = _mlp_problem()
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(8, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    batches = [(x, torch.randint(0, 3, (8,), generator=g)) for x in xs]
    counts = [10, 30, 60]
    params = dict(model.named_parameters())
    kw = dict(sigma=1e-4, seed=11, scheme="central")
    diffs = [loss_differences(model, F.cross_entropy, b, k=16, **kw) for b in batches]
    combined = estimate_gradient(params, combine_loss_differences(diffs, counts), **kw)
    separate = [estimate_gradient(params, d, **kw) for d in diffs]
    for name in params:
        want = sum(c / 100 * s[name] for c, s in zip(counts, separate))
        torch.testing.assert_close(combined[name], want, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(
        combine_loss_differences(diffs, counts), combine_loss_differences(diffs, [0.1, 0.3, 0.6])
    )


def test_estimate_from_shapes_equals_from_params_and_masks_are_exact_zeros() -> None:
    model, batch = _mlp_problem()
    mask = torch.rand(6, 4, generator=torch.Generator().manual_seed(0)) > 0.5
    kw = dict(sigma=1e-4, seed=2, scheme="forward")
    d = loss_differences(model, F.cross_entropy, batch, k=8, masks={"0.weight": mask}, **kw)
    params = dict(model.named_parameters())
    from_params = estimate_gradient(params, d, masks={"0.weight": mask}, **kw)
    shapes = {n: p.shape for n, p in params.items()}
    from_shapes = estimate_gradient(shapes, d, masks={"0.weight": mask}, **kw)
    for name, g in from_params.items():
        assert g.dtype == torch.float64 and from_shapes[name].dtype == torch.float32
        torch.testing.assert_close(g.float(), from_shapes[name])
    assert bool((from_params["0.weight"][~mask] == 0).all())
    assert bool((from_params["0.weight"][mask] != 0).all())


def test_zeroth_order_gradient_equals_the_reference_on_a_subset() -> None:
    model, batch = _mlp_problem()
    kw = dict(k=6, sigma=1e-4, seed=9, scheme="central")
    g = zeroth_order_gradient(model, F.cross_entropy, batch, params=["2.weight", "2.bias"], **kw)
    diffs = _reference_loss_differences(
        model, F.cross_entropy, batch, params=["2.weight", "2.bias"], **kw
    )
    shapes = {n: p.shape for n, p in model.named_parameters() if n.startswith("2.")}
    want = _reference_estimate(shapes, diffs, sigma=1e-4, seed=9, scheme="central")
    assert list(g) == ["2.weight", "2.bias"]
    for name in g:
        assert g[name].dtype == torch.float64  # the parameters' dtype
        # σ = 1e-4 amplifies the float32 rounding of ΔL (~1e-7 relative) by nothing more
        torch.testing.assert_close(g[name], want[name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(k=0), "k must be a positive int"),
        (dict(sigma=0.0), "sigma must be a finite number > 0"),
        (dict(sigma=float("nan")), "sigma must be a finite number > 0"),
        (dict(scheme="backward"), "scheme must be one of"),
        (dict(mode="turbo"), "mode must be one of"),
        (dict(chunk=0), "chunk must be a positive int"),
        (dict(dtype=torch.float64), "dtype must be None"),
    ],
)
def test_loss_differences_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    model, batch = _mlp_problem()
    args = dict(k=2, sigma=1e-3, seed=0, scheme="central") | kwargs
    with pytest.raises(ConfigError, match=match):
        loss_differences(model, F.cross_entropy, batch, **args)


def test_estimate_rejects_bad_client_messages() -> None:
    shapes = {"w": (3,)}
    with pytest.raises(MessageError, match="non-finite values \\(first at k=1\\)") as info:
        bad = torch.tensor([0.1, float("nan")])
        estimate_gradient(shapes, bad, sigma=1e-3, seed=0, scheme="forward")
    # a malformed message, and training that diverged: a run records it as diverged (a screen's
    # lr that blows up loses) instead of failing
    assert isinstance(info.value, DivergenceError)
    with pytest.raises(MessageError, match="1-D tensor"):
        estimate_gradient(shapes, torch.zeros(2, 2), sigma=1e-3, seed=0, scheme="forward")
    with pytest.raises(MessageError, match="same k"):
        combine_loss_differences([torch.zeros(2), torch.zeros(3)], [1, 1])
    with pytest.raises(ConfigError, match="non-negative"):
        combine_loss_differences([torch.zeros(2)], [-1])


def test_precision_warning_for_sigma_below_half_precision_resolution() -> None:
    model, batch = _mlp_problem()
    model = model.float()
    batch = (batch[0].float(), batch[1])
    kw = dict(k=2, seed=0, scheme="central")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float32 with σ = 1e-4: fine, no warning
        loss_differences(model, F.cross_entropy, batch, sigma=1e-4, **kw)
    with pytest.warns(PrecisionWarning, match="bfloat16"):
        loss_differences(model, F.cross_entropy, batch, sigma=1e-4, dtype=torch.bfloat16, **kw)


def test_dropout_in_train_mode_warns() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5))
    batch = (
        torch.randn(4, 4, generator=torch.Generator().manual_seed(0)),
        torch.tensor([0, 1, 2, 0]),
    )
    with pytest.warns(ZerothOrderWarning, match="dropout is active"):
        loss_differences(model, F.cross_entropy, batch, k=2, sigma=1e-2, seed=0, scheme="forward")
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss_differences(model, F.cross_entropy, batch, k=2, sigma=1e-2, seed=0, scheme="forward")


def test_loss_that_ignores_the_weights_warns_and_non_scalar_loss_is_an_error() -> None:
    model, batch = _mlp_problem()
    kw = dict(k=2, sigma=1e-3, seed=0, scheme="forward")
    with pytest.warns(ZerothOrderWarning, match="every loss difference is exactly 0"):
        loss_differences(model, lambda out, y: out.sum() * 0, batch, **kw)
    per_sample = lambda out, y: F.cross_entropy(out, y, reduction="none")  # noqa: E731
    for mode in ("lean", "fast"):
        with pytest.raises(ConfigError, match="scalar"):
            loss_differences(model, per_sample, batch, mode=mode, **kw)


def _frozen_prefix_lenet() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """BAFFLE's LeNet with conv1 frozen, seeded weights and 12 28x28 images (128 MFLOP a forward:
    above the batched pass's threshold, so fast mode runs the threaded loop)."""
    from fedge.models import build_model

    g = torch.Generator().manual_seed(3)
    model = build_model("lenet", input_shape=(1, 28, 28), num_classes=10)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    for p in model.features.conv1.parameters():
        p.requires_grad_(False)
    x = torch.randn(12, 1, 28, 28, generator=g)
    return model, x, torch.randint(0, 10, (12,), generator=g)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(("mode", "workers"), [("lean", None), ("fast", 3)])
def test_the_frozen_prefix_once_gives_the_full_forwards_losses_at_the_suffix_s_flops(
    scheme, mode, workers
):
    """Oracle: the loss differences of the K full forwards. With ``prefix_once`` the frozen conv1
    runs once and the K perturbed forwards run through conv2 and the classifier only: the same
    differences bit for bit (lean loop, and threaded over 3 spans: the prefix's output is one
    tensor every forward reads), and torch's FLOP counter sees exactly
    F_prefix + (forwards) · F_suffix instead of (forwards) · (F_prefix + F_suffix)."""
    from torch.utils.flop_counter import FlopCounterMode

    from fedge.estimators import ZerothOrderSpec
    from fedge.estimators.zeroth_order import split_prefix

    model, x, y = _frozen_prefix_lenet()
    k = 6
    base = ZerothOrderSpec(k=k, sigma=1e-3, scheme=scheme, mode=mode, workers=workers)
    once = dataclasses.replace(base, prefix_once=True)

    def counted(spec):
        counter = FlopCounterMode(display=False)
        with counter:
            d = loss_differences(model, F.cross_entropy, (x, y), spec, seed=9)
        return d, counter.get_total_flops()

    full_d, full_flops = counted(base)
    once_d, once_flops = counted(once)
    assert torch.equal(once_d, full_d)
    # the oracle of the counts: one forward of the prefix and of the whole model, counted apart
    from fedge.estimators.perturbation import select

    prefix, suffix = split_prefix(model, select(model))
    assert prefix == list(model.features.conv1)
    with torch.no_grad(), FlopCounterMode(display=False) as c_prefix:
        h = x
        for m in prefix:
            h = m(h)
    with torch.no_grad(), FlopCounterMode(display=False) as c_total:
        model(x)
    f_prefix, f_total = c_prefix.get_total_flops(), c_total.get_total_flops()
    forwards = forward_budget(k, scheme)
    assert 0 < f_prefix < f_total
    assert full_flops == forwards * f_total
    assert once_flops == f_prefix + forwards * (f_total - f_prefix)


def test_no_prefix_to_split_when_the_first_layer_is_perturbed_or_random():
    from fedge.estimators.perturbation import select
    from fedge.estimators.zeroth_order import split_prefix

    model, _, _ = _frozen_prefix_lenet()
    for p in model.parameters():
        p.requires_grad_(True)
    assert split_prefix(model, select(model)) is None  # conv1 is perturbed
    noisy = nn.Sequential(nn.Dropout(0.5), nn.Linear(3, 2))
    assert split_prefix(noisy.train(), select(noisy)) is None  # dropout draws each forward
    frozen_first = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    frozen_first[0].requires_grad_(False)
    prefix, suffix = split_prefix(frozen_first, select(frozen_first))
    assert prefix == [frozen_first[0], frozen_first[1]] and list(suffix) == [frozen_first[2]]


def _jvp_problem():
    """A small float32 MLP with GroupNorm, its batch and a mask on one weight."""
    g = torch.Generator().manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 5), nn.GroupNorm(1, 5), nn.Tanh(), nn.Linear(5, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.7 * torch.randn(p.shape, generator=g))
    x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
    masks = {"0.weight": torch.rand(5, 6, generator=g) < 0.5}
    return model, (x, y), masks


@pytest.mark.parametrize("scheme", SCHEMES)
def test_jvp_directional_derivatives_equal_autograd_gradient_dot_z(scheme):
    """Oracle: autograd's ∇L (float64 loss) dotted with the seeded z_k ⊙ m. ``mode="jvp"``
    returns c·σ·∇L·z_k, so ΔL/(c·σ) is the directional derivative along the very directions the
    finite-difference modes perturb along."""
    model, batch, masks = _jvp_problem()
    k, sigma = 8, 1e-3
    got = loss_differences(
        model,
        F.cross_entropy,
        batch,
        k=k,
        sigma=sigma,
        scheme=scheme,
        mode="jvp",
        seed=4,
        masks=masks,
    )
    loss = F.cross_entropy(model(batch[0]).double(), batch[1])
    grads = dict(
        zip(dict(model.named_parameters()), torch.autograd.grad(loss, list(model.parameters())))
    )
    c = 2.0 if scheme == "central" else 1.0
    want = []
    for i in range(k):
        d = 0.0
        for name, gr in grads.items():
            z = standard_normal(4, i, name, gr.shape)
            if name in masks:
                z = z * masks[name]
            d += float((gr.double() * z.double()).sum())
        want.append(c * sigma * d)
    torch.testing.assert_close(
        got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-9
    )
    # the finite differences of the same directions tend to it (float64 model, small σ)
    model64 = _jvp_problem()[0].double()
    x64 = (batch[0].double(), batch[1])
    fd = loss_differences(
        model64, F.cross_entropy, x64, k=k, sigma=1e-6, scheme="central", seed=4, masks=masks
    )
    jv = loss_differences(
        model64,
        F.cross_entropy,
        x64,
        k=k,
        sigma=1e-6,
        scheme="central",
        mode="jvp",
        seed=4,
        masks=masks,
    )
    torch.testing.assert_close(jv, fd, rtol=1e-4, atol=1e-10)


def test_the_jvp_estimate_converges_to_the_autograd_gradient_as_k_grows():
    """ĝ = 1/K Σ_k (∇L·z_k) z_k on the server's unchanged rebuild: its cosine with autograd's
    gradient rises with K (≈ sqrt(K / (K + n)) for n = 53 coordinates), near 1 at K = 2048."""
    model, batch, _ = _jvp_problem()
    loss = F.cross_entropy(model(batch[0]).double(), batch[1])
    true = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))])
    cosines = []
    for k in (4, 64, 2048):
        g = zeroth_order_gradient(
            model, F.cross_entropy, batch, k=k, sigma=1e-2, scheme="forward", mode="jvp", seed=11
        )
        est = torch.cat([g[n].reshape(-1) for n, _ in model.named_parameters()])
        cosines.append(float(F.cosine_similarity(est.double(), true.double(), dim=0)))
    assert cosines[0] < cosines[1] < cosines[2] and cosines[2] > 0.97, cosines


def test_jvp_composes_with_the_frozen_prefix():
    """prefix_once with jvp: the tangents start after the frozen prefix; the same derivatives."""
    model, x, y = _frozen_prefix_lenet()
    from fedge.estimators import ZerothOrderSpec

    spec = ZerothOrderSpec(k=3, sigma=1e-3, scheme="forward", mode="jvp")
    full = loss_differences(model, F.cross_entropy, (x[:4], y[:4]), spec, seed=2)
    once = loss_differences(
        model, F.cross_entropy, (x[:4], y[:4]), dataclasses.replace(spec, prefix_once=True), seed=2
    )
    torch.testing.assert_close(once, full, rtol=1e-5, atol=1e-9)


def test_jvp_under_bfloat16_autocast_stays_near_the_float32_derivatives():
    """No finite difference to round away: bf16 forwards (autocast) give directional derivatives
    within a few percent of float32's (finite differences at σ = 1e-4 in bf16 are noise)."""
    model, x, y = _frozen_prefix_lenet()
    kw = dict(k=4, sigma=1e-4, scheme="forward", mode="jvp", seed=1)
    fp32 = loss_differences(model, F.cross_entropy, (x[:8], y[:8]), **kw)
    bf16 = loss_differences(model, F.cross_entropy, (x[:8], y[:8]), dtype=torch.bfloat16, **kw)
    assert float((bf16 - fp32).norm() / fp32.norm()) < 0.05  # measured: 0.8%
    fd = {**kw, "mode": "lean"}
    fd32 = loss_differences(model, F.cross_entropy, (x[:8], y[:8]), **fd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrecisionWarning)
        fd16 = loss_differences(model, F.cross_entropy, (x[:8], y[:8]), dtype=torch.bfloat16, **fd)
    assert float((fd16 - fd32).norm() / fd32.norm()) > 0.5  # measured: 980%
