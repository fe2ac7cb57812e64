"""Reconstruction attacks against oracles: autograd gradients and the client's own K values."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from fedge.attacks.reconstruct import GradientTarget, baffle_projection, idlg_labels, invert
from fedge.estimators import loss_differences
from fedge.models.registry import build_model


def _model(shape=(1, 8, 8)):
    return build_model("lenet-dlg", input_shape=shape, num_classes=10, seed=0)


def _grads(model, x, y):
    params = dict(model.named_parameters())
    g = torch.autograd.grad(F.cross_entropy(model(x), y), list(params.values()))
    return dict(zip(params, g, strict=True))


def test_lenet_dlg_is_the_unpooled_sigmoid_lenet() -> None:
    m = _model((1, 28, 28))
    assert sum(isinstance(x, torch.nn.Sigmoid) for x in m.modules()) == 3
    assert not any("Pool" in type(x).__name__ for x in m.modules())
    assert m(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    t = build_model("lenet-dlg", input_shape=(1, 28, 28), num_classes=10, activation="tanh", seed=0)
    assert sum(isinstance(x, torch.nn.Tanh) for x in t.modules()) == 3


def test_idlg_reads_the_label_of_one_sample() -> None:
    m = _model()
    for label in (0, 3, 9):
        g = _grads(
            m,
            torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(label)),
            torch.tensor([label]),
        )
        assert int(idlg_labels(g, m)) == label


def test_baffle_projection_reproduces_the_clients_loss_differences() -> None:
    """z_kᵀ∇L from the regenerated directions equals ΔL_k / σ (forward scheme) to O(σ)."""
    m = _model()
    x, y = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([4])
    params = dict(m.named_parameters())
    for scheme in ("forward", "central"):
        d = loss_differences(
            m, F.cross_entropy, (x, y), k=16, sigma=1e-3, seed=7, scheme=scheme, params=list(params)
        )
        proj = baffle_projection(
            {n: p.shape for n, p in params.items()},
            d,
            sigma=1e-3,
            seed=7,
            scheme=scheme,
            directions="gaussian",
        )
        torch.testing.assert_close(proj.project(_grads(m, x, y)), proj.t, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("directions", ["gaussian", "block"])
def test_baffle_projection_under_masks_reproduces_a_pruned_clients_loss_differences(
    directions: str,
) -> None:
    """NTK-BAFFLE's client perturbs only kept coordinates, its block directions split by what
    each block keeps: the attacker's regenerated z_k ⊙ m must be exactly those."""
    m = _model()
    x, y = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([4])
    params = dict(m.named_parameters())
    g = torch.Generator().manual_seed(3)
    masks = {
        n: torch.rand(p.shape, generator=g) < (0.05 if i == 0 else 0.9)
        for i, (n, p) in enumerate(params.items())
    }
    d = loss_differences(
        m,
        F.cross_entropy,
        (x, y),
        k=16,
        sigma=1e-3,
        seed=7,
        scheme="central",
        params=list(params),
        masks=masks,
        directions=directions,
    )
    proj = baffle_projection(
        {n: p.shape for n, p in params.items()},
        d,
        sigma=1e-3,
        seed=7,
        scheme="central",
        directions=directions,
        masks=masks,
    )
    torch.testing.assert_close(proj.project(_grads(m, x, y)), proj.t, rtol=2e-2, atol=2e-2)
    assert all(bool(z[:, ~masks[n]].eq(0).all()) for n, z in proj.directions.items())


def test_dlg_inverts_a_single_sample_gradient() -> None:
    m = _model()
    x, y = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(2)), torch.tensor([6])
    g = _grads(m, x, y)
    rec = invert(
        m,
        GradientTarget(g),
        input_shape=(1, 8, 8),
        num_classes=10,
        labels=idlg_labels(g, m),
        iterations=200,
        generator=torch.Generator().manual_seed(0),
    )
    # 1.0e-3 to 1.5e-3 over dummy seeds on an AVX2 CPU, below 1e-3 on AVX-512 ones: the matching loss is
    # ~2e-8 at a flat optimum where float32 roundoff decides the stop; the mean image's error is ~0.08
    assert F.mse_loss(rec.x, x) < 5e-3
    wrong = invert(
        m,
        GradientTarget({n: torch.zeros_like(v) + 0.01 for n, v in g.items()}),
        input_shape=(1, 8, 8),
        num_classes=10,
        labels=torch.tensor([6]),
        iterations=40,
        generator=torch.Generator().manual_seed(0),
    )
    assert (
        F.mse_loss(wrong.x, x) > 1e-2
    )  # a target that is not the gradient does not yield the image


