"""bench.reference: BAFFLE's reference loop against autograd (a quadratic loss)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedge.bench.reference import reference_gradient


def _quadratic_model() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model, (torch.randn(16, 3, generator=g), torch.randn(16, 2, generator=g))


@pytest.mark.parametrize("scheme", ["central", "forward"])
def test_reference_gradient_matches_autograd_and_restores_weights(scheme: str) -> None:
    # Prepare: a quadratic loss, where the central difference is exactly 2δᵀ∇L, so the estimate
    # is (1/K) Σ (zᵀ∇L) z: unbiased, relative error ~ sqrt(n / K) = sqrt(8 / 4000) ≈ 0.045
    # (the forward scheme adds a bias of order σ·|H|, negligible at σ = 1e-3).
    model, batch = _quadratic_model()
    before = [p.detach().clone() for p in model.parameters()]
    F.mse_loss(model(batch[0]), batch[1]).backward()
    truth = torch.cat([p.grad.flatten() for p in model.parameters()])
    # Execute
    est = reference_gradient(
        model,
        F.mse_loss,
        batch,
        k=4000,
        sigma=1e-3,
        scheme=scheme,
        generator=torch.Generator().manual_seed(1),
    )
    # Assert
    got = torch.cat([est[n].flatten() for n, _ in model.named_parameters()])
    assert F.cosine_similarity(got, truth, dim=0) > 0.99
    assert (got.norm() / truth.norm() - 1).abs() < 0.1
    for p, b in zip(model.parameters(), before):  # restored up to the in-place drift, 3 ops a k
        torch.testing.assert_close(p.detach(), b, atol=1e-4, rtol=0)


def test_reference_gradient_rejects_unknown_scheme() -> None:
    model, batch = _quadratic_model()
    with pytest.raises(ValueError, match="backward"):
        reference_gradient(
            model,
            F.mse_loss,
            batch,
            k=1,
            sigma=1e-3,
            scheme="backward",
            generator=torch.Generator(),
        )
