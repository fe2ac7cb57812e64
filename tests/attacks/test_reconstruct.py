"""Reconstruction attacks against oracles: autograd gradients and the client's own K values."""

from __future__ import annotations

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
        g = _grads(m, torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(label)), torch.tensor([label]))
        assert int(idlg_labels(g, m)) == label


def test_baffle_projection_reproduces_the_clients_loss_differences() -> None:
    """z_kᵀ∇L from the regenerated directions equals ΔL_k / σ (forward scheme) to O(σ)."""
    m = _model()
    x, y = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([4])
    params = dict(m.named_parameters())
    for scheme in ("forward", "central"):
        d = loss_differences(m, F.cross_entropy, (x, y), k=16, sigma=1e-3, seed=7, scheme=scheme, params=list(params))
        proj = baffle_projection({n: p.shape for n, p in params.items()}, d, sigma=1e-3, seed=7, scheme=scheme,
                                 directions="gaussian")  # fmt: skip
        torch.testing.assert_close(proj.project(_grads(m, x, y)), proj.t, rtol=2e-2, atol=2e-2)


def test_dlg_inverts_a_single_sample_gradient() -> None:
    m = _model()
    x, y = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(2)), torch.tensor([6])
    g = _grads(m, x, y)
    rec = invert(m, GradientTarget(g), input_shape=(1, 8, 8), num_classes=10, labels=idlg_labels(g, m),
                 iterations=200, generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert F.mse_loss(rec.x, x) < 1e-3
    wrong = invert(m, GradientTarget({n: torch.zeros_like(v) + 0.01 for n, v in g.items()}), input_shape=(1, 8, 8),
                   num_classes=10, labels=torch.tensor([6]), iterations=40, generator=torch.Generator().manual_seed(0))
    assert F.mse_loss(wrong.x, x) > 1e-2  # a target that is not the gradient does not yield the image


def test_matching_k_values_rebuilds_an_image_with_fewer_pixels_than_k() -> None:
    """8x8 = 64 pixels, K = 100: the K projections pin the image down (issue 12's finding)."""
    m = _model()
    x, y = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([1])
    params = dict(m.named_parameters())
    d = loss_differences(m, F.cross_entropy, (x, y), k=100, sigma=1e-4, seed=11, scheme="forward", params=list(params))
    proj = baffle_projection({n: p.shape for n, p in params.items()}, d, sigma=1e-4, seed=11, scheme="forward",
                             directions="gaussian")  # fmt: skip
    rec = invert(m, proj, input_shape=(1, 8, 8), num_classes=10, iterations=300, generator=torch.Generator().manual_seed(0))
    baseline = F.mse_loss(torch.full_like(x, 0.5), x)  # the images' mean value, ~1/12
    assert F.mse_loss(rec.x, x) < baseline / 4


def test_inverting_gradients_recovers_a_single_sample_and_tv_is_by_hand() -> None:
    from fedge.attacks.reconstruct import invert_ig, total_variation

    img = torch.tensor([[[[0.0, 1.0], [3.0, 3.0]]]])  # |1-0|,|3-3| across; |3-0|,|3-1| down
    assert float(total_variation(img)) == (1 + 0) / 2 + (3 + 2) / 2
    from fedge.data.registry import load_dataset

    ds = load_dataset("fashion-mnist", limit_train=10, limit_test=1, seed=0)  # a real image: TV is an image prior
    m = _model((1, 28, 28))
    x, y = ds.x_train[:1], ds.y_train[:1]
    rec = invert_ig(m, GradientTarget(_grads(m, x, y)), input_shape=(1, 28, 28), num_classes=10, labels=y,
                    iterations=300, generator=torch.Generator().manual_seed(0))  # fmt: skip
    baseline = F.mse_loss(torch.zeros_like(x), x)  # the (normalized) mean value
    assert F.mse_loss(rec.x, x) < baseline / 4