def test_matching_k_values_rebuilds_an_image_with_fewer_pixels_than_k() -> None:
    """8x8 = 64 pixels, K = 100: the K projections pin the image down (issue 12's finding)."""
    m = _model()
    x, y = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([1])
    params = dict(m.named_parameters())
    d = loss_differences(
        m,
        F.cross_entropy,
        (x, y),
        k=100,
        sigma=1e-4,
        seed=11,
        scheme="forward",
        params=list(params),
    )
    proj = baffle_projection(
        {n: p.shape for n, p in params.items()},
        d,
        sigma=1e-4,
        seed=11,
        scheme="forward",
        directions="gaussian",
    )
    rec = invert(
        m,
        proj,
        input_shape=(1, 8, 8),
        num_classes=10,
        iterations=300,
        generator=torch.Generator().manual_seed(0),
    )
    baseline = F.mse_loss(torch.full_like(x, 0.5), x)  # the images' mean value, ~1/12
    # a third of the baseline on an AVX2 CPU (0.030-0.032 over dummy seeds), a quarter on AVX-512 ones: where
    # L-BFGS stops on the flat optimum is float32 roundoff; an uninformed guess cannot beat the baseline
    assert F.mse_loss(rec.x, x) < baseline / 2


@pytest.mark.usefixtures("fashion_mnist")
def test_inverting_gradients_recovers_a_single_sample_and_tv_is_by_hand() -> None:
    """On a Fashion-MNIST image, the real one and the made one (a smooth blob): images of the
    kind the total-variation prior favours."""
    from fedge.attacks.reconstruct import invert_ig, total_variation

    img = torch.tensor([[[[0.0, 1.0], [3.0, 3.0]]]])  # |1-0|,|3-3| across; |3-0|,|3-1| down
    assert float(total_variation(img)) == (1 + 0) / 2 + (3 + 2) / 2
    from fedge.data.registry import load_dataset

    ds = load_dataset("fashion-mnist", limit_train=10, limit_test=1, seed=0)
    m = _model((1, 28, 28))
    x, y = ds.x_train[:1], ds.y_train[:1]
    rec = invert_ig(
        m,
        GradientTarget(_grads(m, x, y)),
        input_shape=(1, 28, 28),
        num_classes=10,
        labels=y,
        iterations=300,
        generator=torch.Generator().manual_seed(0),
    )
    baseline = F.mse_loss(torch.zeros_like(x), x)  # the (normalized) mean value
    assert F.mse_loss(rec.x, x) < baseline / 4


def test_scale_fit_by_hand() -> None:
    """Z = I (K = 2), t = (2, 0): p = (2, 2) gives s* = pᵀt/‖p‖² = 4/8 and residual
    ‖(1, 1) − (2, 0)‖² = 2, i.e. 2/‖t‖² = 0.5 relative, where the known-scale loss is
    ‖(2, 2) − (2, 0)‖² = 4; p = (3, 0) fits exactly with s* = 2/3; p = (−1, 0) disagrees in
    sign: s* = 0, loss continued to 1 + cos² = 2."""
    from fedge.attacks.reconstruct import ProjectionTarget

    known = ProjectionTarget({"w": torch.eye(2)}, torch.tensor([2.0, 0.0]))
    fit = ProjectionTarget({"w": torch.eye(2)}, torch.tensor([2.0, 0.0]), fit_scale=True)
    g = {"w": torch.tensor([2.0, 2.0])}
    assert float(known.loss(g)) == 4.0
    assert float(fit.scale(g)) == 0.5 and abs(float(fit.loss(g)) - 0.5) < 1e-6
    exact = {"w": torch.tensor([3.0, 0.0])}
    assert abs(float(fit.scale(exact)) - 2 / 3) < 1e-6 and abs(float(fit.loss(exact))) < 1e-6
    opposite = {"w": torch.tensor([-1.0, 0.0])}
    assert float(fit.scale(opposite)) == 0.0 and abs(float(fit.loss(opposite)) - 2.0) < 1e-6


