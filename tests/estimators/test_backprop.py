"""The backprop oracle against a hand-derived gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedge.estimators import backprop_gradient


def test_least_squares_gradient_matches_closed_form() -> None:
    # Prepare: L(W, b) = mean((xWᵀ + b − y)²) / 2, so ∇W = rᵀx / B and ∇b = mean(r).
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(5, 1).double()
    x = torch.randn(32, 5, generator=g, dtype=torch.float64)
    y = torch.randn(32, 1, generator=g, dtype=torch.float64)
    # Execute
    grads = backprop_gradient(model, lambda out, t: 0.5 * F.mse_loss(out, t), (x, y))
    # Assert
    r = model(x).detach() - y
    torch.testing.assert_close(grads["weight"], r.T @ x / 32)
    torch.testing.assert_close(grads["bias"], r.mean(0))


def test_selected_subset_and_grad_fields_untouched() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    grads = backprop_gradient(model, F.cross_entropy, (x, y), params=["2.weight"])
    assert list(grads) == ["2.weight"] and grads["2.weight"].shape == (2, 3)
    assert all(p.grad is None for p in model.parameters())


def test_unused_parameter_gets_zeros() -> None:
    model = nn.Sequential(nn.Linear(4, 2))
    model.register_parameter("spare", nn.Parameter(torch.ones(3)))
    grads = backprop_gradient(model, F.cross_entropy, (torch.randn(2, 4), torch.tensor([0, 1])))
    assert torch.equal(grads["spare"], torch.zeros(3))