def test_a_clipped_upload_is_still_reconstructed_when_the_scale_is_fitted() -> None:
    """DP clips the K values to L2 norm C (here C = ‖ΔL‖/20, with the clip DP uses): the
    scale-fitted K-value match still rebuilds a one-sample client's image on a tiny model
    (a 610-parameter sigmoid MLP on 8x8 inputs, K = 100), and what it reaches is a match:
    the relative residual after the best scale is ~0."""
    from fedge.privacy.dp.mechanisms import clip_l2

    torch.manual_seed(0)  # the model's init (the attack itself takes its generator)
    m = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 10)
    )
    x, y = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([1])
    params = dict(m.named_parameters())
    d = loss_differences(
        m,
        F.cross_entropy,
        (x, y),
        k=100,
        sigma=1e-4,
        seed=11,
        scheme="forward",
        params=list(params),
    )
    clipped = clip_l2({"dL": d}, float(d.norm()) / 20)[0]["dL"]
    torch.testing.assert_close(clipped, d / 20)
    proj = baffle_projection(
        {n: p.shape for n, p in params.items()},
        clipped,
        sigma=1e-4,
        seed=11,
        scheme="forward",
        directions="gaussian",
    )
    fitted = invert(
        m,
        replace(proj, fit_scale=True),
        input_shape=(1, 8, 8),
        num_classes=10,
        iterations=300,
        generator=torch.Generator().manual_seed(0),
    )
    assert F.mse_loss(fitted.x, x) < 1e-3 < F.mse_loss(torch.full_like(x, 0.5), x)
    assert fitted.loss < 1e-5


def test_dlg_returns_its_best_iterate_with_that_iterates_loss() -> None:
    """The reported matching loss is the loss at the returned x (L-BFGS's step returns the loss
    before the step, which must not be paired with the point after it)."""
    m = _model()
    x, y = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([2])
    target = GradientTarget(_grads(m, x, y))
    # one L-BFGS call (20 iterations): far from converged, so the loss before and after it differ
    rec = invert(
        m,
        target,
        input_shape=(1, 8, 8),
        num_classes=10,
        labels=torch.tensor([2]),
        iterations=20,
        generator=torch.Generator().manual_seed(1),
    )
    params = dict(m.named_parameters())
    dummy = rec.x.clone()
    g = torch.autograd.grad(F.cross_entropy(m(dummy), rec.labels), list(params.values()))
    assert float(target.loss(dict(zip(params, g, strict=True)))) == pytest.approx(
        rec.loss, rel=1e-4, abs=1e-12
    )
    assert rec.iterations == 20


def test_a_target_without_a_finite_objective_is_not_optimized() -> None:
    """Ciphertext read as float32: squares overflow, so DLG cannot start; it says so (loss inf,
    0 iterations) and returns the dummy start untouched."""
    m = _model()
    huge = {n: torch.full_like(p, 3e38) for n, p in m.named_parameters()}
    rec = invert(
        m,
        GradientTarget(huge),
        input_shape=(1, 8, 8),
        num_classes=10,
        labels=torch.tensor([0]),
        iterations=40,
        generator=torch.Generator().manual_seed(0),
    )
    start = invert(
        m,
        GradientTarget(huge),
        input_shape=(1, 8, 8),
        num_classes=10,
        labels=torch.tensor([0]),
        iterations=0,
        generator=torch.Generator().manual_seed(0),
    )
    assert rec.loss == float("inf") and rec.iterations == 0
    assert torch.equal(rec.x, start.x)


def test_inverting_gradients_stays_in_the_pixel_box_when_given_one() -> None:
    """Eq. 4 of Geiping et al. minimizes over x in [0, 1]^n: with ``bounds`` every pixel of the
    result lies in the box (normalized space); without, the signed Adam steps leave it."""
    from fedge.attacks.reconstruct import invert_ig

    m = _model()
    x, y = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([1])
    lo, hi = torch.full((1, 1, 1, 1), -0.4), torch.full((1, 1, 1, 1), 0.6)
    target = GradientTarget(_grads(m, x, y))
    free = invert_ig(
        m,
        target,
        input_shape=(1, 8, 8),
        num_classes=10,
        labels=y,
        iterations=40,
        generator=torch.Generator().manual_seed(0),
    )
    boxed = invert_ig(
        m,
        target,
        input_shape=(1, 8, 8),
        num_classes=10,
        labels=y,
        iterations=40,
        bounds=(lo, hi),
        generator=torch.Generator().manual_seed(0),
    )
    assert float(free.x.min()) < -0.4 or float(free.x.max()) > 0.6
    assert float(boxed.x.min()) >= -0.4 and float(boxed.x.max()) <= 0.6
